// Tests for OrtRuntime: loading the fetched ONNX Runtime, its version, search paths and
// provider probing.
#include <cstdlib>

#include "test_support.hpp"

#ifndef AITUNE_TEST_FETCHED_ORT_LIBRARY
#error "tests/cpp/CMakeLists.txt defines AITUNE_TEST_FETCHED_ORT_LIBRARY"
#endif

namespace aitune {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

// Sets an environment variable for one scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec);
}

TEST(Version, Values) {
  EXPECT_EQ(version(), "0.1.0");
  EXPECT_EQ(ort_api_version(), 29);
}

TEST(OrtRuntime, LoadsTheFetchedLibrary) {
  std::shared_ptr<OrtRuntime> rt = OrtRuntime::load();
  ASSERT_NE(rt, nullptr);
  EXPECT_FALSE(rt->library_path().empty());
  EXPECT_TRUE(fs::exists(rt->library_path())) << rt->library_path();
  if (std::getenv("AITUNE_ORT_LIBRARY") == nullptr) {
    EXPECT_TRUE(same_file(rt->library_path(), AITUNE_TEST_FETCHED_ORT_LIBRARY))
        << rt->library_path() << " vs " << AITUNE_TEST_FETCHED_ORT_LIBRARY;
  }
}

TEST(OrtRuntime, LoadReturnsTheSameRuntime) {
  auto a = OrtRuntime::load();
  auto b = OrtRuntime::load();
  EXPECT_EQ(a.get(), b.get()) << "a process loads ORT once";
  // Naming the library already loaded is fine.
  OrtRuntimeOptions same;
  same.library_path = a->library_path();
  EXPECT_EQ(OrtRuntime::load(same).get(), a.get());
}

TEST(OrtRuntime, LoadingADifferentLibraryLaterThrowsState) {
  auto rt = OrtRuntime::load();
  test::ScopedTempDir dir;
  const std::string other = dir.file("libonnxruntime.so.1");
  fs::copy_file(rt->library_path(), other);
  OrtRuntimeOptions options;
  options.library_path = other;
  const std::string msg = expect_error([&] { OrtRuntime::load(options); }, ErrorCode::kState);
  EXPECT_NE(msg.find(other), std::string::npos) << "should name the library asked for: " << msg;
  EXPECT_EQ(OrtRuntime::load().get(), rt.get()) << "the loaded runtime stays";
}

TEST(OrtRuntime, VersionIs129) {
  auto rt = OrtRuntime::load();
  EXPECT_EQ(rt->version().rfind("1.29", 0), 0u) << rt->version();
}

TEST(OrtRuntime, CompiledProvidersIncludeCpu) {
  auto rt = OrtRuntime::load();
  const auto providers = rt->compiled_providers();
  EXPECT_NE(std::find(providers.begin(), providers.end(), "CPUExecutionProvider"), providers.end());
}

TEST(OrtRuntime, CpuProviderIsAvailable) {
  auto rt = OrtRuntime::load();
  const ProviderStatus st = rt->provider_status(ExecutionProvider::kCPU);
  EXPECT_EQ(st.provider, ExecutionProvider::kCPU);
  EXPECT_TRUE(st.available) << st.reason;
  EXPECT_TRUE(st.reason.empty()) << st.reason;
  EXPECT_TRUE(st.library.empty()) << "the CPU EP is built in: " << st.library;
}

TEST(OrtRuntime, ProvidersDirDefaultsToTheLibraryDirectory) {
  auto rt = OrtRuntime::load();
  EXPECT_FALSE(rt->providers_dir().empty());
  if (std::getenv("AITUNE_ORT_PROVIDERS_DIR") == nullptr) {
    EXPECT_TRUE(same_file(rt->providers_dir(), fs::path(rt->library_path()).parent_path().string()))
        << rt->providers_dir() << " vs " << rt->library_path();
  }
}

void expect_gpu_provider_unavailable(ExecutionProvider provider, const char* library_stem) {
  auto rt = OrtRuntime::load();
  const ProviderStatus st = rt->provider_status(provider);
  EXPECT_EQ(st.provider, provider);
  if (st.available) {
    GTEST_SKIP() << execution_provider_name(provider) << " provider is available here (" << st.library << ")";
  }
  EXPECT_FALSE(st.reason.empty());
  EXPECT_FALSE(st.library.empty()) << "which library was looked for";
  EXPECT_NE(st.library.find(library_stem), std::string::npos) << st.library;
  EXPECT_NE(st.reason.find(library_stem), std::string::npos) << "the reason must name the library: " << st.reason;
  // The answer is cached and stable.
  const ProviderStatus again = rt->provider_status(provider);
  EXPECT_EQ(again.available, st.available);
  EXPECT_EQ(again.reason, st.reason);
}

TEST(OrtRuntime, CudaProviderUnavailableWithoutGpuLibraries) {
  expect_gpu_provider_unavailable(ExecutionProvider::kCUDA, "onnxruntime_providers_cuda");
}

TEST(OrtRuntime, TensorRtProviderUnavailableWithoutGpuLibraries) {
  expect_gpu_provider_unavailable(ExecutionProvider::kTensorRT, "onnxruntime_providers_tensorrt");
}

TEST(OrtRuntime, CudaProviderAvailableOnGpuMachines) {
  AITUNE_REQUIRE_CUDA();
  const ProviderStatus st = OrtRuntime::load()->provider_status(ExecutionProvider::kCUDA);
  EXPECT_TRUE(st.reason.empty()) << st.reason;
  EXPECT_TRUE(fs::exists(st.library)) << st.library;
}

TEST(OrtRuntime, SearchPathsInDocumentedOrder) {
  ScopedEnv unset_env("AITUNE_ORT_LIBRARY", nullptr);
  const auto defaults = OrtRuntime::search_paths();
  ASSERT_FALSE(defaults.empty());
  auto index_of = [](const std::vector<std::string>& paths, const std::string& p) -> std::ptrdiff_t {
    for (std::size_t i = 0; i < paths.size(); ++i) {
      if (paths[i] == p || same_file(paths[i], p)) return static_cast<std::ptrdiff_t>(i);
    }
    return -1;
  };
  const std::ptrdiff_t fetched = index_of(defaults, AITUNE_TEST_FETCHED_ORT_LIBRARY);
  EXPECT_GE(fetched, 0) << "the fetched copy is a candidate";
  const std::ptrdiff_t system = index_of(defaults, "libonnxruntime.so.1");
  EXPECT_GE(system, 0) << "the system loader's name is a candidate";
  EXPECT_EQ(system, static_cast<std::ptrdiff_t>(defaults.size()) - 1) << "the system loader comes last";
  EXPECT_LT(fetched, system);

  // An explicit path comes first, then AITUNE_ORT_LIBRARY, then the rest.
  ScopedEnv env("AITUNE_ORT_LIBRARY", "/opt/from_env/libonnxruntime.so.1");
  OrtRuntimeOptions options;
  options.library_path = "/opt/explicit/libonnxruntime.so.1";
  const auto paths = OrtRuntime::search_paths(options);
  ASSERT_GE(paths.size(), 3u);
  EXPECT_EQ(paths[0], "/opt/explicit/libonnxruntime.so.1");
  EXPECT_EQ(paths[1], "/opt/from_env/libonnxruntime.so.1");
  EXPECT_GE(index_of(paths, AITUNE_TEST_FETCHED_ORT_LIBRARY), 2);
  EXPECT_EQ(paths.back(), defaults.back());
}

}  // namespace
}  // namespace aitune
