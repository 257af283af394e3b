// Tests for TuneReport: its JSON (the report file) and its summary table (logs, CLI).
#include <gtest/gtest.h>

#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aitune/tune_report.hpp"

namespace aitune {
namespace {

Profile profile_with(double p50_us, double throughput) {
  Profile p;
  p.batch_size = 4;
  p.host_us.count = 75;
  p.host_us.p50 = p50_us;
  p.throughput = throughput;
  p.stable = true;
  p.stop_reason = "stable";
  return p;
}

CorrectnessReport passed_with(double max_abs_error) {
  OutputCheck out;
  out.name = "y";
  out.passed = true;
  out.max_abs_error = max_abs_error;
  CorrectnessReport report;
  report.samples.push_back({"sample 0 (batch 4)", {out}});
  return report;
}

// Eager, a selected candidate with a config, correctness and a profile, and a failed one
// with neither.
TuneReport two_candidates() {
  TuneReport r;
  r.graph = "mlp/forward";
  r.eager = profile_with(100.0, 40000.0);
  CandidateResult fast;
  fast.name = "cpu";
  fast.backend = "ONNXRuntimeBackend";
  fast.config_json = R"({"provider":"cpu","intra_op_threads":0})";
  fast.status = CandidateStatus::kSelected;
  fast.reason = "highest throughput";
  fast.correctness = passed_with(1.5e-6);
  fast.profile = profile_with(40.0, 100000.0);
  fast.session_creation_ms = 12.5;
  fast.speedup_vs_eager = 2.5;
  CandidateResult broken;
  broken.name = "cpu[intra_op_threads=1]";
  broken.backend = "ONNXRuntimeBackend";
  broken.group = 1;
  broken.status = CandidateStatus::kFailed;
  broken.reason = "session creation failed";
  r.candidates = {fast, broken};
  r.winner = 0;
  r.decision = "cpu: 2.50x eager";
  r.tuning_s = 1.25;
  return r;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(TuneReportJson, CarriesEveryCandidateAndTheDecision) {
  const auto j = nlohmann::json::parse(two_candidates().to_json());
  EXPECT_EQ(j["graph"], "mlp/forward");
  EXPECT_EQ(j["strategy"], "max-throughput");
  EXPECT_EQ(j["eager_label"], "eager");
  EXPECT_TRUE(j["eager"].is_object());
  EXPECT_EQ(j["winner"], "cpu");
  EXPECT_EQ(j["decision"], "cpu: 2.50x eager");
  EXPECT_DOUBLE_EQ(j["tuning_s"].get<double>(), 1.25);
  ASSERT_EQ(j["candidates"].size(), 2u);
  const auto& fast = j["candidates"][0];
  EXPECT_EQ(fast["name"], "cpu");
  EXPECT_EQ(fast["status"], "selected");
  EXPECT_EQ(fast["precision"], "fp32");
  // The config is embedded as JSON, not as a string.
  EXPECT_EQ(fast["config"]["provider"], "cpu");
  EXPECT_TRUE(fast["correctness"].is_object());
  EXPECT_TRUE(fast["profile"].is_object());
  EXPECT_DOUBLE_EQ(fast["speedup_vs_eager"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(fast["session_creation_ms"].get<double>(), 12.5);
  const auto& broken = j["candidates"][1];
  EXPECT_EQ(broken["status"], "failed");
  EXPECT_EQ(broken["reason"], "session creation failed");
  EXPECT_EQ(broken["group"], 1);
  EXPECT_TRUE(broken["config"].is_null());
  EXPECT_TRUE(broken["correctness"].is_null());
  EXPECT_TRUE(broken["profile"].is_null());
  EXPECT_TRUE(j["batch_search"].is_null());
}

TEST(TuneReportJson, NoWinnerAndNoEagerAreNull) {
  TuneReport r = two_candidates();
  r.winner.reset();
  r.eager.reset();
  const auto j = nlohmann::json::parse(r.to_json());
  EXPECT_TRUE(j["winner"].is_null());
  EXPECT_TRUE(j["eager"].is_null());
}

TEST(TuneReportJson, BatchSearchStepsAndCompactForm) {
  TuneReport r = two_candidates();
  BatchSearchResult search;
  search.recorded_max_batch = 4;
  search.max_batch = 16;
  search.stop_reason = "out of memory at batch 32";
  search.correctness = "passed";
  search.steps = {{8, 150000.0, 53.3, 61.0, ""}, {16, 180000.0, 88.9, 97.5, ""}, {32, 0.0, 0.0, 0.0, "CUDA out of memory"}};
  r.batch_search = search;
  const std::string compact = r.to_json(-1);
  EXPECT_EQ(compact.find('\n'), std::string::npos);
  const auto j = nlohmann::json::parse(compact);
  const auto& b = j["batch_search"];
  EXPECT_EQ(b["recorded_max_batch"], 4);
  EXPECT_EQ(b["max_batch"], 16);
  EXPECT_EQ(b["stop_reason"], "out of memory at batch 32");
  EXPECT_EQ(b["correctness"], "passed");
  ASSERT_EQ(b["steps"].size(), 3u);
  EXPECT_EQ(b["steps"][1]["batch_size"], 16);
  EXPECT_DOUBLE_EQ(b["steps"][1]["throughput"].get<double>(), 180000.0);
  EXPECT_DOUBLE_EQ(b["steps"][1]["p99_us"].get<double>(), 97.5);  // serving plans read the tail
  EXPECT_EQ(b["steps"][2]["error"], "CUDA out of memory");
}

TEST(TuneReportTable, RowsForEagerAndEachCandidateInAlignedColumns) {
  const auto lines = lines_of(two_candidates().summary_table());
  ASSERT_EQ(lines.size(), 6u);  // title, header, eager, two candidates, decision
  EXPECT_EQ(lines[0], "mlp/forward (max-throughput)");
  const std::string& header = lines[1];
  const std::string& eager = lines[2];
  const std::string& fast = lines[3];
  const std::string& broken = lines[4];
  EXPECT_EQ(header.rfind("candidate", 0), 0u);
  EXPECT_EQ(eager.rfind("eager", 0), 0u);
  EXPECT_NE(eager.find("reference"), std::string::npos);
  EXPECT_NE(eager.find("100.0"), std::string::npos);
  EXPECT_NE(eager.find("1.00x"), std::string::npos);
  EXPECT_EQ(fast.rfind("cpu ", 0), 0u);
  for (const char* cell : {"selected", "1.50e-06", "40.0", "100000.0", "2.50x", "highest throughput"})
    EXPECT_NE(fast.find(cell), std::string::npos) << cell << " missing from: " << fast;
  EXPECT_EQ(broken.rfind("cpu[intra_op_threads=1]", 0), 0u);
  EXPECT_NE(broken.find("failed"), std::string::npos);
  EXPECT_NE(broken.find("session creation failed"), std::string::npos);
  // Columns start at the same offset on every row; the widest name sets where the second
  // (precision) begins.
  const auto precision_at = header.find("precision");
  EXPECT_EQ(precision_at, std::string("cpu[intra_op_threads=1]").size() + 2);
  EXPECT_EQ(fast.find("fp32"), precision_at);
  const auto status_at = header.find("status");
  EXPECT_EQ(eager.find("reference"), status_at);
  EXPECT_EQ(fast.find("selected"), status_at);
  EXPECT_EQ(broken.find("failed"), status_at);
  EXPECT_EQ(lines[5], "decision: cpu: 2.50x eager");
}

// An integer output is judged by how many elements differ; its accuracy line says that,
// not "err 1.00e+00 / eager 1.00e+00 ratio inf" (which read as a contradiction, a probe).
TEST(TuneReportTable, AccuracyLineCountsTheDifferingElementsOfAnIntegerOutput) {
  TuneReport r = two_candidates();
  OutputCheck logits;
  logits.name = "logits";
  logits.passed = true;
  logits.max_abs_error = 4.8e-7;
  logits.eager_at_precision_max_abs_error = 6e-7;
  logits.error_ratio = 0.8;
  logits.rule = "table";
  OutputCheck classes;
  classes.name = "classes";
  classes.dtype = DType::kInt64;
  classes.max_abs_error = 1;
  classes.mismatched = 1;
  classes.eager_at_precision_max_abs_error = 1;
  classes.error_ratio = std::numeric_limits<double>::infinity();
  classes.rule = "calibrated-exceeded";
  CorrectnessReport checks;
  checks.samples.push_back({"sample 0 (batch 4)", {logits, classes}});
  checks.calibrated_precision = Precision::kStrict;
  checks.accuracy_factor = 4;
  r.candidates[0].correctness = checks;
  const std::string table = r.summary_table();
  EXPECT_NE(table.find("logits err 4.80e-07 / eager 6.00e-07 ratio 0.80 passed (table)"), std::string::npos) << table;
  EXPECT_NE(table.find("classes 1 element differ ratio inf failed (calibrated-exceeded)"), std::string::npos) << table;
  EXPECT_EQ(table.find("classes err"), std::string::npos) << table;
}

TEST(TuneReportTable, BatchSearchLineWhenRun) {
  TuneReport r = two_candidates();
  BatchSearchResult search;
  search.recorded_max_batch = 4;
  search.max_batch = 16;
  search.stop_reason = "throughput gain 2 % < 5 % at batch 32";
  search.correctness = "passed";
  r.batch_search = search;
  const auto lines = lines_of(r.summary_table());
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[6],
            "max batch size: 16 (recorded up to 4; throughput gain 2 % < 5 % at batch 32; check at max: passed)");
}

TEST(TuneReportTable, ShortShapeConditionsAreListedLongOnesCounted) {
  // An export's derived conditions run to 900 characters each (Swin): twenty of them made
  // the logged table a wall; the short ones are listed and the long ones counted.
  TuneReport r = two_candidates();
  const std::string longer = "(" + std::string(120, 'x') + ") != 0";
  r.shape_conditions = {"(x.shape[3] % 4) == 0", longer, longer};
  r.shape_conditions_left_out = {longer};
  const auto table = r.summary_table();
  EXPECT_NE(table.find("the ONNX graphs hold where `(x.shape[3] % 4) == 0`"), std::string::npos) << table;
  EXPECT_NE(table.find("the ONNX graphs hold under 2 longer conditions too"), std::string::npos) << table;
  EXPECT_NE(table.find("took one side of 1 longer conditions too"), std::string::npos) << table;
  EXPECT_EQ(table.find(longer), std::string::npos) << table;
}

}  // namespace
}  // namespace aitune
