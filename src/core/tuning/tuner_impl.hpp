// Private: GraphTuner's state and the helpers its parts share (tuner.cpp evaluates and
// chooses, tuner_batch_search.cpp widens the winner's batch range).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "aitune/cuda_timer.hpp"
#include "aitune/error.hpp"
#include "aitune/tuner.hpp"

namespace aitune {
namespace detail {

using SteadyTime = std::chrono::steady_clock;

inline double ms_since(SteadyTime::time_point start) {
  return std::chrono::duration<double, std::milli>(SteadyTime::now() - start).count();
}

// A Tensor over memory the caller owns (the views of TuneSample), so that ORT's copy
// helpers, which take Tensors, can read it.
inline Tensor borrowed(const TensorView& view) { return Tensor::adopt(view, std::make_shared<int>(0)); }

// The looser of two precisions: strict < TF32 < FP16.
inline Precision looser(Precision a, Precision b) { return static_cast<int>(a) > static_cast<int>(b) ? a : b; }

inline std::string pct(double fraction) {
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

inline DeviceInputs inputs_on(const OnnxSession& backend, const std::vector<TensorView>& inputs,
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

inline std::vector<Tensor> host_outputs(const OnnxSession& backend, const std::vector<Tensor>& outputs) {
  std::vector<Tensor> host;
  host.reserve(outputs.size());
  for (const auto& t : outputs) host.push_back(backend.to_host(t));
  return host;
}

inline std::vector<TensorView> views_of(const std::vector<Tensor>& tensors) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const auto& t : tensors) views.push_back(t.view());
  return views;
}

}  // namespace detail

struct GraphTuner::Impl {
  using SteadyTime = detail::SteadyTime;
  GraphSpec spec;
  std::vector<TuneSample> samples;
  TunerOptions options;
  TuneReport report;
  std::vector<std::string> output_names;
  std::size_t profile_sample = 0;  // largest batch
  std::vector<std::unique_ptr<OnnxSession>> backends;  // per candidate; null unless passed
  std::vector<std::string> model_paths;
  std::vector<std::vector<std::size_t>> input_maps;  // per candidate: model input i <- graph input map[i]
  std::unique_ptr<OnnxSession> winner;
  // What the final round calls for a passed candidate: the very call its first profile
  // timed (owning what it reads: the session's device inputs, the front end's callable)
  // and its device timer (null without one). Declared after `backends`, so destroyed
  // before the sessions a call may refer to; select's final round takes them out (and releases
  // them) before it clears those.
  struct MeasuredCall {
    std::function<void()> call;
    std::shared_ptr<DeviceTimer> timer;
  };
  std::map<std::size_t, MeasuredCall> measured_calls;  // per passed candidate
  // The reference's call as profile_reference timed it: the final round measures it again
  // beside the finalists, so that speed-ups against it (performance validation) compare
  // figures of one moment. Empty without a reference.
  MeasuredCall reference_call;
  std::map<Precision, EagerAtPrecision> calibrations;  // asked once per precision
  std::optional<double> metric_baseline;                // the user metric of the reference
  bool scoring_baseline = false;  // the user metric is scoring the reference: its errors are rethrown, not verdicts

  // In a candidate's catch block: rethrows the exception being handled when it came from
  // the user's metric scoring eager's own outputs (the backend fails with it); else returns
  // and the caller records the candidate as failed.
  void rethrow_baseline_failure() {
    if (!scoring_baseline) return;
    scoring_baseline = false;
    throw;
  }
  SteadyTime::time_point started = SteadyTime::now();

  void log(const std::string& line) const {
    if (options.log) options.log(report.graph + ": " + line);
  }

  std::size_t push(CandidateResult r, std::unique_ptr<OnnxSession> backend, std::string model_path,
                   std::vector<std::size_t> input_map = {}) {
    report.candidates.push_back(std::move(r));
    backends.push_back(std::move(backend));
    model_paths.push_back(std::move(model_path));
    input_maps.push_back(std::move(input_map));
    report.tuning_s = detail::ms_since(started) / 1e3;
    return report.candidates.size() - 1;
  }

  // A candidate's result before it is evaluated: who it is and what precision it computes in.
  static CandidateResult new_result(const std::string& name, const std::string& backend, int group,
                                    Precision precision) {
    CandidateResult r;
    r.name = name;
    r.backend = backend;
    r.group = group;
    r.precision = precision;
    return r;
  }

