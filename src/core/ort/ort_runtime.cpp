// Loads ONNX Runtime at run time and answers which providers work here, and why not.
#include "aitune/ort_runtime.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "aitune/error.hpp"
#include "ort/ort_library_search.hpp"
#include "ort/ort_runtime_impl.hpp"

namespace aitune {
namespace fs = std::filesystem;

namespace detail {
namespace {
std::atomic<std::size_t> g_live_sessions{0};
}  // namespace
void count_session_created() noexcept { g_live_sessions.fetch_add(1, std::memory_order_relaxed); }
void count_session_released() noexcept { g_live_sessions.fetch_sub(1, std::memory_order_relaxed); }

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
    "install the GPU wheel (pip install 'onnxruntime-gpu[cuda,cudnn]==1.31.1', or aitune[cuda]) in place of "
    "onnxruntime, or point AITUNE_ORT_LIBRARY at its onnxruntime/capi/libonnxruntime.so.1.31.1 (the providers sit "
    "beside it)";
constexpr const char* kCudaLibrariesHint =
    "install the pip CUDA libraries (pip install 'onnxruntime-gpu[cuda,cudnn]==1.31.1'), name their folders in "
    "AITUNE_CUDA_LIBRARY_DIRS, or put CUDA 13, cuBLAS 13 and cuDNN 9 on LD_LIBRARY_PATH";

#ifndef AITUNE_DEFAULT_ORT_LIBRARY
#define AITUNE_DEFAULT_ORT_LIBRARY ""
#endif
#ifndef AITUNE_DEFAULT_CUDA_LIBRARY_DIRS
#define AITUNE_DEFAULT_CUDA_LIBRARY_DIRS ""
#endif

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(sep, start);
    if (end == std::string::npos) end = text.size();
    if (end > start) parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

std::string canonical_or_same(const std::string& path) {
  std::error_code ec;
  auto p = fs::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

std::string last_dlerror() {
  const char* e = dlerror();
  return e ? std::string(e) : std::string("unknown dlopen error");
}

// Why a provider cannot load beside another ONNX Runtime's provider bridge (`other`).
std::string bridge_conflict(const std::string& other) {
  return "another ONNX Runtime's provider bridge is loaded in this process first (" + other +
         ", from the onnxruntime Python package of another install, imported before aitune first used this "
         "provider); aitune's provider would bind to it and crash. Use one ONNX Runtime: install the onnxruntime-gpu "
         "wheel whose libraries aitune loads (pip install 'onnxruntime-gpu==1.31.1'), or let aitune use this "
         "provider (ait.tune / OrtRuntime.provider_status) before anything imports onnxruntime";
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out.empty() ? "(none)" : out;
}

// Leaked on purpose: ORT tears its globals down in its own library destructor, and
// releasing the Env after that (from a static destructor at exit) crashes.
std::mutex g_load_mutex;
std::shared_ptr<OrtRuntime>* g_runtime = nullptr;

std::mutex g_python_mutex;
OrtPythonPackages g_python_packages;  // guarded by g_python_mutex

// The CUDA library folders, in OrtRuntimeOptions' documented order, existing ones once.
std::vector<std::string> cuda_library_dirs_for(const OrtRuntimeOptions& options, const OrtWheel& wheel,
                                               const OrtPythonPackages& python) {
  std::vector<std::string> candidates = options.cuda_library_dirs;
  for (auto& d : split(env_or_empty("AITUNE_CUDA_LIBRARY_DIRS"), ':')) candidates.push_back(std::move(d));
  for (const auto& d : python.cuda_library_dirs) candidates.push_back(d);
  if (!wheel.capi_dir.empty())
    for (auto& d : detail::nvidia_library_dirs_beside(wheel.capi_dir)) candidates.push_back(std::move(d));
  for (auto& d : split(AITUNE_DEFAULT_CUDA_LIBRARY_DIRS, ':')) candidates.push_back(std::move(d));
  std::vector<std::string> dirs;
  for (const auto& d : candidates) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    std::string c = canonical_or_same(d);
    if (std::find(dirs.begin(), dirs.end(), c) == dirs.end()) dirs.push_back(std::move(c));
  }
  return dirs;
}

// Opens one candidate and checks its API version; "" and the outputs set on success, the
// reason it cannot be used otherwise.
std::string try_open(const std::string& path, void*& handle, const OrtApiBase*& base, const OrtApi*& api,
                     std::string& resolved) {
  if (path.find('/') != std::string::npos && !fs::exists(path)) return "no such file";
  handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) return last_dlerror();
  using GetApiBase = const OrtApiBase* (*)();
  auto get_api_base = reinterpret_cast<GetApiBase>(dlsym(handle, "OrtGetApiBase"));
  if (!get_api_base) return "no symbol OrtGetApiBase (not ONNX Runtime?)";
  base = get_api_base();
  // The C API is versioned: a library serves every API version up to its own, so one
  // older than the headers returns null here.
  api = base->GetApi(ORT_API_VERSION);
  if (!api)
    return "ONNX Runtime " + std::string(base->GetVersionString()) + " is older than the C API aitune was built with (ORT_API_VERSION " +
           std::to_string(ORT_API_VERSION) + "): it needs ONNX Runtime >= 1." + std::to_string(ORT_API_VERSION) +
           " (pip install onnxruntime==1.31.1)";
  Dl_info info{};
  resolved = path;
  if (dladdr(reinterpret_cast<void*>(get_api_base), &info) && info.dli_fname) resolved = info.dli_fname;
  resolved = canonical_or_same(resolved);
  return {};
}

}  // namespace

