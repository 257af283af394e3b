// What a finished tune leads to, and first-wins early stop: the drivers' shared decisions.
#include "aitune/tune_outcome.hpp"

#include <algorithm>
#include <set>
#include <string>

namespace aitune {

std::string_view tune_outcome_kind_name(TuneOutcomeKind kind) noexcept {
  switch (kind) {
    case TuneOutcomeKind::kWinner: return "winner";
    case TuneOutcomeKind::kEagerKept: return "eager_kept";
    case TuneOutcomeKind::kEagerFallback: return "eager_fallback";
    case TuneOutcomeKind::kAllIncorrect: return "all_incorrect";
    case TuneOutcomeKind::kNoCandidate: return "no_candidate";
    case TuneOutcomeKind::kUnsupportedDType: return "unsupported_dtype";
  }
  return "no_candidate";
}

TuneOutcome decide_outcome(const TuneReport& report, bool eager_fallback, bool errors_as_mismatch) {
  TuneOutcome out;
  const auto& cs = report.candidates;
  if (report.winner) {
    out.kind = TuneOutcomeKind::kWinner;
    out.winner = *report.winner;
    return out;
  }
  // Performance validation ranked a candidate first but it did not beat eager.
  if (std::any_of(cs.begin(), cs.end(), [](const auto& c) { return c.status == CandidateStatus::kSlowerThanEager; })) {
    out.kind = TuneOutcomeKind::kEagerKept;
    out.why = report.decision;
    return out;
  }
  if (eager_fallback) {
    out.kind = TuneOutcomeKind::kEagerFallback;  // eager is the strategy's own last choice: no note
    return out;
  }
  const bool all_incorrect = !cs.empty() && std::all_of(cs.begin(), cs.end(), [](const auto& c) {
    return c.status == CandidateStatus::kIncorrect;
  });
  // Every candidate failed for want of a kernel at the model's dtype (bfloat16 on ORT's
  // CPU): the front end raises its typed error (UnsupportedDTypeError), the reasons say what
  // to do. A candidate of the same backend (group) that failed before any session (its
  // model transform: onnxscript's fusions refuse bf16) does not change that; any other
  // failure (another backend's, a session's for another cause) does.
  std::set<int> dtype_groups;
  for (const auto& c : cs)
    if (c.failure_code == ErrorCode::kUnsupportedDType) dtype_groups.insert(c.group);
  const bool all_dtype = !dtype_groups.empty() && std::all_of(cs.begin(), cs.end(), [&](const auto& c) {
    return c.status == CandidateStatus::kFailed &&
           (c.failure_code == ErrorCode::kUnsupportedDType || (!c.failure_code && dtype_groups.count(c.group)));
  });
  out.kind = errors_as_mismatch && all_incorrect ? TuneOutcomeKind::kAllIncorrect
             : all_dtype                         ? TuneOutcomeKind::kUnsupportedDType
                                                 : TuneOutcomeKind::kNoCandidate;
  return out;
}

std::string failure_message(TuneOutcomeKind kind, const TuneReport& report) {
  const auto& cs = report.candidates;
  auto where = [](const CandidateResult& c) { return c.divergence ? c.divergence->describe() : std::string(); };
  if (kind == TuneOutcomeKind::kAllIncorrect && !cs.empty()) {
    const auto& first = cs.front();
    const std::string at = where(first);
    return report.graph + ": every candidate differs from eager PyTorch; " + first.name + ": " + first.reason +
           (at.empty() ? "" : "; " + at) + "\n" + report.summary_table();
  }
  if (kind != TuneOutcomeKind::kNoCandidate && kind != TuneOutcomeKind::kAllIncorrect &&
      kind != TuneOutcomeKind::kUnsupportedDType)
    return "";
  std::string reasons;
  for (const auto& c : cs) {
    const std::string at = where(c);
    reasons += (reasons.empty() ? "  - " : "\n  - ") + c.name + " (" + c.backend +
               "): " + std::string(candidate_status_name(c.status)) + ": " + c.reason + (at.empty() ? "" : "\n    " + at);
  }
  const std::string why = kind == TuneOutcomeKind::kUnsupportedDType
                              ? " (its execution provider has no kernel at the model's dtype)"
                              : "";
  return "no backend could build " + report.graph + why + ":\n" + reasons + "\n" + report.summary_table();
}

bool group_succeeded(const TuneReport& report, int group) noexcept {
  return std::any_of(report.candidates.begin(), report.candidates.end(), [&](const CandidateResult& c) {
    return c.group == group && c.status == CandidateStatus::kPassed;
  });
}

}  // namespace aitune
