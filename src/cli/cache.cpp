// `aitune cache list|clean`: the torch front end's cache directory, and debris of processes that died.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "aitune/error.hpp"
#include "aitune/process_directory.hpp"
#include "commands.hpp"

namespace aitune::cli {
namespace {
namespace fs = std::filesystem;

// Per-process directories of the front end (python/aitune/torch/cache.py, checkpoint.py,
// candidate_isolation.py, triton.py) and of checkpoint saves (".<name>.tmp-<pid>-...").
constexpr const char* kRunPrefix = "run-";
constexpr const char* kTempPrefixes[] = {"aitune-save-", "aitune-probe-", "aitune-triton-"};
constexpr const char* kModuleNameFile = ".module_name";

struct CacheOptions {
  std::string dir;
};

std::string temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

// The directories of `dir` (not symbolic links), each visited with `visit(path, name)`.
// One that vanishes or cannot be opened meanwhile (another process's clear_cache or
// sweep removes directories while this walks) is skipped, never the end of the walk.
template <typename Visit>
void each_directory(const fs::path& dir, Visit visit) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code e;
    if (!it->is_directory(e) || it->is_symlink(e)) continue;
    visit(it->path(), it->path().filename().string());
  }
}

// Every place a stale directory may be: each directory of the cache to depth 3 (the
// run directories lie in <module>/<graph>/<backend>/) with its prefixes, and the
// system's temporary directory with the front end's scratch prefixes. Each directory
// is walked on its own, so one removed by another process while this walks costs only
// itself.
template <typename Sweep>
std::vector<StaleDirectory> sweep(const fs::path& root, Sweep each) {
  std::vector<StaleDirectory> found;
  auto add = [&](std::vector<StaleDirectory> more) { found.insert(found.end(), more.begin(), more.end()); };
  auto walk = [&](auto& self, const fs::path& dir, int depth) -> void {
    each_directory(dir, [&](const fs::path& path, const std::string& name) {
      if (name.rfind(kRunPrefix, 0) == 0 || name.find(".tmp-") != std::string::npos ||
          name.find(".old-") != std::string::npos)
        return;  // a run's own files
      add(each(path.string(), kRunPrefix));
      // Staging directories of checkpoints saved here: ".<name>.tmp-<pid>-".
      each_directory(path, [&](const fs::path&, const std::string& c) {
        for (const char* kind : {".tmp-", ".old-"})
          if (auto at = c.find(kind); !c.empty() && c[0] == '.' && at != std::string::npos)
            add(each(path.string(), c.substr(0, at + std::string(kind).size())));
      });
      if (depth + 1 < 3) self(self, path, depth + 1);
    });
  };
  std::error_code ec;
  if (fs::is_directory(root, ec)) {
    walk(walk, root, 0);
    add(each(root.string(), kRunPrefix));
  }
  for (const char* prefix : kTempPrefixes) add(each(temp_dir(), prefix));
  // A directory holding two staging directories of one name is visited once per name.
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  found.erase(std::unique(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.path == b.path; }),
              found.end());
  return found;
}

// The cache directory: --dir must be one (a mistyped --dir listed as an empty, clean cache
// would tell the operator nothing was left behind); the default one may not exist yet.
fs::path cache_root(const CacheOptions& o) {
  const fs::path root = o.dir.empty() ? fs::path(default_cache_root()) : fs::path(o.dir);
  std::error_code ec;
  const auto st = fs::status(root, ec);
  const std::string which = o.dir.empty() ? "the cache directory" : "--dir";
  if (fs::exists(st) && !fs::is_directory(st))
    throw Error(ErrorCode::kInvalidArgument, which + " '" + root.string() + "' is not a directory");
  if (!fs::exists(st) && !o.dir.empty())
    throw Error(ErrorCode::kInvalidArgument, "--dir '" + root.string() + "' does not exist");
  return root;
}

