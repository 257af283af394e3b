// GraphTuner::select's final round: the near-best passed candidates measured again,
// interleaved, on a scripted clock (each call advances it by the candidate's cost), so
// that which candidate is cheap when is exact.
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "aitune/error.hpp"
#include "aitune/tuner.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {
using namespace test;

// Time moves only when a candidate is called.
class ScriptedClock final : public Clock {
 public:
  double now_us() override { return t; }
  double t = 0;
};

struct Graph {
  Tensor x = make_pattern_f32({2, 3}, 1);
  Tensor y = make_pattern_f32({2, 3}, 2);
  GraphSpec spec() const {
    GraphSpecBuilder b;
    b.record({{"x", DType::kFloat32, x.shape()}}, {{"y", DType::kFloat32, y.shape()}}, 2);
    return b.build();
  }
  std::vector<TuneSample> samples() const { return {{{x.view()}, {y.view()}, 2}}; }
};

// Candidates whose cost per call (µs of the scripted clock) the test sets and changes;
// every call is recorded by name, in order.
struct Bench {
  Graph g;
  std::shared_ptr<ScriptedClock> clock = std::make_shared<ScriptedClock>();
  std::map<std::string, double> cost;
  std::map<std::string, int> calls;
  std::vector<std::string> order;
  std::string throws;  // a candidate whose calls throw from now on

  TunerOptions options(int windows = 5) const {
    TunerOptions o;
    o.profile.warmup_calls = 1;
    o.profile.window_calls = 5;
    o.profile.stable_windows = 3;
    o.profile.time_cap_s = 10;
    o.profile.final_round_windows = windows;
    o.clock = clock;
    return o;
  }
  ExternalCandidate candidate(const std::string& name) {
    return {name, "{}", Precision::kStrict, [this](std::size_t) { return std::vector<Tensor>{g.y}; },
            [this, name] {
              if (name == throws) throw std::runtime_error("the compiled graph was lost");
              clock->t += cost.at(name);
              ++calls[name];
              order.push_back(name);
            }};
  }
};

StrategyConfig max_throughput() {
  StrategyConfig s;
  s.performance_validation = false;
  return s;
}

TEST(FinalRound, ReRanksACandidateThatWasCheapOnlyWhenFirstMeasured) {
  Bench b;
  b.cost = {{"A", 10}, {"B", 10.5}};
  GraphTuner tuner("g", b.g.spec(), b.g.samples(), b.options());
  auto a = tuner.evaluate_external(b.candidate("A"), "X", 0);
  b.cost["A"] = 200;  // A is 20x dearer from now on: its first profile no longer holds
  auto bb = tuner.evaluate_external(b.candidate("B"), "X", 0);
  ASSERT_DOUBLE_EQ(tuner.report().candidates[a].profile->host_us.p50, 10);
  const auto& report = tuner.select(max_throughput());
  ASSERT_TRUE(report.winner.has_value()) << report.decision;
  EXPECT_EQ(*report.winner, bb) << report.decision;  // without the final round A (10 us) would win
  const auto& ca = report.candidates[a];
  const auto& cb = report.candidates[bb];
  ASSERT_TRUE(ca.first_profile.has_value());
  ASSERT_TRUE(cb.first_profile.has_value());
  EXPECT_DOUBLE_EQ(ca.first_profile->host_us.p50, 10);
  EXPECT_DOUBLE_EQ(ca.profile->host_us.p50, 200);
  EXPECT_DOUBLE_EQ(cb.first_profile->host_us.p50, 10.5);
  EXPECT_DOUBLE_EQ(cb.profile->host_us.p50, 10.5);
  EXPECT_EQ(ca.profile->stop_reason, "final round");
  EXPECT_EQ(ca.profile->windows, 5);
  EXPECT_EQ(ca.profile->measured_calls, 25);
  EXPECT_EQ(ca.profile->warmup_calls, 5);
  EXPECT_DOUBLE_EQ(ca.profile->throughput, 2 * 1e6 / 200);
  EXPECT_EQ(ca.status, CandidateStatus::kNotChosen);
  auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["candidates"][a]["first_profile"]["host_us"]["p50"], 10.0);
  EXPECT_EQ(j["candidates"][a]["profile"]["host_us"]["p50"], 200.0);
  EXPECT_EQ(j["candidates"][a]["profile"]["stop_reason"], "final round");
}

