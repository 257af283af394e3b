// The tuning engine for one graph: candidates are created, checked, profiled, chosen.
#include "aitune/tuner.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "aitune/cuda_timer.hpp"
#include "aitune/error.hpp"

namespace aitune {
namespace {

using SteadyTime = std::chrono::steady_clock;

double ms_since(SteadyTime::time_point start) {
  return std::chrono::duration<double, std::milli>(SteadyTime::now() - start).count();
}

// A Tensor over memory the caller owns (the views of TuneSample), so that ORT's copy
// helpers, which take Tensors, can read it.
Tensor borrowed(const TensorView& view) { return Tensor::adopt(view, std::make_shared<int>(0)); }

// The looser of two precisions: strict < TF32 < FP16.
Precision looser(Precision a, Precision b) { return static_cast<int>(a) > static_cast<int>(b) ? a : b; }

std::string pct(double fraction) {
  std::ostringstream out;
  out.precision(3);
  out << fraction * 100 << " %";
  return out.str();
}

// Sample inputs on `backend`'s device: views of the caller's memory where it already
// is there, copies made by ORT's data transfer for host inputs.
struct DeviceInputs {
  std::vector<Tensor> copies;
  std::vector<TensorView> views;
};

DeviceInputs inputs_on(const OnnxRuntimeBackend& backend, const std::vector<TensorView>& inputs,
                       const GraphSpec& spec) {
  DeviceInputs out;
  out.copies.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto& v = inputs[i];
    if (v.device == backend.device()) {
      out.views.push_back(v);
    } else if (v.device.kind == DeviceKind::kCPU) {
      out.copies.push_back(backend.to_device(borrowed(v)));
      out.views.push_back(out.copies.back().view());
    } else {
      throw Error(ErrorCode::kInvalidArgument, "sample input '" + spec.inputs[i].name + "' is on " +
                                                   v.device.to_string() + ", but the candidate runs on " +
                                                   backend.device().to_string());
    }
  }
  return out;
}

std::vector<Tensor> host_outputs(const OnnxRuntimeBackend& backend, const std::vector<Tensor>& outputs) {
  std::vector<Tensor> host;
  host.reserve(outputs.size());
  for (const auto& t : outputs) host.push_back(backend.to_host(t));
  return host;
}

std::vector<TensorView> views_of(const std::vector<Tensor>& tensors) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const auto& t : tensors) views.push_back(t.view());
  return views;
}

}  // namespace

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

std::string candidate_name(const OnnxRuntimeBackendConfig& config) {
  std::string name(execution_provider_name(config.provider));
  std::vector<std::string> parts;
  for (const auto& [k, v] : config.provider_options)
    if (k != "user_compute_stream" && k != "has_user_compute_stream") parts.push_back(k + "=" + v);
  if (config.intra_op_threads) parts.push_back("intra_op_threads=" + std::to_string(config.intra_op_threads));
  if (config.inter_op_threads) parts.push_back("inter_op_threads=" + std::to_string(config.inter_op_threads));
  if (config.graph_optimization_level != GraphOptimizationLevel::kAll)
    parts.push_back("graph_optimization_level=" +
                    std::string(graph_optimization_level_name(config.graph_optimization_level)));
  if (parts.empty()) return name;
  name += "[";
  for (std::size_t i = 0; i < parts.size(); ++i) name += (i ? "," : "") + parts[i];
  return name + "]";
}

