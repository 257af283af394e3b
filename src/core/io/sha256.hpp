// Private: SHA-256 of byte streams and files, through OpenSSL's EVP digest API (libcrypto).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace aitune::detail {

/// Incremental SHA-256 (EVP_DigestInit_ex / Update / Final_ex). Move-only; not thread safe.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;

  void update(const void* data, std::size_t size);
  /// The digest as 64 lower-case hex digits. The object must not be updated afterwards.
  std::string final_hex();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

/// Size and SHA-256 (lower-case hex) of a file, read in chunks.
struct FileDigest {
  std::uint64_t size = 0;
  std::string sha256;
};

/// Hashes the file at `path`. Throws Error(kIo) naming the file when it cannot be read.
FileDigest sha256_file(const std::string& path);

}  // namespace aitune::detail