TEST(FinalRound, TheReferenceIsMeasuredAgainBesideTheFinalistsSoSpeedUpsCompareOneMoment) {
  // Eager was cheap when first profiled and costs 3x later, as the candidates do: against
  // its first profile no candidate beats it by min_speedup and eager would be kept;
  // measured again beside them, the fastest does.
  Bench b;
  b.cost = {{"eager", 10}, {"A", 12}, {"B", 12.5}};
  auto eager_run = [&b](const std::vector<TensorView>&) {
    b.clock->t += b.cost.at("eager");
    ++b.calls["eager"];
    b.order.push_back("eager");
  };
  GraphTuner tuner("g", b.g.spec(), b.g.samples(), b.options(3));
  tuner.profile_reference(eager_run);
  b.cost["eager"] = 30;
  auto a = tuner.evaluate_external(b.candidate("A"), "X", 0);
  tuner.evaluate_external(b.candidate("B"), "X", 0);
  b.order.clear();
  StrategyConfig strategy;  // performance validation on: the winner must beat eager by min_speedup
  const auto& report = tuner.select(strategy);
  ASSERT_TRUE(report.winner.has_value()) << report.decision;
  EXPECT_EQ(*report.winner, a) << report.decision;
  ASSERT_TRUE(report.eager_first_profile.has_value());
  EXPECT_DOUBLE_EQ(report.eager_first_profile->host_us.p50, 10);
  EXPECT_DOUBLE_EQ(report.eager->host_us.p50, 30);
  EXPECT_EQ(report.eager->stop_reason, "final round");
  EXPECT_DOUBLE_EQ(report.candidates[a].speedup_vs_eager, 30.0 / 12);
  // Interleaved with the finalists, window by window, after them in each round.
  std::vector<std::string> expected;
  for (int w = 0; w < 1 + 3; ++w)
    for (const char* name : {"A", "B", "eager"})
      for (int k = 0; k < 5; ++k) expected.push_back(name);
  EXPECT_EQ(b.order, expected);
  auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["eager_first_profile"]["host_us"]["p50"], 10.0);
  EXPECT_EQ(j["eager"]["host_us"]["p50"], 30.0);
}

TEST(FinalRound, AReferenceThatThrowsWhenCalledAgainKeepsItsFirstProfile) {
  Bench b;
  b.cost = {{"A", 10}, {"B", 10.5}};
  bool broken = false;
  GraphTuner tuner("g", b.g.spec(), b.g.samples(), b.options(2));
  tuner.profile_reference([&](const std::vector<TensorView>&) {
    if (broken) throw std::runtime_error("eager's module was freed");
    b.clock->t += 100;
  });
  tuner.evaluate_external(b.candidate("A"), "X", 0);
  tuner.evaluate_external(b.candidate("B"), "X", 0);
  broken = true;
  const auto& report = tuner.select(max_throughput());
  EXPECT_FALSE(report.eager_first_profile.has_value());
  EXPECT_DOUBLE_EQ(report.eager->host_us.p50, 100);
  ASSERT_TRUE(report.winner.has_value());
  for (const auto& c : report.candidates) EXPECT_NE(c.status, CandidateStatus::kFailed) << c.name;
}

TEST(FinalRound, FinalistsAreMeasuredInterleavedWindowByWindow) {
  Bench b;
  b.cost = {{"A", 10}, {"B", 10.5}};
  std::vector<std::string> lines;
  TunerOptions options = b.options(3);
  options.log = [&](const std::string& line) { lines.push_back(line); };
  GraphTuner tuner("g", b.g.spec(), b.g.samples(), options);
  tuner.evaluate_external(b.candidate("B"), "X", 0);
  tuner.evaluate_external(b.candidate("A"), "X", 0);
  b.order.clear();
  tuner.select(max_throughput());
  // The fastest first (A), one window (5 calls) each: a warm-up window, then 3 rounds.
  std::vector<std::string> expected;
  for (int w = 0; w < 1 + 3; ++w)
    for (const char* name : {"A", "B"})
      for (int k = 0; k < 5; ++k) expected.push_back(name);
  EXPECT_EQ(b.order, expected);
  int final_lines = 0;
  for (const auto& line : lines)
    if (line.find("final round: A p50 10.000000 us (first 10.000000 us)") != std::string::npos ||
        line.find("final round: B p50 10.500000 us (first 10.500000 us)") != std::string::npos)
      ++final_lines;
  EXPECT_EQ(final_lines, 2);
}