std::vector<OnnxCandidate> provider_variants(const OnnxRuntimeBackendConfig& base, const GraphSpec& spec) {
  std::vector<OnnxCandidate> out;
  // A variant sets options the caller left open; what the caller fixed stays fixed.
  auto add = [&](std::map<std::string, std::string> options, Precision precision,
                 std::optional<int> threads = std::nullopt,
                 std::optional<GraphOptimizationLevel> level = std::nullopt) {
    OnnxRuntimeBackendConfig c = base;
    for (auto& [k, v] : options) c.provider_options.emplace(k, v);
    if (threads && base.intra_op_threads == 0) c.intra_op_threads = *threads;
    if (level && base.graph_optimization_level == GraphOptimizationLevel::kAll) c.graph_optimization_level = *level;
    for (const auto& existing : out)
      if (existing.config == c) return;  // the caller's fixed options made it a duplicate
    // A caller-fixed use_tf32 / trt_fp16_enable decides the precision, not the variant.
    if (auto it = c.provider_options.find("use_tf32"); it != c.provider_options.end())
      precision = it->second == "0" ? Precision::kStrict : Precision::kTF32;
    if (auto it = c.provider_options.find("trt_fp16_enable"); it != c.provider_options.end())
      precision = it->second == "1" || it->second == "true" ? Precision::kFP16 : Precision::kStrict;
    out.push_back({candidate_name(c), c, precision});
  };
  switch (base.provider) {
    case ExecutionProvider::kCPU:
      add({}, Precision::kStrict);
      add({}, Precision::kStrict, 1);
      add({}, Precision::kStrict, std::nullopt, GraphOptimizationLevel::kExtended);
      break;
    case ExecutionProvider::kCUDA:
      // The CUDA EP defaults to TF32 matmuls and convolutions; eager fp32 does not.
      add({{"use_tf32", "0"}}, Precision::kStrict);
      add({{"use_tf32", "0"}, {"cudnn_conv_algo_search", "HEURISTIC"}}, Precision::kStrict);
      add({{"use_tf32", "0"}, {"prefer_nhwc", "1"}}, Precision::kStrict);
      add({{"use_tf32", "1"}}, Precision::kTF32);
      // CUDA graphs for static shapes: one replay instead of a launch per kernel, what
      // small models at batch 1 are bound by. (Dynamic specs would capture a graph per
      // shape seen.) ORT refuses capture for models it cannot capture: the candidate
      // then fails with ORT's reason and the others are chosen from.
      if (std::all_of(spec.inputs.begin(), spec.inputs.end(),
                      [](const TensorSpec& t) { return t.min_shape == t.max_shape; })) {
        add({{"use_tf32", "0"}, {"enable_cuda_graph", "1"}}, Precision::kStrict);
        add({{"use_tf32", "1"}, {"enable_cuda_graph", "1"}}, Precision::kTF32);
      }
      break;
    case ExecutionProvider::kTensorRT:
      add({{"trt_fp16_enable", "0"}}, Precision::kStrict);
      add({{"trt_fp16_enable", "1"}}, Precision::kFP16);
      add({{"trt_fp16_enable", "1"}, {"trt_builder_optimization_level", "5"}}, Precision::kFP16);
      break;
  }
  return out;
}

struct GraphTuner::Impl {
  GraphSpec spec;
  std::vector<TuneSample> samples;
  TunerOptions options;
  TuneReport report;
  std::vector<std::string> output_names;
  std::size_t profile_sample = 0;  // largest batch
  std::vector<std::unique_ptr<OnnxRuntimeBackend>> backends;  // per candidate; null unless passed
  std::vector<std::string> model_paths;
  std::vector<std::vector<std::size_t>> input_maps;  // per candidate: model input i <- graph input map[i]
  std::unique_ptr<OnnxRuntimeBackend> winner;
  SteadyTime::time_point started = SteadyTime::now();

  void log(const std::string& line) const {
    if (options.log) options.log(report.graph + ": " + line);
  }

  std::size_t push(CandidateResult r, std::unique_ptr<OnnxRuntimeBackend> backend, std::string model_path,
                   std::vector<std::size_t> input_map = {}) {
    report.candidates.push_back(std::move(r));
    backends.push_back(std::move(backend));
    model_paths.push_back(std::move(model_path));
    input_maps.push_back(std::move(input_map));
    report.tuning_s = ms_since(started) / 1e3;
    return report.candidates.size() - 1;
  }

  // Device time of a session's calls, by events on the stream it runs on.
  static std::unique_ptr<DeviceTimer> timer_for(const OnnxRuntimeBackend& backend) {
    if (backend.config().provider != ExecutionProvider::kCUDA || backend.cuda_stream() == 0) return nullptr;
    return make_cuda_event_timer(backend.cuda_stream(), backend.config().device_id);
  }

  // The graph's spec / a sample's inputs as the model with `map` sees them.
  GraphSpec spec_for(const std::vector<std::size_t>& map) const {
    GraphSpec s = spec;
    s.inputs.clear();
    for (auto i : map) s.inputs.push_back(spec.inputs.at(i));
    return s;
  }
  static std::vector<TensorView> select(const std::vector<TensorView>& inputs, const std::vector<std::size_t>& map) {
    std::vector<TensorView> out;
    for (auto i : map) out.push_back(inputs.at(i));
    return out;
  }

  // The user's overrides, with defaults for the looser of the candidate's and the
  // reference's precision.
  ToleranceSpec tolerances_for(Precision precision) const {
    ToleranceSpec tolerances = options.tolerances;
    tolerances.precision = looser(precision, options.reference_precision);
    return tolerances;
  }

