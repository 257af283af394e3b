// Private: runs a device session through pooled IoBindings, ordered with a caller's CUDA stream by events.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "cuda/cuda_stream.hpp"
#include "session/session_context.hpp"

namespace aitune::detail {

/// Runs of a CUDA or TensorRT session without CUDA graphs. Safe to call from several
/// threads at once: each call takes a binding of its own from the pool.
class IoBindingRunner {
 public:
  explicit IoBindingRunner(const SessionContext& context) : ctx_(context) {}
  /// Inputs (checked, on the session's device) bound without copies; outputs allocated
  /// by ORT and handed to the caller. With `caller`, ordered with that stream and
  /// returning without a host wait (see OnnxSession::infer_on_stream).
  std::vector<Tensor> run(const std::vector<TensorView>& views, std::optional<std::uintptr_t> caller);

 private:
  // IoBindings reused across calls: ORT plans device copies per binding, and a fresh
  // binding per call costs that planning every time. One per concurrent caller.
  struct PooledBinding {
    explicit PooledBinding(Ort::Session& session) : binding(session) {}
    Ort::IoBinding binding;
    // What each input was last bound to: a call with the same pointer, dtype and shape
    // skips re-binding it (the common case of a caller reusing its input buffers).
    std::vector<TensorView> last_inputs;
    std::vector<Ort::Value> input_values;
    std::unique_ptr<StreamEvent> before, after;  // ordering with the caller's stream
  };
  std::unique_ptr<PooledBinding> take();
  void give_back(std::unique_ptr<PooledBinding> pooled);

  const SessionContext& ctx_;
  std::mutex pool_mutex_;
  std::vector<std::unique_ptr<PooledBinding>> pool_;
};

}  // namespace aitune::detail
