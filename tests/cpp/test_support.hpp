// Helpers shared by the C++ tests: fixture paths, typed error checks, tensor builders
// and comparisons, gtest printers for aitune's enums.
#pragma once

#include <sys/wait.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <ostream>
#include <source_location>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <unistd.h>

#include "aitune/aitune.hpp"

// gtest prints unknown enums as integers; these make failures readable.
namespace aitune {
inline void PrintTo(ErrorCode code, std::ostream* os) { *os << error_code_name(code); }
inline void PrintTo(DType dtype, std::ostream* os) { *os << dtype_name(dtype); }
inline void PrintTo(ExecutionProvider provider, std::ostream* os) { *os << execution_provider_name(provider); }
inline void PrintTo(SessionState state, std::ostream* os) { *os << session_state_name(state); }
inline void PrintTo(DeviceKind kind, std::ostream* os) { *os << (kind == DeviceKind::kCPU ? "cpu" : "cuda"); }
inline void PrintTo(const Device& device, std::ostream* os) { *os << device.to_string(); }
}  // namespace aitune

namespace aitune::test {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------
// Fixtures

/// The directory tests/fixtures/make_models.py wrote (CTest passes it in
/// AITUNE_TEST_MODELS). Fails the current test (fatal) when it is not set.
inline fs::path models_dir() {
  const char* dir = std::getenv("AITUNE_TEST_MODELS");
  if (dir == nullptr || *dir == '\0') {
    ADD_FAILURE() << "AITUNE_TEST_MODELS is not set; run the tests through ctest (the make_fixtures "
                     "test writes the models) or set it to a directory made by "
                     "tests/fixtures/make_models.py";
    return {};
  }
  return fs::path(dir);
}

/// Absolute path of one fixture file; fails the test when the file does not exist.
inline std::string fixture(const std::string& name) {
  fs::path path = models_dir() / name;
  EXPECT_TRUE(fs::exists(path)) << "fixture missing: " << path;
  return path.string();
}

/// Loads a fixture .npy through aitune::load_npy.
inline Tensor load_fixture_npy(const std::string& name) { return load_npy(fixture(name)); }

/// A fresh directory under the system temp dir, removed with its contents on destruction.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    static std::atomic<int> counter{0};
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = fs::temp_directory_path() /
            ("aitune_test_" + std::to_string(::getpid()) + "_" + std::to_string(stamp) + "_" +
             std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~ScopedTempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const fs::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_file_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// ---------------------------------------------------------------------------------
// Messages

inline bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

/// True when `word` occurs in `text` not glued to letters, digits or '_' on either
/// side, so that the input name "x" matches "input 'x'" but not "expected".
inline bool contains_word(std::string_view text, std::string_view word) {
  for (std::size_t pos = text.find(word); pos != std::string_view::npos; pos = text.find(word, pos + 1)) {
    const bool left_ok = pos == 0 || !is_word_char(text[pos - 1]);
    const std::size_t end = pos + word.size();
    const bool right_ok = end >= text.size() || !is_word_char(text[end]);
    if (left_ok && right_ok) return true;
  }
  return false;
}

inline bool contains_icase(std::string_view text, std::string_view needle) {
  auto it = std::search(text.begin(), text.end(), needle.begin(), needle.end(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
  });
  return it != text.end();
}

/// What an expected error must look like: one of `codes`, with every entry of `words`
/// as a whole word and every entry of `substrings` (case-insensitive) in the message.
struct ErrorExpectation {
  std::vector<ErrorCode> codes;
  std::vector<std::string> words = {};
  std::vector<std::string> substrings = {};
};

inline std::string codes_to_string(const std::vector<ErrorCode>& codes) {
  std::string out;
  for (ErrorCode c : codes) {
    if (!out.empty()) out += " or ";
    out += error_code_name(c);
  }
  return out;
}

/// Runs `fn`, which must throw aitune::Error as `expected` says. Records a non-fatal
/// failure at the caller's line otherwise. Returns the message ("" when nothing matched).
template <typename F>
std::string expect_error(F&& fn, const ErrorExpectation& expected,
                         std::source_location loc = std::source_location::current()) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (std::find(expected.codes.begin(), expected.codes.end(), e.code()) == expected.codes.end()) {
      ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line()))
          << "aitune::Error has code " << error_code_name(e.code()) << ", expected "
          << codes_to_string(expected.codes) << "; message: " << msg;
    }
    for (const auto& w : expected.words) {
      if (!contains_word(msg, w)) {
        ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line()))
            << "error message does not mention '" << w << "': " << msg;
      }
    }
    for (const auto& s : expected.substrings) {
      if (!contains_icase(msg, s)) {
        ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line()))
            << "error message does not contain '" << s << "': " << msg;
      }
    }
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line()))
        << "expected aitune::Error (" << codes_to_string(expected.codes)
        << "), got another exception: " << e.what();
    return {};
  } catch (...) {
    ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line()))
        << "expected aitune::Error (" << codes_to_string(expected.codes) << "), got a non-std exception";
    return {};
  }
  ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line()))
      << "expected aitune::Error (" << codes_to_string(expected.codes) << "), nothing was thrown";
  return {};
}

/// Shorthand: one code, whole words that the message must mention.
template <typename F>
std::string expect_error(F&& fn, ErrorCode code, std::vector<std::string> words = {},
                         std::source_location loc = std::source_location::current()) {
  return expect_error(std::forward<F>(fn), ErrorExpectation{{code}, std::move(words), {}}, loc);
}

// ---------------------------------------------------------------------------------
// Tensors

