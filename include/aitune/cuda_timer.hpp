// CudaEventTimer: device time of calls on one CUDA stream, by CUDA events. The CUDA
// runtime is loaded at run time, like ONNX Runtime, so CPU-only builds need no CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "aitune/profiler.hpp"

namespace aitune {

/// True when a CUDA runtime library (libcudart.so.13 / .12 / libcudart.so) loads and
/// reports at least one device. Never throws.
bool cuda_runtime_available() noexcept;

/// A DeviceTimer recording events on `stream` (a cudaStream_t as an integer; 0 is the
/// legacy default stream) of device `device_id`. Throws Error(kProviderUnavailable)
/// naming the libraries tried when no CUDA runtime loads. Not thread-safe.
std::unique_ptr<DeviceTimer> make_cuda_event_timer(std::uintptr_t stream, int device_id = 0);

/// How a stream aitune creates relates to the legacy default stream (stream 0).
enum class StreamSync {
  kNonBlocking,  // cudaStreamNonBlocking: independent of stream 0
  // A blocking stream (cudaStreamDefault): CUDA orders it with stream 0 both ways, so a
  // caller on stream 0 needs no events. Stream 0 may not be used while it captures a graph.
  kWithLegacyStream,
};

/// A CUDA stream owned by aitune, for callers that have none (the CLI) and for sessions.
/// Destroyed with the object.
class CudaStream {
 public:
  static std::unique_ptr<CudaStream> create(int device_id = 0, StreamSync sync = StreamSync::kNonBlocking);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  std::uintptr_t handle() const noexcept { return handle_; }

 private:
  CudaStream(std::uintptr_t handle, int device_id) : handle_(handle), device_id_(device_id) {}
  std::uintptr_t handle_;
  int device_id_;
};

}  // namespace aitune