  CorrectnessReport check(const OnnxRuntimeBackend& backend, Precision precision,
                          const std::vector<std::size_t>& map) const {
    const ToleranceSpec tolerances = tolerances_for(precision);
    CorrectnessReport report_;
    for (std::size_t i = 0; i < samples.size(); ++i) {
      auto inputs = inputs_on(backend, select(samples[i].inputs, map), backend.graph_spec());
      auto outputs = host_outputs(backend, backend.infer(inputs.views));
      report_.samples.push_back(compare_sample(
          "sample " + std::to_string(i) + " (batch " + std::to_string(samples[i].batch_size) + ")", output_names,
          views_of(outputs), samples[i].expected, tolerances));
    }
    return report_;
  }

  void search_batch(std::size_t index);
};

GraphTuner::GraphTuner(std::string graph, GraphSpec spec, std::vector<TuneSample> samples, TunerOptions options)
    : impl_(std::make_unique<Impl>()) {
  options.profile.validate();
  if (samples.empty()) throw Error(ErrorCode::kInvalidArgument, graph + ": tuning needs at least one sample");
  for (std::size_t s = 0; s < samples.size(); ++s) {
    const auto& sample = samples[s];
    auto where = graph + ": sample " + std::to_string(s);
    if (sample.inputs.size() != spec.inputs.size() || sample.expected.size() != spec.outputs.size())
      throw Error(ErrorCode::kInvalidArgument,
                  where + " has " + std::to_string(sample.inputs.size()) + " inputs and " +
                      std::to_string(sample.expected.size()) + " expected outputs; the graph has " +
                      std::to_string(spec.inputs.size()) + " and " + std::to_string(spec.outputs.size()));
    for (std::size_t i = 0; i < spec.inputs.size(); ++i) {
      const auto& t = spec.inputs[i];
      if (sample.inputs[i].dtype != t.dtype)
        throw Error(ErrorCode::kDTypeMismatch, where + ": input '" + t.name + "' is " +
                                                   std::string(dtype_name(sample.inputs[i].dtype)) + ", expected " +
                                                   std::string(dtype_name(t.dtype)));
      if (!t.accepts(sample.inputs[i].shape))
        throw Error(ErrorCode::kShapeMismatch, where + ": input '" + t.name + "' has shape " +
                                                   shape_to_string(sample.inputs[i].shape) + ", outside " +
                                                   t.to_string());
    }
    for (std::size_t o = 0; o < spec.outputs.size(); ++o)
      if (sample.expected[o].device.kind != DeviceKind::kCPU)
        throw Error(ErrorCode::kInvalidArgument, where + ": expected output '" + spec.outputs[o].name +
                                                     "' must be in host memory, it is on " +
                                                     sample.expected[o].device.to_string());
    if (sample.batch_size < 1) throw Error(ErrorCode::kInvalidArgument, where + ": batch_size must be >= 1");
  }
  for (const auto& o : spec.outputs) impl_->output_names.push_back(o.name);
  for (std::size_t s = 1; s < samples.size(); ++s)
    if (samples[s].batch_size > samples[impl_->profile_sample].batch_size) impl_->profile_sample = s;
  impl_->report.graph = std::move(graph);
  impl_->spec = std::move(spec);
  impl_->samples = std::move(samples);
  impl_->options = std::move(options);
}

GraphTuner::~GraphTuner() = default;

const TuneReport& GraphTuner::report() const noexcept { return impl_->report; }
const GraphSpec& GraphTuner::spec() const noexcept { return impl_->spec; }

void GraphTuner::profile_reference(const std::function<void(const std::vector<TensorView>&)>& run,
                                   const std::string& label) {
  const auto& sample = impl_->samples[impl_->profile_sample];
  std::unique_ptr<DeviceTimer> timer;
  if (impl_->options.cuda_stream && !sample.inputs.empty() && sample.inputs.front().device.kind == DeviceKind::kCUDA)
    timer = make_cuda_event_timer(*impl_->options.cuda_stream, sample.inputs.front().device.index);
  impl_->report.eager_label = label;
  impl_->report.eager =
      profile_calls([&] { run(sample.inputs); }, sample.batch_size, impl_->options.profile, timer.get());
  impl_->log(label + ": p50 " + std::to_string(impl_->report.eager->host_us.p50) + " us");
}

std::size_t GraphTuner::add_failed(const std::string& name, const std::string& backend, int group,
                                   const std::string& reason) {
  CandidateResult r;
  r.name = name;
  r.backend = backend;
  r.group = group;
  r.status = CandidateStatus::kFailed;
  r.reason = reason;
  impl_->log(name + ": failed: " + reason);
  return impl_->push(std::move(r), nullptr, "");
}

