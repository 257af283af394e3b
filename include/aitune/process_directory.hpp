// Directories a live process owns (its pid in the name, an flock held), and the sweep that removes those of dead processes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace aitune {

/// A directory "<parent>/<prefix><pid>-<random>" created by and locked for this process
/// (flock LOCK_EX on the directory itself) for as long as this object lives. Processes
/// that share `parent` use this to tell work in progress from debris: a sweep
/// (`remove_stale_directories`) removes an entry only when its pid is not a live process
/// and nobody holds its lock, so neither a pid alone (reused, another pid namespace) nor
/// an age decides. Destroying it releases the lock and leaves the directory;
/// `remove()` removes it first.
class OwnedDirectory {
 public:
  /// Creates and locks the directory (parents created). Error(kIo) when that fails. It is
  /// made as "<parent>/.pending-<prefix><pid>-<random>", locked, then renamed: a directory
  /// of the swept form is locked from its first instant, so a sweep in another pid
  /// namespace (which sees no process of this pid) never takes one being made.
  static OwnedDirectory create(const std::string& parent, const std::string& prefix);
  OwnedDirectory(OwnedDirectory&& other) noexcept;
  OwnedDirectory& operator=(OwnedDirectory&& other) noexcept;
  OwnedDirectory(const OwnedDirectory&) = delete;
  OwnedDirectory& operator=(const OwnedDirectory&) = delete;
  ~OwnedDirectory();

  const std::string& path() const noexcept { return path_; }
  /// False after `remove()` / `release()`.
  bool held() const noexcept { return fd_ >= 0; }
  /// Removes the directory tree, then releases the lock. Errors are ignored (what is
  /// left is found by the next sweep).
  void remove() noexcept;
  /// Releases the lock and keeps the directory (it becomes debris once this process ends).
  void release() noexcept;

 private:
  OwnedDirectory(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

/// An entry of a directory that no live process owns.
struct StaleDirectory {
  std::string path;
  long pid = 0;              ///< the pid its name carries
  std::uint64_t bytes = 0;   ///< the regular files' sizes under it
};

/// The sizes of the regular files under `root`, recursively (0 for a missing root;
/// entries that vanish or cannot be read while walking are skipped).
std::uint64_t tree_bytes(const std::string& root);

/// True when `pid` names a process that exists (kill(pid, 0) succeeds or is refused for
/// permission); false for pid <= 0.
bool process_alive(long pid);

/// The entries "<parent>/<prefix><pid>-..." (and "<parent>/.pending-<prefix><pid>-...",
/// left by a maker killed before naming it) whose pid is not a live process and whose
/// lock (see OwnedDirectory) nobody holds. Nothing is removed. A missing `parent` has none.
std::vector<StaleDirectory> find_stale_directories(const std::string& parent, const std::string& prefix);

/// A stale directory that could not be removed, and why (a read-only file system).
struct StaleRemovalFailure {
  std::string path;
  std::string reason;
};

/// `find_stale_directories`, each removed while its lock is held (so an owner that
/// appears meanwhile is never swept). Returns those removed; those that could not be are
/// skipped, and added to `failures` where given.
std::vector<StaleDirectory> remove_stale_directories(const std::string& parent, const std::string& prefix,
                                                     std::vector<StaleRemovalFailure>* failures = nullptr);

/// Where the torch front end caches its tuning artefacts: $AITUNE_CACHE_DIR, else
/// $XDG_CACHE_HOME/aitune, else $HOME/.cache/aitune ("~" at the start expanded).
std::string default_cache_root();

/// ".<name><kind>": the prefix of the directories a save to a target named `name` makes
/// beside it (`kind` ".tmp-" for staging, ".old-" for a tree set aside). A name over 120
/// bytes is cut to its first 100 (at a UTF-8 character's start) and a stable digest of the
/// whole, so that the longest name the file system takes (255 bytes) leaves room for
/// "<pid>-<random>".
std::string sibling_prefix(const std::string& name, const std::string& kind);

}  // namespace aitune
