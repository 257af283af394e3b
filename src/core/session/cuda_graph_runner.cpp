// CudaGraphRunner: CUDA-graph replays per input shape, with lent output lanes and copies out.
#include "session/cuda_graph_runner.hpp"

#include <string>

#include "aitune/error.hpp"

namespace aitune::detail {

Tensor CudaGraphRunner::stream_buffer(DType dtype, const Shape& shape) const {
  return stream_buffer_tensor(dtype, shape, ctx_.device, ctx_.stream, ctx_.session);
}

Tensor CudaGraphRunner::ready_buffer(DType dtype, const Shape& shape) {
  const auto& rt = require_cuda_runtime("CUDA graphs");
  std::lock_guard lock(mutex_);
  Tensor buffer = stream_buffer(dtype, shape);
  cuda_check(rt.stream_synchronize(reinterpret_cast<cudaStream_t>(ctx_.stream)), "cudaStreamSynchronize");
  return buffer;
}

CudaGraphRunner::SlotKey CudaGraphRunner::slot_key(const std::vector<TensorView>& views,
                                                   const std::vector<bool>& updated_in_place) {
  SlotKey key;
  key.first.reserve(views.size());
  for (std::size_t i = 0; i < views.size(); ++i) {
    key.first.push_back(views[i].shape);
    if (i < updated_in_place.size() && updated_in_place[i])
      key.second.push_back(reinterpret_cast<std::uintptr_t>(views[i].data));
  }
  return key;
}

std::vector<Tensor> CudaGraphRunner::copy_out(const std::vector<Ort::Value>& values,
                                              const std::vector<TensorView>& views) const {
  const auto& rt = cuda_runtime();
  auto on_stream = reinterpret_cast<cudaStream_t>(ctx_.stream);
  std::vector<Tensor> copies;
  copies.reserve(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (const int input = ctx_.output_aliases[i]; input >= 0) {  // written into the caller's buffer
      copies.push_back(ctx_.caller_buffer(views[static_cast<std::size_t>(input)]));
      continue;
    }
    copies.push_back(stream_buffer(ctx_.outputs[i].dtype, values[i].GetTensorTypeAndShapeInfo().GetShape()));
    cuda_check(rt.memcpy_async(copies.back().data(), values[i].GetTensorRawData(), copies.back().nbytes(),
                               kCudaMemcpyDeviceToDevice, on_stream),
               "copying a CUDA graph's output");
  }
  return copies;
}

std::unique_ptr<CudaGraphRunner::Lane> CudaGraphRunner::make_lane(const std::vector<TensorView>& views, int id,
                                                                  const std::vector<Shape>& output_shapes) const {
  auto lane = std::make_unique<Lane>(*ctx_.session);
  for (std::size_t i = 0; i < views.size(); ++i) {
    // An input updated in place is the caller's own buffer (its address is in the slot's key).
    lane->inputs.push_back(ctx_.updated_in_place[i] ? ctx_.caller_buffer(views[i])
                                                    : stream_buffer(views[i].dtype, views[i].shape));
    lane->bound.push_back(value_over(lane->inputs.back().view(), ctx_.memory_info));
    lane->binding.BindInput(ctx_.input_names[i], lane->bound.back());
  }
  // Bound once and never cleared: the captured graph writes there on every replay.
  for (std::size_t i = 0; i < ctx_.outputs.size(); ++i) {
    if (const int input = ctx_.output_aliases[i]; input >= 0) {  // into the caller's buffer
      const auto& into = lane->inputs[static_cast<std::size_t>(input)];
      if (!output_shapes.empty()) lane->outputs.push_back(into);  // keeps lane->outputs in output order
      lane->bound.push_back(value_over(into.view(), ctx_.memory_info));
      lane->binding.BindOutput(ctx_.output_names[i], lane->bound.back());
      continue;
    }
    if (output_shapes.empty()) {
      lane->binding.BindOutput(ctx_.output_names[i], Ort::ConstMemoryInfo(ctx_.memory_info));
      continue;
    }
    lane->outputs.push_back(stream_buffer(ctx_.outputs[i].dtype, output_shapes[i]));
    lane->bound.push_back(value_over(lane->outputs.back().view(), ctx_.memory_info));
    lane->binding.BindOutput(ctx_.output_names[i], lane->bound.back());
  }
  lane->run = quiet_run_options();
  lane->run.AddConfigEntry("gpu_graph_id", std::to_string(id).c_str());
  lane->run.AddConfigEntry("disable_synchronize_execution_providers", "1");
  return lane;
}

CudaGraphRunner::Lane* CudaGraphRunner::pick_lane(Slot& slot, const std::vector<TensorView>& views) {
  if (slot.output_shapes.empty()) return slot.copy_lane.get();
  for (auto& lent : slot.lent_lanes)
    if (lent->lease.expired()) return lent.get();
  if (slot.lent_lanes.size() < kLentLanes) {
    const int id = slot.first_graph_id + 1 + static_cast<int>(slot.lent_lanes.size());
    slot.lent_lanes.push_back(make_lane(views, id, slot.output_shapes));
    return slot.lent_lanes.back().get();
  }
  return slot.copy_lane.get();
}

std::vector<Tensor> CudaGraphRunner::run_uncaptured(const std::vector<TensorView>& views) {
  // gpu_graph_id -1 tells ORT not to capture this run.
  Ort::IoBinding binding(*ctx_.session);
  std::vector<Ort::Value> values;
  for (std::size_t i = 0; i < views.size(); ++i) {
    values.push_back(value_over(views[i], ctx_.memory_info));
    binding.BindInput(ctx_.input_names[i], values.back());
  }
  std::vector<Ort::Value> aliased = ctx_.aliased_outputs(views);
  for (std::size_t i = 0; i < aliased.size(); ++i) {
    if (ctx_.output_aliases[i] >= 0) binding.BindOutput(ctx_.output_names[i], aliased[i]);
    else binding.BindOutput(ctx_.output_names[i], Ort::ConstMemoryInfo(ctx_.memory_info));
  }
  Ort::RunOptions run = quiet_run_options();
  run.AddConfigEntry("gpu_graph_id", "-1");
  ctx_.session->Run(run, binding);  // synchronises the session's stream
  // ORT allocated these in the arena, where captured graphs' activations may live.
  return copy_out(binding.GetOutputValues(), views);
}

void CudaGraphRunner::run_lane(Lane& lane, const std::vector<TensorView>& views) {
  try {
    ctx_.session->Run(lane.run, lane.binding);  // a lane's first calls run, then ORT captures
  } catch (const Ort::Exception& e) {
    const bool left_open = abandon_capture(ctx_.stream);
    std::string shapes;
    for (const auto& v : views) shapes += (shapes.empty() ? "" : ", ") + shape_to_string(v.shape);
    broken_ = "CUDA graph capture or replay of '" + ctx_.model_path + "' failed for input shapes " + shapes + ": " +
              e.what() + (left_open ? " (the capture it left open on the session's stream was ended and dropped)" : "");
    const ErrorCode code = ort_failure_code(e, ErrorCode::kCudaGraphCapture);
    throw Error(code == ErrorCode::kOutOfMemory ? code : ErrorCode::kCudaGraphCapture, *broken_);
  }
}

std::vector<Tensor> CudaGraphRunner::run(const std::vector<TensorView>& views, std::optional<std::uintptr_t> caller) {
  const auto& rt = require_cuda_runtime("CUDA graphs");
  auto on_stream = reinterpret_cast<cudaStream_t>(ctx_.stream);
  const bool ordered = ctx_.needs_events(caller);
  // Without a caller's stream the outputs are ready on return; with one, the caller orders.
  auto finish = [&](std::vector<Tensor> results, StreamEvent& after) {
    if (ordered) after.order(ctx_.stream, *caller);
    if (!caller) cuda_check(rt.stream_synchronize(on_stream), "cudaStreamSynchronize");
    return results;
  };
  const SlotKey key = slot_key(views, ctx_.updated_in_place);
  std::lock_guard lock(mutex_);
  if (broken_)
    throw Error(ErrorCode::kCudaGraphCapture, "an earlier call broke this session: " + *broken_ +
                                                  "; deactivate() and activate() recreate the session");
  // Only ORT captures on the session's stream, inside run_lane; a capture still open here
  // was left by a failure that escaped it, and would swallow this call's work.
  if (abandon_capture(ctx_.stream)) {
    broken_ = "the CUDA stream of '" + ctx_.model_path + "' was left capturing a graph (that capture was ended and dropped)";
    throw Error(ErrorCode::kCudaGraphCapture, *broken_ + "; deactivate() and activate() recreate the session");
  }
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    if (slots_.size() >= kMaxGraphShapes) {
      StreamEvent before, after;
      if (ordered) before.order(*caller, ctx_.stream);
      return finish(run_uncaptured(views), after);
    }
    auto slot = std::make_unique<Slot>();
    // ORT graph ids start at 1 (0 is its default id, -1 means "do not capture").
    slot->first_graph_id = static_cast<int>(slots_.size() * (1 + kLentLanes)) + 1;
    slot->copy_lane = make_lane(views, slot->first_graph_id, {});
    it = slots_.emplace(key, std::move(slot)).first;
  }
  Slot& slot = *it->second;
  Lane* lane = pick_lane(slot, views);
  if (ordered) slot.before.order(*caller, ctx_.stream);
  for (std::size_t i = 0; i < views.size(); ++i)
    if (!ctx_.updated_in_place[i])  // bound as the caller's own buffer: nothing to copy
      cuda_check(rt.memcpy_async(lane->inputs[i].data(), views[i].data, views[i].nbytes(),
                                 kCudaMemcpyDeviceToDevice, on_stream),
                 "copying an input into the CUDA graph's buffer");
  run_lane(*lane, views);
  if (lane == slot.copy_lane.get()) {
    // The copy lane's outputs are overwritten by its next replay: the caller gets copies.
    auto values = lane->binding.GetOutputValues();
    if (slot.output_shapes.empty())
      for (const auto& v : values) slot.output_shapes.push_back(v.GetTensorTypeAndShapeInfo().GetShape());
    return finish(copy_out(values, views), slot.after);
  }
  // Every tensor handed out shares one lease, which also keeps the buffers alive should
  // the runner go first (deactivate).
  auto lease = std::make_shared<std::vector<Tensor>>(lane->outputs);
  lane->lease = lease;
  std::vector<Tensor> lent;
  lent.reserve(lane->outputs.size());
  // An output written into the caller's buffer is not the lane's to lend: it holds no
  // lease (the caller keeps its cache for good, which would hold the lane for good).
  for (std::size_t i = 0; i < lane->outputs.size(); ++i)
    lent.push_back(ctx_.output_aliases[i] >= 0 ? lane->outputs[i] : Tensor::adopt(lane->outputs[i].view(), lease));
  return finish(std::move(lent), slot.after);
}

}  // namespace aitune::detail
