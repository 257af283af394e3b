// Batching of a served graph chosen from measured latency per batch size and a p99 objective.
#include "aitune/serving_plan.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "aitune/error.hpp"

namespace aitune {
namespace {

std::string ms(double us) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(us < 10000 ? 3 : 1) << us / 1e3 << " ms";
  return out.str();
}

std::string number(double v, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

// p99 where it was measured, else p50 (a report written before p99 was kept).
double tail_us(const BatchLatency& m) { return m.p99_us > 0 ? m.p99_us : m.p50_us; }
double throughput(const BatchLatency& m) { return static_cast<double>(m.batch_size) / (m.p50_us / 1e6); }

const nlohmann::json* member(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

double number_at(const nlohmann::json& j, const char* key) {
  const auto* v = member(j, key);
  return v && v->is_number() ? v->get<double>() : 0.0;
}

}  // namespace

std::vector<BatchLatency> batch_latencies_from_report(const std::string& report_json) {
  auto report = nlohmann::json::parse(report_json, nullptr, false);
  if (report.is_discarded() || !report.is_object() || !report.contains("candidates"))
    throw Error(ErrorCode::kInvalidArgument, "not a tuning report (JSON object with 'candidates' expected)");
  std::map<int64_t, BatchLatency> by_batch;
  const auto* winner = member(report, "winner");
  if (!winner || !winner->is_string()) return {};
  for (const auto& c : report["candidates"]) {
    if (!c.is_object() || c.value("name", std::string()) != winner->get<std::string>()) continue;
    const auto* profile = member(c, "profile");
    const auto* host = profile ? member(*profile, "host_us") : nullptr;
    if (!host) break;
    BatchLatency m{static_cast<int64_t>(number_at(*profile, "batch_size")), number_at(*host, "p50"),
                   number_at(*host, "p99"), "winner profile"};
    if (m.batch_size > 0 && m.p50_us > 0) by_batch[m.batch_size] = m;
    break;
  }
  if (const auto* search = member(report, "batch_search")) {
    if (const auto* steps = member(*search, "steps"); steps && steps->is_array())
      for (const auto& s : *steps) {
        if (!s.is_object() || !s.value("error", std::string()).empty()) continue;
        BatchLatency m{static_cast<int64_t>(number_at(s, "batch_size")), number_at(s, "p50_us"),
                       number_at(s, "p99_us"), "batch search"};
        if (m.batch_size > 0 && m.p50_us > 0) by_batch[m.batch_size] = m;
      }
  }
  std::vector<BatchLatency> out;
  for (auto& [batch, m] : by_batch) out.push_back(m);
  return out;
}

void ServingObjective::validate() const {
  if (slo_ms && !(std::isfinite(*slo_ms) && *slo_ms > 0))
    throw Error(ErrorCode::kInvalidArgument, "slo_ms must be a positive number of milliseconds, not " +
                                                 std::to_string(*slo_ms));
  if (!(std::isfinite(overhead_ms) && overhead_ms >= 0))
    throw Error(ErrorCode::kInvalidArgument, "overhead_ms must be >= 0, not " + std::to_string(overhead_ms));
  if (max_batch_accepted < 0)
    throw Error(ErrorCode::kInvalidArgument,
                "max_batch_accepted must be >= 0 (0: unbounded), not " + std::to_string(max_batch_accepted));
}

ServingPlan plan_serving(std::vector<BatchLatency> measured, const ServingObjective& objective) {
  objective.validate();
  for (const auto& m : measured)
    if (m.batch_size < 1 || !(m.p50_us > 0) || m.p99_us < 0 || !std::isfinite(m.p50_us) || !std::isfinite(m.p99_us))
      throw Error(ErrorCode::kInvalidArgument, "measurement at batch " + std::to_string(m.batch_size) +
                                                   " is invalid (batch >= 1, p50 > 0, p99 >= 0 expected)");
  std::sort(measured.begin(), measured.end(),
            [](const BatchLatency& a, const BatchLatency& b) { return a.batch_size < b.batch_size; });
  ServingPlan plan;
  plan.measured = measured;
  const double overhead_us = objective.overhead_ms * 1e3;

  std::vector<BatchLatency> usable;
  const int64_t accepted = objective.apart_reason.empty() ? objective.max_batch_accepted : 1;
  for (const auto& m : measured)
    if (accepted == 0 || m.batch_size <= accepted) usable.push_back(m);
  if (!objective.apart_reason.empty())
    plan.reasons.push_back("each request runs in a call of its own: " + objective.apart_reason);
  else if (usable.size() < measured.size())
    plan.reasons.push_back("batch sizes above " + std::to_string(objective.max_batch_accepted) +
                           " were measured but the graph accepts at most that batch: left out");
  if (usable.empty()) {
    plan.reasons.push_back("no latency was measured for this graph (eager kept, or a report without profiles): "
                           "batch 1, no wait; tune with the batch search (enable_find_max_batch_size) to batch "
                           "from measurements");
    plan.objective_met = !objective.slo_ms;
    return plan;
  }
  if (std::any_of(usable.begin(), usable.end(), [&](const BatchLatency& m) { return m.source != usable[0].source; }))
    // the winner's profile is timed through the tuned module's call (its dispatch included),
    // the batch search on the graph alone: batch 2 read 2.5x slower than batch 4 by it
    plan.reasons.push_back("the rows were measured two ways (see each row's source): the winner's profile through "
                           "the tuned module's call, the batch search on the graph alone; compare rows of one source");
  if (std::any_of(usable.begin(), usable.end(), [](const BatchLatency& m) { return m.p99_us <= 0; }))
    plan.reasons.push_back("p99 was not measured at every batch size: p50 stands in for it there");
  if (usable.size() == 1)
    plan.reasons.push_back("latency was measured at one batch size only (" + std::to_string(usable[0].batch_size) +
                           "): run the batch search when tuning to measure more");
  if (usable.front().batch_size > 1)
    plan.reasons.push_back("smallest measured batch is " + std::to_string(usable.front().batch_size) +
                           ": nothing smaller is planned from (no extrapolation)");

  const BatchLatency* chosen = nullptr;
  if (objective.slo_ms) {
    const double budget_us = *objective.slo_ms * 1e3;
    for (const auto& m : usable)
      if (2 * tail_us(m) + overhead_us <= budget_us) chosen = &m;
    if (chosen) {
      const double left_us = budget_us - 2 * tail_us(*chosen) - overhead_us;
      plan.batch_wait_timeout_s = std::min(left_us, chosen->p50_us) / 1e6;
      plan.reasons.push_back("largest measured batch whose worst case fits the p99 objective of " +
                             ms(budget_us) + ": batch " + std::to_string(chosen->batch_size) + " (2 x p99 " +
                             ms(tail_us(*chosen)) + " + overhead " + ms(overhead_us) + " = " +
                             ms(2 * tail_us(*chosen) + overhead_us) + ")");
      const BatchLatency* next = nullptr;
      for (const auto& m : usable)
        if (m.batch_size > chosen->batch_size) { next = &m; break; }
      if (next)
        plan.reasons.push_back("batch " + std::to_string(next->batch_size) + " would need " +
                               ms(2 * tail_us(*next) + overhead_us) + " > " + ms(budget_us));
      plan.reasons.push_back("wait for a batch to fill: " + ms(plan.batch_wait_timeout_s * 1e6) +
                             (left_us > chosen->p50_us ? " (one batch's p50; waiting longer adds latency, not throughput)"
                                                       : " (what the objective leaves)"));
    } else {
      chosen = &usable.front();
      plan.objective_met = false;
      plan.batch_wait_timeout_s = 0;
      plan.reasons.push_back("the p99 objective of " + ms(budget_us) + " cannot be met: at batch " +
                             std::to_string(chosen->batch_size) + " the worst case is already " +
                             ms(2 * tail_us(*chosen) + overhead_us) + "; serving batch " +
                             std::to_string(chosen->batch_size) + " with no wait (the lowest latency measured)");
    }
  } else {
    for (const auto& m : usable)
      if (!chosen || throughput(m) > throughput(*chosen)) chosen = &m;
    plan.batch_wait_timeout_s = chosen->p50_us / 1e6;
    plan.reasons.push_back("no latency objective: batch " + std::to_string(chosen->batch_size) +
                           ", the highest measured throughput (" + number(throughput(*chosen), 1) +
                           " samples/s), waiting up to one batch's p50 (" + ms(chosen->p50_us) + ")");
  }
  plan.max_batch_size = chosen->batch_size;
  plan.expected_throughput = throughput(*chosen);
  plan.expected_p99_ms = (2 * tail_us(*chosen) + plan.batch_wait_timeout_s * 1e6 + overhead_us) / 1e3;
  // The graph's own speed: a served request adds HTTP, decoding and batching, which only a
  // load test measures (a tiny MLP's 11 million samples/s here served 230 requests/s).
  plan.reasons.push_back("expected per replica: " + number(plan.expected_throughput, 1) +
                         " samples/s at saturation from the graph's own latency (HTTP, decoding and batching not "
                         "counted: aitune loadtest measures them), p99 up to " + ms(plan.expected_p99_ms * 1e3));
  return plan;
}

std::string ServingPlan::explain() const {
  std::ostringstream out;
  out << "batching: max_batch_size=" << max_batch_size << ", batch_wait_timeout_s=" << number(batch_wait_timeout_s, 6)
      << (objective_met ? "" : "  (objective NOT met)") << "\n";
  for (const auto& r : reasons) out << "  - " << r << "\n";
  if (!measured.empty()) {
    out << "  measured:\n";
    out << "    batch        p50        p99   samples/s  source\n";
    for (const auto& m : measured)
      out << "    " << std::setw(5) << m.batch_size << std::setw(11) << number(m.p50_us / 1e3, 3) << std::setw(11)
          << (m.p99_us > 0 ? number(m.p99_us / 1e3, 3) : std::string("-")) << std::setw(12)
          << number(throughput(m), 1) << "  " << m.source << (m.batch_size == max_batch_size ? "  <- chosen" : "")
          << "\n";
    out << "    (milliseconds per call)\n";
  }
  return out.str();
}

std::string ServingPlan::to_json(int indent) const {
  nlohmann::json m = nlohmann::json::array();
  for (const auto& b : measured)
    m.push_back({{"batch_size", b.batch_size}, {"p50_us", b.p50_us}, {"p99_us", b.p99_us}, {"source", b.source}});
  nlohmann::json j = {{"max_batch_size", max_batch_size},
                      {"batch_wait_timeout_s", batch_wait_timeout_s},
                      {"expected_p99_ms", expected_p99_ms},
                      {"expected_throughput", expected_throughput},
                      {"objective_met", objective_met},
                      {"measured", m},
                      {"reasons", reasons}};
  return j.dump(indent);
}

}  // namespace aitune
