// Private CUDA stream primitives of sessions: owned streams, ordering events, stream-ordered buffers, capture state.
#pragma once

#include <cstdint>
#include <memory>

#include "aitune/device.hpp"
#include "aitune/dtype.hpp"
#include "aitune/tensor.hpp"
#include "cuda/cuda_runtime.hpp"

namespace aitune::detail {

/// How a stream aitune creates relates to the legacy default stream (stream 0).
enum class StreamSync {
  kNonBlocking,  // cudaStreamNonBlocking: independent of stream 0
  // A blocking stream (cudaStreamDefault): CUDA orders it with stream 0 both ways, so a
  // caller on stream 0 needs no events. Stream 0 may not be used while it captures a graph.
  kWithLegacyStream,
};

/// A CUDA stream owned by aitune (a session's user_compute_stream), destroyed with the object.
class CudaStream {
 public:
  /// Error(kProviderUnavailable) when no CUDA runtime loads; Error(kInternal) when CUDA fails.
  static std::unique_ptr<CudaStream> create(int device_id = 0, StreamSync sync = StreamSync::kNonBlocking);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  std::uintptr_t handle() const noexcept { return handle_; }

 private:
  explicit CudaStream(std::uintptr_t handle) : handle_(handle) {}
  std::uintptr_t handle_;
};

/// A CUDA event for ordering one stream after another (timing disabled: cheaper).
class StreamEvent {
 public:
  StreamEvent();
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  /// Work queued on `waiter` from now on runs after all work queued on `producer` so far;
  /// the host does not wait.
  void order(std::uintptr_t producer, std::uintptr_t waiter);

 private:
  const CudaRuntime& rt_;
  cudaEvent_t event_ = nullptr;
};

/// A device tensor in CUDA's stream-ordered memory (cudaMallocAsync on `stream`, freed
/// with cudaFreeAsync on it). Used by CUDA-graph sessions for their fixed input and
/// output buffers and for to_device copies: not from the session's arena, because a
/// captured graph keeps using the activations it was captured with, which the arena
/// counts as free after the run, so arena memory handed out after capture is
/// overwritten by later replays (seen on the H200: kept outputs changed). `keep_alive`
/// (the session, whose deleter owns the stream) lives as long as the buffer.
Tensor stream_buffer_tensor(DType dtype, const Shape& shape, Device device, std::uintptr_t stream,
                            std::shared_ptr<const void> keep_alive);

/// Whether `stream` is capturing a CUDA graph now (cudaStreamIsCapturing). Never throws;
/// false without a CUDA runtime.
bool stream_is_capturing(std::uintptr_t stream) noexcept;

/// Waits for the work queued on `stream` so far, host functions included; true once it
/// has finished (and for stream 0 or without a CUDA runtime: nothing of aitune's to wait
/// for). False when it cannot be waited for now: `stream` is capturing, or the wait
/// fails (another stream capturing a graph in global mode prohibits it on this thread).
/// The wait runs in relaxed capture mode, so that a capture of another library's stream
/// (torch's CUDA graphs) neither prohibits it nor is broken by it, and it never waits for
/// the whole device (cudaDeviceSynchronize would break such a capture). Never throws: it
/// runs in destructors (DeferredReleases, session/deferred_release.hpp).
bool drain_stream(std::uintptr_t stream) noexcept;

/// Ends a capture left open on `stream` (a capture that failed half-way) and drops the
/// partial graph, so that the stream can be used again. Returns true when a capture was
/// open. Never throws.
bool abandon_capture(std::uintptr_t stream) noexcept;

}  // namespace aitune::detail
