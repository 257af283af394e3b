// Loads ONNX Runtime at run time and answers which providers work here, and why not.
#include "aitune/ort_runtime.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "aitune/error.hpp"
#include "ort_runtime_impl.hpp"

namespace aitune {
namespace fs = std::filesystem;

namespace detail {
ErrorCode error_code_from_ort(OrtErrorCode code, ErrorCode fallback) noexcept {
  switch (code) {
    case ORT_INVALID_ARGUMENT: return ErrorCode::kInvalidArgument;
    case ORT_NO_SUCHFILE: return ErrorCode::kModelInvalid;
    case ORT_NO_MODEL: return ErrorCode::kModelInvalid;
    case ORT_INVALID_PROTOBUF: return ErrorCode::kModelInvalid;
    case ORT_INVALID_GRAPH: return ErrorCode::kModelInvalid;
    case ORT_MODEL_LOADED: return ErrorCode::kState;
    case ORT_EP_FAIL: return ErrorCode::kProviderUnavailable;
    default: return fallback;
  }
}
}  // namespace detail

namespace {

constexpr const char* kOrtSoname = "libonnxruntime.so.1";
constexpr const char* kCudaProvider = "libonnxruntime_providers_cuda.so";
constexpr const char* kTensorRTProvider = "libonnxruntime_providers_tensorrt.so";
constexpr const char* kSharedProvider = "libonnxruntime_providers_shared.so";
constexpr const char* kGpuPackageHint =
    "install the ONNX Runtime 1.29.0 GPU providers (npm package com.github.asus4.onnxruntime.linux-x64-gpu@0.4.9, "
    "directory package/Plugins/Linux/x64) next to libonnxruntime.so or into AITUNE_ORT_PROVIDERS_DIR";

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// Directory of the binary (extension module or executable) this code was linked into.
std::string self_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&OrtRuntime::search_paths), &info) == 0 || !info.dli_fname) return {};
  std::error_code ec;
  auto p = fs::weakly_canonical(fs::path(info.dli_fname), ec);
  return ec ? std::string() : p.parent_path().string();
}

std::string last_dlerror() {
  const char* e = dlerror();
  return e ? std::string(e) : std::string("unknown dlopen error");
}

// Leaked on purpose: ORT tears its globals down in its own library destructor, and
// releasing the Env after that (from a static destructor at exit) crashes.
std::mutex g_load_mutex;
std::shared_ptr<OrtRuntime>* g_runtime = nullptr;

}  // namespace

std::vector<std::string> OrtRuntime::search_paths(const OrtRuntimeOptions& options) {
  std::vector<std::string> paths;
  if (!options.library_path.empty()) paths.push_back(options.library_path);
  if (auto env = env_or_empty("AITUNE_ORT_LIBRARY"); !env.empty()) paths.push_back(env);
  if (auto dir = self_dir(); !dir.empty()) {
    paths.push_back((fs::path(dir) / "lib" / kOrtSoname).string());
    paths.push_back((fs::path(dir) / ".." / "lib" / kOrtSoname).lexically_normal().string());
  }
#ifdef AITUNE_FETCHED_ORT_LIBRARY
  paths.push_back(AITUNE_FETCHED_ORT_LIBRARY);
#endif
  paths.push_back(kOrtSoname);  // the system loader's search path
  return paths;
}

std::shared_ptr<OrtRuntime> OrtRuntime::load(const OrtRuntimeOptions& options) {
  std::lock_guard lock(g_load_mutex);
  if (g_runtime) {
    auto& rt = *g_runtime;
    if (!options.library_path.empty()) {
      std::error_code ec;
      if (!fs::equivalent(options.library_path, rt->library_path(), ec))
        throw Error(ErrorCode::kState, "ONNX Runtime is already loaded from '" + rt->library_path() +
                                           "'; a process can load only one (asked for '" + options.library_path +
                                           "')");
    }
    return rt;
  }

  std::string tried;
  for (const auto& path : search_paths(options)) {
    bool is_file_path = path.find('/') != std::string::npos;
    if (is_file_path && !fs::exists(path)) {
      tried += "\n  " + path + ": no such file";
      continue;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      tried += "\n  " + path + ": " + last_dlerror();
      continue;
    }
    using GetApiBase = const OrtApiBase* (*)();
    auto get_api_base = reinterpret_cast<GetApiBase>(dlsym(handle, "OrtGetApiBase"));
    if (!get_api_base) {
      tried += "\n  " + path + ": no symbol OrtGetApiBase (not ONNX Runtime?)";
      continue;
    }
    const OrtApiBase* base = get_api_base();
    const OrtApi* api = base->GetApi(ORT_API_VERSION);
    if (!api) {
      tried += "\n  " + path + ": ONNX Runtime " + base->GetVersionString() + " does not provide API version " +
               std::to_string(ORT_API_VERSION) + " (aitune needs ORT >= 1.29)";
      continue;
    }
    Ort::InitApi(api);

    auto impl = std::make_unique<Impl>();
    impl->handle = handle;
    impl->api_base = base;
    Dl_info info{};
    std::string resolved = path;
    if (dladdr(reinterpret_cast<void*>(get_api_base), &info) && info.dli_fname) resolved = info.dli_fname;
    std::error_code ec;
    auto canonical = fs::weakly_canonical(resolved, ec);
    impl->library_path = ec ? resolved : canonical.string();
    impl->providers_dir = !options.providers_dir.empty()                      ? options.providers_dir
                          : !env_or_empty("AITUNE_ORT_PROVIDERS_DIR").empty() ? env_or_empty("AITUNE_ORT_PROVIDERS_DIR")
                                                                               : fs::path(resolved).parent_path().string();
    impl->env.emplace(detail::ort_call(ErrorCode::kInternal, "creating the ONNX Runtime environment", [&] {
      return Ort::Env(static_cast<OrtLoggingLevel>(options.log_severity), "aitune");
    }));
    g_runtime = new std::shared_ptr<OrtRuntime>(new OrtRuntime(std::move(impl)));
    return *g_runtime;
  }
  throw Error(ErrorCode::kProviderUnavailable,
              "cannot load ONNX Runtime; tried:" + tried +
                  "\nrun scripts/fetch-onnxruntime.sh (or `make setup`), or set AITUNE_ORT_LIBRARY to a "
                  "libonnxruntime.so of version 1.29");
}

