// GraphTuner: the tuning engine for one graph. Creates each ONNX Runtime candidate,
// checks it against reference outputs, profiles it and the reference, lets a strategy
// choose, searches the maximum batch size, and hands over the winning session.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aitune/calibration.hpp"
#include "aitune/candidates.hpp"
#include "aitune/correctness.hpp"
#include "aitune/graph_spec.hpp"
#include "aitune/onnx_session.hpp"
#include "aitune/profiler.hpp"
#include "aitune/strategy.hpp"
#include "aitune/tune_report.hpp"
#include "aitune/valid_positions.hpp"

namespace aitune {

/// One recorded call: inputs in graph-spec order (on the device the candidates run on,
/// or on the host: they are copied to the session's device where needed) and the
/// reference outputs in output order, in host memory. Views: the caller keeps the memory
/// alive for the tuner's lifetime.
struct TuneSample {
  std::vector<TensorView> inputs;
  std::vector<TensorView> expected;
  int64_t batch_size = 1;
  /// Positions of each output the model leaves undefined (padding), left out of the checks.
  ValidPositions valid;
  /// A call the front end made itself, not one the user recorded (aitune's crop between the
  /// recorded sizes, interior_shapes.py): a shape condition only probes violate is kept,
  /// and a graph that refuses a probe's sizes under its conditions is not run there (its
  /// session would refuse that call as it refuses the user's; set_shape_conditions). Never
  /// the profiled sample.
  bool probe = false;
};

/// A candidate that runs outside ONNX Runtime (the front end's torch.compile backend):
/// the tuner checks and measures it like any other through the functions the front end
/// gives it. No session is created, so it has no batch search and take_winner() gives
/// nullptr for it (the front end keeps its own runnable).
struct ExternalCandidate {
  std::string name;
  std::string config_json;  ///< the configuration, shown in the report
  Precision precision = Precision::kStrict;
  /// Runs sample `index` and returns its outputs in host memory, in output order.
  std::function<std::vector<Tensor>(std::size_t index)> outputs;
  /// Runs the profile sample (the largest batch) without copying outputs; what is timed.
  /// CUDA work runs on TunerOptions::cuda_stream (device time is measured there).
  std::function<void()> run;
};

/// How the front end calls a candidate's session the way its tuned module will (the
/// module's dispatch: the user's call form, keywords, the output structure rebuilt): given
/// the candidate's session, the call that is profiled, so that the latency a candidate
/// is chosen by is the latency its module has (issue 28). The session outlives the call.
using SessionCallFactory = std::function<std::function<void()>(OnnxSession& session)>;

/// Maximum batch size search settings.
struct BatchSearchConfig {
  bool enabled = false;
  int64_t max_batch_size = 4096;  ///< never search above this
  double min_gain = 0.05;         ///< stop when throughput grows by less than this
  double time_cap_s = 120;        ///< whole search
};

/// What the tuner does besides evaluating candidates.
struct TunerOptions {
  ProfileConfig profile;
  /// User overrides applied to every candidate (its precision supplies the defaults).
  ToleranceSpec tolerances;
  /// The precision the reference itself was computed in: eager PyTorch on a GPU runs
  /// convolutions in TF32 by default (torch.backends.cudnn.allow_tf32), so its outputs are
  /// no closer to exact fp32 than a TF32 candidate's. Defaults are the looser of this and
  /// the candidate's precision.
  Precision reference_precision = Precision::kStrict;
  BatchSearchConfig batch_search;
  /// The reference's outputs (host memory, output order) for other inputs (host memory,
  /// graph input order), or nullopt with `reason` set where it cannot run them: the batch
  /// search checks a widened batch against it, so a forward that branches on the batch size
  /// is caught (the tiled sample's outputs would pass it). Unset (a graph that is its own
  /// reference, `aitune tune` of an ONNX model): the tiled sample's outputs.
  std::function<std::optional<std::vector<Tensor>>(const std::vector<TensorView>& inputs, std::string& reason)>
      reference_at;
  /// Calibrated acceptance (calibration.hpp): a candidate computing in a reduced precision
  /// P passes an output the table fails when its error is within accuracy_factor x eager
  /// PyTorch's own error at P. `eager_at_precision(P, reason)` gives eager's outputs at P
  /// for every sample (host memory, output order); it is asked once per precision, the
  /// first time a candidate of it is checked, and returns nullopt with `reason` set where
  /// eager cannot run at P on this device. Unset: the table alone. Asked for kStrict too,
  /// the first time a strict candidate fails the table: the module run wider (float64),
  /// whose distance from the reference is eager's own fp32 error (calibration_yardstick).
  double accuracy_factor = kDefaultAccuracyFactor;
  std::function<std::optional<std::vector<std::vector<Tensor>>>(Precision, std::string& reason)> eager_at_precision;
  /// The user's metric, which then decides alone: a score of a candidate's outputs
  /// (per sample, output order, host memory) whose drop from the score of the reference
  /// outputs themselves must be <= max_accuracy_drop.
  std::function<double(const std::vector<std::vector<TensorView>>& outputs)> accuracy_metric;
  double max_accuracy_drop = 0;
  /// CUDA stream the reference runs on, so its device time is measured by CUDA events
  /// (nullopt: host time only). CUDA candidates are timed on their sessions' own streams.
  std::optional<std::uintptr_t> cuda_stream;
  /// Called with one line per step (candidate started, checked, profiled, decision).
  std::function<void(const std::string&)> log;
  /// The clock every profile of this tuner is timed by (the reference's, the candidates',
  /// the final round's); null: std::chrono::steady_clock. Tests inject one to script time.
  std::shared_ptr<Clock> clock;
};

class GraphTuner {
 public:
  /// `spec` bounds the samples; `samples` must be non-empty and match the spec
  /// (Error(kInvalidArgument) naming the sample and tensor otherwise).
  GraphTuner(std::string graph, GraphSpec spec, std::vector<TuneSample> samples, TunerOptions options);
  ~GraphTuner();
  GraphTuner(const GraphTuner&) = delete;
  GraphTuner& operator=(const GraphTuner&) = delete;

