// LatencyStats: percentiles and moments of a set of latency samples.
#pragma once

#include <cstddef>
#include <vector>

namespace aitune {

/// Summary of latency samples (any unit; aitune uses microseconds).
struct LatencyStats {
  std::size_t count = 0;
  double mean = 0, stddev = 0, min = 0, max = 0;
  double p50 = 0, p90 = 0, p95 = 0, p99 = 0;
};

/// Percentile by linear interpolation between closest ranks (numpy's default);
/// `q` in [0, 100]. Empty input gives 0.
double percentile(std::vector<double> samples, double q);

/// Summarises `samples` (population standard deviation). Empty input gives all zeros.
LatencyStats summarize_latencies(const std::vector<double>& samples);

}  // namespace aitune
