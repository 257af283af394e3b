// fp16 where it is safe: the measured search for the smallest set of nodes an fp16 model
// must keep in fp32 to pass the correctness check.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "aitune/candidates.hpp"
#include "aitune/tune_report.hpp"

namespace aitune {

struct Fp32NodeSearchResult {
  bool passed = false;             ///< a set was found that passes (false: not even every node in fp32 did)
  std::vector<std::string> kept;   ///< the nodes to keep in fp32, in the order given
  int evaluations = 0;             ///< models checked
  int unrunnable = 0;              ///< of those, models that could not be built or run (`passes` threw)
  double seconds = 0;              ///< wall-clock time the search took (its checks included)
  std::string note;                ///< how the search ended
};

/// The search's clock in seconds (monotonic); tests pass a fake one.
using SearchClock = std::function<double()>;

/// The default bound on the search's wall-clock time: each check converts and loads the
/// whole model, which for a 2 GB decoder is tens of seconds.
inline constexpr double kDefaultFp32NodeSearchSeconds = 120.0;

/// Bisection over the nodes (delta debugging, in the order given, e.g. topological):
/// starting from every node kept in fp32, drop halves, then quarters, ... of the kept set
/// while the model still passes (`passes(kept)` builds and checks the model keeping those
/// nodes in fp32), until single nodes were tried or `max_evaluations` models were checked.
/// The all-fp16 model (nothing kept) is assumed to have failed already. The first check
/// is every node kept; when that fails the search stops (passed false). `passes` throws an
/// aitune::Error when the model could not be built or run (not a verdict on its numbers): that set
/// counts as not passing, and the note says so with the first error, so a model that
/// does not load is never reported as "fails even with every node in fp32".
///
/// `max_seconds` bounds the search's wall-clock time (`clock`, steady_clock when empty):
/// no check starts once that much time has passed since the search began (a check under
/// way finishes; the first check, every node kept, always runs, or nothing would pass).
/// The search then ends with the smallest set that passed so far (passed stays true) and
/// the note "stopped after N s (M checks)". Infinity: no bound. Throws
/// Error(kInvalidArgument) for a `max_seconds` that is not positive (or NaN) and a
/// `max_evaluations` below 1.
Fp32NodeSearchResult search_fp32_nodes(const std::vector<std::string>& nodes,
                                       const std::function<bool(const std::vector<std::string>& kept)>& passes,
                                       int max_evaluations = 24, double max_seconds = kDefaultFp32NodeSearchSeconds,
                                       const SearchClock& clock = {});

/// Whether the searched-fp16 candidate is worth trying for `config`: the index of the
/// all-fp16 candidate (transform "fp16") with that configuration when it was rejected by
/// the check (kIncorrect); nullopt when it passed, failed otherwise, or was not tried.
std::optional<std::size_t> rejected_fp16_candidate(const TuneReport& report, const OnnxSessionConfig& config);

}  // namespace aitune
