// CUDA stream primitives of sessions (cuda_stream.hpp), through the dlopened CUDA runtime.
#include "cuda/cuda_stream.hpp"

#include <algorithm>

#include "aitune/error.hpp"

namespace aitune::detail {

std::unique_ptr<CudaStream> CudaStream::create(int device_id, StreamSync sync) {
  const auto& rt = require_cuda_runtime("a CUDA stream");
  cuda_check(rt.set_device(device_id), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  const unsigned flags = sync == StreamSync::kNonBlocking ? kCudaStreamNonBlocking : 0u;
  cuda_check(rt.stream_create_with_flags(&stream, flags), "cudaStreamCreateWithFlags");
  return std::unique_ptr<CudaStream>(new CudaStream(reinterpret_cast<std::uintptr_t>(stream)));
}

CudaStream::~CudaStream() {
  const auto& rt = cuda_runtime();
  if (rt.error.empty()) rt.stream_destroy(reinterpret_cast<cudaStream_t>(handle_));
}

StreamEvent::StreamEvent() : rt_(require_cuda_runtime("ordering with the caller's CUDA stream")) {
  cuda_check(rt_.event_create_with_flags(&event_, kCudaEventDisableTiming), "cudaEventCreateWithFlags");
}

StreamEvent::~StreamEvent() { rt_.event_destroy(event_); }

void StreamEvent::order(std::uintptr_t producer, std::uintptr_t waiter) {
  cuda_check(rt_.event_record(event_, reinterpret_cast<cudaStream_t>(producer)), "cudaEventRecord");
  cuda_check(rt_.stream_wait_event(reinterpret_cast<cudaStream_t>(waiter), event_, 0), "cudaStreamWaitEvent");
}

namespace {

// Owner of one stream-ordered allocation: freed on the stream it was made on.
struct StreamBuffer {
  void* data = nullptr;
  std::uintptr_t stream = 0;
  std::shared_ptr<const void> keep_alive;  // keeps the stream alive
  ~StreamBuffer() {
    if (data) cuda_runtime().free_async(data, reinterpret_cast<cudaStream_t>(stream));
  }
};

}  // namespace

Tensor stream_buffer_tensor(DType dtype, const Shape& shape, Device device, std::uintptr_t stream,
                            std::shared_ptr<const void> keep_alive) {
  const auto& rt = require_cuda_runtime("CUDA-graph buffers");
  static const bool pool_kept = [&] {
    // Keep freed memory in the pool across synchronisations instead of returning it to
    // the driver each time (the default threshold, 0): reallocation would cost every call.
    void* pool = nullptr;
    if (rt.device_get_default_mem_pool(&pool, device.index) != 0) return false;
    std::uint64_t threshold = std::uint64_t{1} << 30;
    return rt.mem_pool_set_attribute(pool, kCudaMemPoolAttrReleaseThreshold, &threshold) == 0;
  }();
  static_cast<void>(pool_kept);
  auto owner = std::make_shared<StreamBuffer>();
  owner->stream = stream;
  owner->keep_alive = std::move(keep_alive);
  TensorView view{nullptr, dtype, shape, {}, device};
  cuda_check(rt.malloc_async(&owner->data, std::max<std::size_t>(view.nbytes(), 1), reinterpret_cast<cudaStream_t>(stream)),
             "cudaMallocAsync");
  view.data = owner->data;
  return Tensor::adopt(std::move(view), std::move(owner));
}

bool stream_is_capturing(std::uintptr_t stream) noexcept {
  const auto& rt = cuda_runtime();
  if (!rt.error.empty()) return false;
  int status = kCudaStreamCaptureStatusNone;
  if (rt.stream_is_capturing(reinterpret_cast<cudaStream_t>(stream), &status) != 0) return false;
  return status != kCudaStreamCaptureStatusNone;
}

bool drain_stream(std::uintptr_t stream) noexcept {
  if (stream == 0) return true;
  const auto& rt = cuda_runtime();
  if (!rt.error.empty()) return true;
  if (stream_is_capturing(stream)) return false;
  int mode = kCudaStreamCaptureModeRelaxed;
  const bool exchanged = rt.thread_exchange_stream_capture_mode &&
                         rt.thread_exchange_stream_capture_mode(&mode) == 0;
  const bool drained = rt.stream_synchronize(reinterpret_cast<cudaStream_t>(stream)) == 0;
  if (exchanged) rt.thread_exchange_stream_capture_mode(&mode);  // back to the thread's mode
  if (!drained) rt.get_last_error();  // not sticky: leave no error for the next CUDA call to report
  return drained;
}

bool abandon_capture(std::uintptr_t stream) noexcept {
  if (!stream_is_capturing(stream)) return false;
  const auto& rt = cuda_runtime();
  cudaGraph_t graph = nullptr;
  // Ending an invalidated capture fails and returns no graph; the stream leaves capture
  // mode either way.
  rt.stream_end_capture(reinterpret_cast<cudaStream_t>(stream), &graph);
  if (graph) rt.graph_destroy(graph);
  rt.get_last_error();  // clears the (non-sticky) error the failed capture left
  return true;
}

}  // namespace aitune::detail
