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

// Sessions refused for want of a kernel at the model's dtype (bf16 on ORT's CPU) make the
// typed outcome; a same-backend candidate that failed before any session (its transform)
// does not change it, another backend's failure or a session's other failure does.
TEST(TuneOutcome, EverySessionRefusedForTheDTypeIsUnsupportedDType) {
  auto r = report_of({{0, CandidateStatus::kFailed}, {0, CandidateStatus::kFailed}, {0, CandidateStatus::kFailed}});
  r.candidates[0].failure_code = r.candidates[1].failure_code = ErrorCode::kUnsupportedDType;
  EXPECT_EQ(decide_outcome(r, false, true).kind, TuneOutcomeKind::kUnsupportedDType);  // [2]: its transform failed
  EXPECT_TRUE(decide_outcome(r, false, true).is_failure());
  EXPECT_EQ(tune_outcome_kind_name(TuneOutcomeKind::kUnsupportedDType), "unsupported_dtype");
  EXPECT_NE(failure_message(TuneOutcomeKind::kUnsupportedDType, r).find("no kernel at the model's dtype"),
            std::string::npos);
  EXPECT_EQ(decide_outcome(r, true, true).kind, TuneOutcomeKind::kEagerFallback);  // eager still ends a strategy
  auto other_session = r;
  other_session.candidates[2].failure_code = ErrorCode::kModelInvalid;
  EXPECT_EQ(decide_outcome(other_session, false, true).kind, TuneOutcomeKind::kNoCandidate);
  auto other_backend = r;
  other_backend.candidates[2].group = 1;
  EXPECT_EQ(decide_outcome(other_backend, false, true).kind, TuneOutcomeKind::kNoCandidate);
  auto none = report_of({{0, CandidateStatus::kFailed}});
  EXPECT_EQ(decide_outcome(none, false, true).kind, TuneOutcomeKind::kNoCandidate);
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