std::optional<std::string> OrtRuntime::foreign_provider_bridge(const std::string& shared_library) {
  if (!fs::exists(shared_library)) return std::nullopt;  // the provider's own load says what is missing
  void* ours = dlopen(shared_library.c_str(), RTLD_NOW | RTLD_GLOBAL);  // kept, as ONNX Runtime keeps it
  if (!ours) return std::nullopt;
  void* mine = dlsym(ours, "Provider_GetHost");
  void* first = dlsym(RTLD_DEFAULT, "Provider_GetHost");  // what a provider's reference binds to
  if (!mine || !first || mine == first) return std::nullopt;
  Dl_info info{};
  return dladdr(first, &info) && info.dli_fname ? canonical_or_same(info.dli_fname) : std::string("unknown library");
}

void OrtRuntime::use_python_packages(const OrtPythonPackages& packages) {
  std::lock_guard lock(g_python_mutex);
  g_python_packages = packages;
}

OrtPythonPackages OrtRuntime::python_packages() {
  std::lock_guard lock(g_python_mutex);
  return g_python_packages;
}

std::size_t OrtRuntime::live_sessions() noexcept { return detail::g_live_sessions.load(std::memory_order_relaxed); }

std::vector<std::string> OrtRuntime::search_paths(const OrtRuntimeOptions& options) {
  // A library named by the caller or by AITUNE_ORT_LIBRARY is the only candidate: falling
  // back to another one would hide that the one asked for cannot be used.
  if (!options.library_path.empty()) return {options.library_path};
  if (auto env = env_or_empty("AITUNE_ORT_LIBRARY"); !env.empty()) return {env};
  std::vector<std::string> paths;
  const auto python = python_packages();
  if (const auto& capi = python.onnxruntime.capi_dir; !capi.empty()) {
    auto lib = detail::ort_library_in(capi);
    paths.push_back(lib.empty() ? (fs::path(capi) / "libonnxruntime.so.1*").string() : lib);
  }
  if (std::string built_in = AITUNE_DEFAULT_ORT_LIBRARY; !built_in.empty()) {
    if (std::find(paths.begin(), paths.end(), built_in) == paths.end()) paths.push_back(built_in);
  }
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

  const auto paths = search_paths(options);
  const bool named = !options.library_path.empty() || !env_or_empty("AITUNE_ORT_LIBRARY").empty();
  std::string tried;
  for (const auto& path : paths) {
    void* handle = nullptr;
    const OrtApiBase* base = nullptr;
    const OrtApi* api = nullptr;
    std::string resolved;
    if (std::string why = try_open(path, handle, base, api, resolved); !why.empty()) {
      if (named) {
        const char* by = options.library_path.empty() ? "AITUNE_ORT_LIBRARY" : "the library path given";
        throw Error(ErrorCode::kProviderUnavailable,
                    std::string("cannot load ONNX Runtime from ") + path + " (" + by + "): " + why);
      }
      tried += "\n  " + path + ": " + why;
      continue;  // a handle of a library that is not usable stays open: harmless, never used
    }
    Ort::InitApi(api);

    auto impl = std::make_unique<Impl>();
    impl->handle = handle;
    impl->api_base = base;
    impl->library_path = resolved;
    const auto python = python_packages();
    const auto& registered = python.onnxruntime;
    std::error_code ec;
    if (!registered.capi_dir.empty() && !registered.distribution.empty() &&
        fs::equivalent(registered.capi_dir, fs::path(resolved).parent_path(), ec)) {
      impl->wheel = registered;
    } else {
      impl->wheel = detail::wheel_of_library(resolved);
    }
    impl->providers_dir = !options.providers_dir.empty()                      ? options.providers_dir
                          : !env_or_empty("AITUNE_ORT_PROVIDERS_DIR").empty() ? env_or_empty("AITUNE_ORT_PROVIDERS_DIR")
                                                                               : fs::path(resolved).parent_path().string();
    impl->cuda_library_dirs = cuda_library_dirs_for(options, impl->wheel, python);
    impl->env.emplace(detail::ort_call(ErrorCode::kInternal, "creating the ONNX Runtime environment", [&] {
      return Ort::Env(static_cast<OrtLoggingLevel>(options.log_severity), "aitune");
    }));
    g_runtime = new std::shared_ptr<OrtRuntime>(new OrtRuntime(std::move(impl)));
    return *g_runtime;
  }
  throw Error(ErrorCode::kProviderUnavailable,
              "cannot load ONNX Runtime; tried:" + tried +
                  "\ninstall it into the Python environment (pip install onnxruntime==1.31.1, or "
                  "'onnxruntime-gpu[cuda,cudnn]==1.31.1' for CUDA), or set AITUNE_ORT_LIBRARY to a "
                  "libonnxruntime.so of ONNX Runtime >= 1." +
                  std::to_string(ORT_API_VERSION));
}

