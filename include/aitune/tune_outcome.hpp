// TuneOutcome: what a finished tune leads to (the winner, eager kept, eager as the
// fallback, or a failure and which kind), decided once here for every driver.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "aitune/tune_report.hpp"

namespace aitune {

/// What a driver does with a selected TuneReport.
enum class TuneOutcomeKind {
  kWinner,          ///< a candidate won: run it
  kEagerKept,       ///< performance validation kept eager (a candidate was slower than eager)
  kEagerFallback,   ///< no candidate was correct, and the strategy ends with eager
  kAllIncorrect,    ///< failure: every candidate computed, and every one differs from the reference
  kNoCandidate,     ///< failure: no candidate could be built or chosen
  kUnsupportedDType,  ///< failure: no candidate was built, each for want of a kernel at the model's dtype
};
std::string_view tune_outcome_kind_name(TuneOutcomeKind kind) noexcept;

struct TuneOutcome {
  TuneOutcomeKind kind = TuneOutcomeKind::kNoCandidate;
  /// Why eager was kept (the decision); "" otherwise.
  std::string why;
  /// The candidate index for kWinner.
  std::size_t winner = 0;
  /// For a failure: what the user is told (each candidate's reason, the summary table).
  std::string message;
  bool is_failure() const noexcept {
    return kind == TuneOutcomeKind::kAllIncorrect || kind == TuneOutcomeKind::kNoCandidate ||
           kind == TuneOutcomeKind::kUnsupportedDType;
  }
};

/// The outcome of `report` (after GraphTuner::select). `eager_fallback`: the strategy ends
/// with the eager backend (eager wins when nothing earlier did); `errors_as_mismatch`:
/// a tune whose every candidate is incorrect is kAllIncorrect (the front end's
/// NumericMismatchError) instead of kNoCandidate.
TuneOutcome decide_outcome(const TuneReport& report, bool eager_fallback, bool errors_as_mismatch);

/// The message of a failed outcome (kAllIncorrect: the first candidate's mismatch and
/// where it diverges; kNoCandidate: every candidate's reason), with the summary table; ""
/// for any other kind.
std::string failure_message(TuneOutcomeKind kind, const TuneReport& report);

/// True when a candidate of `group` passed its checks: with a first-wins strategy
/// (stop_at_first_success) the driver evaluates no later group.
bool group_succeeded(const TuneReport& report, int group) noexcept;

}  // namespace aitune
