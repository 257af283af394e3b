// The search for the smallest set of fp32 nodes an fp16 model needs to pass its check.
#include "aitune/fp32_node_search.hpp"

#include <algorithm>

namespace aitune {

Fp32NodeSearchResult search_fp32_nodes(const std::vector<std::string>& nodes,
                                       const std::function<bool(const std::vector<std::string>& kept)>& passes,
                                       int max_evaluations) {
  Fp32NodeSearchResult result;
  auto check = [&](const std::vector<std::string>& kept) {
    ++result.evaluations;
    return passes(kept);
  };
  result.kept = nodes;
  if (nodes.empty() || !check(result.kept)) {
    result.note = nodes.empty() ? "no node to keep in fp32" : "fails even with every node in fp32";
    return result;
  }
  result.passed = true;
  std::size_t chunk = std::max<std::size_t>(1, result.kept.size() / 2);
  while (true) {
    // Drop each chunk of the kept set in turn (convert it to fp16) where the model still passes.
    for (std::size_t start = 0; start < result.kept.size();) {
      if (result.evaluations >= max_evaluations) {
        result.note = "stopped after " + std::to_string(result.evaluations) + " checks";
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
  result.note = "minimal: no single kept node can go to fp16 (" + std::to_string(result.evaluations) + " checks)";
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
