// Directories owned by live processes (pid in the name + flock) and the sweep of those whose process is gone.
#include "aitune/process_directory.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <stdio.h>  // renameat2, RENAME_NOREPLACE (glibc >= 2.28)
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "aitune/error.hpp"
#include "io/random_token.hpp"

namespace aitune {
namespace fs = std::filesystem;
namespace {

// What a directory is called between its mkdir and its lock (OwnedDirectory::create): a name
// no sweep of its prefix matches.
const std::string kPending = ".pending-";

// `from` renamed to `to`, failing (EEXIST) where `to` exists; plain rename where the file
// system has no RENAME_NOREPLACE (a clash of two random tokens is all it would miss).
int rename_noreplace(const fs::path& from, const fs::path& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  return ::rename(from.c_str(), to.c_str());
}

// The pid of "<prefix><pid>-<rest>", or 0 when the name is not of that form.
long pid_in_name(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return 0;
  long pid = 0;
  std::size_t i = prefix.size();
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && i - prefix.size() < 10; ++i) pid = pid * 10 + (name[i] - '0');
  if (i == prefix.size() || i >= name.size() || name[i] != '-') return 0;
  return pid;
}

// An fd on `path` holding its exclusive lock, or -1 when someone else holds it (or it is gone).
int try_lock(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// How old a pending directory must be before a sweep takes it.
constexpr std::chrono::seconds kPendingGrace{60};

// Whether `path` was last modified longer than `age` ago (false when that cannot be read).
bool older_than(const fs::path& path, std::chrono::seconds age) {
  std::error_code ec;
  const auto written = fs::last_write_time(path, ec);
  return !ec && fs::file_time_type::clock::now() - written > age;
}

template <typename Visit>
void each_stale(const std::string& parent, const std::string& prefix, Visit visit) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // A directory of the form, or one its maker died before naming (kPending, empty).
    long pid = pid_in_name(name, prefix);
    const bool pending = pid == 0;
    if (pending) pid = pid_in_name(name, kPending + prefix);
    std::error_code type_ec;
    if (pid <= 0 || !it->is_directory(type_ec) || it->is_symlink(type_ec)) continue;
    // A pending directory is unlocked between its maker's mkdir and flock, and a sweep from
    // another pid namespace sees no process of its pid: swept only once older than any
    // maker takes to lock and name it (microseconds), or a busy sweeper takes it from under
    // its maker (3 of 15345 on a 16-core host).
    if (pending && !older_than(it->path(), kPendingGrace)) continue;
    if (process_alive(pid)) continue;  // its owner may be between mkdir and flock
    const int fd = try_lock(it->path());
    if (fd < 0) continue;  // held: a live owner (in another pid namespace, say)
    visit(StaleDirectory{it->path().string(), pid, tree_bytes(it->path().string())}, it->path());
    ::close(fd);
  }
}

}  // namespace

OwnedDirectory OwnedDirectory::create(const std::string& parent, const std::string& prefix) {
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot create the directory '" + parent + "': " + ec.message());
  for (int attempt = 0;; ++attempt) {
    const bool retry = attempt < 8;
    std::string name = prefix;
    name += std::to_string(::getpid());
    name += "-";
    name += detail::random_token();
    // Made under a pending name, locked there, then named: a directory of the swept form
    // holds its lock from the moment it has that name. Made at its name and locked after,
    // a sweep from another pid namespace (containers sharing a cache), which sees no
    // process of this pid, could take it between the mkdir and the flock.
    const fs::path pending = fs::path(parent) / (kPending + name);
    const fs::path path = fs::path(parent) / name;
    if (::mkdir(pending.c_str(), 0755) != 0) {
      if (errno == EEXIST && retry) continue;
      throw Error(ErrorCode::kIo, "cannot create a directory in '" + parent + "': " + std::strerror(errno));
    }
    const int fd = ::open(pending.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && retry) continue;  // a sweep took the unlocked pending directory
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) {
      const std::string why = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      ::rmdir(pending.c_str());
      throw Error(ErrorCode::kIo, "cannot lock the directory '" + pending.string() + "': " + why);
    }
    if (rename_noreplace(pending, path) != 0) {
      const int error = errno;
      ::close(fd);
      ::rmdir(pending.c_str());
      // ENOENT: a sweep took the pending directory before this process held its lock
      if ((error == ENOENT || error == EEXIST || error == ENOTEMPTY) && retry) continue;
      throw Error(ErrorCode::kIo, "cannot name the directory '" + path.string() + "': " + std::strerror(error));
    }
    return OwnedDirectory(path.string(), fd);
  }
}

OwnedDirectory::OwnedDirectory(OwnedDirectory&& other) noexcept : path_(std::move(other.path_)), fd_(other.fd_) {
  other.fd_ = -1;
}

OwnedDirectory& OwnedDirectory::operator=(OwnedDirectory&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

OwnedDirectory::~OwnedDirectory() { release(); }

void OwnedDirectory::remove() noexcept {
  if (fd_ < 0) return;
  std::error_code ec;
  fs::remove_all(path_, ec);  // still locked: no sweep takes it meanwhile
  release();
}

void OwnedDirectory::release() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::uint64_t tree_bytes(const std::string& root) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) total += it->file_size(size_ec);
  }
  return total;
}

bool process_alive(long pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

std::vector<StaleDirectory> find_stale_directories(const std::string& parent, const std::string& prefix) {
  std::vector<StaleDirectory> out;
  each_stale(parent, prefix, [&](StaleDirectory found, const fs::path&) { out.push_back(std::move(found)); });
  return out;
}

std::vector<StaleDirectory> remove_stale_directories(const std::string& parent, const std::string& prefix,
                                                     std::vector<StaleRemovalFailure>* failures) {
  std::vector<StaleDirectory> out;
  each_stale(parent, prefix, [&](StaleDirectory found, const fs::path& path) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (!ec) out.push_back(std::move(found));
    else if (failures) failures->push_back({found.path, ec.message()});
  });
  return out;
}

std::string default_cache_root() {
  auto expand = [](std::string p) {
    if (!p.empty() && p[0] == '~') {
      const char* home = std::getenv("HOME");
      if (home) p = std::string(home) + p.substr(1);
    }
    return p;
  };
  if (const char* dir = std::getenv("AITUNE_CACHE_DIR"); dir && *dir) return expand(dir);
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return (fs::path(expand(xdg)) / "aitune").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home ? home : "") / ".cache" / "aitune").string();
}

std::string sibling_prefix(const std::string& target_name, const std::string& kind) {
  // A name near the file system's 255-byte limit left no room for ".tmp-<pid>-<random>": a
  // 244-byte name the file system takes was refused with "File name too long" (a session-36
  // probe). The digest is FNV-1a: a later process's sweep must find the same prefix.
  constexpr std::size_t kKept = 100, kLong = 120;
  std::string name = target_name;
  if (name.size() > kLong) {
    std::uint64_t hash = 1469598103934665603ULL;
    for (unsigned char c : name) hash = (hash ^ c) * 1099511628211ULL;
    std::size_t cut = kKept;
    while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
    char digest[17];
    std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(hash));
    name = name.substr(0, cut) + "~" + digest;
  }
  return "." + name + kind;
}

}  // namespace aitune
