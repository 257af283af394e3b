// The maximum batch size search on the winner of a tune: powers of two above the largest
// recorded batch until the throughput gain falls below a minimum, checked at the maximum.
#include <algorithm>
#include <cstring>
#include <new>

#include "tuning/tuner_impl.hpp"

namespace aitune {
using namespace detail;

Tensor tile_along_axis(const TensorView& tensor, int axis, int64_t factor) {
  if (tensor.device.kind != DeviceKind::kCPU || !tensor.is_contiguous())
    throw Error(ErrorCode::kInvalidArgument, "tile_along_axis needs a contiguous host tensor");
  if (axis < 0 || static_cast<std::size_t>(axis) >= tensor.shape.size() || factor < 1)
    throw Error(ErrorCode::kInvalidArgument, "tile_along_axis: axis " + std::to_string(axis) + " / factor " +
                                                 std::to_string(factor) + " invalid for shape " +
                                                 shape_to_string(tensor.shape));
  Shape shape = tensor.shape;
  shape[static_cast<std::size_t>(axis)] *= factor;
  Tensor out = Tensor::empty_host(tensor.dtype, shape);
  std::size_t outer = 1, inner = dtype_size(tensor.dtype);
  for (std::size_t i = 0; i < tensor.shape.size(); ++i)
    (static_cast<int>(i) < axis ? outer : inner) *= static_cast<std::size_t>(tensor.shape[i]);
  const auto* src = static_cast<const char*>(tensor.data);
  auto* dst = static_cast<char*>(out.data());
  for (std::size_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < factor; ++k, dst += inner) std::memcpy(dst, src + o * inner, inner);
  return out;
}

void GraphTuner::Impl::search_batch(std::size_t index) {
  BatchSearchResult result;
  const auto& sample = samples[profile_sample];
  result.recorded_max_batch = sample.batch_size;
  result.max_batch = sample.batch_size;
  const auto& map = input_maps[index];
  const GraphSpec model_spec = spec_for(map);
  bool has_batch = std::any_of(model_spec.inputs.begin(), model_spec.inputs.end(),
                               [](const TensorSpec& t) { return t.batch_axis; });
  if (!has_batch) {
    result.stop_reason = "the graph has no batch axis (record at least two batch sizes)";
    result.correctness = "not run";
    report.batch_search = result;
    return;
  }
  // A batch maximum above the profile sample's (the largest recorded) was declared by the
  // user (ait.Module's dynamic_shapes): the search stays within it. An unbounded one
  // (kUnbounded) needs no widening, only the search for the best batch.
  int64_t declared_max = 0;
  for (const auto& t : model_spec.inputs)
    if (t.batch_axis) {
      const int64_t m = t.max_shape[static_cast<std::size_t>(*t.batch_axis)];
      if (m != kUnbounded && m > sample.batch_size) declared_max = declared_max ? std::min(declared_max, m) : m;
    }
  const auto& candidate = report.candidates[index];
  const auto& original = *backends[index];
  OnnxSessionConfig config = original.config();
  GraphSpec open = model_spec;
  for (auto* tensors : {&open.inputs, &open.outputs})
    for (auto& t : *tensors)
      if (t.batch_axis) t.max_shape[static_cast<std::size_t>(*t.batch_axis)] = kUnbounded;

  auto search_start = SteadyTime::now();
  std::unique_ptr<OnnxSession> wide;
  std::vector<Tensor> host_inputs;
  try {
    wide = OnnxSession::create(model_paths[index], config, open);
    for (const auto& v : select(sample.inputs, map)) host_inputs.push_back(original.to_host(borrowed(v)));
  } catch (const Error& e) {
    result.stop_reason = std::string("could not open the model with an unbounded batch: ") + e.what();
    result.correctness = "not run";
    report.batch_search = result;
    return;
  }
  auto tiled_inputs = [&](int64_t factor) {
    std::vector<Tensor> out;
    for (std::size_t i = 0; i < host_inputs.size(); ++i) {
      const auto& axis = model_spec.inputs[i].batch_axis;
      Tensor host = axis ? tile_along_axis(host_inputs[i].view(), *axis, factor) : host_inputs[i];
      out.push_back(wide->to_device(host));
    }
    return out;
  };
  auto timer = timer_for(*wide);
  double previous = candidate.profile->throughput;
  ProfileConfig quick = options.profile;
  for (int64_t batch = sample.batch_size * 2;; batch *= 2) {
    if (batch > options.batch_search.max_batch_size) {
      result.stop_reason = "reached the limit of " + std::to_string(options.batch_search.max_batch_size);
      break;
    }
    if (declared_max && batch > declared_max) {
      result.stop_reason = "reached the declared batch maximum " + std::to_string(declared_max);
      break;
    }
    if (ms_since(search_start) / 1e3 > options.batch_search.time_cap_s) {
      result.stop_reason = "time cap of the search reached";
      break;
    }
    BatchSearchResult::Step step;
    step.batch_size = batch;
    try {
      auto inputs = tiled_inputs(batch / sample.batch_size);
      auto views = views_of(inputs);
      auto profile = profile_calls([&] { wide->infer(views); }, batch, quick, timer.get());
      step.throughput = profile.throughput;
      step.p50_us = profile.host_us.p50;
      step.p99_us = profile.host_us.p99;
    } catch (const Error& e) {
      step.error = e.what();
      result.steps.push_back(step);
      // The code says why: kOutOfMemory is set where ORT's or CUDA's allocation failed.
      result.stop_reason = (e.code() == ErrorCode::kOutOfMemory ? "out of memory at batch " : "failed at batch ") +
                           std::to_string(batch);
      break;
    } catch (const std::bad_alloc&) {
      step.error = "std::bad_alloc";
      result.steps.push_back(step);
      result.stop_reason = "out of memory at batch " + std::to_string(batch);
      break;
    }
    result.steps.push_back(step);
    result.max_batch = batch;
    double gain = previous > 0 ? step.throughput / previous - 1 : 1;
    log("batch " + std::to_string(batch) + ": " + std::to_string(step.throughput) + " samples/s (gain " + pct(gain) +
        ")");
    if (gain < options.batch_search.min_gain) {
      result.stop_reason = "throughput gain " + pct(gain) + " < " + pct(options.batch_search.min_gain) +
                           " at batch " + std::to_string(batch);
      break;
    }
    previous = step.throughput;
  }

  // The widened range is only handed out once outputs at its maximum are right: the
  // profile sample tiled to max_batch against the reference run on it (reference_at), or
  // without one against its expected outputs tiled the same way.
  result.correctness = "not needed";
  if (result.max_batch > sample.batch_size) {
    try {
      int64_t factor = result.max_batch / sample.batch_size;
      auto inputs = tiled_inputs(factor);
      auto outputs = host_outputs(*wide, wide->infer(views_of(inputs)));
      std::vector<Tensor> expected;
      if (options.reference_at) {
        // The reference itself at the widened batch: a forward that branches on the batch
        // size (`if x.shape[0] > 2`) computes otherwise there, which tiling would not show.
        std::vector<Tensor> graph_inputs;
        for (std::size_t i = 0; i < spec.inputs.size(); ++i) {
          const auto& axis = spec.inputs[i].batch_axis;
          Tensor host = original.to_host(borrowed(sample.inputs[i]));
          graph_inputs.push_back(axis ? tile_along_axis(host.view(), *axis, factor) : host);
        }
        std::string reason;
        auto reference = options.reference_at(views_of(graph_inputs), reason);
        if (!reference)
          throw Error(ErrorCode::kInvalidArgument, "the reference could not run batch " +
                                                       std::to_string(result.max_batch) + " to check it: " + reason);
        if (reference->size() != spec.outputs.size())
          throw Error(ErrorCode::kInvalidArgument, "the reference gave " + std::to_string(reference->size()) +
                                                       " outputs at batch " + std::to_string(result.max_batch) +
                                                       ", the graph " + std::to_string(spec.outputs.size()));
        expected = std::move(*reference);
      } else {
        for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
          const auto& axis = spec.outputs[o].batch_axis;
          expected.push_back(axis ? tile_along_axis(sample.expected[o], *axis, factor) : borrowed(sample.expected[o]));
        }
      }
      CorrectnessReport tiled;
      tiled.samples.push_back(compare_sample("batch " + std::to_string(result.max_batch), output_names,
                                             views_of(outputs), views_of(expected), tolerances_for(candidate.precision)));
      calibrate_where_due(tiled, candidate.precision, profile_sample);
      const auto& check = tiled.samples.front();
      if (check.passed()) {
        GraphSpec widened = model_spec;
        for (auto* tensors : {&widened.inputs, &widened.outputs})
          for (auto& t : *tensors)
            if (t.batch_axis) {
              auto& max = t.max_shape[static_cast<std::size_t>(*t.batch_axis)];
              // declared ranges (unbounded, or above the recorded batch) already hold max_batch
              if (max != kUnbounded && max <= sample.batch_size) max = max / sample.batch_size * result.max_batch;
            }
        wide.reset();
        winner = OnnxSession::create(model_paths[index], config, widened);
        result.correctness = "passed";
      } else {
        for (const auto& o : check.outputs)
          if (!o.passed) result.correctness = o.name + ": " + o.failure;
        result.max_batch = sample.batch_size;
      }
    } catch (const Error& e) {
      result.correctness = std::string("failed: ") + e.what();
      result.max_batch = sample.batch_size;
    }
  }
  log("max batch size " + std::to_string(result.max_batch) + " (" + result.stop_reason + ")");
  report.batch_search = result;
}

}  // namespace aitune
