// Tests for serving_plan and serving_batches: batching chosen from measured latencies
// and a p99 objective; requests checked against a graph spec and grouped into calls.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "aitune/error.hpp"
#include "aitune/serving_batches.hpp"
#include "aitune/serving_plan.hpp"

namespace aitune {
namespace {

// A model whose p99 is 1.5 x p50 and whose p50 grows sub-linearly with the batch.
std::vector<BatchLatency> measured() {
  return {{1, 1000, 1500, "winner profile"}, {2, 1200, 1800, "batch search"}, {4, 1600, 2400, "batch search"},
          {8, 2400, 3600, "batch search"},   {16, 4000, 6000, "batch search"}};
}

TEST(ServingPlan, ChoosesTheLargestBatchWhoseWorstCaseFitsTheObjective) {
  // Budget 10 ms, overhead 1 ms: batch 8 needs 2 x 3.6 + 1 = 8.2 ms; batch 16 needs 13 ms.
  auto plan = plan_serving(measured(), {10.0, 1.0, 0});
  EXPECT_EQ(plan.max_batch_size, 8);
  EXPECT_TRUE(plan.objective_met);
  // 1.8 ms left, capped at batch 8's p50 (2.4 ms): 1.8 ms.
  EXPECT_NEAR(plan.batch_wait_timeout_s, 0.0018, 1e-9);
  EXPECT_NEAR(plan.expected_p99_ms, 10.0, 1e-9);
  EXPECT_NEAR(plan.expected_throughput, 8 / 0.0024, 1e-6);
  std::string why = plan.explain();
  EXPECT_NE(why.find("batch 16 would need 13.0 ms > 10.0 ms"), std::string::npos) << why;
  EXPECT_NE(why.find("<- chosen"), std::string::npos) << why;
  // Each row names how it was measured, and rows measured two ways are said to be: the
  // winner's profile (through the module's call) read batch 2 2.5x slower than batch 4.
  EXPECT_NE(why.find("1.000      1.500      1000.0  winner profile"), std::string::npos) << why;
  EXPECT_NE(why.find("1666.7  batch search"), std::string::npos) << why;
  EXPECT_NE(why.find("the rows were measured two ways"), std::string::npos) << why;
  EXPECT_NE(why.find("from the graph's own latency (HTTP, decoding and batching not counted"), std::string::npos)
      << why;
  const auto all = measured();
  const std::vector<BatchLatency> one_way(all.begin() + 1, all.end());
  EXPECT_EQ(plan_serving(one_way, {10.0, 1.0, 0}).explain().find("two ways"), std::string::npos);
}

TEST(ServingPlan, WaitIsCappedAtOneBatchsP50) {
  auto plan = plan_serving(measured(), {100.0, 1.0, 0});
  EXPECT_EQ(plan.max_batch_size, 16);
  EXPECT_NEAR(plan.batch_wait_timeout_s, 0.004, 1e-9);
}

TEST(ServingPlan, TheGraphsBatchLimitBoundsTheChoice) {
  auto plan = plan_serving(measured(), {100.0, 1.0, 4});
  EXPECT_EQ(plan.max_batch_size, 4);
  EXPECT_NE(plan.explain().find("accepts at most"), std::string::npos);
}

TEST(ServingPlan, AnObjectiveBelowBatchOneIsReportedNotMet) {
  auto plan = plan_serving(measured(), {2.0, 1.0, 0});
  EXPECT_FALSE(plan.objective_met);
  EXPECT_EQ(plan.max_batch_size, 1);
  EXPECT_EQ(plan.batch_wait_timeout_s, 0);
  EXPECT_NE(plan.explain().find("cannot be met"), std::string::npos);
}

TEST(ServingPlan, WithoutAnObjectiveTheHighestThroughputWins) {
  auto m = measured();
  m.push_back({32, 9000, 12000, "batch search"});  // 3556/s < batch 16's 4000/s
  auto plan = plan_serving(m, {std::nullopt, 1.0, 0});
  EXPECT_EQ(plan.max_batch_size, 16);
  EXPECT_NEAR(plan.batch_wait_timeout_s, 0.004, 1e-9);
}

TEST(ServingPlan, P50StandsInForAMissingP99AndSaysSo) {
  auto plan = plan_serving({{1, 1000, 0, "winner profile"}, {4, 2000, 0, "batch search"}}, {6.0, 1.0, 0});
  EXPECT_EQ(plan.max_batch_size, 4);  // 2 x 2 + 1 = 5 ms
  EXPECT_NE(plan.explain().find("p50 stands in"), std::string::npos);
}

TEST(ServingPlan, NothingMeasuredMeansBatchOneAndSaysWhy) {
  auto plan = plan_serving({}, {10.0, 1.0, 0});
  EXPECT_EQ(plan.max_batch_size, 1);
  EXPECT_FALSE(plan.objective_met);
  EXPECT_NE(plan.explain().find("no latency was measured"), std::string::npos);
}

TEST(ServingPlan, InvalidObjectivesAndMeasurementsAreRefused) {
  EXPECT_THROW(plan_serving(measured(), {0.0, 1.0, 0}), Error);
  EXPECT_THROW(plan_serving(measured(), {-5.0, 1.0, 0}), Error);
  EXPECT_THROW(plan_serving(measured(), {10.0, -1.0, 0}), Error);
  EXPECT_THROW(plan_serving({{0, 1000, 0, ""}}, {10.0, 1.0, 0}), Error);
  EXPECT_THROW(plan_serving({{1, 0, 0, ""}}, {10.0, 1.0, 0}), Error);
}

TEST(ServingPlan, ReadsTheWinnersProfileAndTheBatchSearchFromAReport) {
  nlohmann::json report = {
      {"winner", "cpu"},
      {"candidates",
       {{{"name", "other"}, {"profile", {{"batch_size", 4}, {"host_us", {{"p50", 1.0}, {"p99", 2.0}}}}}},
        {{"name", "cpu"}, {"profile", {{"batch_size", 4}, {"host_us", {{"p50", 900.0}, {"p99", 1100.0}}}}}}}},
      {"batch_search",
       {{"steps",
         {{{"batch_size", 8}, {"p50_us", 1500.0}, {"p99_us", 1900.0}, {"error", ""}},
          {{"batch_size", 16}, {"p50_us", 0.0}, {"error", "out of memory"}}}}}}};
  auto m = batch_latencies_from_report(report.dump());
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], (BatchLatency{4, 900, 1100, "winner profile"}));
  EXPECT_EQ(m[1], (BatchLatency{8, 1500, 1900, "batch search"}));
  report["winner"] = nullptr;
  EXPECT_TRUE(batch_latencies_from_report(report.dump()).empty());
  EXPECT_THROW(batch_latencies_from_report("[1, 2]"), Error);
}

