// OrtRuntime: ONNX Runtime loaded at run time (dlopen + manual API init), its version
// and which execution providers it can drive here.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aitune/execution_provider.hpp"

namespace aitune {

/// ONNX Runtime installed as a Python package: the PyPI wheel `onnxruntime` or
/// `onnxruntime-gpu`, whose `onnxruntime/capi/` holds `libonnxruntime.so.1.<minor>.<patch>`
/// and, in the GPU wheel, the CUDA and TensorRT provider libraries.
struct OrtWheel {
  std::string distribution;  ///< "onnxruntime" or "onnxruntime-gpu"; "" when unknown
  std::string version;       ///< the distribution's version ("1.31.1"); "" when unknown
  std::string capi_dir;      ///< `<site-packages>/onnxruntime/capi`; "" when there is none
  std::string warning;       ///< e.g. both distributions installed over one another; "" when fine
};

/// What the Python environment holds for ONNX Runtime: the wheel, and the `lib` folders of
/// the pip `nvidia-*` packages (CUDA runtime, cuBLAS, cuFFT, cuRAND, NVRTC, cuDNN) that its
/// CUDA provider needs. The Python front end finds them without importing onnxruntime
/// (python/aitune/_ort_wheel.py) and hands them over with OrtRuntime::use_python_packages.
struct OrtPythonPackages {
  OrtWheel onnxruntime;
  std::vector<std::string> cuda_library_dirs;
};

/// How to find ONNX Runtime. Search order:
///   1. `library_path` (a file), else the environment variable AITUNE_ORT_LIBRARY: when one
///      of them is given it is the only candidate (an error names it if it cannot be used);
///   2. the onnxruntime / onnxruntime-gpu wheel of the Python environment
///      (`<capi_dir>/libonnxruntime.so.1*`, see OrtRuntime::use_python_packages);
///   3. the library named when aitune was built (CMake option AITUNE_ORT_LIBRARY; for a
///      build with tests, the configuring Python's wheel), if any;
///   4. the system loader's search path (`libonnxruntime.so.1`).
/// A library older than the headers aitune was compiled with (ORT_API_VERSION, see
/// ort_api_version()) is refused with its version named.
/// The CUDA provider library (plugin-EP route) is looked for in `providers_dir`, then
/// AITUNE_ORT_PROVIDERS_DIR, then the directory of the loaded libonnxruntime. The TensorRT
/// provider loads through ORT's provider bridge, which only looks next to libonnxruntime,
/// so it must sit there. Before a GPU provider loads, the CUDA and cuDNN libraries it links
/// are preloaded from the first of these folders that holds them (as onnxruntime's own
/// `preload_dlls` does): `cuda_library_dirs`, AITUNE_CUDA_LIBRARY_DIRS (':'-separated), the
/// Python packages' folders, `<site-packages>/nvidia/*/lib` beside the loaded wheel, the
/// folders named when aitune was built (CMake option AITUNE_CUDA_LIBRARY_DIRS); a library
/// already in the process (loaded by torch, say) or in none of them is left to the loader.
struct OrtRuntimeOptions {
  std::string library_path;
  std::string providers_dir;
  std::vector<std::string> cuda_library_dirs;
  /// ORT log severity: 0 verbose ... 3 error (default), 4 fatal.
  int log_severity = 3;
};

/// Whether an execution provider can be used, and if not, exactly why.
struct ProviderStatus {
  ExecutionProvider provider = ExecutionProvider::kCPU;
  bool available = false;
  std::string library;  ///< the provider library involved ("" for the built-in CPU EP)
  std::string reason;   ///< why it is unavailable, with what to install; "" when available
  /// The CUDA / cuDNN libraries in the process after probing a GPU provider, as
  /// "soname: path" ("libcudart.so.13: /.../nvidia/cu13/lib/libcudart.so.13"); empty for CPU.
  std::vector<std::string> cuda_libraries;
};

/// The lines `aitune doctor` prints under a provider's status (its registry entry's
/// doctor check: the CUDA provider lists the CUDA libraries in the process).
std::vector<std::string> provider_doctor_details(const ProviderStatus& status);

namespace detail {
struct OrtRuntimeAccess;  // the engine's way to OrtRuntime::Impl
}  // namespace detail

/// The process's ONNX Runtime. ORT's C++ API keeps one global API table, so a process
/// loads ORT once: the first `load` decides the library; a later `load` naming a
/// different library throws Error(kState). Thread safe.
class OrtRuntime {
 public:
  /// Loads (or returns the already loaded) runtime. Throws Error(kProviderUnavailable)
  /// listing every path tried and why each failed.
  static std::shared_ptr<OrtRuntime> load(const OrtRuntimeOptions& options = {});

  /// Registers the Python environment's ONNX Runtime wheel and CUDA library folders as
  /// search candidates (see OrtRuntimeOptions). Process-wide; takes effect for the next
  /// `load` that finds nothing loaded yet. Thread safe.
  static void use_python_packages(const OrtPythonPackages& packages);
  /// What use_python_packages registered (empty when nothing was).
  static OrtPythonPackages python_packages();

  /// The candidate library paths `load` would try, in order (for `aitune doctor`).
  static std::vector<std::string> search_paths(const OrtRuntimeOptions& options = {});

  /// ORT sessions the engine created that are still alive in this process. A session
  /// lives as long as its backend and every tensor it handed out; a front end that
  /// releases what it tuned or loaded brings this back down (tests check it; issue 17).
  static std::size_t live_sessions() noexcept;

  /// Path of the loaded libonnxruntime.
  const std::string& library_path() const noexcept;
  /// The wheel the loaded library belongs to (empty fields when it does not sit in an
  /// `onnxruntime/capi` folder); distribution and version from the Python packages, else
  /// from the `*.dist-info` folder beside the package.
  const OrtWheel& wheel() const noexcept;
  /// Directory searched for GPU provider libraries.
  const std::string& providers_dir() const noexcept;
  /// Folders searched for the CUDA and cuDNN libraries, in order.
  const std::vector<std::string>& cuda_library_dirs() const noexcept;
  /// ORT's version string ("1.31.1"), from OrtApiBase::GetVersionString.
  std::string version() const;
  /// ORT's GetAvailableProviders(): the providers compiled into or bridged by this build.
  std::vector<std::string> compiled_providers() const;

  /// Probes one provider (loading its library once and caching the answer). Never throws
  /// for an unavailable provider: the reason is in the result.
  ProviderStatus provider_status(ExecutionProvider provider);

  /// The library the process's ONNX Runtime provider bridge comes from, when it is not
  /// `shared_library` (a libonnxruntime_providers_shared.so); nullopt when it is, or when
  /// there is none yet. The CUDA and TensorRT providers bind its Provider_GetHost by name,
  /// to the first such library loaded RTLD_GLOBAL: another ONNX Runtime's (the onnxruntime
  /// Python package of another install, imported first) hands them a host of another
  /// layout, and they crash in a kernel (a call through a null slot). Loads
  /// `shared_library` RTLD_GLOBAL, as ONNX Runtime does before loading a provider.
  static std::optional<std::string> foreign_provider_bridge(const std::string& shared_library);

  ~OrtRuntime();
  OrtRuntime(const OrtRuntime&) = delete;
  OrtRuntime& operator=(const OrtRuntime&) = delete;

  /// Private state (the Ort::Env, registered EP libraries), defined and reached inside the
  /// engine only (src/core/ort/ort_runtime_impl.hpp).
  struct Impl;

 private:
  friend struct detail::OrtRuntimeAccess;
  explicit OrtRuntime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace aitune
