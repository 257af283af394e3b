// LD_PRELOAD helper for a crash hunt on the GPU host (scripts/gpu/segv_hunt.sh): on SIGSEGV,
// SIGBUS or SIGABRT, print the native frames (Python's faulthandler shows only Python's),
// then let the signal end the process as it would have. Build:
//   gcc -shared -fPIC -O1 -g -o /tmp/segv_backtrace.so scripts/gpu/segv_backtrace.c
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_fatal(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  static const char head[] = "\n==== native frames (segv_backtrace.so) ====\n";
  write(2, head, sizeof head - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal;
  sa.sa_flags = SA_ONSTACK;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
  sigaction(SIGABRT, &sa, 0);
}
