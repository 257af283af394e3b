// The one tuning driver (drive_tune) with a fake front end: backends in order, first-wins
// early stop, eager as the fallback when every candidate fails, a backend's failure
// recorded or propagated, a fatal one always let through, the outcome and its message.
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "aitune/error.hpp"
#include "aitune/tune_driver.hpp"

namespace aitune {
namespace {

// One graph y = 2x on a [2, 3] float32 tensor; candidates are external (no session).
struct Graph {
  Tensor x = Tensor::empty_host(DType::kFloat32, {2, 3});
  Tensor y = Tensor::empty_host(DType::kFloat32, {2, 3});
  Tensor wrong = Tensor::empty_host(DType::kFloat32, {2, 3});
  Graph() {
    for (int i = 0; i < 6; ++i) {
      static_cast<float*>(x.data())[i] = static_cast<float>(i);
      static_cast<float*>(y.data())[i] = 2.0f * static_cast<float>(i);
      static_cast<float*>(wrong.data())[i] = 3.0f * static_cast<float>(i) + 1.0f;
    }
  }
  GraphTuner tuner() const {
    GraphSpecBuilder b;
    b.record({{"x", DType::kFloat32, {2, 3}}}, {{"y", DType::kFloat32, {2, 3}}}, 2);
    TunerOptions o;
    o.profile.warmup_calls = 1;
    o.profile.window_calls = 3;
    o.profile.time_cap_s = 0.05;
    return GraphTuner("g", b.build(), {{{x.view()}, {y.view()}, 2}}, o);
  }
};

// What each fake backend does when asked for its candidates.
enum class Does { kRight, kWrong, kThrow, kFatal };

struct FakeFrontEnd : TuneFrontEnd {
  const Graph& g;
  std::vector<Does> backends;
  std::vector<std::size_t> asked;  // the backends asked, in order
  int reference_runs = 0;
  bool explained = false;
  std::vector<std::string> warnings;

