// Renders a tune report's JSON as one self-contained HTML page with inline SVG charts.
#include "aitune/tune_report_html.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "aitune/error.hpp"

namespace aitune {
namespace {

using nlohmann::json;

std::string esc(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v, const char* format = "%.3g") {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // A similarity near 1 (cosine 0.99991) must not read as exactly 1.
  if (std::abs(v) > 0.99 && std::abs(v) < 1) format = "%.6g";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string str_of(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
  return j[key].get<std::string>();
}

std::optional<double> num_of(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return std::nullopt;
  return j[key].get<double>();
}

// Any JSON value as page text: scalars as they are, arrays of scalars inline, objects
// and arrays of objects as nested tables (fields a newer report adds render this way).
std::string value_html(const json& v, int depth = 0);

std::string object_table(const json& object, int depth) {
  std::string out = "<table class=\"kv\">";
  for (const auto& [key, value] : object.items())
    out += "<tr><th>" + esc(key) + "</th><td>" + value_html(value, depth + 1) + "</td></tr>";
  return out + "</table>";
}

// A table with one row per object of `rows` and a column per key any of them has.
std::string rows_table(const json& rows, int depth, const std::string& css = "rows") {
  // What a reader looks for first leads; every other field follows in name order, the
  // long texts last (JSON objects keep their keys sorted, which would put "name" late).
  static const std::vector<std::string> first = {"candidate", "name", "passed", "module", "node", "op",
                                                 "max_abs_error", "max abs error", "atol", "rtol", "max_rel_error"};
  static const std::vector<std::string> last = {"failure", "summary", "sample"};
  std::vector<std::string> keys;
  std::set<std::string> seen;
  for (const auto& k : first)
    for (const auto& row : rows)
      if (row.contains(k) && seen.insert(k).second) keys.push_back(k);
  for (const auto& row : rows)
    for (const auto& [key, value] : row.items())
      if (std::find(last.begin(), last.end(), key) == last.end() && seen.insert(key).second) keys.push_back(key);
  for (const auto& k : last)
    for (const auto& row : rows)
      if (row.contains(k) && seen.insert(k).second) keys.push_back(k);
  std::string out = "<table class=\"" + css + "\"><tr>";
  for (const auto& k : keys) out += "<th>" + esc(k) + "</th>";
  out += "</tr>";
  for (const auto& row : rows) {
    out += "<tr>";
    for (const auto& k : keys) {
      // Long texts (a failure sentence) wrap in a wide cell; numbers stay on one line.
      const bool long_text = row.contains(k) && row[k].is_string() && row[k].get<std::string>().size() > 40;
      out += std::string(long_text ? "<td class=\"long\">" : "<td>") +
             (row.contains(k) ? value_html(row[k], depth + 1) : "") + "</td>";
    }
    out += "</tr>";
  }
  return out + "</table>";
}

std::string value_html(const json& v, int depth) {
  if (v.is_null()) return "<span class=\"none\">&ndash;</span>";
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return num(v.get<double>());
  if (v.is_string()) return esc(v.get<std::string>());
  if (depth > 6) return esc(v.dump());
  if (v.is_object()) return object_table(v, depth);
  if (v.is_array()) {
    const bool objects = !v.empty() && std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_object(); });
    if (objects) return rows_table(v, depth);
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + value_html(v[i], depth + 1);
    return out + "]";
  }
  return esc(v.dump());
}

struct Latency {
  double min = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

std::optional<Latency> latency_of(const json& profile) {
  if (!profile.is_object() || !profile.contains("host_us")) return std::nullopt;
  const auto& h = profile["host_us"];
  auto p50 = num_of(h, "p50");
  if (!p50) return std::nullopt;
  Latency l;
  l.p50 = *p50;
  l.min = num_of(h, "min").value_or(l.p50);
  l.p90 = num_of(h, "p90").value_or(l.p50);
  l.p99 = num_of(h, "p99").value_or(l.p90);
  l.max = num_of(h, "max").value_or(l.p99);
  return l;
}

// Per output: the check of the sample where the output came out worst (the first failed
// one, else the largest max_abs_error), with every field the report has for it.
std::vector<json> worst_outputs(const json& correctness) {
  std::vector<json> worst;
  if (!correctness.is_object() || !correctness.contains("samples") || !correctness["samples"].is_array()) return worst;
  for (const auto& sample : correctness["samples"]) {
    if (!sample.contains("outputs") || !sample["outputs"].is_array()) continue;
    for (const auto& out : sample["outputs"]) {
      const std::string name = str_of(out, "name");
      auto it = std::find_if(worst.begin(), worst.end(), [&](const json& w) { return str_of(w, "name") == name; });
      json entry = out;
      entry["sample"] = sample.value("sample", "");
      if (it == worst.end()) {
        worst.push_back(entry);
        continue;
      }
      const bool it_failed = it->contains("passed") && (*it)["passed"] == false;
      const bool failed = out.contains("passed") && out["passed"] == false;
      if (it_failed) continue;
      if (failed || num_of(out, "max_abs_error").value_or(0) > num_of(*it, "max_abs_error").value_or(0)) *it = entry;
    }
  }
  return worst;
}

// How far a candidate is from eager: the largest max_abs_error / atol over its outputs
// (below 1 passes the check's absolute bound); nullopt without numbers.
std::optional<double> error_ratio(const json& candidate) {
  std::optional<double> ratio;
  for (const auto& out : worst_outputs(candidate.value("correctness", json()))) {
    auto err = num_of(out, "max_abs_error");
    auto atol = num_of(out, "atol");
    if (!err || !atol || *atol <= 0) continue;
    ratio = std::max(ratio.value_or(0), *err / *atol);
  }
  return ratio;
}

// The latency chart of one candidate: a whisker from min to max, a box from p50 to p90, a
// tick at p99, eager's p50 as a dashed line; every chart shares [0, scale_max].
std::string latency_svg(const Latency& l, std::optional<double> eager_p50, double scale_max) {
  const double width = 340, left = 10, right = 330;
  auto x = [&](double us) { return left + (right - left) * std::clamp(us / scale_max, 0.0, 1.0); };
  std::ostringstream s;
  s << "<svg class=\"latency\" width=\"" << width << "\" height=\"56\" viewBox=\"0 0 " << width
    << " 56\" role=\"img\"><title>latency p50 " << num(l.p50) << " us</title>";
  s << "<line x1=\"" << x(l.min) << "\" x2=\"" << x(l.max) << "\" y1=\"20\" y2=\"20\" stroke=\"#555\"/>";
  s << "<line x1=\"" << x(l.min) << "\" x2=\"" << x(l.min) << "\" y1=\"14\" y2=\"26\" stroke=\"#555\"/>";
  if (l.max <= scale_max)
    s << "<line x1=\"" << x(l.max) << "\" x2=\"" << x(l.max) << "\" y1=\"14\" y2=\"26\" stroke=\"#555\"/>";
  else  // cut at the edge: an arrowhead says it goes on (its max is in the text below)
    s << "<path class=\"beyond\" d=\"M" << right << " 14 L" << right + 8 << " 20 L" << right << " 26 Z\" fill=\"#555\">"
      << "<title>max " << num(l.max) << " us, beyond the scale</title></path>";
  s << "<rect x=\"" << x(l.p50) << "\" y=\"10\" width=\"" << std::max(1.5, x(l.p90) - x(l.p50))
    << "\" height=\"20\" fill=\"#9cc3e6\" stroke=\"#2b6cb0\"/>";
  s << "<line x1=\"" << x(l.p50) << "\" x2=\"" << x(l.p50) << "\" y1=\"8\" y2=\"32\" stroke=\"#1a365d\" stroke-width=\"2\"/>";
  s << "<line x1=\"" << x(l.p99) << "\" x2=\"" << x(l.p99) << "\" y1=\"12\" y2=\"28\" stroke=\"#c05621\"/>";
  if (eager_p50)
    s << "<line x1=\"" << x(*eager_p50) << "\" x2=\"" << x(*eager_p50)
      << "\" y1=\"4\" y2=\"36\" stroke=\"#718096\" stroke-dasharray=\"3,2\"/>";
  s << "<text x=\"" << left << "\" y=\"50\" font-size=\"11\">p50 " << num(l.p50) << " &#181;s &#183; p90 "
    << num(l.p90) << " &#183; p99 " << num(l.p99) << " &#183; min " << num(l.min) << " &#183; max " << num(l.max)
    << "</text></svg>";
  return s.str();
}

struct Point {
  std::string name;
  double p50 = 0, ratio = 0;
  bool winner = false;
  std::size_t number = 0;  // the candidate's number on its card ("3. cpu[...]"), 1-based
};

// Accuracy (error / tolerance, log scale) against latency (p50) for every measured
// candidate; the Pareto frontier (no other point both faster and more accurate) joined
// by a line; eager's p50 as a dashed vertical line.
std::string frontier_svg(std::vector<Point> points, std::optional<double> eager_p50) {
  // The legend in the cards' order, as `points` come (they are sorted by latency below).
  std::string legend = "<ol class=\"legend\">";
  for (const auto& p : points)
    legend += "<li value=\"" + std::to_string(p.number) + "\">" + esc(p.name) + (p.winner ? " <b>(winner)</b>" : "") +
              "</li>";
  legend += "</ol>";
  const double W = 760, H = 360, L = 70, R = 20, T = 20, B = 50;
  double xmax = eager_p50.value_or(0);
  double ymin = 1e-3, ymax = 10;
  for (const auto& p : points) {
    xmax = std::max(xmax, p.p50);
    if (p.ratio > 0) ymin = std::min(ymin, p.ratio), ymax = std::max(ymax, p.ratio);
  }
  xmax = xmax > 0 ? xmax * 1.1 : 1;
  const double lmin = std::floor(std::log10(ymin)), lmax = std::ceil(std::log10(ymax));
  auto x = [&](double us) { return L + (W - L - R) * us / xmax; };
  auto y = [&](double ratio) {
    const double l = std::log10(std::max(ratio, std::pow(10.0, lmin)));
    return T + (H - T - B) * (1 - (l - lmin) / (lmax - lmin));
  };
  std::ostringstream s;
  s << "<svg id=\"frontier-chart\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H
    << "\" role=\"img\"><title>accuracy versus latency</title>";
  s << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B
    << "\" fill=\"#fafafa\" stroke=\"#ccc\"/>";
  for (double e = lmin; e <= lmax; e += 1) {
    s << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << y(std::pow(10.0, e)) << "\" y2=\""
      << y(std::pow(10.0, e)) << "\" stroke=\"" << (e == 0 ? "#c53030" : "#e2e8f0") << "\""
      << (e == 0 ? " stroke-dasharray=\"6,3\"" : "") << "/>";
    s << "<text x=\"" << L - 6 << "\" y=\"" << y(std::pow(10.0, e)) + 4 << "\" font-size=\"11\" text-anchor=\"end\">1e"
      << static_cast<int>(e) << "</text>";
  }
  for (int i = 0; i <= 4; ++i) {
    const double us = xmax * i / 4;
    s << "<text x=\"" << x(us) << "\" y=\"" << H - B + 16 << "\" font-size=\"11\" text-anchor=\"middle\">" << num(us)
      << "</text>";
  }
  s << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 12 << "\" font-size=\"12\" text-anchor=\"middle\">p50 latency (&#181;s)</text>";
  s << "<text x=\"16\" y=\"" << (T + H - B) / 2 << "\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 16 "
    << (T + H - B) / 2 << ")\">max error / tolerance (log)</text>";
  s << "<text x=\"" << W - R - 4 << "\" y=\"" << y(1) - 4 << "\" font-size=\"11\" text-anchor=\"end\" fill=\"#c53030\">tolerance</text>";
  if (eager_p50) {
    s << "<line x1=\"" << x(*eager_p50) << "\" x2=\"" << x(*eager_p50) << "\" y1=\"" << T << "\" y2=\"" << H - B
      << "\" stroke=\"#718096\" stroke-dasharray=\"4,3\"/><text x=\"" << x(*eager_p50) + 4 << "\" y=\"" << T + 12
      << "\" font-size=\"11\" fill=\"#4a5568\">eager p50</text>";
  }
  std::sort(points.begin(), points.end(), [](const Point& a, const Point& b) { return a.p50 < b.p50; });
  std::vector<const Point*> frontier;
  double best = std::numeric_limits<double>::infinity();
  for (const auto& p : points)
    if (p.ratio < best) {
      frontier.push_back(&p);
      best = p.ratio;
    }
  if (frontier.size() > 1) {
    s << "<polyline class=\"frontier\" fill=\"none\" stroke=\"#2f855a\" stroke-width=\"2\" points=\"";
    for (const auto* p : frontier) s << x(p->p50) << "," << y(p->ratio) << " ";
    s << "\"/>";
  }
  // Points drawn within a few pixels of each other share one label ("1, 2, 3"): three
  // candidates of one model and equal speed were drawn on one spot with their numbers
  // printed over each other.
  struct Label {
    double x, y;
    std::string text;
  };
  std::vector<Label> labels;
  for (bool winner : {false, true})  // the winner's circle last: on top of any it shares a spot with
    for (const auto& p : points) {
      if (p.winner != winner) continue;
      const bool on_frontier = std::find(frontier.begin(), frontier.end(), &p) != frontier.end();
      s << "<circle cx=\"" << x(p.p50) << "\" cy=\"" << y(p.ratio) << "\" r=\"" << (p.winner ? 7 : 5) << "\" fill=\""
        << (p.winner ? "#d69e2e" : on_frontier ? "#2f855a" : "#a0aec0") << "\" stroke=\"#1a202c\"><title>"
        << esc(p.name) << ": p50 " << num(p.p50) << " us, error/tolerance " << num(p.ratio) << "</title></circle>";
    }
  // Each point is labelled with its candidate's number on the cards below (the chart
  // numbered them by latency and the cards in report order: point 1 was another card's 1).
  for (const auto& p : points) {
    auto near = std::find_if(labels.begin(), labels.end(), [&](const Label& l) {
      return std::abs(l.x - x(p.p50)) < 6 && std::abs(l.y - y(p.ratio)) < 6;
    });
    if (near != labels.end())
      near->text += ", " + std::to_string(p.number);
    else
      labels.push_back({x(p.p50), y(p.ratio), std::to_string(p.number)});
  }
  for (std::size_t i = 0; i < labels.size(); ++i)
    s << "<text class=\"point-label\" x=\"" << labels[i].x + 8 << "\" y=\""
      << labels[i].y - 6 - 11.0 * static_cast<double>(i % 2) << "\" font-size=\"10\" fill=\"#2d3748\">"
      << labels[i].text << "</text>";
  s << "</svg>" << legend;
  return s.str();
}

const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1a202c;max-width:1160px}
h1{font-size:22px;margin:0 0 6px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #e2e8f0;padding-bottom:4px}
table{border-collapse:collapse;font-size:12px} th,td{border:1px solid #e2e8f0;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f7fafc;font-weight:600} table:not(.kv) td{white-space:nowrap} table:not(.kv) td.long{white-space:normal;min-width:24em} table.kv th{width:1%;white-space:nowrap}
.candidate{border:1px solid #cbd5e0;border-radius:6px;margin:12px 0;padding:10px 12px}
.candidate h3{margin:0 0 6px;font-size:15px;word-break:break-all} .side{display:flex;gap:18px;flex-wrap:wrap}
.side>div{flex:1 1 360px;min-width:0;overflow-x:auto} .status{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;margin-left:6px}
.passed{background:#c6f6d5} .incorrect{background:#fed7d7} .failed{background:#feebc8} .other{background:#e2e8f0}
.winner{background:#faf089} .reason{font-size:12px;color:#4a5568;margin:6px 0;word-break:break-word} .none{color:#a0aec0}
.divergence{background:#fff5f5;border-left:3px solid #c53030;padding:6px 8px;font-size:12px;margin-top:6px;word-break:break-word}
.legend{font-size:11px;columns:2;color:#2d3748} .muted{color:#718096;font-size:12px}
)";

}  // namespace

std::string tune_report_html(const std::string& report_json) {
  json r = json::parse(report_json, nullptr, false);
  if (r.is_discarded()) throw Error(ErrorCode::kInvalidArgument, "the tune report is not valid JSON");
  if (!r.is_object() || !r.contains("candidates") || !r["candidates"].is_array())
    throw Error(ErrorCode::kInvalidArgument, "not a tune report: no \"candidates\" array");
  const json& candidates = r["candidates"];
  const std::string winner = str_of(r, "winner");
  // Which candidate won: by its index where the report has one (names repeat across
  // backends), by name in a report written before it was (one badge either way).
  std::optional<std::size_t> winner_index;
  if (r.contains("winner_index") && r["winner_index"].is_number_unsigned() &&
      r["winner_index"].get<std::size_t>() < candidates.size())
    winner_index = r["winner_index"].get<std::size_t>();
  // A report without the index: the candidate of that name whose status is "selected", else
  // the first of that name.
  for (int selected = 1; !winner_index && !winner.empty() && selected >= 0; --selected)
    for (std::size_t i = 0; !winner_index && i < candidates.size(); ++i)
      if (str_of(candidates[i], "name") == winner && (!selected || str_of(candidates[i], "status") == "selected"))
        winner_index = i;
  const std::optional<std::size_t> winner_at = winner_index;
  const auto is_the_winner = [&](std::size_t i) { return winner_at && i == *winner_at; };
  const std::string eager_label = str_of(r, "eager_label").empty() ? "eager" : str_of(r, "eager_label");
  const auto eager = latency_of(r.value("eager", json()));
  const std::optional<double> eager_p50 = eager ? std::optional<double>(eager->p50) : std::nullopt;

  // One scale for all: up to the largest p99, but at most 4x the largest p90. One stalled
  // call (a max of 12 ms beside p50s of 8 us) set the scale to its max and flattened every
  // box and eager's line into a pixel; a whisker past the edge is cut, its max in the text.
  double largest_p99 = eager ? eager->p99 : 0, largest_p90 = eager ? eager->p90 : 0;
  for (const auto& c : candidates)
    if (auto l = latency_of(c.value("profile", json()))) {
      largest_p99 = std::max(largest_p99, l->p99);
      largest_p90 = std::max(largest_p90, l->p90);
    }
  double scale_max = std::min(largest_p99, 4 * largest_p90);
  scale_max = scale_max > 0 ? scale_max * 1.1 : 1;

  std::ostringstream h;
  h << "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>aitune tune report: "
    << esc(str_of(r, "graph")) << "</title><style>" << kStyle << "</style></head><body>";
  h << "<h1>Tune report: " << esc(str_of(r, "graph")) << "</h1>";
  h << "<section id=\"summary\"><table class=\"kv\">";
  h << "<tr><th>strategy</th><td>" << esc(str_of(r, "strategy")) << "</td></tr>";
  h << "<tr><th>winner</th><td id=\"winner\">";
  if (winner.empty())
    h << "none (" << esc(eager_label) << " kept)";
  else if (winner_at)  // its number and a link: another backend's candidate may have the same name
    h << "<a href=\"#candidate-" << *winner_at << "\">" << *winner_at + 1 << ". " << esc(winner) << "</a>";
  else
    h << esc(winner);
  h << "</td></tr>";
  h << "<tr><th>decision</th><td>" << esc(str_of(r, "decision")) << "</td></tr>";
  if (eager)
    h << "<tr><th>" << esc(eager_label) << " p50</th><td>" << num(eager->p50) << " &#181;s</td></tr>";
  if (auto t = num_of(r, "tuning_s")) h << "<tr><th>tuning time</th><td>" << num(*t) << " s</td></tr>";
  // The sizes the model's code branches on, as the ONNX export took them (shape_condition.hpp)
  for (const auto& [key, title] : {std::pair{"shape_conditions", "ONNX graphs hold where"},
                                   std::pair{"shape_conditions_left_out", "export took one side of"}}) {
    if (!r.contains(key) || !r[key].is_array() || r[key].empty()) continue;
    // One per line, the short ones first; an export derives long ones (Swin's window padding:
    // twenty of up to 900 characters), folded away so that the short ones can be read.
    std::vector<std::string> texts;
    for (const auto& c : r[key]) texts.push_back(c.is_string() ? c.get<std::string>() : "?");
    std::stable_sort(texts.begin(), texts.end(), [](const auto& a, const auto& b) { return a.size() < b.size(); });
    constexpr std::size_t kShown = 6, kShort = 100;
    std::size_t shown = 0;
    while (shown < texts.size() && shown < kShown && (shown == 0 || texts[shown].size() <= kShort)) ++shown;
    h << "<tr><th>" << title << "</th><td id=\"" << key << "\">";
    for (std::size_t i = 0; i < shown; ++i) h << (i ? "<br>" : "") << "<code>" << esc(texts[i]) << "</code>";
    if (shown < texts.size()) {
      h << "<details><summary>" << texts.size() - shown << " more, longer</summary>";
      for (std::size_t i = shown; i < texts.size(); ++i)
        h << (i > shown ? "<br>" : "") << "<code>" << esc(texts[i]) << "</code>";
      h << "</details>";
    }
    h << "</td></tr>";
  }
  h << "<tr><th>candidates</th><td>" << candidates.size() << "</td></tr></table></section>";

  // The frontier: every candidate with both a latency and an error.
  std::vector<Point> points;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const auto& c = candidates[i];
    auto l = latency_of(c.value("profile", json()));
    auto ratio = error_ratio(c);
    if (l && ratio) points.push_back({str_of(c, "name"), l->p50, *ratio, is_the_winner(i), i + 1});
  }
  h << "<section id=\"frontier\"><h2>Accuracy versus latency</h2>";
  if (points.empty()) {
    h << "<p class=\"muted\">No candidate was both checked and measured.</p>";
  } else {
    h << "<p class=\"muted\">Each measured candidate by its p50 latency and its largest error over the tolerance it "
         "was checked with (below the red line passes). The green line joins the frontier: candidates no other is "
         "both faster and more accurate than. Candidates that failed the check are not measured; see below.</p>"
      << frontier_svg(points, eager_p50);
  }
  h << "</section>";

  h << "<section id=\"candidates\"><h2>Candidates</h2><p class=\"muted\">Left: latency distribution (whisker min&#8211;max, "
       "box p50&#8211;p90, orange tick p99, dashed line "
    << esc(eager_label) << "'s p50; one scale for all, to the largest p99 or 4x the largest p90: a whisker cut at the edge ends in an arrowhead). Right: accuracy against " << esc(eager_label)
    << " per output, on the sample where it came out worst.</p>";
  static const std::set<std::string> shown = {"name", "backend", "status", "precision", "reason", "profile",
                                              "correctness", "divergence", "speedup_vs_eager", "config"};
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const auto& c = candidates[i];
    const std::string name = str_of(c, "name"), status = str_of(c, "status");
    const bool is_winner = is_the_winner(i);
    const std::string css = is_winner ? "winner" : status == "passed" ? "passed" : status == "incorrect" ? "incorrect"
                                                 : status == "failed" ? "failed" : "other";
    h << "<div class=\"candidate\" id=\"candidate-" << i << "\"><h3>" << i + 1 << ". " << esc(name)
      << "<span class=\"status " << css << "\">" << esc(is_winner ? "winner" : status) << "</span></h3>";
    h << "<div class=\"muted\">" << esc(str_of(c, "backend")) << " &#183; precision " << esc(str_of(c, "precision"));
    if (auto s = num_of(c, "speedup_vs_eager"); s && *s > 0) h << " &#183; " << num(*s) << "&#215; " << esc(eager_label);
    h << "</div><div class=\"side\"><div class=\"latency-cell\"><b>Latency</b><br>";
    if (auto l = latency_of(c.value("profile", json()))) {
      h << latency_svg(*l, eager_p50, scale_max);
      if (auto first = latency_of(c.value("first_profile", json())))
        h << "<div class=\"muted final-round\">measured again in the final round (side by side); first p50 "
          << num(first->p50) << " &#181;s</div>";
    } else
      h << "<span class=\"none\">not measured</span>";
    h << "</div><div class=\"accuracy-cell\"><b>Accuracy against " << esc(eager_label) << "</b><br>";
    const auto outputs = worst_outputs(c.value("correctness", json()));
    if (outputs.empty())
      h << "<span class=\"none\">not checked</span>";
    else
      h << rows_table(json(outputs), 1, "accuracy");
    h << "</div></div>";
    if (!str_of(c, "reason").empty()) h << "<div class=\"reason\">" << esc(str_of(c, "reason")) << "</div>";
    if (c.contains("divergence") && c["divergence"].is_object()) {
      h << "<div class=\"divergence\"><b>Divergence:</b> " << esc(str_of(c["divergence"], "summary")) << "</div>";
    }
    json extra = json::object();  // fields of a newer report (or of another helper's) as they are
    for (const auto& [key, value] : c.items())
      if (!shown.count(key) && !value.is_null()) extra[key] = value;
    if (!extra.empty()) h << "<details><summary class=\"muted\">more</summary>" << object_table(extra, 1) << "</details>";
    h << "</div>";
  }
  h << "</section>";

  h << "<section id=\"divergence\"><h2>Where failed candidates diverge</h2>";
  json rows = json::array();
  for (const auto& c : candidates) {
    if (!c.contains("divergence") || !c["divergence"].is_object()) continue;
    const auto& d = c["divergence"];
    const json first = d.value("first", json());
    // "where": the deepest module holding the suspect nodes; "seen at": the first value beyond tolerance.
    const std::string seen =
        first.is_object() ? (first.value("input", false) ? "input of " : "output of ") + first.value("module", "") : "";
    rows.push_back({{"candidate", str_of(c, "name")},
                    {"where", first.is_object() ? first.value("location", first.value("module", "")) : "(none found)"},
                    {"seen at", seen},
                    {"node", first.is_object() ? first.value("node", "") : ""},
                    {"op", first.is_object() ? first.value("op_type", "") : ""},
                    {"max abs error", first.is_object() ? first.value("max_abs_error", json()) : json()},
                    {"compared with", d.value("reference", "")},
                    {"summary", d.value("summary", "")}});
  }
  if (rows.empty())
    h << "<p class=\"muted\">No candidate was traced (none failed the check, or tracing was not possible).</p>";
  else
    h << rows_table(rows, 1, "divergence-table");
  h << "</section>";

  if (r.contains("batch_search") && r["batch_search"].is_object())
    h << "<section id=\"batch-search\"><h2>Batch size search</h2>" << object_table(r["batch_search"], 1) << "</section>";
  h << "</body></html>\n";
  return h.str();
}

}  // namespace aitune
