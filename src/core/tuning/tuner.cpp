// The tuning engine for one graph: candidates are created, checked, profiled, chosen
// (the batch search on the winner is tuner_batch_search.cpp).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "aitune/tuner.hpp"
#include "aitune/tune_driver.hpp"

#include "tuning/tuner_impl.hpp"

namespace aitune {
using namespace detail;

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
  // The profiled call is the user's largest (a probe is aitune's own, never timed).
  for (std::size_t s = 0; s < samples.size(); ++s)
    if (!samples[s].probe && (samples[impl_->profile_sample].probe ||
                              samples[s].batch_size > samples[impl_->profile_sample].batch_size))
      impl_->profile_sample = s;
  validate_accuracy_factor(options.accuracy_factor);
  if (options.accuracy_metric && !(options.max_accuracy_drop >= 0))
    throw Error(ErrorCode::kInvalidArgument, graph + ": max_accuracy_drop must be >= 0");
  {
    std::vector<std::vector<TensorView>> expected;
    for (const auto& s : samples) expected.push_back(s.expected);
    impl_->report.vacuous_outputs = vacuous_outputs(impl_->output_names, expected);
  }
  impl_->report.accuracy_factor = options.accuracy_factor;
  impl_->report.graph = std::move(graph);
  impl_->spec = std::move(spec);
  impl_->samples = std::move(samples);
  impl_->options = std::move(options);
}

GraphTuner::~GraphTuner() = default;

const EagerAtPrecision& GraphTuner::Impl::calibration(Precision precision) {
  if (auto it = calibrations.find(precision); it != calibrations.end()) return it->second;
  EagerAtPrecision eager;
  eager.precision = precision;
  std::string reason;
  auto outputs = options.eager_at_precision(precision, reason);
  if (!outputs) {
    eager.reason = reason.empty() ? "not measured" : reason;
  } else if (outputs->size() != samples.size()) {
    eager.reason = "the front end gave " + std::to_string(outputs->size()) + " samples, expected " +
                   std::to_string(samples.size());
  } else {
    eager.available = true;
    for (std::size_t i = 0; i < samples.size(); ++i)
      eager.samples.push_back(compare_sample(sample_label(i), output_names, views_of((*outputs)[i]),
                                             samples[i].expected, tolerances_for(precision)));
    if (precision == Precision::kStrict) raise_to_level_over_samples(eager);
  }
  log("eager at " + std::string(precision_name(precision)) + ": " +
      (eager.available ? "measured (the calibrated bound of its candidates)" : "unavailable: " + eager.reason));
  auto& stored = calibrations.emplace(precision, std::move(eager)).first->second;
  report.eager_at_precision.push_back(stored);
  return stored;
}

void GraphTuner::Impl::calibrate_where_due(CorrectnessReport& checks, Precision precision,
                                           std::optional<std::size_t> only_sample) {
  if (!options.eager_at_precision || (precision == Precision::kStrict && checks.passed())) return;
  const EagerAtPrecision& eager = calibration(precision);
  const double factor = calibration_factor(precision, options.accuracy_factor);
  if (!only_sample || !eager.available) return apply_calibration(checks, eager, factor);
  EagerAtPrecision one = eager;
  one.samples = {eager.samples.at(*only_sample)};
  apply_calibration(checks, one, factor);
}

CorrectnessReport GraphTuner::Impl::judge(Precision precision, const std::vector<std::vector<Tensor>>& outputs) {
  const ToleranceSpec tolerances = tolerances_for(precision);
  CorrectnessReport result;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (auto refused = refused_probes.find(i); refused != refused_probes.end() && outputs.at(i).empty()) {
      SampleCheck skipped;
      skipped.sample = sample_label(i);
      skipped.not_run = "aitune's own probe at sizes the graph refuses (`" + refused->second +
                        "`): the tuned module refuses these sizes too, or runs them eagerly (eager_fallback)";
      result.samples.push_back(std::move(skipped));
      continue;
    }
    result.samples.push_back(compare_sample_at_valid_positions(sample_label(i), output_names, views_of(outputs.at(i)),
                                                               samples[i].expected, samples[i].valid, tolerances));
  }
  calibrate_where_due(result, precision);
  if (options.accuracy_metric) {
    if (!metric_baseline) {
      std::vector<std::vector<TensorView>> reference;
      for (const auto& s : samples) reference.push_back(s.expected);
      // The metric failing on eager's own outputs is the metric's fault, not a candidate's:
      // the evaluation rethrows it (the backend fails with it) instead of judging with it.
      scoring_baseline = true;
      double baseline = options.accuracy_metric(reference);
      if (!std::isfinite(baseline))
        throw Error(ErrorCode::kInvalidArgument,
                    report.graph + ": the accuracy metric scored eager's own outputs (the baseline) " +
                        (std::isnan(baseline) ? std::string("NaN") : std::string(baseline > 0 ? "inf" : "-inf")) +
                        "; it must return a finite number");
      scoring_baseline = false;
      metric_baseline = baseline;
    }
    // A probe the graph refuses is scored with eager's outputs: what the module gives there
    // when it runs such a call eagerly (eager_fallback).
    std::vector<std::vector<TensorView>> views;
    for (std::size_t i = 0; i < outputs.size(); ++i)
      views.push_back(outputs[i].empty() && refused_probes.count(i) ? samples[i].expected : views_of(outputs[i]));
    UserMetricResult metric;
    metric.baseline = *metric_baseline;
    metric.max_drop = options.max_accuracy_drop;
    metric.score = options.accuracy_metric(views);
    result.user_metric = metric;
  }
  return result;
}

