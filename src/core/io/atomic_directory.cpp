// Durable files and atomically replaced directories: what makes a checkpoint save all-or-nothing.
#include "io/atomic_directory.hpp"

#include "aitune/process_directory.hpp"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "aitune/error.hpp"
#include "io/random_token.hpp"

namespace aitune::detail {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void fail(ErrorCode code, const std::string& message) { throw Error(code, message); }

std::string errno_text() { return std::strerror(errno); }

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // close() reports write-back errors on some file systems, so a writer checks it.
  void close_checked(const std::string& path) {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(ErrorCode::kIo, "cannot write '" + path + "': close failed: " + errno_text());
  }

 private:
  int fd_;
};

void write_all(int fd, const char* data, std::size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::kIo, "cannot write '" + path + "': " + errno_text());
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

Fd create_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail(ErrorCode::kIo, "cannot create '" + path.string() + "': " + errno_text());
  return Fd(fd);
}

// ".<target's name><infix><random>", built by appending (GCC 12 warns falsely on "." + ...).
std::string hidden_name(const fs::path& target, const std::string& infix);

void sync_and_close(Fd& fd, const fs::path& path) {
  if (::fsync(fd.get()) != 0) fail(ErrorCode::kIo, "cannot flush '" + path.string() + "' to disk: " + errno_text());
  fd.close_checked(path.string());
}

}  // namespace

namespace {
std::string hidden_name(const fs::path& target, const std::string& infix) {
  std::string name = ".";
  name += target.filename().string();
  name += infix;
  name += random_token();
  return name;
}
}  // namespace

FileDigest copy_and_hash(const fs::path& source, const fs::path& dest) {
  Fd in(::open(source.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) fail(ErrorCode::kIo, "cannot open '" + source.string() + "' for reading: " + errno_text());
  Fd out = create_file(dest);
  Sha256 sha;
  FileDigest digest;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    ssize_t n = ::read(in.get(), buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::kIo, "cannot read '" + source.string() + "': " + errno_text());
    }
    if (n == 0) break;
    sha.update(buffer.data(), static_cast<std::size_t>(n));
    write_all(out.get(), buffer.data(), static_cast<std::size_t>(n), dest.string());
    digest.size += static_cast<std::uint64_t>(n);
  }
  sync_and_close(out, dest);
  digest.sha256 = sha.final_hex();
  return digest;
}

void write_durable_file(const fs::path& path, const std::string& text) {
  Fd out = create_file(path);
  write_all(out.get(), text.data(), text.size(), path.string());
  sync_and_close(out, path);
}

void sync_directory(const fs::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0)
    fail(ErrorCode::kIo, "cannot flush directory '" + dir.string() + "' to disk: " + errno_text());
}

OwnedDirectory create_directory_beside(const fs::path& target) {
  try {
    return OwnedDirectory::create(target.parent_path().string(),
                                  sibling_prefix(target.filename().string(), ".tmp-"));
  } catch (const Error& e) {
    fail(ErrorCode::kIo, "cannot create a temporary directory next to '" + target.string() + "': " + e.what());
  }
}

std::size_t remove_stale_beside(const fs::path& target) noexcept {
  try {
    const std::string parent = target.parent_path().string();
    return remove_stale_directories(parent, sibling_prefix(target.filename().string(), ".tmp-")).size() +
           remove_stale_directories(parent, sibling_prefix(target.filename().string(), ".old-")).size();
  } catch (...) {  // a sweep is housekeeping: it never fails a save or a load
    return 0;
  }
}

void replace_directory(const fs::path& tmp, const fs::path& target, bool target_exists) {
  if (!target_exists) {
    if (::rename(tmp.c_str(), target.c_str()) != 0)
      fail(ErrorCode::kIo, "cannot move '" + tmp.string() + "' to '" + target.string() + "': " + errno_text());
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // the previous tree; a leftover is harmless
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    fail(ErrorCode::kIo, "cannot swap '" + tmp.string() + "' into '" + target.string() + "': " + errno_text());
  // No atomic exchange here: move the old tree aside, the new one in, then drop the old
  // one; put the old one back if the second rename fails.
  fs::path aside = target.parent_path() / hidden_name(target, ".old-" + std::to_string(::getpid()) + "-");
  if (::rename(target.c_str(), aside.c_str()) != 0)
    fail(ErrorCode::kIo, "cannot move the previous '" + target.string() + "' aside: " + errno_text());
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    std::string why = errno_text();
    ::rename(aside.c_str(), target.c_str());
    fail(ErrorCode::kIo, "cannot move '" + tmp.string() + "' to '" + target.string() + "': " + why);
  }
  std::error_code ec;
  fs::remove_all(aside, ec);
}

}  // namespace aitune::detail
