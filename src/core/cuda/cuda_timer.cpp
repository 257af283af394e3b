// CUDA-event device timing, through the dlopened CUDA runtime.
#include "aitune/cuda_timer.hpp"

#include "aitune/error.hpp"
#include "cuda/cuda_runtime.hpp"

namespace aitune {
namespace {
using detail::cuda_check;
using detail::cuda_runtime;
using detail::cudaEvent_t;
using detail::cudaStream_t;
using detail::CudaRuntime;

class CudaEventTimer final : public DeviceTimer {
 public:
  CudaEventTimer(std::uintptr_t stream, int device_id) : rt_(detail::require_cuda_runtime("CUDA timing")) {
    stream_ = reinterpret_cast<cudaStream_t>(stream);
    cuda_check(rt_.set_device(device_id), "cudaSetDevice");
    cuda_check(rt_.event_create(&start_), "cudaEventCreate");
    if (rt_.event_create(&stop_) != 0) {
      rt_.event_destroy(start_);
      throw Error(ErrorCode::kInternal, "cudaEventCreate failed");
    }
  }
  ~CudaEventTimer() override {
    rt_.event_destroy(start_);
    rt_.event_destroy(stop_);
  }
  void start() override { cuda_check(rt_.event_record(start_, stream_), "cudaEventRecord"); }
  void stop() override {
    cuda_check(rt_.event_record(stop_, stream_), "cudaEventRecord");
    cuda_check(rt_.event_synchronize(stop_), "cudaEventSynchronize");
  }
  double elapsed_us() override {
    float ms = 0;
    cuda_check(rt_.event_elapsed_time(&ms, start_, stop_), "cudaEventElapsedTime");
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

}  // namespace aitune
