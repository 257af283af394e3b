// The one tuning driver: the sequence of every tune (the CLI's and the front end's): the
// reference profiled, each backend of a strategy asked for its candidates in order, a
// backend's failure recorded or propagated, first-wins early stop, eager as the fallback,
// the strategy's choice, failures explained, and the outcome decided (tune_outcome.hpp).
// What needs the framework (export, the eager reference, a torch-side candidate) comes
// from the caller through one interface, TuneFrontEnd.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "aitune/strategy.hpp"
#include "aitune/tune_outcome.hpp"
#include "aitune/tuner.hpp"

namespace aitune {

/// One backend of a strategy, as the driver sees it.
struct DriverBackend {
  std::string name;    ///< how logs and failure lines name it ("ONNXRuntimeBackend[...]")
  std::string kind;    ///< the report's backend column when its failure is recorded ("ONNXRuntimeBackend")
  bool eager = false;  ///< eager itself: the strategy's fallback; it needs no candidate and ends the list
};

/// A strategy as the driver sequences it.
struct DriverStrategy {
  StrategyConfig choice;  ///< how the winner is chosen (strategy.hpp)
  std::vector<DriverBackend> backends;
  bool stop_at_first_success = false;  ///< first wins: no later backend once one has a passing candidate
  /// A backend's error leaves the driver unchanged (OneBackendStrategy: the user sees the
  /// error's own type) instead of being recorded as a failed candidate; a tune whose every
  /// candidate is incorrect is then kAllIncorrect.
  bool propagate_errors = false;
};

/// Thrown by TuneFrontEnd::add_candidates for a failure that leaves nothing after it
/// runnable (a candidate broke the process's CUDA context): the driver stops and lets it
/// through whatever the strategy says. Any other exception is one backend's failure.
class FatalTuneError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What only the caller can do: the framework's side of a tune.
class TuneFrontEnd {
 public:
  virtual ~TuneFrontEnd() = default;
  /// Runs the reference once on the profile sample's inputs (what profile_reference times).
  virtual void run_reference(const std::vector<TensorView>& inputs) = 0;
  /// Adds the candidates of backend `backend` (an index into DriverStrategy::backends) to
  /// `tuner` as candidate group `group`: exports, makes models, evaluate_onnx /
  /// evaluate_external. Throws when no candidate can be made at all (its export failed,
  /// its provider is missing): the driver records that as the backend's failure.
  virtual void add_candidates(std::size_t backend, GraphTuner& tuner, int group) = 0;
  /// After the choice: explains failed candidates in the report (divergence tracing).
  virtual void explain_failures(GraphTuner& /*tuner*/) {}
  /// A backend failed and its failure was recorded: `line` names it and says why.
  virtual void warn(const std::string& /*line*/) {}
};

/// Runs one tune on `tuner` (samples and options already in it): profiles the reference
/// as `reference_label`, asks each backend of `strategy` for its candidates (group i for
/// backend i), stops at the first group with a passing candidate under
/// stop_at_first_success, stops at an eager backend (the fallback), lets the strategy
/// choose, lets the front end explain failures, and decides the outcome; a failure's
/// outcome carries its message. Error(kInvalidArgument) for a strategy without backends;
/// FatalTuneError, and any backend error under propagate_errors, pass through.
TuneOutcome drive_tune(GraphTuner& tuner, const DriverStrategy& strategy, TuneFrontEnd& front_end,
                       const std::string& reference_label = "eager");

}  // namespace aitune
