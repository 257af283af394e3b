// Tests for latency_stats: numpy-style percentiles and the summary of a set of samples.
#include <gtest/gtest.h>

#include <vector>

#include "aitune/latency_stats.hpp"

namespace aitune {
namespace {

TEST(Percentile, InterpolatesBetweenClosestRanksLikeNumpy) {
  // numpy.percentile(range(1, 11), q) for these q.
  const std::vector<double> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(percentile(ten, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(ten, 50), 5.5);
  EXPECT_DOUBLE_EQ(percentile(ten, 90), 9.1);
  EXPECT_DOUBLE_EQ(percentile(ten, 95), 9.55);
  EXPECT_DOUBLE_EQ(percentile(ten, 100), 10.0);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 50), 2.5);
}

TEST(Percentile, SortsItsOwnCopyAndClampsQ) {
  std::vector<double> shuffled = {9, 1, 7, 3, 5};
  EXPECT_DOUBLE_EQ(percentile(shuffled, 50), 5.0);
  EXPECT_EQ(shuffled, (std::vector<double>{9, 1, 7, 3, 5}));  // the caller's order is kept
  EXPECT_DOUBLE_EQ(percentile(shuffled, -10), 1.0);
  EXPECT_DOUBLE_EQ(percentile(shuffled, 250), 9.0);
}

TEST(Percentile, EmptyAndSingleSample) {
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
  EXPECT_DOUBLE_EQ(percentile({42}, 0), 42.0);
  EXPECT_DOUBLE_EQ(percentile({42}, 99), 42.0);
}

TEST(SummarizeLatencies, MomentsAndPercentiles) {
  // The textbook set with mean 5 and population standard deviation 2.
  const LatencyStats s = summarize_latencies({9, 2, 5, 4, 4, 7, 4, 5});
  EXPECT_EQ(s.count, 8u);
  EXPECT_DOUBLE_EQ(s.mean, 5.0);
  EXPECT_DOUBLE_EQ(s.stddev, 2.0);
  EXPECT_DOUBLE_EQ(s.min, 2.0);
  EXPECT_DOUBLE_EQ(s.max, 9.0);
  EXPECT_DOUBLE_EQ(s.p50, 4.5);
  EXPECT_DOUBLE_EQ(s.p90, percentile({9, 2, 5, 4, 4, 7, 4, 5}, 90));
  EXPECT_DOUBLE_EQ(s.p99, percentile({9, 2, 5, 4, 4, 7, 4, 5}, 99));
  EXPECT_LE(s.p50, s.p90);
  EXPECT_LE(s.p90, s.p95);
  EXPECT_LE(s.p95, s.p99);
  EXPECT_LE(s.p99, s.max);
}

TEST(SummarizeLatencies, EmptyGivesZerosAndOneSampleHasNoSpread) {
  const LatencyStats empty = summarize_latencies({});
  EXPECT_EQ(empty.count, 0u);
  EXPECT_DOUBLE_EQ(empty.mean, 0.0);
  EXPECT_DOUBLE_EQ(empty.p99, 0.0);
  const LatencyStats one = summarize_latencies({12.5});
  EXPECT_EQ(one.count, 1u);
  EXPECT_DOUBLE_EQ(one.stddev, 0.0);
  EXPECT_DOUBLE_EQ(one.min, 12.5);
  EXPECT_DOUBLE_EQ(one.p50, 12.5);
  EXPECT_DOUBLE_EQ(one.p99, 12.5);
}

}  // namespace
}  // namespace aitune
