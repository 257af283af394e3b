// What a finished tune leads to (decide_outcome) and first-wins early stop (group_succeeded).
#include "aitune/tune_outcome.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {

TuneReport report_of(std::vector<std::pair<int, CandidateStatus>> candidates) {
  TuneReport r;
  for (auto [group, status] : candidates) {
    CandidateResult c;
    c.group = group;
    c.status = status;
    r.candidates.push_back(c);
  }
  return r;
}

TEST(TuneOutcome, AWinnerWins) {
  auto r = report_of({{0, CandidateStatus::kFailed}, {0, CandidateStatus::kSelected}});
  r.winner = 1;
  auto o = decide_outcome(r, true, true);
  EXPECT_EQ(o.kind, TuneOutcomeKind::kWinner);
  EXPECT_EQ(o.winner, 1u);
  EXPECT_FALSE(o.is_failure());
}

TEST(TuneOutcome, ValidationKeepsEagerWithTheDecision) {
  auto r = report_of({{0, CandidateStatus::kSlowerThanEager}});
  r.decision = "eager is faster";
  for (bool fallback : {false, true}) {
    auto o = decide_outcome(r, fallback, false);
    EXPECT_EQ(o.kind, TuneOutcomeKind::kEagerKept);
    EXPECT_EQ(o.why, "eager is faster");
  }
}

TEST(TuneOutcome, EagerIsTheFallbackOnlyWhenTheStrategyEndsWithIt) {
  auto r = report_of({{0, CandidateStatus::kFailed}});
  EXPECT_EQ(decide_outcome(r, true, false).kind, TuneOutcomeKind::kEagerFallback);
  EXPECT_EQ(decide_outcome(r, true, false).why, "");
  EXPECT_EQ(decide_outcome(r, false, false).kind, TuneOutcomeKind::kNoCandidate);
  EXPECT_TRUE(decide_outcome(r, false, false).is_failure());
}

TEST(TuneOutcome, EveryCandidateIncorrectIsAMismatchWhenAsked) {
  auto r = report_of({{0, CandidateStatus::kIncorrect}, {1, CandidateStatus::kIncorrect}});
  EXPECT_EQ(decide_outcome(r, false, true).kind, TuneOutcomeKind::kAllIncorrect);
  EXPECT_EQ(decide_outcome(r, false, false).kind, TuneOutcomeKind::kNoCandidate);
  auto mixed = report_of({{0, CandidateStatus::kIncorrect}, {1, CandidateStatus::kFailed}});
  EXPECT_EQ(decide_outcome(mixed, false, true).kind, TuneOutcomeKind::kNoCandidate);
  EXPECT_EQ(decide_outcome(TuneReport{}, false, true).kind, TuneOutcomeKind::kNoCandidate);
}

TEST(TuneOutcome, FirstWinsStopsAfterAGroupWithAPassedCandidate) {
  auto r = report_of({{0, CandidateStatus::kFailed}, {1, CandidateStatus::kPassed}});
  EXPECT_FALSE(group_succeeded(r, 0));
  EXPECT_TRUE(group_succeeded(r, 1));
  EXPECT_FALSE(group_succeeded(r, 2));
}

TEST(TuneOutcome, KindNames) {
  EXPECT_EQ(tune_outcome_kind_name(TuneOutcomeKind::kEagerFallback), "eager_fallback");
  EXPECT_EQ(tune_outcome_kind_name(TuneOutcomeKind::kAllIncorrect), "all_incorrect");
}

}  // namespace
}  // namespace aitune