GraphSpec image_spec(int64_t max_batch) {
  TensorSpec x{"x", DType::kFloat32, {1, 3, 4}, {max_batch, 3, 8}, 0};
  TensorSpec y{"y", DType::kFloat32, {1, 2}, {max_batch, 2}, 0};
  GraphSpec spec{{x}, {y}, {1, max_batch}};
  spec.batch_rows = BatchRows::kIndependent;  // as the tuner finds a model that keeps rows apart
  return spec;
}

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;
}

TEST(ServingBatches, ChecksEachRequestAgainstTheSpec) {
  auto spec = image_spec(8);
  EXPECT_EQ(check_request(spec, {{"x", DType::kFloat32, {2, 3, 5}}}), (std::vector<std::size_t>{0}));
  EXPECT_EQ(code_of([&] { check_request(spec, {{"x", DType::kFloat64, {2, 3, 5}}}); }), ErrorCode::kDTypeMismatch);
  EXPECT_EQ(code_of([&] { check_request(spec, {{"x", DType::kFloat32, {2, 4, 5}}}); }), ErrorCode::kShapeMismatch);
  EXPECT_EQ(code_of([&] { check_request(spec, {{"x", DType::kFloat32, {9, 3, 5}}}); }), ErrorCode::kShapeMismatch);
  EXPECT_EQ(code_of([&] { check_request(spec, {}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { check_request(spec, {{"x", DType::kFloat32, {1, 3, 4}}, {"z", DType::kFloat32, {1}}}); }),
            ErrorCode::kInvalidArgument);
  try {
    check_request(spec, {{"x", DType::kFloat32, {2, 4, 5}}});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x' has shape [2, 4, 5]"), std::string::npos) << e.what();
  }
}

TEST(ServingBatches, InputsMustAgreeOnTheBatchSize) {
  TensorSpec a{"a", DType::kInt64, {1, 4}, {8, 16}, 0};
  TensorSpec m{"m", DType::kInt64, {1, 4}, {8, 16}, 0};
  GraphSpec spec{{a, m}, {}, {1, 8}};
  EXPECT_NO_THROW(check_request(spec, {{"m", DType::kInt64, {2, 5}}, {"a", DType::kInt64, {2, 7}}}));
  EXPECT_EQ(code_of([&] { check_request(spec, {{"a", DType::kInt64, {2, 5}}, {"m", DType::kInt64, {3, 5}}}); }),
            ErrorCode::kShapeMismatch);
}

TEST(ServingBatches, GroupsByShapeAndSplitsAtTheBatchLimit) {
  auto spec = image_spec(4);
  std::vector<std::vector<Shape>> requests = {
      {{1, 3, 4}}, {{2, 3, 4}}, {{1, 3, 5}}, {{1, 3, 4}}, {{1, 3, 4}}, {{3, 3, 5}}};
  auto calls = group_requests(spec, requests, std::vector<std::string>(requests.size()));
  // [0,1,3] fill batch 4; 4 opens a new call; shape 5: [2,5] = batch 4.
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0], (std::vector<std::size_t>{0, 1, 3}));
  EXPECT_EQ(calls[1], (std::vector<std::size_t>{2, 5}));
  EXPECT_EQ(calls[2], (std::vector<std::size_t>{4}));
  EXPECT_EQ(request_batch_size(spec, {{3, 3, 5}}), 3);
}

