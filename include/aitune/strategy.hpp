// Tune strategies: which of the measured candidates of a graph wins, and whether it
// beats eager PyTorch by enough to replace it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "aitune/correctness.hpp"
#include "aitune/error.hpp"
#include "aitune/divergence.hpp"
#include "aitune/profiler.hpp"

namespace aitune {

/// The reference's strategies. kOneBackend and kFirstWins pick within the first backend
/// (candidate group) that has a correct candidate, the fastest of its variants.
enum class StrategyKind { kOneBackend, kFirstWins, kMaxThroughput, kMinLatency, kLatencyBudget };

/// "one-backend", "first-wins", "max-throughput", "min-latency", "latency-budget".
std::string_view strategy_kind_name(StrategyKind kind) noexcept;
/// Inverse of strategy_kind_name (also accepts '_' for '-'); Error(kInvalidArgument) otherwise.
StrategyKind parse_strategy_kind(std::string_view text);

/// A strategy and the performance validation applied to its choice. Value type.
struct StrategyConfig {
  StrategyKind kind = StrategyKind::kMaxThroughput;
  double latency_budget_ms = 0;         ///< kLatencyBudget: p50 latency limit
  bool performance_validation = true;   ///< the winner must beat eager by min_speedup
  double min_speedup = 1.01;            ///< eager p50 / winner p50, as the reference requires
  /// Eager is one of the competitors (TorchEagerBackend listed in a strategy where every
  /// backend competes): the winner must be at least as fast as eager even without
  /// performance validation (with it, by max(min_speedup, 1)).
  bool eager_competes = false;

  /// Throws Error(kInvalidArgument) naming the bad field.
  void validate() const;
  std::string describe() const;  ///< "max-throughput" / "latency-budget(2.5 ms)"
};

/// Where a candidate ended.
enum class CandidateStatus {
  kFailed,           ///< could not be built or run (export, session creation, provider)
  kIncorrect,        ///< outputs differ from the reference beyond tolerance
  kPassed,           ///< correct, measured, not (yet) decided on
  kSelected,         ///< the winner
  kNotChosen,        ///< correct but another candidate ranked higher
  kOverBudget,       ///< correct but above the latency budget
  kSlowerThanEager,  ///< ranked first but did not beat eager by min_speedup: eager kept
};
std::string_view candidate_status_name(CandidateStatus status) noexcept;

/// One candidate of one graph: a backend with one full configuration.
struct CandidateResult {
  std::string name;          ///< e.g. "cuda[cudnn_conv_algo_search=HEURISTIC,use_tf32=0]"
  std::string backend;       ///< front-end backend that produced it, e.g. "ONNXRuntimeBackend"
  int group = 0;             ///< index of that backend in the strategy's order
  std::string config_json;   ///< the full configuration (OnnxSessionConfig JSON for ORT)
  Precision precision = Precision::kStrict;
  /// The graph transform its model went through ("" for the export as it is), e.g.
  /// "ort_fusions" (onnxscript's optimize_for_ort), and the fused operators it made.
  std::string transform;
  std::map<std::string, int64_t> fused_operators;
  /// Mixed precision (transform "fp16_mixed"): the nodes its model keeps in fp32, as the
  /// search found them (names of the exported graph's nodes); empty otherwise.
  std::vector<std::string> fp32_nodes;
  /// How its model was made, where the transform's name does not say it all: for
  /// "fp16_search", how the search ended ("stopped after 120.4 s (7 checks)") and, where
  /// the set was reused, the configuration whose search found it. Empty otherwise.
  std::string transform_note;
  /// The outputs its session writes into an input's buffer, output name -> input name
  /// (OnnxSessionConfig::in_place_outputs / output_aliases): those inputs are updated in
  /// place by every call. Empty otherwise.
  std::map<std::string, std::string> in_place_outputs;
  CandidateStatus status = CandidateStatus::kFailed;
  std::string reason;        ///< why it failed, was rejected or was chosen
  /// For a failed candidate whose session could not be created or run: the engine's error code
  /// (kUnsupportedDType: the provider has no kernel at the model's dtype); empty otherwise.
  std::optional<ErrorCode> failure_code;
  std::optional<CorrectnessReport> correctness;
  /// For an incorrect candidate: where its graph first diverges, when traced
  /// (`GraphTuner::trace_divergence`).
  std::optional<DivergenceReport> divergence;
  /// Its latency: the final round's measurement where it was a finalist (stop_reason
  /// "final round"), else its first profile.
  std::optional<Profile> profile;
  /// A finalist's first measurement (right after it was created), which the final round's
  /// `profile` replaced; empty for candidates the final round did not measure.
  std::optional<Profile> first_profile;
  double session_creation_ms = 0;
  double first_run_ms = 0;
  double speedup_vs_eager = 0;  ///< eager p50 / this p50; 0 when either is unmeasured
};

/// Decides among `candidates` (statuses and reasons are updated in place). Only
/// kPassed candidates with a profile compete. Returns the winner's index, or nullopt
/// when none is correct or performance validation keeps eager; `decision` says why.
/// `reference_label` names what `eager` measured in reasons and the decision ("eager", or an
/// ONNX-only tune's "reference (cpu fp32)").
std::optional<std::size_t> select_candidate(const StrategyConfig& strategy, std::vector<CandidateResult>& candidates,
                                            const std::optional<Profile>& eager, std::string& decision,
                                            const std::string& reference_label = "eager");

}  // namespace aitune
