// The one tuning driver (tune_driver.hpp): the sequence of a tune, for every caller.
#include "aitune/tune_driver.hpp"

#include <exception>

#include "aitune/error.hpp"

namespace aitune {

TuneOutcome drive_tune(GraphTuner& tuner, const DriverStrategy& strategy, TuneFrontEnd& front_end,
                       const std::string& reference_label) {
  if (strategy.backends.empty()) throw Error(ErrorCode::kInvalidArgument, "drive_tune: a strategy needs a backend");
  tuner.profile_reference([&](const std::vector<TensorView>& inputs) { front_end.run_reference(inputs); },
                          reference_label);

  bool eager_fallback = false;
  StrategyConfig choice = strategy.choice;
  for (std::size_t i = 0; i < strategy.backends.size(); ++i) {
    const DriverBackend& backend = strategy.backends[i];
    const int group = static_cast<int>(i);
    if (backend.eager) {
      eager_fallback = true;
      // First wins: eager from here on, unless an earlier backend already has a winner.
      if (strategy.stop_at_first_success) break;
      // A strategy where every backend competes: eager competes too, wherever it is listed
      // (it stopped the backends after it before, whose candidates then never ran). Its p50
      // is the reference's, measured anyway (strategy.hpp: eager_competes).
      choice.eager_competes = true;
      continue;
    }
    try {
      front_end.add_candidates(i, tuner, group);
    } catch (const FatalTuneError&) {
      throw;  // nothing after it can run: never one backend's failure
    } catch (const std::exception& error) {
      if (strategy.propagate_errors) throw;
      // Classified here: the backend could not make any candidate; the tune goes on.
      front_end.warn(backend.name + ": " + error.what());
      tuner.add_failed(backend.name, backend.kind, group, error.what());
    }
    if (strategy.stop_at_first_success && group_succeeded(tuner.report(), group)) break;  // first wins
  }
  tuner.select(choice);
  front_end.explain_failures(tuner);
  TuneOutcome outcome = decide_outcome(tuner.report(), eager_fallback, strategy.propagate_errors);
  if (outcome.is_failure()) outcome.message = failure_message(outcome.kind, tuner.report());
  return outcome;
}

}  // namespace aitune