  FakeFrontEnd(const Graph& graph, std::vector<Does> b) : g(graph), backends(std::move(b)) {}
  void run_reference(const std::vector<TensorView>& inputs) override {
    ASSERT_EQ(inputs.size(), 1u);
    ++reference_runs;
  }
  void add_candidates(std::size_t backend, GraphTuner& tuner, int group) override {
    asked.push_back(backend);
    const Tensor& out = backends.at(backend) == Does::kWrong ? g.wrong : g.y;
    switch (backends.at(backend)) {
      case Does::kThrow: throw Error(ErrorCode::kModelInvalid, "export failed");
      case Does::kFatal: throw FatalTuneError("the CUDA context is lost");
      default: break;
    }
    ExternalCandidate c{"b" + std::to_string(backend), "{}", Precision::kStrict,
                        [&out](std::size_t) { return std::vector<Tensor>{out}; }, [] {}};
    tuner.evaluate_external(c, "Fake", group);
  }
  void explain_failures(GraphTuner&) override { explained = true; }
  void warn(const std::string& line) override { warnings.push_back(line); }
};

DriverStrategy strategy(std::vector<DriverBackend> backends, StrategyKind kind = StrategyKind::kMaxThroughput) {
  DriverStrategy s;
  s.choice.kind = kind;
  s.choice.performance_validation = false;
  s.backends = std::move(backends);
  s.stop_at_first_success = kind == StrategyKind::kFirstWins;
  return s;
}

const DriverBackend kA{"A[x=1]", "A"}, kB{"B", "B"}, kC{"C", "C"}, kEager{"Eager", "Eager", true};

TEST(TuneDriver, MeasuringStrategiesAskEveryBackendAndPickAWinner) {
  Graph g;
  auto tuner = g.tuner();
  FakeFrontEnd fe(g, {Does::kRight, Does::kWrong, Does::kRight});
  auto outcome = drive_tune(tuner, strategy({kA, kB, kC}), fe);
  EXPECT_EQ(fe.asked, (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_GT(fe.reference_runs, 0);
  EXPECT_TRUE(fe.explained);
  ASSERT_EQ(outcome.kind, TuneOutcomeKind::kWinner);
  const auto& r = tuner.report();
  EXPECT_TRUE(r.eager.has_value());
  EXPECT_EQ(r.candidates[1].status, CandidateStatus::kIncorrect);
  EXPECT_NE(outcome.winner, 1u);
  EXPECT_EQ(r.candidates[outcome.winner].group, static_cast<int>(outcome.winner == 0 ? 0 : 2));
  EXPECT_TRUE(outcome.message.empty());
}

TEST(TuneDriver, FirstWinsStopsAtTheFirstBackendWithAPassingCandidate) {
  Graph g;
  auto tuner = g.tuner();
  FakeFrontEnd fe(g, {Does::kWrong, Does::kThrow, Does::kRight, Does::kRight});
  auto outcome = drive_tune(tuner, strategy({kA, kB, kC, kA}, StrategyKind::kFirstWins), fe);
  EXPECT_EQ(fe.asked, (std::vector<std::size_t>{0, 1, 2}));  // the fourth never asked
  ASSERT_EQ(outcome.kind, TuneOutcomeKind::kWinner);
  EXPECT_EQ(tuner.report().candidates[outcome.winner].group, 2);
  EXPECT_EQ(tuner.report().candidates.size(), 3u);
}

TEST(TuneDriver, ABackendsFailureIsRecordedUnderItsNameAndWarned) {
  Graph g;
  auto tuner = g.tuner();
  FakeFrontEnd fe(g, {Does::kThrow, Does::kRight});
  auto outcome = drive_tune(tuner, strategy({kA, kB}), fe);
  ASSERT_EQ(outcome.kind, TuneOutcomeKind::kWinner);
  const auto& failed = tuner.report().candidates[0];
  EXPECT_EQ(failed.name, "A[x=1]");
  EXPECT_EQ(failed.backend, "A");
  EXPECT_EQ(failed.group, 0);
  EXPECT_EQ(failed.status, CandidateStatus::kFailed);
  EXPECT_NE(failed.reason.find("export failed"), std::string::npos);
  ASSERT_EQ(fe.warnings.size(), 1u);
  EXPECT_EQ(fe.warnings[0].rfind("A[x=1]: ", 0), 0u) << fe.warnings[0];
}

TEST(TuneDriver, EagerIsTheFallbackWhenEveryCandidateBeforeItFails) {
  Graph g;
  auto tuner = g.tuner();
  FakeFrontEnd fe(g, {Does::kThrow, Does::kWrong, Does::kRight, Does::kRight});
  auto outcome = drive_tune(tuner, strategy({kA, kB, kEager, kC}, StrategyKind::kFirstWins), fe);
  EXPECT_EQ(fe.asked, (std::vector<std::size_t>{0, 1}));  // eager ends the list: C never asked
  EXPECT_EQ(outcome.kind, TuneOutcomeKind::kEagerFallback);
  EXPECT_FALSE(outcome.is_failure());
  EXPECT_TRUE(outcome.message.empty());
}

TEST(TuneDriver, WithoutEagerEveryFailureIsClassifiedAndListed) {
  Graph g;
  {
    auto tuner = g.tuner();
    FakeFrontEnd fe(g, {Does::kThrow, Does::kWrong});
    auto outcome = drive_tune(tuner, strategy({kA, kB}, StrategyKind::kFirstWins), fe);
    EXPECT_EQ(outcome.kind, TuneOutcomeKind::kNoCandidate);
    EXPECT_EQ(outcome.message.rfind("no backend could build g:\n  - A[x=1] (A): failed: ", 0), 0u) << outcome.message;
    EXPECT_NE(outcome.message.find("\n  - b1 (Fake): incorrect: "), std::string::npos) << outcome.message;
    EXPECT_NE(outcome.message.find(tuner.report().summary_table()), std::string::npos);
  }
  {  // every candidate computed and differs: a mismatch where the strategy propagates errors
    auto tuner = g.tuner();
    FakeFrontEnd fe(g, {Does::kWrong});
    auto s = strategy({kB}, StrategyKind::kOneBackend);
    s.propagate_errors = true;
    auto outcome = drive_tune(tuner, s, fe);
    EXPECT_EQ(outcome.kind, TuneOutcomeKind::kAllIncorrect);
    EXPECT_EQ(outcome.message.rfind("g: every candidate differs from eager PyTorch; b0: ", 0), 0u) << outcome.message;
  }
}

TEST(TuneDriver, PropagatedAndFatalErrorsLeaveTheDriverUnchanged) {
  Graph g;
  {
    auto tuner = g.tuner();
    FakeFrontEnd fe(g, {Does::kThrow, Does::kRight});
    auto s = strategy({kA, kB});
    s.propagate_errors = true;
    try {
      drive_tune(tuner, s, fe);
      FAIL() << "no exception";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kModelInvalid);  // its own type and code
    }
    EXPECT_EQ(fe.asked, (std::vector<std::size_t>{0}));
  }
  {
    auto tuner = g.tuner();
    FakeFrontEnd fe(g, {Does::kFatal, Does::kRight, Does::kRight});
    EXPECT_THROW(drive_tune(tuner, strategy({kA, kB, kEager}, StrategyKind::kFirstWins), fe), FatalTuneError);
    EXPECT_EQ(fe.asked, (std::vector<std::size_t>{0}));
    EXPECT_TRUE(fe.warnings.empty());
  }
  {
    auto tuner = g.tuner();
    FakeFrontEnd fe(g, {});
    EXPECT_THROW(drive_tune(tuner, strategy({}), fe), Error);
  }
}

}  // namespace
}  // namespace aitune
