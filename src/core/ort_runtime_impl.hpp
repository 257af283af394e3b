// Private: OrtRuntime's state, shared with the backend (env, CUDA EP devices).
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "aitune/ort_runtime.hpp"
#include "ort_api.hpp"

namespace aitune {

struct OrtRuntime::Impl {
  std::string library_path;
  std::string providers_dir;
  void* handle = nullptr;  // dlopen handle; never closed (see ort_runtime.cpp)
  const OrtApiBase* api_base = nullptr;
  std::optional<Ort::Env> env;

  std::mutex mutex;  // guards the members below
  std::map<ExecutionProvider, ProviderStatus> status_cache;
  bool cuda_registered = false;
  std::vector<Ort::ConstEpDevice> cuda_devices;  // plugin CUDA EP devices, in ORT's order

  /// Registers the CUDA plugin EP library once and returns its devices. Throws
  /// Error(kProviderUnavailable) with the reason when it cannot be used.
  const std::vector<Ort::ConstEpDevice>& cuda_ep_devices();

  /// Probes (uncached) one provider.
  ProviderStatus probe(ExecutionProvider provider);
};

}  // namespace aitune