TEST(ServingBatches, ConcatenatesOnlyIntoBatchesTheGraphsConditionsAllow) {
  // A graph exported under `x.shape[0] != 3` (the model branched on a batch of 3):
  // a request of 3 is refused, and 1 + 2 do not join into a call of 3.
  auto spec = image_spec(8);
  spec.conditions.push_back(ShapeCondition::from_json(R"(["ne", ["dim", "x", 0], 3])"));
  try {
    check_request(spec, {{"x", DType::kFloat32, {3, 3, 4}}});
    ADD_FAILURE() << "a request of 3 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShapeMismatch);
    EXPECT_NE(std::string(e.what()).find("`x.shape[0] != 3`"), std::string::npos) << e.what();
  }
  auto calls = group_requests(spec, {{{1, 3, 4}}, {{2, 3, 4}}, {{2, 3, 4}}}, {"", "", ""});
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0], (std::vector<std::size_t>{0}));
  EXPECT_EQ(calls[1], (std::vector<std::size_t>{1, 2}));
}

TEST(ServingBatches, AGraphWithoutABatchAxisServesEachRequestAlone) {
  TensorSpec x{"x", DType::kFloat32, {3, 4}, {3, 4}, std::nullopt};
  GraphSpec spec{{x}, {}, {}};
  auto calls = group_requests(spec, {{{3, 4}}, {{3, 4}}}, {"", ""});
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(request_batch_size(spec, {{3, 4}}), 0);
}

// A model whose outputs mix the rows of a batch (a batch mean, `a @ b.T`, logits flattened
// over the batch) answers a request joined with others with a part of their answers: such a
// graph, and one never checked (a checkpoint written before the check), serves each request
// alone. The batch rows survive the spec's JSON (a checkpoint's manifest).
TEST(ServingBatches, RequestsShareACallOnlyWhereTheRowsWereFoundIndependent) {
  auto spec = image_spec(8);
  const std::vector<std::vector<Shape>> requests = {{{1, 3, 4}}, {{1, 3, 4}}, {{2, 3, 4}}};
  EXPECT_EQ(group_requests(spec, requests, {"", "", ""}).size(), 1u);
  for (BatchRows rows : {BatchRows::kCoupled, BatchRows::kUnchecked}) {
    spec.batch_rows = rows;
    auto calls = group_requests(spec, requests, {"", "", ""});
    ASSERT_EQ(calls.size(), 3u) << batch_rows_name(rows);
    EXPECT_EQ(calls[1], (std::vector<std::size_t>{1}));
  }
  spec.batch_rows = BatchRows::kCoupled;
  spec.batch_rows_reason = "output 'y' has no batch axis";
  const GraphSpec back = GraphSpec::from_json(spec.to_json());
  EXPECT_EQ(back.batch_rows, BatchRows::kCoupled);
  EXPECT_EQ(back.batch_rows_reason, "output 'y' has no batch axis");
  EXPECT_EQ(GraphSpec::from_json(image_spec(8).to_json()).batch_rows, BatchRows::kIndependent);
  GraphSpec old = image_spec(8);
  old.batch_rows = BatchRows::kUnchecked;
  EXPECT_EQ(old.to_json().find("batch_rows"), std::string::npos);  // a spec as written before the check
  EXPECT_EQ(code_of([] { GraphSpec::from_json(R"({"inputs": [], "outputs": [], "batch_rows": "maybe"})"); }),
            ErrorCode::kInvalidArgument);
}

// An input without a batch axis (a diffusion timestep, a scale) is one value for the
// whole call: requests that sent other values of it must not share a call, or all but
// the first would silently be answered for the first one's value.
TEST(ServingBatches, RequestsWithOtherValuesOfAnUnbatchedInputRunApart) {
  TensorSpec x{"x", DType::kFloat32, {1, 4}, {8, 4}, 0};
  TensorSpec t{"t", DType::kFloat32, {}, {}, std::nullopt};
  GraphSpec spec{{x, t}, {}, {1, 8}};
  spec.batch_rows = BatchRows::kIndependent;
  const std::vector<std::vector<Shape>> requests = {{{1, 4}, {}}, {{2, 4}, {}}, {{1, 4}, {}}, {{1, 4}, {}}};
  const std::string one(4, '\x01'), three(4, '\x03');
  auto calls = group_requests(spec, requests, {one, three, one, three});
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0], (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(calls[1], (std::vector<std::size_t>{1, 3}));
  // one value per request, or the grouping could not tell them apart
  EXPECT_EQ(code_of([&] { group_requests(spec, requests, {one, three}); }), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace aitune