const TuneReport& GraphTuner::report() const noexcept { return impl_->report; }
const GraphSpec& GraphTuner::spec() const noexcept { return impl_->spec; }

std::vector<ShapeCondition> GraphTuner::set_shape_conditions(std::vector<ShapeCondition> conditions) {
  auto& impl = *impl_;
  std::vector<ShapeCondition> kept, dropped;
  for (auto& condition : conditions) {
    if (const auto problem = condition.problem_with(impl.spec); !problem.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  impl.report.graph + ": the shape condition `" + condition.to_string() + "`: " + problem);
    // Implied by the spec's ranges (`1 < h * w` over 32..48): nothing to check per call.
    if (condition.holds_throughout(impl.spec)) {
      impl.log("`" + condition.to_string() + "` holds at every size the graph accepts");
      continue;
    }
    // aitune's probes do not decide: a crop landing across a branch on a size leaves the
    // graph refusing the crop's sizes rather than judged (and failed) there.
    const bool all_hold = std::all_of(impl.samples.begin(), impl.samples.end(), [&](const TuneSample& sample) {
      return sample.probe || condition.holds(impl.spec, impl.shapes_of(sample));
    });
    (all_hold ? kept : dropped).push_back(std::move(condition));
  }
  impl.refused_probes.clear();
  for (std::size_t s = 0; s < impl.samples.size(); ++s) {
    if (!impl.samples[s].probe) continue;
    const auto shapes = impl.shapes_of(impl.samples[s]);
    for (const auto& c : kept)
      if (!c.holds(impl.spec, shapes)) {
        impl.refused_probes.emplace(s, c.to_string());
        impl.log(impl.sample_label(s) + " is aitune's probe at sizes outside `" + c.to_string() +
                 "`: the graph refuses them, so it is not run there");
        break;
      }
  }
  impl.spec.conditions = std::move(kept);
  impl.conditions_left_out = dropped;
  impl.report.shape_conditions.clear();
  impl.report.shape_conditions_left_out.clear();
  for (const auto& c : impl.spec.conditions) impl.report.shape_conditions.push_back(c.to_string());
  for (const auto& c : dropped) impl.report.shape_conditions_left_out.push_back(c.to_string());
  for (const auto& c : impl.spec.conditions) impl.log("the ONNX graph holds where `" + c.to_string() + "`");
  for (const auto& c : dropped)
    impl.log("`" + c.to_string() + "` left out: a recorded sample violates it, and the check at that sample judges it");
  return dropped;
}

void GraphTuner::profile_reference(const std::function<void(const std::vector<TensorView>&)>& run,
                                   const std::string& label) {
  const auto& sample = impl_->samples[impl_->profile_sample];
  auto timer = impl_->front_end_timer(sample);
  impl_->report.eager_label = label;
  impl_->report.eager =
      profile_calls([&] { run(sample.inputs); }, sample.batch_size, impl_->options.profile, impl_->clock(),
                    timer.get());
  // Kept for the final round (select): `run` is copied (it must stay callable until then).
  impl_->reference_call.call = [run, inputs = sample.inputs] { run(inputs); };
  impl_->reference_call.timer = std::move(timer);
  impl_->log(label + ": p50 " + std::to_string(impl_->report.eager->host_us.p50) + " us");
}

