// The search for the smallest set of fp32 nodes an fp16 model needs to pass its check.
#include "aitune/fp32_node_search.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "aitune/error.hpp"

namespace aitune {
namespace {

std::string checks(int n) { return std::to_string(n) + (n == 1 ? " check" : " checks"); }

}  // namespace

Fp32NodeSearchResult search_fp32_nodes(const std::vector<std::string>& nodes,
                                       const std::function<bool(const std::vector<std::string>& kept)>& passes,
                                       int max_evaluations, double max_seconds, const SearchClock& clock) {
  if (!(max_seconds > 0))  // NaN too
    throw Error(ErrorCode::kInvalidArgument,
                "search_fp32_nodes: max_seconds must be positive (infinity: no bound), got " + std::to_string(max_seconds));
  if (max_evaluations < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "search_fp32_nodes: max_evaluations must be at least 1, got " + std::to_string(max_evaluations));
  const SearchClock now = clock ? clock : [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  const double start_time = now();
  Fp32NodeSearchResult result;
  std::string first_error;  // why the first model that could not be built or run could not
  auto check = [&](const std::vector<std::string>& kept) {
    ++result.evaluations;
    try {
      return passes(kept);
    } catch (const Error& e) {
      // Not a verdict on the numbers: the model could not be made or run. It does not
      // pass (its set stays kept), and the note says so rather than blaming fp16.
      ++result.unrunnable;
      if (first_error.empty()) first_error = e.what();
      return false;
    }
  };
  auto elapsed = [&] { return now() - start_time; };
  auto with_errors = [&](std::string note) {
    result.seconds = elapsed();
    if (result.unrunnable > 0)
      note += "; " + std::to_string(result.unrunnable) + " of the models could not be built or run (first: " +
              first_error + ")";
    return note;
  };
  result.kept = nodes;
  if (nodes.empty()) {
    result.note = "no node to keep in fp32";
    return result;
  }
  if (!check(result.kept)) {
    // Every node kept is the fp32 model up to the casts at its inputs and outputs: a model
    // that could not run says nothing about fp16, one that ran and failed is a real finding.
    result.note = result.unrunnable > 0
                      ? "the model keeping every node in fp32 could not be built or run: " + first_error
                      : "fails even with every node in fp32";
    result.seconds = elapsed();
    return result;
  }
  result.passed = true;
  std::size_t chunk = std::max<std::size_t>(1, result.kept.size() / 2);
  while (true) {
    // Drop each chunk of the kept set in turn (convert it to fp16) where the model still passes.
    for (std::size_t start = 0; start < result.kept.size();) {
      if (result.evaluations >= max_evaluations) {
        result.note = with_errors("stopped after " + checks(result.evaluations));
        return result;
      }
      if (double spent = elapsed(); spent >= max_seconds) {
        // The time bound: the kept set is the last one that passed, what the search found.
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%.1f", spent);
        result.note = with_errors("stopped after " + std::string(seconds) + " s (" + checks(result.evaluations) + ")");
        return result;
      }
      std::size_t end = std::min(result.kept.size(), start + chunk);
      std::vector<std::string> without(result.kept.begin(), result.kept.begin() + static_cast<long>(start));
      without.insert(without.end(), result.kept.begin() + static_cast<long>(end), result.kept.end());
      if (!without.empty() && check(without))
        result.kept = std::move(without);  // the same start now holds the next chunk
      else
        start = end;
    }
    if (chunk == 1) break;
    chunk = std::max<std::size_t>(1, chunk / 2);
  }
  result.note =
      with_errors("minimal: no single kept node can go to fp16 (" + checks(result.evaluations) + ")");
  return result;
}

std::optional<std::size_t> rejected_fp16_candidate(const TuneReport& report, const OnnxSessionConfig& config) {
  for (std::size_t i = 0; i < report.candidates.size(); ++i) {
    const auto& c = report.candidates[i];
    if (c.transform != model_transform::kFp16 || c.status != CandidateStatus::kIncorrect) continue;
    // Its config_json is its session's configuration after creation (stream options
    // added): the candidate name leaves those out.
    if (candidate_name(OnnxSessionConfig::from_json(c.config_json)) == candidate_name(config)) return i;
  }
  return std::nullopt;
}

}  // namespace aitune
