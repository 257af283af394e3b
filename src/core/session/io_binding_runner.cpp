// IoBindingRunner: device runs through pooled IoBindings, ordered with a caller's CUDA stream.
#include "session/io_binding_runner.hpp"

namespace aitune::detail {

std::unique_ptr<IoBindingRunner::PooledBinding> IoBindingRunner::take() {
  {
    std::lock_guard lock(pool_mutex_);
    if (!pool_.empty()) {
      auto pooled = std::move(pool_.back());
      pool_.pop_back();
      return pooled;
    }
  }
  auto pooled = std::make_unique<PooledBinding>(*ctx_.session);
  pooled->last_inputs.resize(ctx_.inputs.size());
  pooled->input_values.resize(ctx_.inputs.size());
  return pooled;
}

void IoBindingRunner::give_back(std::unique_ptr<PooledBinding> pooled) {
  std::lock_guard lock(pool_mutex_);
  pool_.push_back(std::move(pooled));
}

std::vector<Tensor> IoBindingRunner::run(const std::vector<TensorView>& views, std::optional<std::uintptr_t> caller) {
  auto pooled = take();
  Ort::IoBinding& binding = pooled->binding;
  Ort::ConstMemoryInfo mem(ctx_.memory_info);
  for (std::size_t i = 0; i < views.size(); ++i) {
    const auto& v = views[i];
    auto& last = pooled->last_inputs[i];
    if (last.data == v.data && last.dtype == v.dtype && last.shape == v.shape) continue;
    pooled->input_values[i] = value_over(v, ctx_.memory_info);
    binding.BindInput(ctx_.input_names[i], pooled->input_values[i]);
    last = TensorView{v.data, v.dtype, v.shape, {}, v.device};
  }
  // Outputs are bound afresh each call, so ORT allocates new ones: tensors returned by
  // earlier calls stay the caller's. An output written into an input (output_aliases) is
  // bound to that input's buffer: ORT writes it there, with no allocation and no copy of
  // the input (a KV cache updated in place).
  std::vector<Ort::Value> aliased = ctx_.aliased_outputs(views);
  for (std::size_t i = 0; i < aliased.size(); ++i) {
    if (ctx_.output_aliases[i] >= 0) binding.BindOutput(ctx_.output_names[i], aliased[i]);
    else binding.BindOutput(ctx_.output_names[i], mem);
  }
  const bool ordered = ctx_.needs_events(caller);
  if (ordered) {
    if (!pooled->before) pooled->before = std::make_unique<StreamEvent>(), pooled->after = std::make_unique<StreamEvent>();
    pooled->before->order(*caller, ctx_.stream);  // inputs the caller is still producing
  } else if (caller && ctx_.stream == 0) {
    // A session on a stream of ORT's own (TensorRT): the host waits for the caller's work.
    const auto& rt = require_cuda_runtime("ordering with the caller's CUDA stream");
    cuda_check(rt.stream_synchronize(reinterpret_cast<cudaStream_t>(*caller)), "cudaStreamSynchronize");
  }
  // Ordered calls return without waiting for the device: the caller's stream waits instead.
  ctx_.session->Run(caller && ctx_.stream != 0 ? ctx_.run_async : ctx_.run_default, binding);
  if (ordered) pooled->after->order(ctx_.stream, *caller);
  auto values = binding.GetOutputValues();
  binding.ClearBoundOutputs();  // the outputs now belong to the caller alone
  give_back(std::move(pooled));
  return ctx_.adopt_outputs(std::move(values));
}

}  // namespace aitune::detail