  /// Profiles the reference (eager) on the profile sample (the one with the largest
  /// batch). `run` gets that sample's inputs. With a cuda_stream, device time is
  /// measured on it.
  void profile_reference(const std::function<void(const std::vector<TensorView>&)>& run,
                         const std::string& label = "eager");

  /// Records a candidate that failed before it could run (e.g. its export or its model
  /// transform), with the precision it would have computed in, so the report says which
  /// precision was lost, and the failure's code where one is known (an isolated trial's
  /// unsupported dtype: the outcome's kind is decided by it).
  std::size_t add_failed(const std::string& name, const std::string& backend, int group, const std::string& reason,
                         Precision precision = Precision::kStrict,
                         std::optional<ErrorCode> code = std::nullopt);

  /// Creates a session for `candidate` on `model_path` (timing creation and first run),
  /// runs every sample and compares with the expected outputs, and profiles it when
  /// correct. Never throws for a failing candidate: its status and reason say why.
  /// `model_inputs` maps the model's inputs to the graph's: model input i is graph input
  /// model_inputs[i] (an exporter may drop unused inputs); empty means all, in order.
  /// `module_call`: what is profiled (correctness is always checked on the session
  /// itself); empty: the session's own `infer` on the profile sample.
  std::size_t evaluate_onnx(const std::string& model_path, const OnnxCandidate& candidate,
                            const std::string& backend, int group,
                            const std::vector<std::size_t>& model_inputs = {},
                            const SessionCallFactory& module_call = {});

  /// Whether `candidate` on `model_path` passes the check (its session created, every
  /// sample judged as evaluate_onnx judges), without profiling it or adding it to the
  /// report: one step of a search (fp32_node_search.hpp). Throws the session's Error when
  /// the model cannot be created or run: that is no verdict on its numbers.
  bool check_onnx(const std::string& model_path, const OnnxCandidate& candidate,
                  const std::vector<std::size_t>& model_inputs = {});

  /// Checks and profiles `candidate` (first call timed as its first run: a compiler
  /// compiles there). Never throws for a failing candidate: an exception from its
  /// functions makes it kFailed with the message as the reason.
  std::size_t evaluate_external(const ExternalCandidate& candidate, const std::string& backend, int group);

  /// The index of the first sample an incorrect candidate failed on; nullopt when it
  /// has no failed check.
  std::optional<std::size_t> first_failing_sample(std::size_t candidate) const;

  /// The ONNX model a candidate ran on ("" for external and failed-early candidates).
  const std::string& model_path(std::size_t candidate) const;

  /// Where an incorrect ONNX candidate's graph first diverges from eager PyTorch:
  /// `eager` are the module outputs (forward hooks) on sample `sample`, each with the
  /// ONNX value the exporter's metadata maps it to, in the order the modules finished.
  /// Runs the candidate's model and configuration on that sample (`aitune::trace_divergence`)
  /// and keeps the result in the candidate's report. Error(kInvalidArgument) for an index
  /// out of range or a candidate that has no ONNX model.
  const DivergenceReport& trace_divergence(std::size_t candidate, std::size_t sample,
                                           const std::vector<ModuleOutput>& eager);

  /// The final round first (ProfileConfig::final_round_*): the passed candidates within
  /// final_round_margin of the best host p50 (at most final_round_max, the fastest) are
  /// measured again, round-robin one window each per round, so that they are compared
  /// under the same conditions; their `profile` becomes that measurement and their first
  /// one is kept in `first_profile`. A finalist whose call throws there fails. Then lets
  /// `strategy` choose; runs the batch search on the winner when enabled.
  const TuneReport& select(const StrategyConfig& strategy);

  /// The winning session, its spec widened by the batch search (nullptr when eager was
  /// kept or already taken). Its state is kActive.
  std::unique_ptr<OnnxSession> take_winner();

  const TuneReport& report() const noexcept;
  const GraphSpec& spec() const noexcept;

  /// The conditions on input shapes the ONNX graphs evaluated from now on were exported
  /// under (ShapeCondition: a branch of the model's code on a size, recorded on one side):
  /// their sessions, and so the winner and its checkpoint, refuse calls violating one. A
  /// condition some recorded sample violates is left out and returned: that sample is run
  /// through the graph and checked against eager like every sample, which judges the graph
  /// at that size. A probe (TuneSample::probe) violating a kept condition is not run
  /// through those graphs: its check says so (SampleCheck::not_run) and passes, as the
  /// module refuses (or runs eagerly) there. Throws Error(kInvalidArgument) for a
  /// condition reading an input the graph does not have.
  std::vector<ShapeCondition> set_shape_conditions(std::vector<ShapeCondition> conditions);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A host tensor repeating `tensor` `factor` times along `axis` (the batch axis), so
/// that a model that treats batch items independently gives `factor` copies of its
/// outputs. `tensor` must be in host memory and contiguous.
Tensor tile_along_axis(const TensorView& tensor, int axis, int64_t factor);

}  // namespace aitune
