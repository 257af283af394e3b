// ServingPlan: request batching of a served graph (largest batch, how long a batch waits
// to fill) chosen from the latency measured per batch size and a p99 latency objective.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace aitune {

/// Latency of one call of the tuned graph at one batch size, as the tuner measured it.
struct BatchLatency {
  int64_t batch_size = 0;
  double p50_us = 0;
  double p99_us = 0;    ///< 0 when only p50 was measured (the plan then uses p50, and says so)
  std::string source;   ///< where the figure comes from ("winner profile", "batch search")

  bool operator==(const BatchLatency&) const = default;
};

/// The winner's latencies in a tuning report (TuneReport::to_json): its profile (at the
/// largest recorded batch) and each successful step of the batch search. Sorted by batch
/// size, one per size. Empty when the report has no winner (eager kept). Throws
/// Error(kInvalidArgument) when `report_json` is not a report.
std::vector<BatchLatency> batch_latencies_from_report(const std::string& report_json);

/// What the user asks of the server.
struct ServingObjective {
  /// p99 latency objective for one request, in milliseconds; nullopt: highest throughput.
  std::optional<double> slo_ms;
  /// Latency a request spends outside the model (HTTP, the router, (de)serialising), in
  /// milliseconds; part of the objective's budget.
  double overhead_ms = 2.0;
  /// Largest batch the graph accepts (its batch axis' upper bound); 0: unbounded.
  int64_t max_batch_accepted = 0;
  /// Why requests may not share a call (GraphSpec::batch_rows not independent: the reason
  /// the tuner gave); "" where they may. Non-empty: batch 1, said in the plan's reasons.
  std::string apart_reason;

  /// Throws Error(kInvalidArgument) naming the field that is out of range.
  void validate() const;
};

/// The batching a deployment is given, with why.
struct ServingPlan {
  int64_t max_batch_size = 1;       ///< requests (of batch 1) per model call
  double batch_wait_timeout_s = 0;  ///< how long the first request of a batch waits for more
  double expected_p99_ms = 0;       ///< worst case under load: one batch ahead, the wait, its own batch, overhead
  double expected_throughput = 0;   ///< samples per second of one replica at max_batch_size (batch / p50)
  bool objective_met = true;        ///< false when even batch 1 cannot meet the objective
  std::vector<BatchLatency> measured;
  std::vector<std::string> reasons;  ///< one line per decision, in order

  /// The reasons and a table of the measurements, for the command line.
  std::string explain() const;
  std::string to_json(int indent = 2) const;
};

/// Chooses the batching: among measured batch sizes within `max_batch_accepted`, the
/// largest whose worst case (a request arriving as a batch starts waits for it, then for
/// its own: 2 x p99, plus the overhead) fits the objective; the wait is what is left of
/// the budget, at most one batch's p50 (waiting longer than a call lasts gains no
/// throughput: under load, the next batch fills while the current one runs). Without an
/// objective: the batch of highest measured throughput, waiting one p50. Nothing
/// measured: batch 1, no wait, said in the reasons. Never extrapolates beyond what was
/// measured. Throws Error(kInvalidArgument) for an invalid objective or measurement.
ServingPlan plan_serving(std::vector<BatchLatency> measured, const ServingObjective& objective);

}  // namespace aitune
