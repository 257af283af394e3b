// SHA-256 through OpenSSL's EVP API; the only place aitune touches libcrypto.
#include "io/sha256.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "aitune/error.hpp"

namespace aitune::detail {

struct Sha256::Ctx {
  struct Free {
    void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> md{EVP_MD_CTX_new()};
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  if (!ctx_->md || EVP_DigestInit_ex(ctx_->md.get(), EVP_sha256(), nullptr) != 1)
    throw Error(ErrorCode::kInternal, "OpenSSL: cannot initialise a SHA-256 digest (EVP_DigestInit_ex failed)");
}

Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(const void* data, std::size_t size) {
  if (size > 0 && EVP_DigestUpdate(ctx_->md.get(), data, size) != 1)
    throw Error(ErrorCode::kInternal, "OpenSSL: EVP_DigestUpdate failed");
}

std::string Sha256::final_hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(ctx_->md.get(), digest, &length) != 1)
    throw Error(ErrorCode::kInternal, "OpenSSL: EVP_DigestFinal_ex failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

FileDigest sha256_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kIo, "cannot open '" + path + "' for reading: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  Sha256 sha;
  FileDigest out;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kIo, "cannot read '" + path + "': " + std::strerror(errno));
    }
    if (n == 0) break;
    sha.update(buffer.data(), static_cast<std::size_t>(n));
    out.size += static_cast<std::uint64_t>(n);
  }
  out.sha256 = sha.final_hex();
  return out;
}

}  // namespace aitune::detail
