// OrtRuntime: ONNX Runtime loaded at run time (dlopen + manual API init), its version
// and which execution providers it can drive here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "aitune/execution_provider.hpp"

namespace aitune {

/// How to find ONNX Runtime. Search order (first that exists wins):
///   1. `library_path` (a file);
///   2. the environment variable AITUNE_ORT_LIBRARY (a file);
///   3. the copy shipped beside aitune: `<dir of the aitune binary>/lib/libonnxruntime.so.1`
///      and `<dir>/../lib/libonnxruntime.so.1` (the wheel and the installed package);
///   4. the copy fetched at build time (.deps/onnxruntime/lib of the source tree);
///   5. the system loader's search path (`libonnxruntime.so.1`).
/// The CUDA provider library (plugin-EP route) is looked for in `providers_dir`, then
/// AITUNE_ORT_PROVIDERS_DIR, then the directory of the loaded libonnxruntime.so. The
/// TensorRT provider loads through ORT's provider bridge, which only looks next to
/// libonnxruntime.so, so it must sit there.
struct OrtRuntimeOptions {
  std::string library_path;
  std::string providers_dir;
  /// ORT log severity: 0 verbose ... 3 error (default), 4 fatal.
  int log_severity = 3;
};

/// Whether an execution provider can be used, and if not, exactly why.
struct ProviderStatus {
  ExecutionProvider provider = ExecutionProvider::kCPU;
  bool available = false;
  std::string library;  ///< the provider library involved ("" for the built-in CPU EP)
  std::string reason;   ///< why it is unavailable, with what to install; "" when available
};

/// The process's ONNX Runtime. ORT's C++ API keeps one global API table, so a process
/// loads ORT once: the first `load` decides the library; a later `load` naming a
/// different library throws Error(kState). Thread safe.
class OrtRuntime {
 public:
  /// Loads (or returns the already loaded) runtime. Throws Error(kProviderUnavailable)
  /// listing every path tried and why each failed.
  static std::shared_ptr<OrtRuntime> load(const OrtRuntimeOptions& options = {});

  /// The candidate library paths `load` would try, in order (for `aitune doctor`).
  static std::vector<std::string> search_paths(const OrtRuntimeOptions& options = {});

  /// Path of the loaded libonnxruntime.
  const std::string& library_path() const noexcept;
  /// Directory searched for GPU provider libraries.
  const std::string& providers_dir() const noexcept;
  /// ORT's version string ("1.29.0"), from OrtApiBase::GetVersionString.
  std::string version() const;
  /// ORT's GetAvailableProviders(): the providers compiled into or bridged by this build.
  std::vector<std::string> compiled_providers() const;

  /// Probes one provider (loading its library once and caching the answer). Never throws
  /// for an unavailable provider: the reason is in the result.
  ProviderStatus provider_status(ExecutionProvider provider);

  ~OrtRuntime();
  OrtRuntime(const OrtRuntime&) = delete;
  OrtRuntime& operator=(const OrtRuntime&) = delete;

  struct Impl;
  /// Private state (the Ort::Env, registered EP libraries); used inside the engine only.
  Impl& impl() noexcept { return *impl_; }

 private:
  explicit OrtRuntime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace aitune