  // A candidate's end: failed (it could not be made or run), rejected (its correctness
  // report failed) or passed; logged and pushed with its session where it has one.
  std::size_t push_failed(CandidateResult r, const std::string& reason, std::string model_path = "",
                          std::vector<std::size_t> input_map = {}, std::optional<ErrorCode> code = std::nullopt) {
    r.status = CandidateStatus::kFailed;
    r.reason = reason;
    r.failure_code = code;
    log(r.name + ": failed: " + r.reason);
    return push(std::move(r), nullptr, std::move(model_path), std::move(input_map));
  }
  // `note`: added to the reason where not empty (fixed_sizes_note).
  std::size_t push_rejected(CandidateResult r, std::string model_path = "", std::vector<std::size_t> input_map = {},
                            const std::string& note = "") {
    r.status = CandidateStatus::kIncorrect;
    r.reason = r.correctness->first_failure() + (note.empty() ? "" : "; " + note);
    log(r.name + ": rejected: " + r.reason);
    return push(std::move(r), nullptr, std::move(model_path), std::move(input_map));
  }
  std::size_t push_passed(CandidateResult r, std::unique_ptr<OnnxSession> backend, std::string model_path = "",
                          std::vector<std::size_t> input_map = {}) {
    r.status = CandidateStatus::kPassed;
    log(r.name + ": correct (max abs error " + std::to_string(r.correctness->max_abs_error()) + "), p50 " +
        std::to_string(r.profile->host_us.p50) + " us");
    return push(std::move(r), std::move(backend), std::move(model_path), std::move(input_map));
  }

  // Device time of calls the front end makes on `sample` (eager, an external candidate),
  // by events on the user's CUDA stream; null on the host or without a stream.
  std::unique_ptr<DeviceTimer> front_end_timer(const TuneSample& sample) const {
    if (!options.cuda_stream || sample.inputs.empty() || sample.inputs.front().device.kind != DeviceKind::kCUDA)
      return nullptr;
    return make_cuda_event_timer(*options.cuda_stream, sample.inputs.front().device.index);
  }

  // A model's inputs as graph input indices: `model_inputs`, or every graph input in order
  // when it is empty (the model takes them all).
  std::vector<std::size_t> input_map(const std::vector<std::size_t>& model_inputs) const {
    std::vector<std::size_t> map = model_inputs;
    if (map.empty())
      for (std::size_t i = 0; i < spec.inputs.size(); ++i) map.push_back(i);
    return map;
  }

  // Device time of a session's calls, by events on the stream it runs on.
  static std::unique_ptr<DeviceTimer> timer_for(const OnnxSession& backend) {
    // A session on a CUDA stream (the CUDA provider; TensorRT reports none).
    if (!provider_capabilities(backend.config().provider).device_memory || backend.cuda_stream() == 0) return nullptr;
    return make_cuda_event_timer(backend.cuda_stream(), backend.config().device_id);
  }