std::size_t GraphTuner::evaluate_onnx(const std::string& model_path, const OnnxCandidate& candidate,
                                      const std::string& backend_name, int group,
                                      const std::vector<std::size_t>& model_inputs) {
  auto& impl = *impl_;
  std::vector<std::size_t> map = model_inputs;
  if (map.empty())
    for (std::size_t i = 0; i < impl.spec.inputs.size(); ++i) map.push_back(i);
  for (auto i : map)
    if (i >= impl.spec.inputs.size())
      throw Error(ErrorCode::kInvalidArgument, impl.report.graph + ": model input index " + std::to_string(i) +
                                                   " is out of range; the graph has " +
                                                   std::to_string(impl.spec.inputs.size()) + " inputs");
  const GraphSpec model_spec = impl.spec_for(map);
  CandidateResult r;
  r.name = candidate.name;
  r.backend = backend_name;
  r.group = group;
  r.precision = candidate.precision;
  r.transform = candidate.transform;
  r.fused_operators = candidate.fused_operators;
  OnnxRuntimeBackendConfig config = candidate.config;
  r.config_json = config.to_json(-1);
  impl.log(r.name + ": creating the session");

  std::unique_ptr<OnnxRuntimeBackend> backend;
  auto start = SteadyTime::now();
  try {
    backend = OnnxRuntimeBackend::create(model_path, config, model_spec);
  } catch (const Error& e) {
    r.status = CandidateStatus::kFailed;
    r.reason = e.what();
    impl.log(r.name + ": failed: " + r.reason);
    return impl.push(std::move(r), nullptr, model_path, map);
  }
  r.session_creation_ms = ms_since(start);
  r.config_json = backend->config().to_json(-1);

  try {
    const auto& sample = impl.samples[impl.profile_sample];
    auto inputs = inputs_on(*backend, Impl::select(sample.inputs, map), model_spec);
    start = SteadyTime::now();
    backend->infer(inputs.views);  // TensorRT builds its engines here
    r.first_run_ms = ms_since(start);

    r.correctness = impl.check(*backend, candidate.precision, map);
    if (!r.correctness->passed()) {
      r.status = CandidateStatus::kIncorrect;
      r.reason = r.correctness->first_failure();
      impl.log(r.name + ": rejected: " + r.reason);
      return impl.push(std::move(r), nullptr, model_path, map);
    }
    auto timer = Impl::timer_for(*backend);
    r.profile = profile_calls([&] { backend->infer(inputs.views); }, sample.batch_size, impl.options.profile,
                              timer.get());
  } catch (const Error& e) {
    r.status = CandidateStatus::kFailed;
    r.reason = e.what();
    impl.log(r.name + ": failed: " + r.reason);
    return impl.push(std::move(r), nullptr, model_path, map);
  }
  r.status = CandidateStatus::kPassed;
  impl.log(r.name + ": correct (max abs error " + std::to_string(r.correctness->max_abs_error()) + "), p50 " +
           std::to_string(r.profile->host_us.p50) + " us");
  return impl.push(std::move(r), std::move(backend), model_path, map);
}

