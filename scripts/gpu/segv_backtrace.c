// LD_PRELOAD helper for a crash hunt on the GPU host (scripts/gpu/segv_hunt.sh): on SIGSEGV,
// SIGBUS or SIGABRT, print the native frames (Python's faulthandler shows only Python's),
// then let the signal end the process as it would have. A jump to a null function pointer
// leaves nothing to unwind from, so the faulting instruction and the words at the top of
// the stack (the caller's return address among them) are printed by name too. Build:
//   gcc -shared -fPIC -O1 -g -o /tmp/segv_backtrace.so scripts/gpu/segv_backtrace.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static void say(const char* text) { (void)!write(2, text, strlen(text)); }

static void name_of(const char* label, uintptr_t address) {
  char line[512];
  Dl_info info;
  if (dladdr((void*)address, &info) && info.dli_fname) {
    snprintf(line, sizeof line, "%s %#lx  %s(%s+%#lx)\n", label, (unsigned long)address, info.dli_fname,
             info.dli_sname ? info.dli_sname : "?",
             (unsigned long)(address - (uintptr_t)(info.dli_saddr ? info.dli_saddr : info.dli_fbase)));
  } else {
    snprintf(line, sizeof line, "%s %#lx\n", label, (unsigned long)address);
  }
  say(line);
}

static void on_fatal(int sig, siginfo_t* si, void* context) {
  say("\n==== native frames (segv_backtrace.so) ====\n");
  ucontext_t* uc = (ucontext_t*)context;
  const uintptr_t rip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
  const uintptr_t* rsp = (const uintptr_t*)uc->uc_mcontext.gregs[REG_RSP];
  name_of("fault address", (uintptr_t)si->si_addr);
  name_of("instruction  ", rip);
  for (int i = 0; i < 24; ++i) {  // return addresses among the stack's top words
    Dl_info info;
    if (dladdr((void*)rsp[i], &info) && info.dli_fname) name_of("stack word   ", rsp[i]);
  }
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
  sigaction(SIGABRT, &sa, 0);
}
