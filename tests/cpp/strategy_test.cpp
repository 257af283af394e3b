// Strategies: ranking, groups, budgets, performance validation, parsing.
#include <gtest/gtest.h>

#include "aitune/strategy.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {
using namespace test;

Profile profile(double p50_us, double throughput) {
  Profile p;
  p.host_us.p50 = p50_us;
  p.throughput = throughput;
  return p;
}

CandidateResult passed(const std::string& name, double p50_us, double throughput, int group = 0) {
  CandidateResult c;
  c.name = name;
  c.backend = "B" + std::to_string(group);
  c.group = group;
  c.status = CandidateStatus::kPassed;
  c.profile = profile(p50_us, throughput);
  return c;
}

CandidateResult with_status(const std::string& name, CandidateStatus status, int group = 0) {
  CandidateResult c;
  c.name = name;
  c.group = group;
  c.status = status;
  c.reason = "broken";
  return c;
}

StrategyConfig strategy(StrategyKind kind, bool validation = false) {
  StrategyConfig s;
  s.kind = kind;
  s.performance_validation = validation;
  return s;
}

// Throughput and latency disagree: "wide" was measured at a larger batch.
std::vector<CandidateResult> mixed() {
  return {passed("fast", 100, 10000), passed("wide", 400, 80000), with_status("bad", CandidateStatus::kIncorrect)};
}

TEST(Strategy, MaxThroughputAndMinLatencyRankDifferently) {
  std::string why;
  auto a = mixed();
  EXPECT_EQ(select_candidate(strategy(StrategyKind::kMaxThroughput), a, std::nullopt, why), 1u);
  EXPECT_EQ(a[1].status, CandidateStatus::kSelected);
  EXPECT_EQ(a[0].status, CandidateStatus::kNotChosen);
  EXPECT_EQ(a[2].status, CandidateStatus::kIncorrect);  // untouched
  auto b = mixed();
  EXPECT_EQ(select_candidate(strategy(StrategyKind::kMinLatency), b, std::nullopt, why), 0u);
  EXPECT_NE(why.find("lowest p50"), std::string::npos) << why;
}

TEST(Strategy, LatencyBudgetPicksTheHighestThroughputWithinBudget) {
  std::vector<CandidateResult> c = {passed("a", 900, 1000), passed("b", 1500, 5000), passed("c", 400, 800)};
  auto s = strategy(StrategyKind::kLatencyBudget);
  s.latency_budget_ms = 1.0;
  std::string why;
  EXPECT_EQ(select_candidate(s, c, std::nullopt, why), 0u);
  EXPECT_EQ(c[1].status, CandidateStatus::kOverBudget);
  EXPECT_NE(c[1].reason.find("> budget 1 ms"), std::string::npos) << c[1].reason;
  EXPECT_EQ(c[2].status, CandidateStatus::kNotChosen);

  std::vector<CandidateResult> none = {passed("a", 3000, 1000), passed("b", 2000, 900)};
  EXPECT_EQ(select_candidate(s, none, std::nullopt, why), 1u);
  EXPECT_NE(why.find("no candidate meets"), std::string::npos) << why;
}

TEST(Strategy, FirstWinsTakesTheFirstGroupWithACorrectCandidate) {
  std::vector<CandidateResult> c = {with_status("g0", CandidateStatus::kFailed, 0), passed("g1-slow", 300, 300, 1),
                                    passed("g1-fast", 200, 500, 1), passed("g2-fastest", 10, 90000, 2)};
  std::string why;
  EXPECT_EQ(select_candidate(strategy(StrategyKind::kFirstWins), c, std::nullopt, why), 2u);
  EXPECT_EQ(c[3].status, CandidateStatus::kNotChosen);
  auto one = strategy(StrategyKind::kOneBackend);
  std::vector<CandidateResult> variants = {passed("v0", 300, 300), passed("v1", 200, 500)};
  EXPECT_EQ(select_candidate(one, variants, std::nullopt, why), 1u);
}

TEST(Strategy, PerformanceValidationKeepsEagerUnlessTheWinnerIsFasterByTheMargin) {
  auto eager = profile(100, 10000);
  std::string why;
  std::vector<CandidateResult> barely = {passed("ort", 99.5, 10050)};  // 1.005x < 1.01x
  EXPECT_EQ(select_candidate(strategy(StrategyKind::kMaxThroughput, true), barely, eager, why), std::nullopt);
  EXPECT_EQ(barely[0].status, CandidateStatus::kSlowerThanEager);
  EXPECT_NEAR(barely[0].speedup_vs_eager, 100 / 99.5, 1e-12);
  EXPECT_NE(why.find("eager kept"), std::string::npos) << why;
  // Without eager PyTorch (an ONNX-only tune) the reason names the reference it was run against.
  std::vector<CandidateResult> against_reference = {passed("ort", 99.5, 10050)};
  EXPECT_EQ(select_candidate(strategy(StrategyKind::kMaxThroughput, true), against_reference, eager, why,
                             "reference (cpu fp32)"),
            std::nullopt);
  EXPECT_EQ(against_reference[0].reason, "speed-up vs reference (cpu fp32) 1.005x < required 1.01x") << why;
  EXPECT_NE(why.find("; reference (cpu fp32) kept"), std::string::npos) << why;
  EXPECT_EQ(why.find("eager"), std::string::npos) << why;

  std::vector<CandidateResult> faster = {passed("ort", 50, 20000)};
  EXPECT_EQ(select_candidate(strategy(StrategyKind::kMaxThroughput, true), faster, eager, why), 0u);
  EXPECT_DOUBLE_EQ(faster[0].speedup_vs_eager, 2.0);

  std::vector<CandidateResult> off = {passed("ort", 200, 5000)};  // slower, validation off
  EXPECT_EQ(select_candidate(strategy(StrategyKind::kMaxThroughput, false), off, eager, why), 0u);
  EXPECT_DOUBLE_EQ(off[0].speedup_vs_eager, 0.5);
}

TEST(Strategy, NothingCorrectMeansNoWinner) {
  std::vector<CandidateResult> c = {with_status("a", CandidateStatus::kIncorrect),
                                    with_status("b", CandidateStatus::kFailed)};
  std::string why;
  EXPECT_EQ(select_candidate(strategy(StrategyKind::kMinLatency), c, std::nullopt, why), std::nullopt);
  EXPECT_NE(why.find("no candidate passed"), std::string::npos) << why;
}

TEST(Strategy, ParsingAndValidation) {
  EXPECT_EQ(parse_strategy_kind("max-throughput"), StrategyKind::kMaxThroughput);
  EXPECT_EQ(parse_strategy_kind("latency_budget"), StrategyKind::kLatencyBudget);
  for (auto k : {StrategyKind::kOneBackend, StrategyKind::kFirstWins, StrategyKind::kMaxThroughput,
                 StrategyKind::kMinLatency, StrategyKind::kLatencyBudget})
    EXPECT_EQ(parse_strategy_kind(strategy_kind_name(k)), k);
  expect_error([] { parse_strategy_kind("fastest"); }, ErrorCode::kInvalidArgument, {"fastest", "min-latency"});
  auto s = strategy(StrategyKind::kLatencyBudget);
  std::vector<CandidateResult> c;
  std::string why;
  expect_error([&] { select_candidate(s, c, std::nullopt, why); }, ErrorCode::kInvalidArgument,
               {"latency_budget_ms"});
  s.latency_budget_ms = 2.5;
  EXPECT_EQ(s.describe(), "latency-budget(2.5 ms)");
}

}  // namespace
}  // namespace aitune
