// Ranking of measured candidates and performance validation against eager.
#include "aitune/strategy.hpp"

#include <algorithm>
#include <sstream>

#include "aitune/error.hpp"
#include "base/enum_names.hpp"

namespace aitune {
namespace {

std::string fmt(double v, int precision = 3) {
  std::ostringstream out;
  out.precision(precision);
  out << v;
  return out.str();
}

double p50_ms(const CandidateResult& c) { return c.profile->host_us.p50 / 1e3; }

constexpr detail::EnumNames<StrategyKind, 5> kStrategyNames{{
    {StrategyKind::kOneBackend, "one-backend"},
    {StrategyKind::kFirstWins, "first-wins"},
    {StrategyKind::kMaxThroughput, "max-throughput"},
    {StrategyKind::kMinLatency, "min-latency"},
    {StrategyKind::kLatencyBudget, "latency-budget"},
}};

constexpr detail::EnumNames<CandidateStatus, 7> kStatusNames{{
    {CandidateStatus::kFailed, "failed"},
    {CandidateStatus::kIncorrect, "incorrect"},
    {CandidateStatus::kPassed, "passed"},
    {CandidateStatus::kSelected, "selected"},
    {CandidateStatus::kNotChosen, "not chosen"},
    {CandidateStatus::kOverBudget, "over budget"},
    {CandidateStatus::kSlowerThanEager, "slower than eager"},
}};

}  // namespace

std::string_view strategy_kind_name(StrategyKind kind) noexcept { return detail::enum_name(kStrategyNames, kind); }

StrategyKind parse_strategy_kind(std::string_view text) {
  std::string normalized(text);
  std::replace(normalized.begin(), normalized.end(), '_', '-');
  if (auto kind = detail::enum_value(kStrategyNames, normalized)) return *kind;
  throw Error(ErrorCode::kInvalidArgument, "unknown strategy '" + std::string(text) +
                                               "'; valid values: " + detail::enum_names_list(kStrategyNames));
}

void StrategyConfig::validate() const {
  if (kind == StrategyKind::kLatencyBudget && !(latency_budget_ms > 0))
    throw Error(ErrorCode::kInvalidArgument,
                "latency-budget strategy needs latency_budget_ms > 0, got " + fmt(latency_budget_ms));
  if (!(min_speedup > 0))
    throw Error(ErrorCode::kInvalidArgument, "min_speedup must be > 0, got " + fmt(min_speedup));
}

std::string StrategyConfig::describe() const {
  std::ostringstream out;  // (not string concatenation: GCC 12 warns falsely on it here)
  out << strategy_kind_name(kind);
  if (kind == StrategyKind::kLatencyBudget) out << "(" << fmt(latency_budget_ms) << " ms)";
  if (eager_competes) out << ", eager competing";
  return out.str();
}

std::string_view candidate_status_name(CandidateStatus status) noexcept {
  return detail::enum_name(kStatusNames, status);
}

std::optional<std::size_t> select_candidate(const StrategyConfig& strategy, std::vector<CandidateResult>& candidates,
                                            const std::optional<Profile>& eager, std::string& decision,
                                            const std::string& reference_label) {
  strategy.validate();
  for (auto& c : candidates)
    c.speedup_vs_eager = eager && c.profile && c.profile->host_us.p50 > 0 ? eager->host_us.p50 / c.profile->host_us.p50 : 0;

  std::vector<std::size_t> eligible;
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].status == CandidateStatus::kPassed && candidates[i].profile) eligible.push_back(i);
  if (eligible.empty()) {
    decision = candidates.empty() ? "no candidates" : "no candidate passed its checks";
    return std::nullopt;
  }

  auto by_throughput = [&](std::size_t a, std::size_t b) {
    return candidates[a].profile->throughput > candidates[b].profile->throughput;
  };
  auto by_latency = [&](std::size_t a, std::size_t b) { return p50_ms(candidates[a]) < p50_ms(candidates[b]); };
  std::size_t winner = eligible.front();
  switch (strategy.kind) {
    case StrategyKind::kOneBackend:
    case StrategyKind::kFirstWins: {
      int group = candidates[eligible.front()].group;
      for (auto i : eligible) group = std::min(group, candidates[i].group);
      std::vector<std::size_t> in_group;
      for (auto i : eligible)
        if (candidates[i].group == group) in_group.push_back(i);
      winner = *std::min_element(in_group.begin(), in_group.end(), by_throughput);
      decision = "first backend with a correct candidate (" + candidates[winner].backend +
                 "), its highest-throughput variant";
      break;
    }
    case StrategyKind::kMaxThroughput:
      winner = *std::min_element(eligible.begin(), eligible.end(), by_throughput);
      decision = "highest throughput (" + fmt(candidates[winner].profile->throughput, 4) + " samples/s)";
      break;
    case StrategyKind::kMinLatency:
      winner = *std::min_element(eligible.begin(), eligible.end(), by_latency);
      decision = "lowest p50 latency (" + fmt(p50_ms(candidates[winner])) + " ms)";
      break;
    case StrategyKind::kLatencyBudget: {
      std::vector<std::size_t> within;
      for (auto i : eligible) {
        if (p50_ms(candidates[i]) <= strategy.latency_budget_ms) {
          within.push_back(i);
        } else {
          candidates[i].status = CandidateStatus::kOverBudget;
          candidates[i].reason = "p50 " + fmt(p50_ms(candidates[i])) + " ms > budget " +
                                 fmt(strategy.latency_budget_ms) + " ms";
        }
      }
      if (within.empty()) {
        winner = *std::min_element(eligible.begin(), eligible.end(), by_latency);
        decision = "no candidate meets the " + fmt(strategy.latency_budget_ms) +
                   " ms budget; chose the lowest p50 latency (" + fmt(p50_ms(candidates[winner])) + " ms)";
      } else {
        winner = *std::min_element(within.begin(), within.end(), by_throughput);
        decision = "highest throughput within the " + fmt(strategy.latency_budget_ms) + " ms budget";
      }
      break;
    }
  }

  auto& best = candidates[winner];
  for (auto i : eligible)
    if (i != winner && candidates[i].status == CandidateStatus::kPassed) {
      candidates[i].status = CandidateStatus::kNotChosen;
      candidates[i].reason = "ranked below " + best.name;
    }
  const bool validate = strategy.performance_validation || strategy.eager_competes;
  const double required = !strategy.eager_competes          ? strategy.min_speedup
                          : strategy.performance_validation ? std::max(strategy.min_speedup, 1.0)
                                                            : 1.0;
  if (validate && eager && best.speedup_vs_eager < required) {
    best.status = CandidateStatus::kSlowerThanEager;
    // Digits enough to tell the two apart: 1.005 at 3 read "1.01x < required 1.01x".
    int digits = 3;
    while (digits < 8 && fmt(best.speedup_vs_eager, digits) == fmt(required, digits)) ++digits;
    best.reason = "speed-up vs " + reference_label + " " + fmt(best.speedup_vs_eager, digits) + "x < required " +
                  fmt(required) + "x" +
                  (strategy.eager_competes ? " (eager competes: the strategy lists TorchEagerBackend)" : "");
    decision = best.name + " ranked first but " + best.reason + "; " + reference_label + " kept";
    return std::nullopt;
  }
  best.status = CandidateStatus::kSelected;
  best.reason = decision;
  return winner;
}

}  // namespace aitune