TEST(FinalRound, ACandidateOutsideTheMarginOrBeyondTheMaximumIsNotMeasuredAgain) {
  Bench b;
  b.cost = {{"A", 10}, {"B", 10.5}, {"C", 10.8}, {"slow", 11.5}};  // slow: 15 % above A
  TunerOptions options = b.options();
  options.profile.final_round_max = 2;  // C is within the margin but the third fastest
  GraphTuner tuner("g", b.g.spec(), b.g.samples(), options);
  auto a = tuner.evaluate_external(b.candidate("A"), "X", 0);
  auto bb = tuner.evaluate_external(b.candidate("B"), "X", 0);
  auto c = tuner.evaluate_external(b.candidate("C"), "X", 0);
  auto slow = tuner.evaluate_external(b.candidate("slow"), "X", 0);
  const auto before = b.calls;
  const auto& report = tuner.select(max_throughput());
  EXPECT_GT(b.calls["A"], before.at("A"));
  EXPECT_GT(b.calls["B"], before.at("B"));
  EXPECT_EQ(b.calls["C"], before.at("C"));
  EXPECT_EQ(b.calls["slow"], before.at("slow"));
  EXPECT_TRUE(report.candidates[a].first_profile.has_value());
  EXPECT_TRUE(report.candidates[bb].first_profile.has_value());
  EXPECT_FALSE(report.candidates[c].first_profile.has_value());
  EXPECT_FALSE(report.candidates[slow].first_profile.has_value());
  EXPECT_NE(report.candidates[slow].profile->stop_reason, "final round");
  auto j = nlohmann::json::parse(report.to_json());
  EXPECT_TRUE(j["candidates"][slow]["first_profile"].is_null());
  EXPECT_TRUE(j["candidates"][a]["first_profile"].is_object());
}

TEST(FinalRound, NoWindowsOrNoFinalistsMeansNoFinalRound) {
  for (int variant = 0; variant < 2; ++variant) {
    Bench b;
    b.cost = {{"A", 10}, {"B", 10.5}, {"C", 50}};
    TunerOptions options = b.options(variant == 0 ? 0 : 5);
    if (variant == 1) options.profile.final_round_max = 0;
    GraphTuner tuner("g", b.g.spec(), b.g.samples(), options);
    auto a = tuner.evaluate_external(b.candidate("A"), "X", 0);
    b.cost["A"] = 200;
    tuner.evaluate_external(b.candidate("B"), "X", 0);
    const auto before = b.calls;
    const auto& report = tuner.select(max_throughput());
    EXPECT_EQ(b.calls, before) << "variant " << variant;
    for (const auto& c : report.candidates) EXPECT_FALSE(c.first_profile.has_value()) << c.name;
    EXPECT_EQ(report.winner, std::optional<std::size_t>(a)) << "variant " << variant;  // its first p50 decides
  }
}

// The only candidate within the margin is measured again at the end, beside the reference:
// the p50 the report gives the winner is of the moment the module is handed over (a GPT-2
// winner measured 2.5 % slower after its tune than when first profiled, on an H100).
TEST(FinalRound, ALoneFinalistIsMeasuredAgainAtTheEnd) {
  Bench b;
  b.cost = {{"A", 10}, {"C", 50}};
  GraphTuner tuner("g", b.g.spec(), b.g.samples(), b.options(5));
  auto a = tuner.evaluate_external(b.candidate("A"), "X", 0);
  tuner.evaluate_external(b.candidate("C"), "X", 0);  // beyond the margin
  b.cost["A"] = 12;  // slower by the end of the tune
  const auto before = b.calls;
  const auto& report = tuner.select(max_throughput());
  EXPECT_GT(b.calls, before);
  ASSERT_EQ(report.winner, std::optional<std::size_t>(a));
  const auto& winner = report.candidates[a];
  ASSERT_TRUE(winner.first_profile.has_value());
  EXPECT_NEAR(winner.first_profile->host_us.p50, 10, 1e-6);
  EXPECT_NEAR(winner.profile->host_us.p50, 12, 1e-6);
  EXPECT_EQ(winner.profile->stop_reason, "final round");
  EXPECT_FALSE(report.candidates[1].first_profile.has_value()) << "C was not a finalist";
  EXPECT_NE(report.decision.find("the only candidate within the margin measured again at the end"), std::string::npos)
      << report.decision;
}

TEST(FinalRound, TheTimeCapStopsAtARoundBoundary) {
  Bench b;
  b.cost = {{"A", 10}, {"B", 10}};
  TunerOptions options = b.options(10);
  // The windows shrink to fit the cap (at least 3 calls: 350 us over 11 windows of 20 us a
  // call pair gives 1, so 3), a round then takes 60 us; the cap counts from the end of the
  // final round's warm-up: rounds start at 0, 60, ..., 300 us, not at 360 (past the cap).
  options.profile.time_cap_s = 350e-6;
  GraphTuner tuner("g", b.g.spec(), b.g.samples(), options);
  auto a = tuner.evaluate_external(b.candidate("A"), "X", 0);
  auto bb = tuner.evaluate_external(b.candidate("B"), "X", 0);
  ASSERT_EQ(tuner.report().candidates[a].profile->measured_calls, 15);
  const auto& report = tuner.select(max_throughput());
  for (auto i : {a, bb}) {
    const auto& p = report.candidates[i].profile;
    EXPECT_EQ(p->stop_reason, "final round");
    EXPECT_EQ(p->windows, 6);
    EXPECT_EQ(p->measured_calls, 18);
  }
}