OrtRuntime::OrtRuntime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OrtRuntime::~OrtRuntime() = default;

const std::string& OrtRuntime::library_path() const noexcept { return impl_->library_path; }
const OrtWheel& OrtRuntime::wheel() const noexcept { return impl_->wheel; }
const std::string& OrtRuntime::providers_dir() const noexcept { return impl_->providers_dir; }
const std::vector<std::string>& OrtRuntime::cuda_library_dirs() const noexcept { return impl_->cuda_library_dirs; }
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

void OrtRuntime::Impl::preload_cuda_libraries_locked() {
  if (cuda_libraries_preloaded) return;
  cuda_preload_failures = detail::preload_cuda_libraries(cuda_library_dirs);
  cuda_libraries_preloaded = true;
}

const std::vector<Ort::ConstEpDevice>& OrtRuntime::Impl::cuda_ep_devices() {
  std::lock_guard lock(mutex);
  if (cuda_registered) return cuda_devices;
  std::string lib = (fs::path(providers_dir) / kCudaProvider).string();
  if (!fs::exists(lib))
    throw Error(ErrorCode::kProviderUnavailable,
                "CUDA execution provider unavailable: " + lib + " not found (ONNX Runtime " +
                    api_base->GetVersionString() + " here is a CPU build); " + kGpuPackageHint);
  preload_cuda_libraries_locked();
  if (auto other = foreign_provider_bridge((fs::path(providers_dir) / kSharedProvider).string()))
    throw Error(ErrorCode::kProviderUnavailable, "CUDA execution provider unavailable: " + bridge_conflict(*other));
  try {
    env->RegisterExecutionProviderLibrary("aitune_cuda", lib);
  } catch (const Ort::Exception& e) {
    std::string dep = dependency_problem(lib);
    std::string failures;
    for (const auto& f : cuda_preload_failures) failures += "; preloading " + f;
    throw Error(ErrorCode::kProviderUnavailable,
                "CUDA execution provider unavailable: cannot load " + lib + ": " + (dep.empty() ? e.what() : dep) +
                    failures + "; CUDA libraries looked for in: " + joined(cuda_library_dirs) + "; " +
                    kCudaLibrariesHint);
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

// OrtRuntime::Impl::probe (the registry's probe of a provider) is in provider_registry.cpp.

ProviderStatus OrtRuntime::Impl::probe_cuda() {
  ProviderStatus s;
  s.library = (fs::path(providers_dir) / kCudaProvider).string();
  try {
    cuda_ep_devices();
    s.available = true;
  } catch (const Error& e) {
    s.reason = e.what();
  }
  s.cuda_libraries = detail::loaded_cuda_libraries();
  return s;
}

ProviderStatus OrtRuntime::Impl::probe_tensorrt() {
  ProviderStatus s;
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
  {
    std::lock_guard lock(mutex);
    preload_cuda_libraries_locked();
  }
  s.cuda_libraries = detail::loaded_cuda_libraries();
  if (auto other = foreign_provider_bridge((dir / kSharedProvider).string())) {
    s.reason = "TensorRT execution provider unavailable: " + bridge_conflict(*other);
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

}  // namespace aitune
