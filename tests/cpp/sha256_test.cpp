// Tests for the private SHA-256 helper against the FIPS 180-2 test vectors, incrementally and from files.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "aitune/error.hpp"
#include "io/sha256.hpp"

namespace aitune::detail {
namespace {

std::string digest_of(const std::string& text) {
  Sha256 sha;
  sha.update(text.data(), text.size());
  return sha.final_hex();
}

// FIPS 180-2, appendix B.
constexpr const char* kAbc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr const char* kTwoBlock = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
constexpr const char* kMillionA = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
constexpr const char* kEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(digest_of("abc"), kAbc);
  EXPECT_EQ(digest_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"), kTwoBlock);
  EXPECT_EQ(digest_of(""), kEmpty);
}

TEST(Sha256, IncrementalUpdatesEqualOneUpdate) {
  // A million 'a' fed in uneven pieces crossing the 64-byte block boundary.
  Sha256 sha;
  const std::string piece(997, 'a');
  std::size_t fed = 0;
  while (fed + piece.size() <= 1000000) {
    sha.update(piece.data(), piece.size());
    fed += piece.size();
  }
  sha.update(piece.data(), 1000000 - fed);
  sha.update(piece.data(), 0);  // an empty update changes nothing
  EXPECT_EQ(sha.final_hex(), kMillionA);
}

TEST(Sha256, MovedFromDigestContinues) {
  Sha256 a;
  a.update("ab", 2);
  Sha256 b = std::move(a);
  b.update("c", 1);
  EXPECT_EQ(b.final_hex(), kAbc);
}

TEST(Sha256, FileDigestHasSizeAndHash) {
  namespace fs = std::filesystem;
  const fs::path path = fs::temp_directory_path() / ("aitune_sha256_test_" + std::to_string(::getpid()));
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string(1000000, 'a');
  }
  const FileDigest d = sha256_file(path.string());
  fs::remove(path);
  EXPECT_EQ(d.size, 1000000u);
  EXPECT_EQ(d.sha256, kMillionA);
}

TEST(Sha256, MissingFileIsAnIoErrorNamingIt) {
  const std::string path = "/nonexistent/aitune/sha256/input.bin";
  try {
    sha256_file(path);
    FAIL() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace aitune::detail
