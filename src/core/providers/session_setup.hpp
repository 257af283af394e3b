// Private: SessionSetup, the value a provider's session hook fills in (ORT session options,
// where the session computes, its stream), in its own header so that providers need not
// include the session code that calls them.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>

#include "cuda/cuda_stream.hpp"
#include "ort/ort_api.hpp"

namespace aitune::detail {

/// Everything session creation needs besides the model, and what the runners need to
/// know about where the session computes.
struct SessionSetup {
  Ort::SessionOptions options;
  /// Where inputs must live and outputs are allocated: the session's device. Points into
  /// `owned_memory_info` or into the runtime's CUDA EP device (which outlives sessions).
  std::optional<Ort::MemoryInfo> owned_memory_info;
  const OrtMemoryInfo* memory_info = nullptr;
  /// The provider's host-accessible (pinned) memory, in the runtime's CUDA EP device; null
  /// where there is none. The session's deleter holds the session's allocator of it until
  /// the stream has drained after the session is deleted (session/deferred_release.hpp).
  const OrtMemoryInfo* pinned_memory_info = nullptr;
  /// The CUDA stream the session runs on (user_compute_stream): `owned_stream`'s, or the
  /// caller's. 0 where unknown (CPU, TensorRT).
  std::uintptr_t stream = 0;
  /// The stream aitune created for the session; the session's deleter takes it over so
  /// that it is destroyed after the session.
  std::shared_ptr<CudaStream> owned_stream;
  /// True when `stream` is aitune's own blocking stream (StreamSync::kWithLegacyStream):
  /// CUDA itself orders it with a caller on the legacy default stream, so no events.
  bool stream_syncs_with_legacy = false;
  /// enable_cuda_graph is on (CUDA only).
  bool cuda_graph = false;
  /// Strings the V1 TensorRT struct points into; alive until the session is created.
  std::list<std::string> keep_alive;
};

}  // namespace aitune::detail
