// Private: durable files and atomically replaced directories (fsync, rename, RENAME_EXCHANGE).
#pragma once

#include <filesystem>
#include <string>

#include "aitune/process_directory.hpp"
#include "io/sha256.hpp"

namespace aitune::detail {

/// Copies `source` to the new file `dest` (which must not exist), hashing what it
/// writes; the copy is flushed to disk (fsync) before this returns. Error(kIo) naming
/// the file otherwise.
FileDigest copy_and_hash(const std::filesystem::path& source, const std::filesystem::path& dest);

/// Writes `text` to the new file `path` (which must not exist) and flushes it to disk.
void write_durable_file(const std::filesystem::path& path, const std::string& text);

/// fsync on a directory: makes the entries created in it durable. Error(kIo) otherwise.
void sync_directory(const std::filesystem::path& dir);

/// Creates an empty directory ".<name>.tmp-<pid>-<random>" beside `target` (in the
/// same file system, so it can be renamed onto it), locked for this process while the
/// returned object lives (see OwnedDirectory). Error(kIo) when that fails.
OwnedDirectory create_directory_beside(const std::filesystem::path& target);

/// Removes what saves to `target` left beside it in processes that died: staging
/// directories ".<name>.tmp-<pid>-..." and set-aside trees ".<name>.old-<pid>-..." whose
/// pid is gone and whose lock nobody holds. Returns how many were removed; never throws.
std::size_t remove_stale_beside(const std::filesystem::path& target) noexcept;

/// Puts the finished directory `tmp` at `target` in one step: rename when `target` does
/// not exist, else an atomic exchange (renameat2 RENAME_EXCHANGE) and removal of the
/// old tree; where the file system has no exchange, the old tree is moved aside first
/// and moved back when the second rename fails. After this returns `tmp` no longer
/// exists; on Error(kIo) `target` is as it was.
void replace_directory(const std::filesystem::path& tmp, const std::filesystem::path& target, bool target_exists);

}  // namespace aitune::detail