std::size_t GraphTuner::add_failed(const std::string& name, const std::string& backend, int group,
                                   const std::string& reason, Precision precision, std::optional<ErrorCode> code) {
  return impl_->push_failed(Impl::new_result(name, backend, group, precision), reason, "", {}, code);
}

std::size_t GraphTuner::evaluate_onnx(const std::string& model_path, const OnnxCandidate& candidate,
                                      const std::string& backend_name, int group,
                                      const std::vector<std::size_t>& model_inputs,
                                      const SessionCallFactory& module_call) {
  auto& impl = *impl_;
  const std::vector<std::size_t> map = impl.input_map(model_inputs);
  for (auto i : map)
    if (i >= impl.spec.inputs.size())
      throw Error(ErrorCode::kInvalidArgument, impl.report.graph + ": model input index " + std::to_string(i) +
                                                   " is out of range; the graph has " +
                                                   std::to_string(impl.spec.inputs.size()) + " inputs");
  const GraphSpec model_spec = impl.spec_for(map);
  CandidateResult r = Impl::new_result(candidate.name, backend_name, group, candidate.precision);
  r.transform = candidate.transform;
  r.fused_operators = candidate.fused_operators;
  r.fp32_nodes = candidate.fp32_nodes;
  r.transform_note = candidate.transform_note;
  OnnxSessionConfig config = candidate.config;
  r.config_json = config.to_json(-1);
  impl.log(r.name + ": creating the session");

  std::unique_ptr<OnnxSession> backend;
  auto start = SteadyTime::now();
  try {
    backend = OnnxSession::create(model_path, config, model_spec);
  } catch (const Error& e) {
    return impl.push_failed(std::move(r), e.what(), model_path, map, e.code());
  }
  r.session_creation_ms = ms_since(start);
  r.config_json = backend->config().to_json(-1);
  for (std::size_t o = 0; o < backend->output_aliases().size(); ++o)
    if (const int i = backend->output_aliases()[o]; i >= 0)
      r.in_place_outputs[backend->outputs()[o].name] = backend->inputs()[static_cast<std::size_t>(i)].name;

  Impl::MeasuredCall measured;
  const std::string fixed_sizes = Impl::fixed_sizes_note(*backend);
  try {
    const auto& sample = impl.samples[impl.profile_sample];
    // Shared: the call below keeps them for the final round (select), after this returns.
    auto inputs = std::make_shared<DeviceInputs>(inputs_on(*backend, Impl::select(sample.inputs, map), model_spec));
    start = SteadyTime::now();
    try {
      backend->infer(inputs->views);  // TensorRT builds its engines here
    } catch (const Error& e) {
      throw Error(e.code(), impl.sample_call(impl.profile_sample, map) + ": " + e.what());
    }
    r.first_run_ms = ms_since(start);

    r.correctness = impl.check(*backend, candidate.precision, map);
    if (!r.correctness->passed()) return impl.push_rejected(std::move(r), model_path, map, fixed_sizes);
    measured.timer = Impl::timer_for(*backend);
    // Through the module's own dispatch where the front end gives it: the latency a
    // candidate wins by is then the latency of the module a user calls.
    OnnxSession* session = backend.get();  // kept in impl.backends until select is done
    measured.call = [session, inputs] { session->infer(inputs->views); };
    if (module_call) measured.call = module_call(*backend);
    r.profile = profile_calls(measured.call, sample.batch_size, impl.options.profile, impl.clock(),
                              measured.timer.get());
  } catch (const Error& e) {
    impl.rethrow_baseline_failure();  // the user's metric failed on eager's outputs: not this candidate's verdict
    return impl.push_failed(std::move(r), fixed_sizes.empty() ? std::string(e.what()) : e.what() + ("; " + fixed_sizes),
                            model_path, map, e.code());
  }
  const std::size_t index = impl.push_passed(std::move(r), std::move(backend), model_path, map);
  impl.measured_calls[index] = std::move(measured);
  return index;
}

bool GraphTuner::check_onnx(const std::string& model_path, const OnnxCandidate& candidate,
                            const std::vector<std::size_t>& model_inputs) {
  auto& impl = *impl_;
  const std::vector<std::size_t> map = impl.input_map(model_inputs);
  try {
    auto backend = OnnxSession::create(model_path, candidate.config, impl.spec_for(map));
    bool passed = impl.check(*backend, candidate.precision, map).passed();
    impl.log(candidate.name + " on " + model_path + ": " + (passed ? "passes" : "fails") + " the check");
    return passed;
  } catch (const Error& e) {
    // Not a verdict: the search must not take "could not run" for "fails the check".
    impl.log(candidate.name + " on " + model_path + ": could not be run: " + e.what());
    throw;
  }
}

