// Loads the CUDA runtime with dlopen and resolves the entry points of cuda_runtime.hpp.
#include "cuda/cuda_runtime.hpp"

#include <dlfcn.h>

#include <type_traits>

#include "aitune/error.hpp"

namespace aitune::detail {

const CudaRuntime& cuda_runtime() {
  static CudaRuntime rt = [] {
    CudaRuntime r;
    void* lib = nullptr;
    std::string tried;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      tried += std::string(tried.empty() ? "" : ", ") + name;
    }
    if (!lib) {
      r.error = "no CUDA runtime could be loaded (tried " + tried +
                "); install the CUDA runtime or put it on LD_LIBRARY_PATH";
      return r;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && r.error.empty()) r.error = std::string("the CUDA runtime lacks ") + name;
    };
    sym(r.set_device, "cudaSetDevice");
    sym(r.get_device_count, "cudaGetDeviceCount");
    sym(r.event_create, "cudaEventCreate");
    sym(r.event_create_with_flags, "cudaEventCreateWithFlags");
    sym(r.event_destroy, "cudaEventDestroy");
    sym(r.event_record, "cudaEventRecord");
    sym(r.event_synchronize, "cudaEventSynchronize");
    sym(r.event_elapsed_time, "cudaEventElapsedTime");
    sym(r.stream_create_with_flags, "cudaStreamCreateWithFlags");
    sym(r.stream_destroy, "cudaStreamDestroy");
    sym(r.stream_synchronize, "cudaStreamSynchronize");
    sym(r.device_synchronize, "cudaDeviceSynchronize");
    sym(r.stream_wait_event, "cudaStreamWaitEvent");
    sym(r.memcpy_async, "cudaMemcpyAsync");
    sym(r.malloc_async, "cudaMallocAsync");
    sym(r.free_async, "cudaFreeAsync");
    sym(r.device_get_default_mem_pool, "cudaDeviceGetDefaultMemPool");
    sym(r.mem_pool_set_attribute, "cudaMemPoolSetAttribute");
    sym(r.stream_is_capturing, "cudaStreamIsCapturing");
    sym(r.stream_end_capture, "cudaStreamEndCapture");
    sym(r.graph_destroy, "cudaGraphDestroy");
    sym(r.get_last_error, "cudaGetLastError");
    r.thread_exchange_stream_capture_mode =
        reinterpret_cast<int (*)(int*)>(dlsym(lib, "cudaThreadExchangeStreamCaptureMode"));
    sym(r.get_error_string, "cudaGetErrorString");
    return r;
  }();
  return rt;
}

const CudaRuntime& require_cuda_runtime(const char* what) {
  const auto& rt = cuda_runtime();
  if (!rt.error.empty()) throw Error(ErrorCode::kProviderUnavailable, std::string(what) + ": " + rt.error);
  return rt;
}

void cuda_check(int status, const char* what) {
  if (status != 0) {
    const auto& rt = cuda_runtime();
    throw Error(status == kCudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal,
                std::string(what) + " failed: " + (rt.get_error_string ? rt.get_error_string(status) : "?"));
  }
}

}  // namespace aitune::detail