// A large model (calls of ~50 ms) got one round of 25 calls per run within the cap: each run
// timed once, in back-to-back blocks, and that single window replaced the first profile
// (eager's came out 7x its first on a busy host). The windows now shrink so the rounds fit,
// and where fewer than 2 rounds fit the first measurements stand.
TEST(FinalRound, WindowsShrinkToFitTheCapAndOneRoundIsNoFinalRound) {
  {
    Bench b;
    b.cost = {{"A", 1000}, {"B", 1000}};
    TunerOptions options = b.options(5);
    options.profile.time_cap_s = 0.03;  // 30 ms: 6 windows of 2 runs fit 2 calls each: 3 calls a window
    GraphTuner tuner("g", b.g.spec(), b.g.samples(), options);
    auto a = tuner.evaluate_external(b.candidate("A"), "X", 0);
    tuner.evaluate_external(b.candidate("B"), "X", 0);
    const auto& report = tuner.select(max_throughput());
    const auto& p = report.candidates[a].profile;
    EXPECT_EQ(p->stop_reason, "final round");
    EXPECT_GE(p->windows, 2);
    EXPECT_EQ(p->measured_calls, p->windows * 3);
  }
  {
    Bench b;
    b.cost = {{"A", 1000}, {"B", 1000}};
    TunerOptions options = b.options(5);
    options.profile.time_cap_s = 0.004;  // one round of 3 calls each (6 ms) passes the 4 ms cap
    GraphTuner tuner("g", b.g.spec(), b.g.samples(), options);
    auto a = tuner.evaluate_external(b.candidate("A"), "X", 0);
    tuner.evaluate_external(b.candidate("B"), "X", 0);
    const auto& report = tuner.select(max_throughput());
    EXPECT_NE(report.candidates[a].profile->stop_reason, "final round");
    EXPECT_FALSE(report.candidates[a].first_profile.has_value());
  }
}

TEST(FinalRound, AFinalistThatThrowsWhenCalledAgainFails) {
  Bench b;
  b.cost = {{"A", 10}, {"B", 10.5}};
  GraphTuner tuner("g", b.g.spec(), b.g.samples(), b.options());
  auto a = tuner.evaluate_external(b.candidate("A"), "X", 0);
  auto bb = tuner.evaluate_external(b.candidate("B"), "X", 0);
  b.throws = "A";
  const auto& report = tuner.select(max_throughput());
  EXPECT_EQ(report.candidates[a].status, CandidateStatus::kFailed);
  EXPECT_NE(report.candidates[a].reason.find("final round"), std::string::npos) << report.candidates[a].reason;
  EXPECT_NE(report.candidates[a].reason.find("the compiled graph was lost"), std::string::npos);
  EXPECT_EQ(report.winner, std::optional<std::size_t>(bb)) << report.decision;
  EXPECT_EQ(report.candidates[bb].profile->stop_reason, "final round");
}

TEST(FinalRound, ValidateRejectsOutOfRangeSettingsNamingTheField) {
  ProfileConfig c;
  c.final_round_margin = -0.1;
  expect_error([&] { c.validate(); }, ErrorCode::kInvalidArgument, {"final_round_margin"});
  c = ProfileConfig{};
  c.final_round_windows = -1;
  expect_error([&] { c.validate(); }, ErrorCode::kInvalidArgument, {"final_round_windows"});
  c = ProfileConfig{};
  c.final_round_max = -1;
  expect_error([&] { c.validate(); }, ErrorCode::kInvalidArgument, {"final_round_max"});
  c = ProfileConfig{};
  c.final_round_windows = 0;  // off, and valid
  c.final_round_max = 0;
  c.final_round_margin = 0;
  EXPECT_NO_THROW(c.validate());
  EXPECT_DOUBLE_EQ(ProfileConfig{}.final_round_margin, 0.10);
  EXPECT_EQ(ProfileConfig{}.final_round_windows, 5);
  EXPECT_EQ(ProfileConfig{}.final_round_max, 4);
  Graph g;
  TunerOptions options;
  options.profile.final_round_windows = -2;
  expect_error([&] { GraphTuner("g", g.spec(), g.samples(), options); }, ErrorCode::kInvalidArgument,
               {"final_round_windows"});
}

}  // namespace
}  // namespace aitune
