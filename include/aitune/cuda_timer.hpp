// CudaEventTimer: device time of calls on one CUDA stream, by CUDA events. The CUDA
// runtime is loaded at run time, like ONNX Runtime, so CPU-only builds need no CUDA.
#pragma once

#include <cstdint>
#include <memory>

#include "aitune/profiler.hpp"

namespace aitune {

/// True when a CUDA runtime library (libcudart.so.13 / .12 / libcudart.so) loads and
/// reports at least one device. Never throws.
bool cuda_runtime_available() noexcept;

/// A DeviceTimer recording events on `stream` (a cudaStream_t as an integer; 0 is the
/// legacy default stream) of device `device_id`. Throws Error(kProviderUnavailable)
/// naming the libraries tried when no CUDA runtime loads. Not thread-safe.
std::unique_ptr<DeviceTimer> make_cuda_event_timer(std::uintptr_t stream, int device_id = 0);

}  // namespace aitune