/// A host tensor of `dtype` and `shape` filled from `values` (sizes must match).
template <typename T>
Tensor make_host(DType dtype, const Shape& shape, const std::vector<T>& values) {
  Tensor t = Tensor::empty_host(dtype, shape);
  EXPECT_EQ(sizeof(T), dtype_size(dtype)) << "element type does not match " << dtype_name(dtype);
  EXPECT_EQ(values.size() * sizeof(T), t.nbytes()) << "values do not fill " << shape_to_string(shape);
  if (!values.empty() && values.size() * sizeof(T) == t.nbytes()) std::memcpy(t.data(), values.data(), t.nbytes());
  return t;
}

/// A float32 host tensor filled with a deterministic pattern derived from `seed`.
inline Tensor make_pattern_f32(const Shape& shape, uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> values(static_cast<std::size_t>(n));
  uint32_t state = seed * 2654435761u + 12345u;
  for (auto& v : values) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(state >> 8) % 2001 - 1000) / 500.0f;  // [-2, 2]
  }
  return make_host(DType::kFloat32, shape, values);
}

/// The elements of a compact host tensor, as T (sizeof(T) must equal the dtype's size).
template <typename T>
std::vector<T> values_of(const Tensor& t) {
  EXPECT_EQ(t.device().kind, DeviceKind::kCPU) << "values_of needs a host tensor";
  EXPECT_EQ(sizeof(T), dtype_size(t.dtype())) << "element type does not match " << dtype_name(t.dtype());
  if (t.device().kind != DeviceKind::kCPU || sizeof(T) != dtype_size(t.dtype()) || t.data() == nullptr) return {};
  std::vector<T> out(t.nbytes() / sizeof(T));
  std::memcpy(out.data(), t.data(), out.size() * sizeof(T));
  return out;
}

/// Asserts (non-fatally) that two float32 host tensors have the same shape and agree
/// elementwise within `atol`; reports the worst element.
inline void expect_allclose_f32(const Tensor& actual, const Tensor& expected, double atol,
                                std::source_location loc = std::source_location::current()) {
  auto fail = [&](const std::string& what) {
    ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line())) << what;
  };
  if (actual.dtype() != DType::kFloat32 || expected.dtype() != DType::kFloat32) {
    fail("expect_allclose_f32 needs float32 tensors, got " + std::string(dtype_name(actual.dtype())) + " and " +
         std::string(dtype_name(expected.dtype())));
    return;
  }
  if (actual.shape() != expected.shape()) {
    fail("shape " + shape_to_string(actual.shape()) + " != expected " + shape_to_string(expected.shape()));
    return;
  }
  if (!actual.view().is_contiguous() || !expected.view().is_contiguous()) {
    fail("expect_allclose_f32 needs contiguous tensors");
    return;
  }
  const auto a = values_of<float>(actual);
  const auto e = values_of<float>(expected);
  if (a.size() != e.size()) {
    fail("element counts differ");
    return;
  }
  double worst = 0.0;
  std::size_t worst_at = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double diff = std::isnan(a[i]) != std::isnan(e[i]) ? INFINITY : std::fabs(double(a[i]) - double(e[i]));
    if (diff > worst || std::isnan(diff)) {
      worst = std::isnan(diff) ? INFINITY : diff;
      worst_at = i;
    }
  }
  if (worst > atol) {
    std::ostringstream os;
    os << "max |actual - expected| = " << worst << " > " << atol << " at flat index " << worst_at << " (actual "
       << a[worst_at] << ", expected " << e[worst_at] << ")";
    fail(os.str());
  }
}

/// IEEE half (binary16) to float, for checking float16 outputs.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float value;
  if (exp == 0) {
    value = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    value = mant ? NAN : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -value : value;
}

// ---------------------------------------------------------------------------------
// Runtime and backends

/// Exit code and combined stdout + stderr of a shell command (-1 when it did not exit).
struct CommandResult {
  int exit_code = -1;
  std::string output;
};

inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::shared_ptr<OrtRuntime> runtime() { return OrtRuntime::load(); }

/// True when the CUDA execution provider can be used here (GPU tests skip otherwise).
inline bool cuda_available() { return runtime()->provider_status(ExecutionProvider::kCUDA).available; }

inline std::string cuda_unavailable_reason() { return runtime()->provider_status(ExecutionProvider::kCUDA).reason; }

inline OnnxSessionConfig cpu_config() {
  OnnxSessionConfig config;
  config.provider = ExecutionProvider::kCPU;
  return config;
}

inline OnnxSessionConfig cuda_config() {
  OnnxSessionConfig config;
  config.provider = ExecutionProvider::kCUDA;
  return config;
}

/// Runs `body(thread, call)` from `threads` threads, `calls` times each, all at once.
/// `body` returns "" when the call was right, else what was wrong; an exception counts
/// as wrong. Returns the number of wrong calls and, in `first_failure`, the first message.
inline int run_concurrently(int threads, int calls, const std::function<std::string(int, int)>& body,
                            std::string& first_failure) {
  std::atomic<int> failures{0};
  std::mutex mu;
  auto fail = [&](std::string what) {
    if (failures++ == 0) {
      std::lock_guard<std::mutex> lock(mu);
      first_failure = std::move(what);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int call = 0; call < calls; ++call) {
        const std::string where = "thread " + std::to_string(t) + " call " + std::to_string(call);
        try {
          if (std::string what = body(t, call); !what.empty()) fail(where + ": " + what);
        } catch (const std::exception& e) {
          fail(where + " threw: " + e.what());
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  return failures.load();
}

}  // namespace aitune::test

/// Skips the current test unless the CUDA provider is usable, saying why.
#define AITUNE_REQUIRE_CUDA()                                                              \
  do {                                                                                     \
    if (!::aitune::test::cuda_available()) {                                               \
      GTEST_SKIP() << "needs a usable CUDA provider; " << ::aitune::test::cuda_unavailable_reason(); \
    }                                                                                      \
  } while (0)