std::size_t GraphTuner::evaluate_external(const ExternalCandidate& candidate, const std::string& backend_name,
                                          int group) {
  auto& impl = *impl_;
  CandidateResult r = Impl::new_result(candidate.name, backend_name, group, candidate.precision);
  r.config_json = candidate.config_json;
  if (!candidate.outputs || !candidate.run)
    throw Error(ErrorCode::kInvalidArgument, impl.report.graph + ": external candidate '" + candidate.name +
                                                 "' needs both an outputs and a run function");
  impl.log(r.name + ": first run");
  Impl::MeasuredCall measured;
  try {
    auto start = SteadyTime::now();
    candidate.run();  // a compiler compiles (and captures) here
    r.first_run_ms = ms_since(start);
    std::vector<std::vector<Tensor>> outputs;
    for (std::size_t i = 0; i < impl.samples.size(); ++i) outputs.push_back(candidate.outputs(i));
    r.correctness = impl.judge(candidate.precision, outputs);
    if (!r.correctness->passed()) return impl.push_rejected(std::move(r));
    const auto& sample = impl.samples[impl.profile_sample];
    measured.timer = impl.front_end_timer(sample);
    measured.call = candidate.run;  // owns what it calls (the front end's callable): kept for the final round
    r.profile = profile_calls(measured.call, sample.batch_size, impl.options.profile, impl.clock(),
                              measured.timer.get());
  } catch (const std::exception& e) {  // the front end's errors arrive as whatever it raised
    impl.rethrow_baseline_failure();
    return impl.push_failed(std::move(r), e.what());
  }
  const std::size_t index = impl.push_passed(std::move(r), nullptr);
  impl.measured_calls[index] = std::move(measured);
  return index;
}

const std::string& GraphTuner::model_path(std::size_t candidate) const {
  if (candidate >= impl_->model_paths.size())
    throw Error(ErrorCode::kInvalidArgument, impl_->report.graph + ": no candidate " + std::to_string(candidate));
  return impl_->model_paths[candidate];
}

std::optional<std::size_t> GraphTuner::first_failing_sample(std::size_t candidate) const {
  const auto& candidates = impl_->report.candidates;
  if (candidate >= candidates.size() || !candidates[candidate].correctness) return std::nullopt;
  const auto& samples = candidates[candidate].correctness->samples;
  for (std::size_t s = 0; s < samples.size(); ++s)
    if (!samples[s].passed()) return s;
  return std::nullopt;
}

const DivergenceReport& GraphTuner::trace_divergence(std::size_t candidate, std::size_t sample,
                                                     const std::vector<ModuleOutput>& eager) {
  auto& impl = *impl_;
  if (candidate >= impl.report.candidates.size() || impl.model_paths[candidate].empty())
    throw Error(ErrorCode::kInvalidArgument, impl.report.graph + ": candidate " + std::to_string(candidate) +
                                                 " has no ONNX model to trace");
  if (sample >= impl.samples.size())
    throw Error(ErrorCode::kInvalidArgument, impl.report.graph + ": sample " + std::to_string(sample) +
                                                 " is out of range; there are " + std::to_string(impl.samples.size()));
  auto& r = impl.report.candidates[candidate];
  const auto config = OnnxSessionConfig::from_json(r.config_json);
  // The model's inputs by name (the graph's names; an exporter may have dropped some).
  const std::vector<std::size_t> map = impl.input_map(impl.input_maps[candidate]);
  std::map<std::string, TensorView> inputs;
  for (auto i : map) inputs.emplace(impl.spec.inputs.at(i).name, impl.samples[sample].inputs.at(i));
  impl.log(r.name + ": tracing where it diverges from eager");
  r.divergence = aitune::trace_divergence(impl.model_paths[candidate], config, inputs, eager, r.precision);
  impl.log(r.name + ": " + r.divergence->describe());
  return *r.divergence;
}

