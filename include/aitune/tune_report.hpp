// TuneReport: everything tuning one graph decided and measured, as JSON and as a table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "aitune/calibration.hpp"
#include "aitune/profiler.hpp"
#include "aitune/strategy.hpp"

namespace aitune {

/// The maximum batch size search on the winner: powers of two above the largest recorded
/// batch until the throughput gain falls below `min_gain`, an error (out of memory) or a limit.
struct BatchSearchResult {
  struct Step {
    int64_t batch_size = 0;
    double throughput = 0;  ///< samples per second (0 when the step failed)
    double p50_us = 0;
    double p99_us = 0;
    std::string error;      ///< why the step failed; "" when it ran
  };
  std::vector<Step> steps;
  int64_t recorded_max_batch = 0;
  int64_t max_batch = 0;    ///< the widened upper bound of the batch axis
  std::string stop_reason;
  std::string correctness;  ///< result of the check at max_batch ("passed" or the failure)
};

/// One graph's tuning.
struct TuneReport {
  std::string graph;  ///< "<module>/<graph key>" or the model path
  StrategyConfig strategy;
  std::optional<Profile> eager;  ///< the reference implementation's profile
  /// Its first profile, where the final round measured it again beside the finalists (then
  /// `eager` is the final round's, so that speed-ups compare one moment's figures).
  std::optional<Profile> eager_first_profile;
  std::string eager_label = "eager";
  std::vector<CandidateResult> candidates;
  std::optional<std::size_t> winner;
  std::string decision;
  std::optional<BatchSearchResult> batch_search;
  /// Reference outputs that cannot judge a candidate (all NaN/Inf, constant); the front
  /// end warns, and a decision made on them says so.
  std::vector<VacuousOutput> vacuous_outputs;
  /// The calibrated rule's factor, and eager PyTorch at each reduced precision a candidate
  /// computed in (measured, or why not), in the order they were first needed.
  double accuracy_factor = kDefaultAccuracyFactor;
  std::vector<EagerAtPrecision> eager_at_precision;
  double tuning_s = 0;  ///< wall time of the whole tuning of this graph
  /// The branches of the model's code on sizes the ONNX graphs were exported under
  /// (ShapeCondition text): those their sessions enforce, and those left out because a
  /// recorded sample is on their other side (the check at that sample judges the graph).
  std::vector<std::string> shape_conditions;
  std::vector<std::string> shape_conditions_left_out;

  std::string to_json(int indent = 2) const;
  /// A fixed-width table: candidate, status, max error, p50, throughput, speed-up vs
  /// eager, reason; then the decision (and the batch search, when run).
  std::string summary_table() const;
};

}  // namespace aitune
