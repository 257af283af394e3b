// TuneReport as JSON (the report file) and as a text table (logs, CLI).
#include "aitune/tune_report.hpp"

#include "aitune/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

namespace aitune {
namespace {

nlohmann::json parse_or_null(const std::string& text) {
  if (text.empty()) return nullptr;
  return nlohmann::json::parse(text, nullptr, false);
}

std::string fixed(double v, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

std::string sci(double v) {
  std::ostringstream out;
  out << std::setprecision(2) << std::scientific << v;
  return out.str();
}

}  // namespace

std::string TuneReport::to_json(int indent) const {
  nlohmann::json cands = nlohmann::json::array();
  for (const auto& c : candidates) {
    cands.push_back({
        {"name", c.name},
        {"backend", c.backend},
        {"group", c.group},
        {"config", parse_or_null(c.config_json)},
        {"precision", precision_name(c.precision)},
        {"transform", c.transform},
        {"fused_operators", c.fused_operators},
        {"fp32_nodes", c.fp32_nodes},
        {"transform_note", c.transform_note},
        {"in_place_outputs", c.in_place_outputs},
        {"status", candidate_status_name(c.status)},
        {"reason", c.reason},
        {"correctness", c.correctness ? parse_or_null(c.correctness->to_json(-1)) : nlohmann::json(nullptr)},
        {"divergence", c.divergence ? parse_or_null(c.divergence->to_json(-1)) : nlohmann::json(nullptr)},
        {"profile", c.profile ? parse_or_null(c.profile->to_json(-1)) : nlohmann::json(nullptr)},
        {"first_profile", c.first_profile ? parse_or_null(c.first_profile->to_json(-1)) : nlohmann::json(nullptr)},
        {"session_creation_ms", c.session_creation_ms},
        {"first_run_ms", c.first_run_ms},
        {"speedup_vs_eager", c.speedup_vs_eager},
    });
  }
  nlohmann::json j = {
      {"graph", graph},
      {"strategy", strategy.describe()},
      {"performance_validation", strategy.performance_validation},
      {"min_speedup", strategy.min_speedup},
      {"eager_label", eager_label},
      {"eager", eager ? parse_or_null(eager->to_json(-1)) : nlohmann::json(nullptr)},
      {"eager_first_profile", eager_first_profile ? parse_or_null(eager_first_profile->to_json(-1)) : nlohmann::json(nullptr)},
      {"candidates", cands},
      {"winner", winner ? nlohmann::json(candidates[*winner].name) : nlohmann::json(nullptr)},
      // Names repeat across backends (two ONNX Runtime backends, one exporting with dynamo and
      // one with the tracer): the index into "candidates" and the backend say which one won.
      {"winner_index", winner ? nlohmann::json(*winner) : nlohmann::json(nullptr)},
      {"winner_backend", winner ? nlohmann::json(candidates[*winner].backend) : nlohmann::json(nullptr)},
      {"decision", decision},
      {"tuning_s", tuning_s},
      {"accuracy_factor", accuracy_factor},
  };
  nlohmann::json vacuous = nlohmann::json::array();
  for (const auto& v : vacuous_outputs) vacuous.push_back({{"name", v.name}, {"why", v.why}});
  j["vacuous_outputs"] = vacuous;
  j["shape_conditions"] = shape_conditions;
  j["shape_conditions_left_out"] = shape_conditions_left_out;
  // Per reduced precision: eager PyTorch's own error at it, per output (worst sample).
  nlohmann::json eager_at = nlohmann::json::object();
  for (const auto& e : eager_at_precision) {
    CorrectnessReport eager_checks;
    eager_checks.samples = e.samples;
    nlohmann::json outputs = nlohmann::json::array();
    for (const auto& o : eager_checks.outputs())
      outputs.push_back({{"name", o.name},
                         {"max_abs_error", o.max_abs_error},
                         {"rel_l2_error", std::isfinite(o.rel_l2_error) ? o.rel_l2_error : -1},
                         {"cosine_similarity", o.cosine_similarity},
                         {"top1_agreement", o.top1_agreement ? nlohmann::json(*o.top1_agreement) : nlohmann::json(nullptr)}});
    eager_at[std::string(precision_name(e.precision))] = {
        {"available", e.available}, {"reason", e.reason}, {"outputs", outputs}};
  }
  j["eager_at_precision"] = eager_at;
  if (batch_search) {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& s : batch_search->steps)
      steps.push_back({{"batch_size", s.batch_size}, {"throughput", s.throughput}, {"p50_us", s.p50_us}, {"p99_us", s.p99_us},
                       {"error", s.error}});
    j["batch_search"] = {{"recorded_max_batch", batch_search->recorded_max_batch},
                         {"max_batch", batch_search->max_batch},
                         {"stop_reason", batch_search->stop_reason},
                         {"correctness", batch_search->correctness},
                         {"steps", steps}};
  } else {
    j["batch_search"] = nullptr;
  }
  return j.dump(indent);
}

std::string TuneReport::summary_table() const {
  struct Row {
    std::string name, precision, status, error, p50, throughput, speedup, reason;
  };
  std::vector<Row> rows;
  if (eager)
    rows.push_back({eager_label, "-", "reference", "-", fixed(eager->host_us.p50, 1), fixed(eager->throughput, 1), "1.00x",
                    ""});
  for (const auto& c : candidates) {
    // The JSON keeps the status's stable name; the table a person reads names the reference
    // an ONNX-only tune ran against (it has no eager).
    std::string status(candidate_status_name(c.status));
    if (c.status == CandidateStatus::kSlowerThanEager && eager_label != "eager") status = "slower than reference";
    Row r{c.name, std::string(precision_name(c.precision)), status, "-", "-", "-", "-", c.reason};
    if (c.correctness) r.error = sci(c.correctness->max_abs_error());
    if (c.profile) {
      r.p50 = fixed(c.profile->host_us.p50, 1);
      // Measured again in the tuner's final round: its first p50 beside the one it ranked by
      if (c.first_profile) r.p50 += " (first " + fixed(c.first_profile->host_us.p50, 1) + ")";
      r.throughput = fixed(c.profile->throughput, 1);
    }
    if (c.speedup_vs_eager > 0) r.speedup = fixed(c.speedup_vs_eager, 2) + "x";
    rows.push_back(std::move(r));
  }
  Row header{"candidate", "precision", "status", "max abs err", "p50 us", "samples/s", "speed-up", "reason"};
  std::size_t w[6] = {header.name.size(), header.status.size(), header.error.size(),
                      header.p50.size(),  header.throughput.size(), header.speedup.size()};
  std::size_t wp = header.precision.size();
  for (const auto& r : rows) {
    wp = std::max(wp, r.precision.size());
    w[0] = std::max(w[0], r.name.size());
    w[1] = std::max(w[1], r.status.size());
    w[2] = std::max(w[2], r.error.size());
    w[3] = std::max(w[3], r.p50.size());
    w[4] = std::max(w[4], r.throughput.size());
    w[5] = std::max(w[5], r.speedup.size());
  }
  std::ostringstream out;
  auto line = [&](const Row& r) {
    out << std::left << std::setw(static_cast<int>(w[0])) << r.name << "  " << std::setw(static_cast<int>(wp))
        << r.precision << "  " << std::setw(static_cast<int>(w[1]))
        << r.status << "  " << std::right << std::setw(static_cast<int>(w[2])) << r.error << "  "
        << std::setw(static_cast<int>(w[3])) << r.p50 << "  " << std::setw(static_cast<int>(w[4])) << r.throughput
        << "  " << std::setw(static_cast<int>(w[5])) << r.speedup << "  " << r.reason << "\n";
  };
  out << graph << " (" << strategy.describe() << ")\n";
  line(header);
  for (const auto& r : rows) line(r);
  // Inputs a candidate updates in place: the module then changes what it is given.
  for (const auto& c : candidates) {
    if (c.in_place_outputs.empty()) continue;
    out << "inputs " << c.name << " updates in place:";
    std::string sep = " ";
    for (const auto& [output, input] : c.in_place_outputs) {
      out << sep << input << " (as " << output << ")";
      sep = ", ";
    }
    out << "\n";
  }
  // Fused operators per transformed candidate: what a fusion pass made of the graph.
  for (const auto& c : candidates) {
    if (c.transform.empty()) continue;
    out << "graph of " << c.name << ": " << c.transform;
    std::string sep = " (";
    for (const auto& [op, count] : c.fused_operators) {
      out << sep << op << ": " << count;
      sep = ", ";
    }
    out << (c.fused_operators.empty() ? "" : ")");
    if (!c.fp32_nodes.empty()) {  // mixed precision: the nodes kept in fp32 (a few named)
      out << "; kept in fp32: " << c.fp32_nodes.size() << " node" << (c.fp32_nodes.size() == 1 ? "" : "s") << " (";
      for (std::size_t i = 0; i < c.fp32_nodes.size() && i < 5; ++i) out << (i ? ", " : "") << c.fp32_nodes[i];
      out << (c.fp32_nodes.size() > 5 ? ", ...)" : ")");
    }
    if (!c.transform_note.empty()) out << "; " << c.transform_note;
    out << "\n";
  }
  // Accuracy per output of reduced-precision candidates: its error, eager's at the same
  // precision, the ratio and which rule decided.
  for (const auto& c : candidates) {
    if (!c.correctness) continue;
    const auto& k = *c.correctness;
    if (!k.calibration_note.empty()) out << "accuracy of " << c.name << ": " << k.calibration_note << "\n";
    if (k.calibrated_precision) {
      out << "accuracy of " << c.name << " (vs " << calibration_yardstick(*k.calibrated_precision) << ", factor "
          << fixed(k.accuracy_factor, 1) << "):";
      for (const auto& o : k.outputs()) {
        out << " " << o.name;
        // integers and flags are judged by how many elements differ: their "max abs error"
        // of 1 beside eager's 1 read as a contradiction next to a ratio of inf (a probe)
        if (!dtype_is_floating(o.dtype))
          out << " " << o.mismatched << " element" << (o.mismatched == 1 ? "" : "s") << " differ";
        else
          out << " err " << sci(o.max_abs_error) << " / eager "
              << (o.eager_at_precision_max_abs_error ? sci(*o.eager_at_precision_max_abs_error) : "-");
        out << " ratio "
            << (o.error_ratio ? (std::isfinite(*o.error_ratio) ? fixed(*o.error_ratio, 2) : "inf") : "-") << " "
            << (o.passed ? "passed" : "failed") << " (" << o.rule;
        if (o.top1_near_ties && *o.top1_near_ties > 0)
          out << "; " << *o.top1_near_ties << " of " << o.top1_flips << " top-1 flips near-ties, ignored";
        out << ")";
      }
      out << "\n";
    }
    if (k.user_metric)
      out << "accuracy of " << c.name << ": user metric " << k.user_metric->score << " (eager " << k.user_metric->baseline
          << ", drop " << k.user_metric->drop() << ", max " << k.user_metric->max_drop << ") "
          << (k.user_metric->passed() ? "passed" : "failed") << "\n";
  }
  for (const auto& v : vacuous_outputs)
    out << "warning: eager output " << v.name << " cannot judge a candidate: " << v.why << "\n";
  for (const auto& c : candidates)
    if (c.divergence) out << "divergence of " << c.name << ": " << c.divergence->describe() << "\n";
  // Long conditions an export derived (Swin's window padding: up to 900 characters each)
  // are counted here, not printed: the report's JSON and page list them all.
  constexpr std::size_t kLong = 100;
  auto long_ones = [&](const std::vector<std::string>& all) {
    return std::count_if(all.begin(), all.end(), [&](const std::string& c) { return c.size() > kLong; });
  };
  for (const auto& c : shape_conditions)
    if (c.size() <= kLong) out << "the ONNX graphs hold where `" << c << "` (calls elsewhere are refused)\n";
  if (auto n = long_ones(shape_conditions))
    out << "the ONNX graphs hold under " << n << " longer conditions too (shape_conditions in the report)\n";
  for (const auto& c : shape_conditions_left_out)
    if (c.size() <= kLong)
      out << "the ONNX export took one side of `" << c << "`; a recorded sample is on the other, checked there\n";
  if (auto n = long_ones(shape_conditions_left_out))
    out << "the ONNX export took one side of " << n
        << " longer conditions too; recorded samples are on the other, checked there (shape_conditions_left_out)\n";
  out << "decision: " << decision << "\n";
  if (batch_search) {
    out << "max batch size: " << batch_search->max_batch << " (recorded up to " << batch_search->recorded_max_batch
        << "; " << batch_search->stop_reason << "; check at max: " << batch_search->correctness << ")\n";
  }
  return out.str();
}

}  // namespace aitune