  // The graph's spec / a sample's inputs as the model with `map` sees them.
  GraphSpec spec_for(const std::vector<std::size_t>& map) const {
    GraphSpec s = spec;
    s.inputs.clear();
    for (auto i : map) s.inputs.push_back(spec.inputs.at(i));
    // (a condition on an input the model does not take cannot be checked by its session;
    // the exporters that drop inputs, the trace exporter's, find no conditions)
    std::erase_if(s.conditions, [&](const ShapeCondition& c) {
      const auto names = c.inputs();
      return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return !s.find_input(n); });
    });
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
    tolerances.precision = detail::looser(precision, options.reference_precision);
    return tolerances;
  }

  std::string sample_label(std::size_t i) const {
    std::string label = "sample " + std::to_string(i) + " (batch " + std::to_string(samples[i].batch_size);
    // A sample across a branch of the model's code on a size from the export's example:
    // a graph failing there computes the other branch, said where the failure is read.
    if (samples[i].probe) label += ", aitune's probe";
    if (!conditions_left_out.empty()) {
      const auto shapes = shapes_of(samples[i]);
      for (const auto& c : conditions_left_out)
        if (!c.holds(spec, shapes)) label += ", across `" + c.to_string() + "` from the export's example";
    }
    return label + ")";
  }
  // The shape conditions of the export that recorded samples violate (set_shape_conditions).
  std::vector<ShapeCondition> conditions_left_out;
  // Probes the kept conditions refuse, with the condition: not run through the graphs.
  std::map<std::size_t, std::string> refused_probes;
  static std::vector<Shape> shapes_of(const TuneSample& sample) {
    std::vector<Shape> shapes;
    for (const auto& input : sample.inputs) shapes.push_back(input.shape);
    return shapes;
  }

  // Eager at `precision` against the reference, asked of the front end once (calibration.hpp).
  const EagerAtPrecision& calibration(Precision precision);

  // The calibrated rule where it applies: a reduced precision always, strict only where the
  // table rejected the check (eager's own fp32 error is measured then, once, by running the
  // module wider). `only_sample`: the check is of that sample alone (the batch search's
  // tiled check repeats it, so eager's errors on it are its errors on the tiles).
  void calibrate_where_due(CorrectnessReport& checks, Precision precision,
                           std::optional<std::size_t> only_sample = std::nullopt);

  // The checks of a candidate computing in `precision` with these outputs (per sample):
  // the table, the calibrated rule for reduced precisions, the user's metric.
  CorrectnessReport judge(Precision precision, const std::vector<std::vector<Tensor>>& outputs);

  CorrectnessReport check(const OnnxSession& backend, Precision precision, const std::vector<std::size_t>& map) {
    std::vector<std::vector<Tensor>> outputs;
    for (std::size_t i = 0; i < samples.size(); ++i) {
      if (refused_probes.count(i)) {  // the session refuses it as it would the user's call (judge says so)
        outputs.emplace_back();
        continue;
      }
      try {
        auto inputs = detail::inputs_on(backend, select(samples[i].inputs, map), backend.graph_spec());
        outputs.push_back(detail::host_outputs(backend, backend.infer(inputs.views)));
      } catch (const Error& e) {
        throw Error(e.code(), sample_call(i, map) + ": " + e.what());
      }
    }
    return judge(precision, outputs);
  }

  // "sample 3 (batch 2; input_x [2, 5, 4])": the sample a model's run failed on, with its
  // inputs' shapes (which of the recorded sizes the model could not take).
  std::string sample_call(std::size_t i, const std::vector<std::size_t>& map) const {
    std::string out = "sample " + std::to_string(i) + " (batch " + std::to_string(samples[i].batch_size);
    for (std::size_t k = 0; k < map.size(); ++k)
      out += (k == 0 ? "; " : ", ") + spec.inputs.at(map[k]).name + " " +
             shape_to_string(samples[i].inputs.at(map[k]).shape);
    return out + ")";
  }

  // Sizes the model fixes where the recorded samples vary ("output_0 axis 1 is 6 in the
  // model, 3..6 in the samples"), or "": an export specialised to its example's size (a
  // Python loop or branch over it in forward, which torch.export unrolls) declares that
  // size, and the graph holds only there. Said with a candidate's failure, whose own
  // message (an index out of bounds deep in the graph, a shape differing) does not say it.
  static std::string fixed_sizes_note(const OnnxSession& backend) {
    std::string found;
    auto scan = [&](const std::vector<IoInfo>& ios, const std::vector<TensorSpec>& specs) {
      for (const auto& io : ios) {
        auto it = std::find_if(specs.begin(), specs.end(), [&](const TensorSpec& t) { return t.name == io.name; });
        if (it == specs.end() || it->rank() != io.shape.size()) continue;
        for (std::size_t a = 0; a < io.shape.size(); ++a)
          if (io.shape[a] >= 0 && it->is_dynamic(a))
            found += std::string(found.empty() ? "" : ", ") + io.name + " axis " + std::to_string(a) + " is " +
                     std::to_string(io.shape[a]) + " in the model, " + std::to_string(it->min_shape[a]) + ".." +
                     (it->max_shape[a] == kUnbounded ? std::string("") : std::to_string(it->max_shape[a])) +
                     " in the samples";
      }
    };
    scan(backend.inputs(), backend.graph_spec().inputs);
    scan(backend.outputs(), backend.graph_spec().outputs);
    if (found.empty()) return "";
    return "the exported model fixes sizes the recorded samples vary (" + found +
           "): the export specialised them to its example input (a Python loop or branch over a size in forward "
           "is unrolled or decided for that size, and `len(tensor)` is read as a constant: write `x.shape[0]`), "
           "so the graph holds only at that size; make the code "
           "independent of that size, record samples of that size only, or let TorchCompileBackend take the graph "
           "(its guards compile again for another size)";
  }

  // The clock profiles are timed by: the injected one, else a steady clock.
  Clock& clock() {
    if (!options.clock) options.clock = std::make_shared<SteadyClock>();
    return *options.clock;
  }

  // The final round (GraphTuner::select): the near-best passed candidates measured again,
  // interleaved; their profiles replaced, the first ones kept. Releases measured_calls.
  // Returns how many finalists it measured again (0: no final round).
  std::size_t final_round();

  void search_batch(std::size_t index);
  // Whether candidate `index` computes each row of the largest recorded batch as it
  // computes that row alone (tuner_batch_rows.cpp): what a server needs to join requests.
  std::pair<BatchRows, std::string> check_batch_rows(std::size_t index);
};

}  // namespace aitune
