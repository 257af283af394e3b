// Tests for OrtRuntime: loading the default ONNX Runtime (the wheel of the Python that
// configured the build), its version and wheel, search paths, CUDA library folders and
// provider probing.
#include <cstdlib>
#include <fstream>

#include "test_support.hpp"

#ifndef AITUNE_TEST_DEFAULT_ORT_LIBRARY
#error "tests/cpp/CMakeLists.txt defines AITUNE_TEST_DEFAULT_ORT_LIBRARY"
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

TEST(OrtRuntime, LoadsTheDefaultLibrary) {
  std::shared_ptr<OrtRuntime> rt = OrtRuntime::load();
  ASSERT_NE(rt, nullptr);
  EXPECT_FALSE(rt->library_path().empty());
  EXPECT_TRUE(fs::exists(rt->library_path())) << rt->library_path();
  if (std::getenv("AITUNE_ORT_LIBRARY") == nullptr) {
    EXPECT_TRUE(same_file(rt->library_path(), AITUNE_TEST_DEFAULT_ORT_LIBRARY))
        << rt->library_path() << " vs " << AITUNE_TEST_DEFAULT_ORT_LIBRARY;
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

TEST(OrtRuntime, VersionIsAtLeastTheHeaders) {
  auto rt = OrtRuntime::load();
  const std::string v = rt->version();
  ASSERT_EQ(v.rfind("1.", 0), 0u) << v;
  EXPECT_GE(std::stoi(v.substr(2)), ort_api_version()) << v << " is older than the headers' API";
}

TEST(OrtRuntime, KnowsTheWheelItLoadedFrom) {
  auto rt = OrtRuntime::load();
  const OrtWheel& wheel = rt->wheel();
  if (fs::path(rt->library_path()).parent_path().filename() != "capi")
    GTEST_SKIP() << "not loaded from a wheel: " << rt->library_path();
  // A hand-unpacked copy of the wheel's libraries (the H200's, docs/gpu.md) has the capi
  // folder but no installed distribution's metadata beside it.
  bool has_metadata = false;
  const fs::path site = fs::path(rt->library_path()).parent_path().parent_path().parent_path();
  for (const auto& entry : fs::directory_iterator(site))
    has_metadata |= entry.path().filename().string().rfind("onnxruntime", 0) == 0 &&
                    entry.path().extension() == ".dist-info";
  if (!has_metadata) GTEST_SKIP() << "no onnxruntime*.dist-info in " << site << ": not an installed wheel";
  EXPECT_TRUE(same_file(wheel.capi_dir, fs::path(rt->library_path()).parent_path().string())) << wheel.capi_dir;
  EXPECT_TRUE(wheel.distribution == "onnxruntime" || wheel.distribution == "onnxruntime-gpu") << wheel.distribution;
  EXPECT_EQ(wheel.version, rt->version()) << "the wheel's metadata and the library agree";
}

TEST(OrtRuntime, CudaLibraryFoldersAreExistingAndDistinct) {
  auto rt = OrtRuntime::load();
  const auto& dirs = rt->cuda_library_dirs();
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    EXPECT_TRUE(fs::is_directory(dirs[i])) << dirs[i];
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(dirs[i], dirs[j]);
  }
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
  const OrtPythonPackages saved = OrtRuntime::python_packages();
  auto index_of = [](const std::vector<std::string>& paths, const std::string& p) -> std::ptrdiff_t {
    for (std::size_t i = 0; i < paths.size(); ++i) {
      if (paths[i] == p || same_file(paths[i], p)) return static_cast<std::ptrdiff_t>(i);
    }
    return -1;
  };
  // Without a Python environment: the compiled-in default, then the system loader.
  OrtRuntime::use_python_packages({});
  const auto defaults = OrtRuntime::search_paths();
  ASSERT_FALSE(defaults.empty());
  const std::ptrdiff_t built_in = index_of(defaults, AITUNE_TEST_DEFAULT_ORT_LIBRARY);
  EXPECT_GE(built_in, 0) << "the compiled-in library is a candidate";
  EXPECT_EQ(defaults.back(), "libonnxruntime.so.1") << "the system loader comes last";
  EXPECT_LT(built_in, static_cast<std::ptrdiff_t>(defaults.size()) - 1);

  // A registered wheel goes first: its newest libonnxruntime.so.1.* (the wheel has no symlink).
  test::ScopedTempDir site;
  const fs::path capi = fs::path(site.path()) / "onnxruntime" / "capi";
  fs::create_directories(capi);
  for (const char* name : {"libonnxruntime.so.1.30.0", "libonnxruntime.so.1.31.1", "libonnxruntime.so.10",
                           "libonnxruntime_providers_shared.so"})
    std::ofstream(capi / name) << "x";
  OrtPythonPackages packages;
  packages.onnxruntime.capi_dir = capi.string();
  OrtRuntime::use_python_packages(packages);
  const auto with_wheel = OrtRuntime::search_paths();
  ASSERT_GE(with_wheel.size(), 2u);
  EXPECT_EQ(with_wheel[0], (capi / "libonnxruntime.so.1.31.1").string());
  EXPECT_GT(index_of(with_wheel, AITUNE_TEST_DEFAULT_ORT_LIBRARY), 0);
  EXPECT_EQ(with_wheel.back(), "libonnxruntime.so.1");

  // AITUNE_ORT_LIBRARY, or an explicit path, is the only candidate.
  ScopedEnv env("AITUNE_ORT_LIBRARY", "/opt/from_env/libonnxruntime.so.1");
  EXPECT_EQ(OrtRuntime::search_paths(), std::vector<std::string>{"/opt/from_env/libonnxruntime.so.1"});
  OrtRuntimeOptions options;
  options.library_path = "/opt/explicit/libonnxruntime.so.1";
  EXPECT_EQ(OrtRuntime::search_paths(options), std::vector<std::string>{"/opt/explicit/libonnxruntime.so.1"});
  OrtRuntime::use_python_packages(saved);
}

}  // namespace
}  // namespace aitune