std::size_t GraphTuner::Impl::final_round() {
  // Taken out first: whatever happens below, the calls (and the front end's callables, the
  // device inputs they own) are released when this returns, before the sessions go.
  std::map<std::size_t, MeasuredCall> calls = std::move(measured_calls);
  measured_calls.clear();
  MeasuredCall reference = std::move(reference_call);
  reference_call = {};
  const ProfileConfig& config = options.profile;
  if (config.final_round_windows == 0 || config.final_round_max < 1) return 0;

  // The finalists: passed, measured, with their call kept; within the margin of the best
  // first p50; the fastest final_round_max of them.
  std::vector<std::size_t> finalists;
  double best = 0;
  for (const auto& [index, call] : calls) {
    const auto& c = report.candidates[index];
    if (c.status != CandidateStatus::kPassed || !c.profile) continue;
    if (finalists.empty() || c.profile->host_us.p50 < best) best = c.profile->host_us.p50;
    finalists.push_back(index);
  }
  auto p50_of = [&](std::size_t i) { return report.candidates[i].profile->host_us.p50; };
  std::erase_if(finalists, [&](std::size_t i) { return p50_of(i) > best * (1 + config.final_round_margin); });
  std::stable_sort(finalists.begin(), finalists.end(), [&](std::size_t a, std::size_t b) { return p50_of(a) < p50_of(b); });
  if (finalists.size() > static_cast<std::size_t>(config.final_round_max))
    finalists.resize(static_cast<std::size_t>(config.final_round_max));
  // One finalist is measured again too, beside the reference: the p50 the report gives the
  // winner is then of the tune's end, the moment the module is handed over (a GPT-2's winner
  // measured 2.5 % slower after its tune than when first profiled, on an H100), and the
  // speed-up over eager compares figures of one moment.
  if (finalists.empty()) return 0;

  struct Finalist {
    std::size_t index;
    MeasuredCall* measured;
    std::vector<double> host, device, window_means;
    bool failed = false;
  };
  std::vector<Finalist> runs;
  for (auto i : finalists) runs.push_back({i, &calls.at(i), {}, {}, {}, false});
  // The reference joins the rounds (not as a finalist): its profile then comes from the
  // same moment as theirs.
  constexpr std::size_t kReference = static_cast<std::size_t>(-1);
  if (reference.call && report.eager) runs.push_back({kReference, &reference, {}, {}, {}, false});
  // Windows short enough that the warm-up and every round fit in the time cap: a large
  // model (50 ms a call) would otherwise get one round of 25 calls per run, timed in
  // back-to-back blocks, which is no interleaving (a busy host made eager's one window 7x
  // its first profile). At least 3 calls a window.
  auto profile_of = [&](const Finalist& f) -> std::optional<Profile>& {
    return f.index == kReference ? report.eager : report.candidates[f.index].profile;
  };
  double per_round_us = 0;
  for (const auto& f : runs)
    if (const auto& first = profile_of(f)) per_round_us += std::max(first->host_us.p50, 1.0);
  std::size_t window = static_cast<std::size_t>(config.window_calls);
  if (per_round_us > 0) {
    const double fits = config.time_cap_s * 1e6 / (per_round_us * (config.final_round_windows + 1));
    window = std::clamp<std::size_t>(static_cast<std::size_t>(fits), std::min<std::size_t>(3, window), window);
  }
  // The reference runs beside the finalists but is none of them: "3 finalists" matches the
  // decision's "the 3 fastest measured again".
  log("final round: " + std::to_string(finalists.size()) + " finalist(s)" +
      (runs.size() > finalists.size() ? " and " + report.eager_label : std::string()) + " (within " +
      detail::pct(config.final_round_margin) + " of the best p50), " + std::to_string(config.final_round_windows) + " interleaved windows of " +
      std::to_string(window) + " calls each");

  Clock& clk = clock();
  // One window of `f`: each call timed as profile_calls times one. A call that throws fails
  // the finalist (it passed before; a candidate that cannot be called again cannot win).
  auto run_window = [&](Finalist& f, bool measure) {
    try {
      std::vector<double> host;
      for (std::size_t k = 0; k < window; ++k)
        host.push_back(time_call(f.measured->call, clk, f.measured->timer.get(), measure ? &f.device : nullptr));
      if (!measure) return;
      f.window_means.push_back(std::accumulate(host.begin(), host.end(), 0.0) / static_cast<double>(host.size()));
      f.host.insert(f.host.end(), host.begin(), host.end());
    } catch (const FatalTuneError&) {
      throw;  // nothing after it can run (a lost CUDA context, an interrupt): not a verdict
    } catch (const std::exception& e) {
      f.failed = true;
      if (f.index == kReference) {  // its first profile stands; no candidate's verdict
        log(report.eager_label + ": could not be measured again in the final round: " + e.what());
        return;
      }
      auto& c = report.candidates[f.index];
      c.status = CandidateStatus::kFailed;
      c.reason = std::string("failed in the final round: ") + e.what();
      log(c.name + ": " + c.reason);
    }
  };
  auto live = [&] { return std::count_if(runs.begin(), runs.end(), [](const Finalist& f) { return !f.failed; }); };
  for (auto& f : runs) run_window(f, false);  // warm-up: one window each
  // The cap counts from here: a slow model's warm-up windows must not leave no round at all
  // (the first round always runs).
  const double begin = clk.now_us();
  int rounds = 0;
  for (; rounds < config.final_round_windows && live() > 0; ++rounds) {
    if (clk.now_us() - begin >= config.time_cap_s * 1e6) break;  // at a round boundary: equal windows
    for (auto& f : runs)
      if (!f.failed) run_window(f, true);
  }
  const double total_s = (clk.now_us() - begin) / 1e6;
  if (rounds < 2) {
    // One round is each run timed once, one after another: no more of one moment than the
    // first profiles, whose own windows were checked for stability.
    log("final round: the time cap (" + std::to_string(config.time_cap_s) + " s) was reached after " +
        std::to_string(rounds) + " round(s); the first measurements stand");
    return 0;
  }
  std::size_t measured_again = 0;
  for (auto& f : runs) {
    if (f.failed) continue;
    std::optional<Profile>& profile = profile_of(f);
    Profile p;
    p.batch_size = profile->batch_size;
    set_latencies(p, f.host, f.measured->timer ? &f.device : nullptr);
    p.warmup_calls = static_cast<int>(window);
    p.windows = rounds;
    p.measured_calls = static_cast<int>(f.host.size());
    auto [lo, hi] = std::minmax_element(f.window_means.begin(), f.window_means.end());
    p.stable = *lo > 0 ? (*hi - *lo) / *lo <= config.stability : *hi == 0;
    p.stop_reason = "final round";
    p.total_s = total_s;
    const bool is_reference = f.index == kReference;
    log("final round: " + (is_reference ? report.eager_label : report.candidates[f.index].name) + " p50 " +
        std::to_string(p.host_us.p50) + " us (first " + std::to_string(profile->host_us.p50) + " us)");
    (is_reference ? report.eager_first_profile : report.candidates[f.index].first_profile) = std::move(profile);
    profile = std::move(p);
    if (!is_reference) ++measured_again;
  }
  return measured_again;
}

