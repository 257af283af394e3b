// Private: runs a CUDA session as captured CUDA graphs (per input shape: a slot of lanes with fixed buffers).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_stream.hpp"
#include "session/session_context.hpp"

namespace aitune::detail {

/// Runs of a CUDA session created with enable_cuda_graph=1. A captured graph replays
/// fixed device addresses, so each input shape gets a slot of lanes, each lane a graph of
/// its own (ORT graph id) with fixed input buffers that calls copy into, all on the
/// session's stream, so no host wait orders them. One call at a time (a lane's buffers
/// are shared); calls from several threads take turns.
///
/// Inputs updated in place (SessionContext::output_aliases, a decode step's KV cache) are
/// not copied in or out: the lanes bind the caller's own buffer as that input and as the
/// output written into it, so a replay updates the caller's cache where it lies. A
/// captured graph then holds the caller's address, so that address is part of the slot's
/// key: a decode loop that passes back the caches it got (the same buffers every step)
/// replays one graph; another cache (a new generation) captures a slot of its own (up to
/// kMaxGraphShapes, then runs uncaptured). A slot is replayed only for a call passing
/// that very address, i.e. while the caller holds the buffer, so a slot whose buffer was
/// freed is never replayed into freed memory. (Unverified on a GPU as written: CPU tests
/// cover the key; the lead's GPU run covers the replays.)
class CudaGraphRunner {
 public:
  explicit CudaGraphRunner(const SessionContext& context) : ctx_(context) {}
  /// Inputs (checked, on the session's device) copied into the slot's buffers; outputs
  /// lent from a lane or copied out (see OnnxSession::infer). With `caller`,
  /// ordered with that stream; without, the outputs are ready on return.
  ///
  /// A run that fails while a graph is captured or replayed throws
  /// Error(kCudaGraphCapture) (kOutOfMemory when an allocation failed) naming the model
  /// and the input shapes; a capture it left open on the session's stream is ended and
  /// dropped first, so the stream (and a caller on the legacy stream) can be used again.
  /// ORT's state for a graph that failed half-way is unknown, so every later call throws
  /// Error(kCudaGraphCapture) too, until the session is recreated (deactivate, activate).
  std::vector<Tensor> run(const std::vector<TensorView>& views, std::optional<std::uintptr_t> caller);

  /// A buffer of `dtype` and `shape` on the session's device in stream-ordered memory
  /// (not the arena, see stream_buffer_tensor), ready on return: allocated and the
  /// session's stream synchronised while holding the runner's lock, so the wait never
  /// lands inside another thread's capture (a cudaStreamSynchronize on a capturing
  /// stream invalidates that capture). For OnnxSession::to_device.
  Tensor ready_buffer(DType dtype, const Shape& shape);

  /// Shapes past this many run without a graph (gpu_graph_id -1): each captured graph
  /// keeps its activations reserved.
  static constexpr std::size_t kMaxGraphShapes = 8;
  /// Lent lanes per shape: a caller that keeps the last output while making the next
  /// call (`y = m(x)` in a loop) alternates between two.
  static constexpr std::size_t kLentLanes = 2;

  /// The slot a call's inputs replay: their shapes, and the addresses of the inputs a
  /// graph writes into (`updated_in_place`), which its captured graphs bind directly.
  static std::pair<std::vector<Shape>, std::vector<std::uintptr_t>> slot_key(const std::vector<TensorView>& views,
                                                                            const std::vector<bool>& updated_in_place);

 private:
  struct Lane {
    explicit Lane(Ort::Session& session) : binding(session) {}
    Ort::IoBinding binding;
    std::vector<Tensor> inputs;
    std::vector<Ort::Value> bound;  // ORT's views of `inputs` and `outputs`
    Ort::RunOptions run;
    // Lent lanes: outputs in buffers of their own (not the arena, see
    // stream_buffer_tensor) that calls hand to the caller without a copy. The lane is
    // free again once every tensor of its last call is gone (`lease` expired); until
    // then its graph does not replay.
    std::vector<Tensor> outputs;
    std::weak_ptr<void> lease;
  };
  struct Slot {
    // Outputs bound once to ORT's allocation and copied out on every call: the first call
    // of a shape (which tells the output shapes) and calls made while every lent lane is held.
    std::unique_ptr<Lane> copy_lane;
    std::vector<std::unique_ptr<Lane>> lent_lanes;  // made on demand, up to kLentLanes
    std::vector<Shape> output_shapes;               // known after the first call
    int first_graph_id = 0;
    StreamEvent before, after;
  };

  // A lane for graph id `id`: input buffers shaped like `views`; outputs bound to
  // buffers of `output_shapes` (a lent lane) or, where that is empty, to ORT's allocation.
  std::unique_ptr<Lane> make_lane(const std::vector<TensorView>& views, int id,
                                  const std::vector<Shape>& output_shapes) const;
  // The lane of `slot` this call uses: a free lent lane, a new one, or the copy lane.
  Lane* pick_lane(Slot& slot, const std::vector<TensorView>& views);
  // A call with a new shape past kMaxGraphShapes: a plain run, outputs copied out.
  std::vector<Tensor> run_uncaptured(const std::vector<TensorView>& views);
  // Copies of `values` in stream-ordered memory, on the session's stream.
  // An output written into an input (`views[output_aliases[i]]`) is that input itself.
  std::vector<Tensor> copy_out(const std::vector<Ort::Value>& values, const std::vector<TensorView>& views) const;
  Tensor stream_buffer(DType dtype, const Shape& shape) const;
  // Session::Run for a lane; a failure is typed, any open capture abandoned, the runner broken.
  void run_lane(Lane& lane, const std::vector<TensorView>& views);

  const SessionContext& ctx_;
  std::mutex mutex_;
  // The input shapes, and the addresses of the inputs updated in place (bound, not copied).
  using SlotKey = std::pair<std::vector<Shape>, std::vector<std::uintptr_t>>;
  std::map<SlotKey, std::unique_ptr<Slot>> slots_;
  std::optional<std::string> broken_;  // why an earlier capture or replay failed
};

}  // namespace aitune::detail
