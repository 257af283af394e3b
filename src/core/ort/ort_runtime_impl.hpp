// Private: OrtRuntime's state, shared with the backend (env, CUDA EP devices).
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "aitune/ort_runtime.hpp"
#include "ort/ort_api.hpp"

namespace aitune {

namespace detail {
/// Bookkeeping behind OrtRuntime::live_sessions(): called when a session is created and
/// from its deleter.
void count_session_created() noexcept;
void count_session_released() noexcept;
}  // namespace detail

struct OrtRuntime::Impl {
  std::string library_path;
  OrtWheel wheel;
  std::string providers_dir;
  std::vector<std::string> cuda_library_dirs;
  void* handle = nullptr;  // dlopen handle; never closed (see ort_runtime.cpp)
  const OrtApiBase* api_base = nullptr;
  std::optional<Ort::Env> env;

  std::mutex mutex;  // guards the members below
  std::map<ExecutionProvider, ProviderStatus> status_cache;
  bool cuda_registered = false;
  bool cuda_libraries_preloaded = false;
  std::vector<std::string> cuda_preload_failures;  // "path: why" of preloads that failed
  std::vector<Ort::ConstEpDevice> cuda_devices;  // plugin CUDA EP devices, in ORT's order

  /// Registers the CUDA plugin EP library once and returns its devices. Throws
  /// Error(kProviderUnavailable) with the reason when it cannot be used.
  const std::vector<Ort::ConstEpDevice>& cuda_ep_devices();

  /// Preloads the CUDA / cuDNN libraries from cuda_library_dirs once (caller holds mutex).
  void preload_cuda_libraries_locked();

  /// Probes (uncached) one provider: its registry entry's probe.
  ProviderStatus probe(ExecutionProvider provider);
  /// The GPU providers' probes (they load libraries the way this runtime does).
  ProviderStatus probe_cuda();
  ProviderStatus probe_tensorrt();
};

namespace detail {
/// The engine's access to OrtRuntime's private state (the public header keeps it opaque).
struct OrtRuntimeAccess {
  static OrtRuntime::Impl& impl(OrtRuntime& runtime) noexcept { return *runtime.impl_; }
};
inline OrtRuntime::Impl& runtime_impl(OrtRuntime& runtime) noexcept { return OrtRuntimeAccess::impl(runtime); }
}  // namespace detail

}  // namespace aitune