std::size_t GraphTuner::evaluate_external(const ExternalCandidate& candidate, const std::string& backend_name,
                                          int group) {
  auto& impl = *impl_;
  CandidateResult r;
  r.name = candidate.name;
  r.backend = backend_name;
  r.group = group;
  r.precision = candidate.precision;
  r.config_json = candidate.config_json;
  if (!candidate.outputs || !candidate.run)
    throw Error(ErrorCode::kInvalidArgument, impl.report.graph + ": external candidate '" + candidate.name +
                                                 "' needs both an outputs and a run function");
  impl.log(r.name + ": first run");
  try {
    auto start = SteadyTime::now();
    candidate.run();  // a compiler compiles (and captures) here
    r.first_run_ms = ms_since(start);
    const ToleranceSpec tolerances = impl.tolerances_for(candidate.precision);
    CorrectnessReport correctness;
    for (std::size_t i = 0; i < impl.samples.size(); ++i) {
      auto outputs = candidate.outputs(i);
      correctness.samples.push_back(compare_sample(
          "sample " + std::to_string(i) + " (batch " + std::to_string(impl.samples[i].batch_size) + ")",
          impl.output_names, views_of(outputs), impl.samples[i].expected, tolerances));
    }
    r.correctness = std::move(correctness);
    if (!r.correctness->passed()) {
      r.status = CandidateStatus::kIncorrect;
      r.reason = r.correctness->first_failure();
      impl.log(r.name + ": rejected: " + r.reason);
      return impl.push(std::move(r), nullptr, "");
    }
    const auto& sample = impl.samples[impl.profile_sample];
    std::unique_ptr<DeviceTimer> timer;
    if (impl.options.cuda_stream && !sample.inputs.empty() && sample.inputs.front().device.kind == DeviceKind::kCUDA)
      timer = make_cuda_event_timer(*impl.options.cuda_stream, sample.inputs.front().device.index);
    r.profile = profile_calls([&] { candidate.run(); }, sample.batch_size, impl.options.profile, timer.get());
  } catch (const std::exception& e) {  // the front end's errors arrive as whatever it raised
    r.status = CandidateStatus::kFailed;
    r.reason = e.what();
    impl.log(r.name + ": failed: " + r.reason);
    return impl.push(std::move(r), nullptr, "");
  }
  r.status = CandidateStatus::kPassed;
  impl.log(r.name + ": correct (max abs error " + std::to_string(r.correctness->max_abs_error()) + "), p50 " +
           std::to_string(r.profile->host_us.p50) + " us");
  return impl.push(std::move(r), nullptr, "");
}

const TuneReport& GraphTuner::select(const StrategyConfig& strategy) {
  auto& impl = *impl_;
  impl.report.strategy = strategy;
  impl.report.winner = select_candidate(strategy, impl.report.candidates, impl.report.eager, impl.report.decision);
  impl.log("decision: " + impl.report.decision);
  if (impl.report.winner) {
    std::size_t w = *impl.report.winner;
    if (impl.options.batch_search.enabled) {
      if (impl.backends[w]) {
        impl.search_batch(w);
      } else {  // an external candidate: the front end runs it, there is no session to widen
        BatchSearchResult none;
        none.recorded_max_batch = none.max_batch = impl.samples[impl.profile_sample].batch_size;
        none.stop_reason = "not searched: the winner runs outside ONNX Runtime";
        none.correctness = "not run";
        impl.report.batch_search = none;
      }
    }
    if (!impl.winner) impl.winner = std::move(impl.backends[w]);
    if (impl.winner) impl.winner->activate();
  }
  impl.backends.clear();  // the losers' sessions and their device memory go now
  impl.report.tuning_s = ms_since(impl.started) / 1e3;
  return impl.report;
}

std::unique_ptr<OnnxRuntimeBackend> GraphTuner::take_winner() { return std::move(impl_->winner); }

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
  const auto& candidate = report.candidates[index];
  const auto& original = *backends[index];
  OnnxRuntimeBackendConfig config = original.config();
  GraphSpec open = model_spec;
  for (auto* tensors : {&open.inputs, &open.outputs})
    for (auto& t : *tensors)
      if (t.batch_axis) t.max_shape[static_cast<std::size_t>(*t.batch_axis)] = kUnbounded;

  auto search_start = SteadyTime::now();
  std::unique_ptr<OnnxRuntimeBackend> wide;
  std::vector<Tensor> host_inputs;
  try {
    wide = OnnxRuntimeBackend::create(model_paths[index], config, open);
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
  // profile sample tiled to max_batch against its expected outputs tiled the same way.
  result.correctness = "not needed";
  if (result.max_batch > sample.batch_size) {
    try {
      int64_t factor = result.max_batch / sample.batch_size;
      auto inputs = tiled_inputs(factor);
      auto outputs = host_outputs(*wide, wide->infer(views_of(inputs)));
      std::vector<Tensor> expected;
      for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
        const auto& axis = spec.outputs[o].batch_axis;
        expected.push_back(axis ? tile_along_axis(sample.expected[o], *axis, factor) : borrowed(sample.expected[o]));
      }
      auto check = compare_sample("batch " + std::to_string(result.max_batch), output_names, views_of(outputs),
                                  views_of(expected), tolerances_for(candidate.precision));
      if (check.passed()) {
        GraphSpec widened = model_spec;
        for (auto* tensors : {&widened.inputs, &widened.outputs})
          for (auto& t : *tensors)
            if (t.batch_axis)
              t.max_shape[static_cast<std::size_t>(*t.batch_axis)] =
                  t.max_shape[static_cast<std::size_t>(*t.batch_axis)] / sample.batch_size * result.max_batch;
        wide.reset();
        winner = OnnxRuntimeBackend::create(model_paths[index], config, widened);
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