OrtRuntime::OrtRuntime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OrtRuntime::~OrtRuntime() = default;

const std::string& OrtRuntime::library_path() const noexcept { return impl_->library_path; }
const std::string& OrtRuntime::providers_dir() const noexcept { return impl_->providers_dir; }
std::string OrtRuntime::version() const { return impl_->api_base->GetVersionString(); }

std::vector<std::string> OrtRuntime::compiled_providers() const {
  return detail::ort_call(ErrorCode::kInternal, "GetAvailableProviders", [] { return Ort::GetAvailableProviders(); });
}

ProviderStatus OrtRuntime::provider_status(ExecutionProvider provider) {
  {
    std::lock_guard lock(impl_->mutex);
    if (auto it = impl_->status_cache.find(provider); it != impl_->status_cache.end()) return it->second;
  }
  ProviderStatus status = impl_->probe(provider);
  std::lock_guard lock(impl_->mutex);
  impl_->status_cache[provider] = status;
  return status;
}

namespace {

// Loads `path` only to learn whether its dependencies resolve, e.g. which CUDA or
// TensorRT library is missing; ORT's own message for that is less precise.
std::string dependency_problem(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (!h) return last_dlerror();
  dlclose(h);
  return {};
}

}  // namespace

const std::vector<Ort::ConstEpDevice>& OrtRuntime::Impl::cuda_ep_devices() {
  std::lock_guard lock(mutex);
  if (cuda_registered) return cuda_devices;
  std::string lib = (fs::path(providers_dir) / kCudaProvider).string();
  if (!fs::exists(lib))
    throw Error(ErrorCode::kProviderUnavailable,
                "CUDA execution provider unavailable: " + lib + " not found; " + kGpuPackageHint +
                    " (needs CUDA 13, cuBLAS 13 and cuDNN 9 on the loader path)");
  try {
    env->RegisterExecutionProviderLibrary("aitune_cuda", lib);
  } catch (const Ort::Exception& e) {
    std::string dep = dependency_problem(lib);
    throw Error(ErrorCode::kProviderUnavailable,
                "CUDA execution provider unavailable: cannot load " + lib + ": " + (dep.empty() ? e.what() : dep) +
                    "; put the CUDA 13, cuBLAS 13 and cuDNN 9 libraries on LD_LIBRARY_PATH");
  }
  std::vector<Ort::ConstEpDevice> found;
  for (const auto& d : env->GetEpDevices())
    if (std::string(d.EpName()) == "CUDAExecutionProvider") found.push_back(d);
  if (found.empty()) {
    env->UnregisterExecutionProviderLibrary("aitune_cuda");
    throw Error(ErrorCode::kProviderUnavailable,
                "CUDA execution provider unavailable: " + lib + " loaded but reports no CUDA device (is a GPU and "
                "its driver present? nvidia-smi should list it)");
  }
  cuda_devices = std::move(found);
  cuda_registered = true;
  return cuda_devices;
}

ProviderStatus OrtRuntime::Impl::probe(ExecutionProvider provider) {
  ProviderStatus s;
  s.provider = provider;
  switch (provider) {
    case ExecutionProvider::kCPU:
      s.available = true;
      return s;
    case ExecutionProvider::kCUDA:
      s.library = (fs::path(providers_dir) / kCudaProvider).string();
      try {
        cuda_ep_devices();
        s.available = true;
      } catch (const Error& e) {
        s.reason = e.what();
      }
      return s;
    case ExecutionProvider::kTensorRT: {
      // The TensorRT EP loads through ORT's provider bridge, which looks next to libonnxruntime.
      auto dir = fs::path(library_path).parent_path();
      s.library = (dir / kTensorRTProvider).string();
      if (!fs::exists(s.library)) {
        s.reason = "TensorRT execution provider unavailable: " + s.library + " not found; " + kGpuPackageHint;
        return s;
      }
      if (!fs::exists(dir / kSharedProvider)) {
        s.reason = "TensorRT execution provider unavailable: " + (dir / kSharedProvider).string() +
                   " not found (it ships with the GPU providers); " + kGpuPackageHint;
        return s;
      }
      // The provider links TensorRT itself; probing those libraries names the missing one
      // without loading the provider outside ORT.
      for (const char* trt_lib : {"libnvinfer.so.10", "libnvonnxparser.so.10"}) {
        if (auto dep = dependency_problem(trt_lib); !dep.empty()) {
          s.reason = "TensorRT execution provider unavailable: " + s.library + " needs " + trt_lib + ": " + dep +
                     "; install TensorRT 10 (libnvinfer.so.10, libnvonnxparser.so.10) on the loader path";
          return s;
        }
      }
      try {
        Ort::SessionOptions so;
        OrtTensorRTProviderOptions trt{};
        so.AppendExecutionProvider_TensorRT(trt);
        s.available = true;
      } catch (const Ort::Exception& e) {
        s.reason = std::string("TensorRT execution provider unavailable: ") + e.what();
      }
      return s;
    }
  }
  return s;
}

}  // namespace aitune