int cache_list(const CacheOptions& o) {
  const fs::path root = cache_root(o);
  std::error_code ec;
  std::cout << "cache: " << root.string() << (fs::exists(root, ec) ? "" : " (not created yet)") << "\n";
  std::uintmax_t total = 0;
  for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code e;
    if (!it->is_directory(e) || it->is_symlink(e)) continue;
    std::string name = it->path().filename().string();
    const auto bytes = tree_bytes(it->path().string());
    total += bytes;
    // Every module's directory records its name; one without (the build's ORT header
    // downloads share the default root) is listed as what it is, not as a module.
    if (!fs::exists(fs::symlink_status(it->path() / kModuleNameFile, e))) {
      std::cout << "not a module's directory: " << name << "  " << human_bytes(bytes) << "\n";
      continue;
    }
    std::ifstream recorded;  // a .module_name that is no file (a directory) leaves the directory's name
    if (fs::is_regular_file(it->path() / kModuleNameFile, e)) recorded.open(it->path() / kModuleNameFile, std::ios::binary);
    if (recorded.is_open() && recorded) name.assign(std::istreambuf_iterator<char>(recorded), std::istreambuf_iterator<char>());
    std::cout << "module '" << name << "': " << human_bytes(bytes) << "  " << it->path().filename().string() << "\n";
  }
  auto stale = sweep(root, [](const std::string& parent, const std::string& prefix) {
    return find_stale_directories(parent, prefix);
  });
  std::uintmax_t stale_bytes = 0;
  for (const auto& s : stale) {
    stale_bytes += s.bytes;
    std::cout << "stale (process " << s.pid << " is gone): " << s.path << "  " << human_bytes(s.bytes) << "\n";
  }
  std::cout << "total " << human_bytes(total) << "; " << stale.size() << " stale directories, "
            << human_bytes(stale_bytes) << " (aitune cache clean removes them)\n";
  return 0;
}

int cache_clean(const CacheOptions& o) {
  const fs::path root = cache_root(o);
  std::vector<StaleRemovalFailure> failures;
  auto removed = sweep(root, [&failures](const std::string& parent, const std::string& prefix) {
    return remove_stale_directories(parent, prefix, &failures);
  });
  std::uintmax_t bytes = 0;
  for (const auto& s : removed) {
    bytes += s.bytes;
    std::cout << "removed " << s.path << "  " << human_bytes(s.bytes) << "\n";
  }
  std::cout << "removed " << removed.size() << " stale directories, " << human_bytes(bytes) << "\n";
  // One that stays (a read-only cache) is said, with the file system's reason, and fails the
  // command: "removed 0" and exit 0 read as a clean cache that was not.
  for (const auto& f : failures)
    std::cerr << "aitune cache clean: could not remove " << f.path << ": " << f.reason << "\n";
  return failures.empty() ? 0 : 1;
}

}  // namespace

Command add_cache(CLI::App& app) {
  auto* sub = app.add_subcommand("cache", "List or clean the tuning cache and what processes that died left behind");
  sub->require_subcommand(1);
  auto o = std::make_shared<CacheOptions>();
  auto* list = sub->add_subcommand("list", "modules in the cache with their sizes, and stale directories");
  auto* clean = sub->add_subcommand("clean",
                                    "remove stale directories: runs, checkpoint staging and scratch directories whose "
                                    "process is gone and whose lock nobody holds");
  for (auto* s : {list, clean})
    s->add_option("--dir", o->dir, "cache directory (default: $AITUNE_CACHE_DIR, $XDG_CACHE_HOME/aitune, ~/.cache/aitune)")
        ->check(CLI::Validator(
            [](std::string& v) {  // an unset variable (--dir "$X") meant the default cache before
              return v.empty() ? std::string("is empty (an unset variable?): name the cache directory, or leave --dir "
                                             "out for the default one")
                               : std::string();
            },
            "DIR"));
  return {sub, [o, list] { return list->parsed() ? cache_list(*o) : cache_clean(*o); }};
}

}  // namespace aitune::cli