const TuneReport& GraphTuner::select(const StrategyConfig& strategy) {
  auto& impl = *impl_;
  impl.report.strategy = strategy;
  // The near-best measured again, side by side; their calls released.
  const std::size_t finalists = impl.final_round();
  impl.report.winner = select_candidate(strategy, impl.report.candidates, impl.report.eager, impl.report.decision,
                                        impl.report.eager_label);
  if (finalists > 1)
    impl.report.decision += "; ranked on a final round that measured the " + std::to_string(finalists) +
                            " fastest again side by side";
  else if (finalists == 1)
    impl.report.decision +=
        "; the only candidate within the margin measured again at the end, beside " + impl.report.eager_label;
  if (impl.report.winner && !impl.report.vacuous_outputs.empty()) {
    // The check could not judge these outputs: the user is told in the decision itself.
    std::string names;
    for (const auto& v : impl.report.vacuous_outputs) names += (names.empty() ? "" : ", ") + v.name + ": " + v.why;
    impl.report.decision += "; warning: " + impl.report.eager_label + "'s outputs cannot judge it (" + names +
                            "), so the comparison of these outputs is vacuous";
  }
  impl.log("decision: " + impl.report.decision);
  if (impl.report.winner) {
    std::size_t w = *impl.report.winner;
    // Before the batch search replaces the winner's session: the session checked is the
    // candidate as judged; the flag goes on whichever session is served.
    std::pair<BatchRows, std::string> rows{BatchRows::kUnchecked, "the winner runs outside ONNX Runtime"};
    if (impl.backends[w]) rows = impl.check_batch_rows(w);
    impl.log("batch rows: " + std::string(batch_rows_name(rows.first)) +
             (rows.second.empty() ? "" : " (" + rows.second + ")"));
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
    if (impl.winner) impl.winner->set_batch_rows(rows.first, rows.second);
    if (impl.winner) impl.winner->activate();
  }
  impl.backends.clear();  // the losers' sessions and their device memory go now
  impl.report.tuning_s = ms_since(impl.started) / 1e3;
  return impl.report;
}

std::unique_ptr<OnnxSession> GraphTuner::take_winner() { return std::move(impl_->winner); }

}  // namespace aitune
