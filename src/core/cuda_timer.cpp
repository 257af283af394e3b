// CUDA events through a dlopened CUDA runtime: only the handful of entry points timing needs.
#include "aitune/cuda_timer.hpp"

#include <dlfcn.h>


#include "aitune/error.hpp"

namespace aitune {
namespace {

// cudaError_t is an int enum; 0 is cudaSuccess. Handles are opaque pointers.
using cudaEvent_t = void*;
using cudaStream_t = void*;

struct CudaRuntime {
  int (*set_device)(int) = nullptr;
  int (*get_device_count)(int*) = nullptr;
  int (*event_create)(cudaEvent_t*) = nullptr;
  int (*event_destroy)(cudaEvent_t) = nullptr;
  int (*event_record)(cudaEvent_t, cudaStream_t) = nullptr;
  int (*event_synchronize)(cudaEvent_t) = nullptr;
  int (*event_elapsed_time)(float*, cudaEvent_t, cudaEvent_t) = nullptr;
  int (*stream_create_with_flags)(cudaStream_t*, unsigned) = nullptr;
  int (*stream_destroy)(cudaStream_t) = nullptr;
  const char* (*get_error_string)(int) = nullptr;
  std::string error;  // why loading failed; empty when loaded
};

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
    sym(r.event_destroy, "cudaEventDestroy");
    sym(r.event_record, "cudaEventRecord");
    sym(r.event_synchronize, "cudaEventSynchronize");
    sym(r.event_elapsed_time, "cudaEventElapsedTime");
    sym(r.stream_create_with_flags, "cudaStreamCreateWithFlags");
    sym(r.stream_destroy, "cudaStreamDestroy");
    sym(r.get_error_string, "cudaGetErrorString");
    return r;
  }();
  return rt;
}

const CudaRuntime& require_runtime() {
  const auto& rt = cuda_runtime();
  if (!rt.error.empty()) throw Error(ErrorCode::kProviderUnavailable, "CUDA timing: " + rt.error);
  return rt;
}

void check(int status, const char* what) {
  if (status != 0) {
    const auto& rt = cuda_runtime();
    throw Error(ErrorCode::kInternal,
                std::string(what) + " failed: " + (rt.get_error_string ? rt.get_error_string(status) : "?"));
  }
}

class CudaEventTimer final : public DeviceTimer {
 public:
  CudaEventTimer(std::uintptr_t stream, int device_id) : rt_(require_runtime()) {
    stream_ = reinterpret_cast<cudaStream_t>(stream);
    check(rt_.set_device(device_id), "cudaSetDevice");
    check(rt_.event_create(&start_), "cudaEventCreate");
    if (rt_.event_create(&stop_) != 0) {
      rt_.event_destroy(start_);
      throw Error(ErrorCode::kInternal, "cudaEventCreate failed");
    }
  }
  ~CudaEventTimer() override {
    rt_.event_destroy(start_);
    rt_.event_destroy(stop_);
  }
  void start() override { check(rt_.event_record(start_, stream_), "cudaEventRecord"); }
  void stop() override {
    check(rt_.event_record(stop_, stream_), "cudaEventRecord");
    check(rt_.event_synchronize(stop_), "cudaEventSynchronize");
  }
  double elapsed_us() override {
    float ms = 0;
    check(rt_.event_elapsed_time(&ms, start_, stop_), "cudaEventElapsedTime");
    return static_cast<double>(ms) * 1e3;
  }

 private:
  const CudaRuntime& rt_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

bool cuda_runtime_available() noexcept {
  const auto& rt = cuda_runtime();
  if (!rt.error.empty()) return false;
  int count = 0;
  return rt.get_device_count(&count) == 0 && count > 0;
}

std::unique_ptr<DeviceTimer> make_cuda_event_timer(std::uintptr_t stream, int device_id) {
  return std::make_unique<CudaEventTimer>(stream, device_id);
}

std::unique_ptr<CudaStream> CudaStream::create(int device_id) {
  const auto& rt = require_runtime();
  check(rt.set_device(device_id), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(rt.stream_create_with_flags(&stream, 1u /* cudaStreamNonBlocking */), "cudaStreamCreateWithFlags");
  return std::unique_ptr<CudaStream>(new CudaStream(reinterpret_cast<std::uintptr_t>(stream), device_id));
}

CudaStream::~CudaStream() {
  const auto& rt = cuda_runtime();
  if (rt.error.empty()) rt.stream_destroy(reinterpret_cast<cudaStream_t>(handle_));
}

}  // namespace aitune
