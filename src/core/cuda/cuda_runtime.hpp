// The CUDA runtime entry points aitune calls itself (events, streams, async copies),
// loaded with dlopen like ONNX Runtime, so builds without CUDA still run on the CPU.
#pragma once

#include <cstddef>
#include <string>

namespace aitune::detail {

// cudaError_t is an int enum (0 = cudaSuccess); handles are opaque pointers.
using cudaEvent_t = void*;
using cudaStream_t = void*;
using cudaGraph_t = void*;
inline constexpr unsigned kCudaStreamNonBlocking = 1;
inline constexpr unsigned kCudaEventDisableTiming = 2;
inline constexpr int kCudaMemcpyDeviceToDevice = 3;
inline constexpr int kCudaMemPoolAttrReleaseThreshold = 4;
inline constexpr int kCudaStreamCaptureStatusNone = 0;
inline constexpr int kCudaStreamCaptureModeRelaxed = 2;  // cudaStreamCaptureModeRelaxed
inline constexpr int kCudaErrorMemoryAllocation = 2;  // cudaErrorMemoryAllocation: out of memory

struct CudaRuntime {
  int (*set_device)(int) = nullptr;
  int (*get_device_count)(int*) = nullptr;
  int (*event_create)(cudaEvent_t*) = nullptr;
  int (*event_create_with_flags)(cudaEvent_t*, unsigned) = nullptr;
  int (*event_destroy)(cudaEvent_t) = nullptr;
  int (*event_record)(cudaEvent_t, cudaStream_t) = nullptr;
  int (*event_synchronize)(cudaEvent_t) = nullptr;
  int (*event_elapsed_time)(float*, cudaEvent_t, cudaEvent_t) = nullptr;
  int (*stream_create_with_flags)(cudaStream_t*, unsigned) = nullptr;
  int (*stream_destroy)(cudaStream_t) = nullptr;
  int (*stream_synchronize)(cudaStream_t) = nullptr;
  int (*device_synchronize)() = nullptr;
  int (*stream_wait_event)(cudaStream_t, cudaEvent_t, unsigned) = nullptr;
  int (*memcpy_async)(void*, const void*, std::size_t, int, cudaStream_t) = nullptr;
  int (*malloc_async)(void**, std::size_t, cudaStream_t) = nullptr;
  int (*free_async)(void*, cudaStream_t) = nullptr;
  int (*device_get_default_mem_pool)(void**, int) = nullptr;
  int (*mem_pool_set_attribute)(void*, int, void*) = nullptr;
  int (*stream_is_capturing)(cudaStream_t, int*) = nullptr;  // status: cudaStreamCaptureStatus
  int (*stream_end_capture)(cudaStream_t, cudaGraph_t*) = nullptr;
  int (*graph_destroy)(cudaGraph_t) = nullptr;
  // cudaThreadExchangeStreamCaptureMode; optional (nullptr when the runtime lacks it).
  int (*thread_exchange_stream_capture_mode)(int*) = nullptr;
  int (*get_last_error)() = nullptr;
  const char* (*get_error_string)(int) = nullptr;
  std::string error;  // why loading failed; empty when loaded
};

/// The process's CUDA runtime (loaded once; check `error`). Never throws.
const CudaRuntime& cuda_runtime();
/// As cuda_runtime(), but Error(kProviderUnavailable) saying `what` needed it and which
/// libraries were tried when none loads.
const CudaRuntime& require_cuda_runtime(const char* what);
/// Error(kInternal) "`what` failed: <CUDA's message>" for a non-zero status
/// (kOutOfMemory for cudaErrorMemoryAllocation).
void cuda_check(int status, const char* what);

}  // namespace aitune::detail
