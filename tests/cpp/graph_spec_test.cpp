// Tests for TensorSpec, GraphSpec (JSON) and GraphSpecBuilder (dynamic axes, batch axis,
// mismatches between recorded calls).
#include <nlohmann/json.hpp>

#include "test_support.hpp"

namespace aitune {
namespace {

using test::expect_error;

TensorRecord rec(std::string name, DType dtype, Shape shape) { return TensorRecord{std::move(name), dtype, std::move(shape)}; }

TEST(GraphSpecBuilder, TwoBatchSizesGiveBatchAxisZero) {
  GraphSpecBuilder b;
  b.record({rec("pixels", DType::kFloat32, {1, 3, 32, 32})}, {rec("logits", DType::kFloat32, {1, 10})}, 1);
  b.record({rec("pixels", DType::kFloat32, {2, 3, 32, 32})}, {rec("logits", DType::kFloat32, {2, 10})}, 2);
  EXPECT_EQ(b.num_samples(), 2u);
  const GraphSpec spec = b.build();
  ASSERT_EQ(spec.inputs.size(), 1u);
  ASSERT_EQ(spec.outputs.size(), 1u);
  EXPECT_EQ(spec.batch_sizes, (std::vector<int64_t>{1, 2}));

  const TensorSpec& in = spec.inputs[0];
  EXPECT_EQ(in.name, "pixels");
  EXPECT_EQ(in.dtype, DType::kFloat32);
  EXPECT_EQ(in.rank(), 4u);
  EXPECT_EQ(in.batch_axis, 0);
  EXPECT_EQ(in.min_shape, (Shape{1, 3, 32, 32}));
  EXPECT_EQ(in.max_shape, (Shape{2, 3, 32, 32}));
  EXPECT_EQ(in.dynamic_axes(), (std::vector<int>{0}));
  EXPECT_TRUE(in.is_dynamic(0));
  EXPECT_FALSE(in.is_dynamic(1));

  const TensorSpec& out = spec.outputs[0];
  EXPECT_EQ(out.name, "logits");
  EXPECT_EQ(out.batch_axis, 0);
  EXPECT_EQ(out.min_shape, (Shape{1, 10}));
  EXPECT_EQ(out.max_shape, (Shape{2, 10}));
  EXPECT_EQ(out.dynamic_axes(), (std::vector<int>{0}));
}

TEST(GraphSpecBuilder, BatchSizesAreDistinctAndAscending) {
  GraphSpecBuilder b;
  for (int64_t n : {4, 1, 4, 2, 1}) b.record({rec("tokens", DType::kInt64, {n, 16})}, {}, n);
  EXPECT_EQ(b.num_samples(), 5u);
  const GraphSpec spec = b.build();
  EXPECT_EQ(spec.batch_sizes, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(spec.inputs[0].min_shape, (Shape{1, 16}));
  EXPECT_EQ(spec.inputs[0].max_shape, (Shape{4, 16}));
  EXPECT_EQ(spec.inputs[0].batch_axis, 0);
  EXPECT_TRUE(spec.outputs.empty());
}

TEST(GraphSpecBuilder, BatchAxisNeedNotBeFirst) {
  // Sequence-first layout: [seq, batch, hidden].
  GraphSpecBuilder b;
  b.record({rec("seq", DType::kFloat32, {5, 2, 8})}, {rec("out", DType::kFloat32, {5, 2, 8})}, 2);
  b.record({rec("seq", DType::kFloat32, {5, 3, 8})}, {rec("out", DType::kFloat32, {5, 3, 8})}, 3);
  const GraphSpec spec = b.build();
  EXPECT_EQ(spec.inputs[0].batch_axis, 1);
  EXPECT_EQ(spec.outputs[0].batch_axis, 1);
  EXPECT_EQ(spec.inputs[0].dynamic_axes(), (std::vector<int>{1}));
}

TEST(GraphSpecBuilder, FirstAxisTrackingBatchWins) {
  // Axes 0 and 2 both equal the batch size in every sample: the first is the batch axis.
  GraphSpecBuilder b;
  b.record({rec("sq", DType::kFloat32, {2, 3, 2})}, {}, 2);
  b.record({rec("sq", DType::kFloat32, {4, 3, 4})}, {}, 4);
  const GraphSpec spec = b.build();
  EXPECT_EQ(spec.inputs[0].batch_axis, 0);
  EXPECT_EQ(spec.inputs[0].dynamic_axes(), (std::vector<int>{0, 2}));
}

TEST(GraphSpecBuilder, SpatialAxisVaryingIsDynamicButNotBatch) {
  GraphSpecBuilder b;
  b.record({rec("image", DType::kFloat32, {1, 3, 32, 48})}, {rec("mask", DType::kFloat32, {1, 32, 48})}, 1);
  b.record({rec("image", DType::kFloat32, {2, 3, 64, 48})}, {rec("mask", DType::kFloat32, {2, 64, 48})}, 2);
  const GraphSpec spec = b.build();
  const TensorSpec& in = spec.inputs[0];
  EXPECT_EQ(in.batch_axis, 0);
  EXPECT_EQ(in.dynamic_axes(), (std::vector<int>{0, 2}));
  EXPECT_EQ(in.min_shape[2], 32);
  EXPECT_EQ(in.max_shape[2], 64);
  EXPECT_FALSE(in.is_dynamic(3));
  EXPECT_EQ(spec.outputs[0].batch_axis, 0);
  EXPECT_EQ(spec.outputs[0].dynamic_axes(), (std::vector<int>{0, 1}));
}

TEST(GraphSpecBuilder, SpatialAxisVaryingAtOneBatchSizeIsDynamicWithoutBatchAxis) {
  GraphSpecBuilder b;
  b.record({rec("image", DType::kFloat32, {1, 3, 32, 32})}, {}, 1);
  b.record({rec("image", DType::kFloat32, {1, 3, 64, 32})}, {}, 1);
  const GraphSpec spec = b.build();
  const TensorSpec& in = spec.inputs[0];
  EXPECT_FALSE(in.batch_axis.has_value()) << *in.batch_axis;
  EXPECT_EQ(in.dynamic_axes(), (std::vector<int>{2}));
  EXPECT_EQ(in.min_shape, (Shape{1, 3, 32, 32}));
  EXPECT_EQ(in.max_shape, (Shape{1, 3, 64, 32}));
  EXPECT_EQ(spec.batch_sizes, (std::vector<int64_t>{1}));
}

TEST(GraphSpecBuilder, SingleBatchSizeGivesNoBatchAxis) {
  GraphSpecBuilder b;
  b.record({rec("pixels", DType::kFloat32, {4, 3})}, {rec("logits", DType::kFloat32, {4, 2})}, 4);
  b.record({rec("pixels", DType::kFloat32, {4, 3})}, {rec("logits", DType::kFloat32, {4, 2})}, 4);
  const GraphSpec spec = b.build();
  EXPECT_FALSE(spec.inputs[0].batch_axis.has_value());
  EXPECT_FALSE(spec.outputs[0].batch_axis.has_value());
  EXPECT_TRUE(spec.inputs[0].dynamic_axes().empty());
  EXPECT_EQ(spec.inputs[0].min_shape, spec.inputs[0].max_shape);
  EXPECT_EQ(spec.batch_sizes, (std::vector<int64_t>{4}));
}

TEST(GraphSpecBuilder, CallsWithoutBatch) {
  GraphSpecBuilder b;
  b.record({rec("signal", DType::kFloat32, {100})}, {}, 0);
  b.record({rec("signal", DType::kFloat32, {200})}, {}, -1);
  const GraphSpec spec = b.build();
  EXPECT_TRUE(spec.batch_sizes.empty());
  EXPECT_FALSE(spec.inputs[0].batch_axis.has_value());
  EXPECT_EQ(spec.inputs[0].dynamic_axes(), (std::vector<int>{0}));
}

TEST(GraphSpecBuilder, MultipleTensorsKeepCallOrder) {
  GraphSpecBuilder b;
  for (int64_t n : {1, 3}) {
    b.record({rec("input_ids", DType::kInt64, {n, 7}), rec("attention_mask", DType::kBool, {n, 7})},
             {rec("hidden", DType::kFloat16, {n, 7, 4}), rec("pooled", DType::kFloat16, {n, 4})}, n);
  }
  const GraphSpec spec = b.build();
  ASSERT_EQ(spec.inputs.size(), 2u);
  ASSERT_EQ(spec.outputs.size(), 2u);
  EXPECT_EQ(spec.inputs[0].name, "input_ids");
  EXPECT_EQ(spec.inputs[1].name, "attention_mask");
  EXPECT_EQ(spec.inputs[1].dtype, DType::kBool);
  EXPECT_EQ(spec.outputs[0].name, "hidden");
  EXPECT_EQ(spec.outputs[1].name, "pooled");
  EXPECT_EQ(spec.outputs[0].dtype, DType::kFloat16);
  for (const auto& t : spec.inputs) EXPECT_EQ(t.batch_axis, 0) << t.name;
  for (const auto& t : spec.outputs) EXPECT_EQ(t.batch_axis, 0) << t.name;
  EXPECT_EQ(spec.find_input("attention_mask"), 1u);
  EXPECT_EQ(spec.find_input("input_ids"), 0u);
  EXPECT_FALSE(spec.find_input("hidden").has_value());
}

TEST(GraphSpecBuilder, DTypeChangeThrowsDTypeMismatchNamingTheTensor) {
  GraphSpecBuilder b;
  b.record({rec("pixels", DType::kFloat32, {1, 3})}, {rec("logits", DType::kFloat32, {1, 2})}, 1);
  expect_error([&] { b.record({rec("pixels", DType::kFloat16, {2, 3})}, {rec("logits", DType::kFloat32, {2, 2})}, 2); },
               ErrorCode::kDTypeMismatch, {"pixels", "float32", "float16"});
  expect_error([&] { b.record({rec("pixels", DType::kFloat32, {2, 3})}, {rec("logits", DType::kInt64, {2, 2})}, 2); },
               ErrorCode::kDTypeMismatch, {"logits", "float32", "int64"});
}

TEST(GraphSpecBuilder, RankChangeThrowsShapeMismatchNamingTheTensor) {
  GraphSpecBuilder b;
  b.record({rec("pixels", DType::kFloat32, {1, 3})}, {rec("logits", DType::kFloat32, {1, 2})}, 1);
  expect_error([&] { b.record({rec("pixels", DType::kFloat32, {2, 3, 1})}, {rec("logits", DType::kFloat32, {2, 2})}, 2); },
               ErrorCode::kShapeMismatch, {"pixels"});
  expect_error([&] { b.record({rec("pixels", DType::kFloat32, {2, 3})}, {rec("logits", DType::kFloat32, {4})}, 2); },
               ErrorCode::kShapeMismatch, {"logits"});
}

TEST(GraphSpecBuilder, NameOrCountMismatchThrowsInvalidArgument) {
  GraphSpecBuilder b;
  b.record({rec("pixels", DType::kFloat32, {1, 3})}, {rec("logits", DType::kFloat32, {1, 2})}, 1);
  expect_error([&] { b.record({rec("voxels", DType::kFloat32, {1, 3})}, {rec("logits", DType::kFloat32, {1, 2})}, 1); },
               ErrorCode::kInvalidArgument, {"pixels", "voxels"});
  expect_error([&] { b.record({rec("pixels", DType::kFloat32, {1, 3})}, {rec("scores", DType::kFloat32, {1, 2})}, 1); },
               ErrorCode::kInvalidArgument, {"logits", "scores"});
  expect_error(
      [&] {
        b.record({rec("pixels", DType::kFloat32, {1, 3}), rec("extra", DType::kFloat32, {1})},
                 {rec("logits", DType::kFloat32, {1, 2})}, 1);
      },
      ErrorCode::kInvalidArgument);
  expect_error([&] { b.record({}, {rec("logits", DType::kFloat32, {1, 2})}, 1); }, ErrorCode::kInvalidArgument);
}

TEST(GraphSpecBuilder, RejectedCallLeavesBuilderUsable) {
  GraphSpecBuilder b;
  b.record({rec("pixels", DType::kFloat32, {1, 3})}, {}, 1);
  expect_error([&] { b.record({rec("pixels", DType::kFloat16, {5, 3})}, {}, 5); }, ErrorCode::kDTypeMismatch);
  b.record({rec("pixels", DType::kFloat32, {2, 3})}, {}, 2);
  EXPECT_EQ(b.num_samples(), 2u);
  const GraphSpec spec = b.build();
  EXPECT_EQ(spec.batch_sizes, (std::vector<int64_t>{1, 2})) << "the rejected call must not count";
  EXPECT_EQ(spec.inputs[0].max_shape, (Shape{2, 3}));
}

TEST(GraphSpecBuilder, BuildWithNothingRecordedThrowsState) {
  GraphSpecBuilder b;
  EXPECT_EQ(b.num_samples(), 0u);
  expect_error([&] { (void)b.build(); }, ErrorCode::kState);
}

TEST(GraphSpecBuilder, DeclaredRangeWidensTheAxisAndTheOutputAxesThatFollowedIt) {
  // A sequence recorded at 16 and 32, declared 1..512: ids and the hidden state's
  // sequence axis take the range; the hidden size (also 16 in one call) does not follow it.
  GraphSpecBuilder b;
  b.record({rec("ids", DType::kInt64, {1, 16}), rec("mask", DType::kInt64, {1, 16})},
           {rec("hidden", DType::kFloat32, {1, 16, 16}), rec("pooled", DType::kFloat32, {1, 16})}, 1);
  b.record({rec("ids", DType::kInt64, {2, 32}), rec("mask", DType::kInt64, {2, 32})},
           {rec("hidden", DType::kFloat32, {2, 32, 16}), rec("pooled", DType::kFloat32, {2, 16})}, 2);
  b.declare_range("ids", 1, 1, 512);
  const GraphSpec spec = b.build();
  EXPECT_EQ(spec.inputs[0].min_shape, (Shape{1, 1}));
  EXPECT_EQ(spec.inputs[0].max_shape, (Shape{2, 512}));
  EXPECT_EQ(spec.inputs[1].min_shape, (Shape{1, 16}));  // undeclared: as recorded
  EXPECT_EQ(spec.inputs[1].max_shape, (Shape{2, 32}));
  EXPECT_EQ(spec.outputs[0].min_shape, (Shape{1, 1, 16}));
  EXPECT_EQ(spec.outputs[0].max_shape, (Shape{2, 512, 16}));
  EXPECT_EQ(spec.outputs[1].min_shape, (Shape{1, 16}));
  EXPECT_EQ(spec.outputs[1].max_shape, (Shape{2, 16}));
}

TEST(GraphSpecBuilder, DeclaredBatchRangeWidensEveryBatchAxis) {
  GraphSpecBuilder b;
  for (int64_t n : {1, 2})
    b.record({rec("x", DType::kFloat32, {n, 3}), rec("y", DType::kFloat32, {4, n})}, {rec("z", DType::kFloat32, {n, 3})}, n);
  b.declare_range("x", 0, 1, kUnbounded);
  const GraphSpec spec = b.build();
  EXPECT_EQ(spec.inputs[0].max_shape, (Shape{kUnbounded, 3}));
  EXPECT_EQ(spec.inputs[1].max_shape, (Shape{4, kUnbounded}));
  EXPECT_EQ(spec.outputs[0].max_shape, (Shape{kUnbounded, 3}));
  EXPECT_TRUE(spec.inputs[0].accepts({4096, 3}));
}

TEST(GraphSpecBuilder, DeclaredStepAcceptsOnlyItsMultiplesAndSurvivesJson) {
  // A UNet's latents: heights 8..32 in steps of 2 (recorded 16 and 24).
  GraphSpecBuilder b;
  for (int64_t h : {16, 24})
    b.record({rec("sample", DType::kFloat32, {1, 4, h, 16})}, {rec("out", DType::kFloat32, {1, 4, h, 16})}, 1);
  b.declare_range("sample", 2, 8, 32, 2);
  const GraphSpec spec = b.build();
  const TensorSpec& in = spec.inputs[0];
  EXPECT_EQ(in.step, (Shape{1, 1, 2, 1}));
  EXPECT_EQ(spec.outputs[0].step, (Shape{1, 1, 2, 1}));  // the output's height followed
  EXPECT_TRUE(in.accepts({1, 4, 8, 16}));
  EXPECT_TRUE(in.accepts({1, 4, 30, 16}));
  EXPECT_FALSE(in.accepts({1, 4, 9, 16}));
  EXPECT_FALSE(in.accepts({1, 4, 34, 16}));
  EXPECT_EQ(in.to_string(), "float32[1, 4, 8..32 step 2, 16]");
  EXPECT_EQ(GraphSpec::from_json(spec.to_json()), spec);
  EXPECT_EQ(spec.to_json().find("step") != std::string::npos, true);
  GraphSpecBuilder odd;
  odd.record({rec("sample", DType::kFloat32, {1, 4, 15, 16})}, {}, 1);
  odd.declare_range("sample", 2, 8, 32, 2);
  expect_error([&] { (void)odd.build(); }, ErrorCode::kInvalidArgument, {"8..32 step 2", "recorded at 15"});
  expect_error([&] { odd.declare_range("sample", 2, 8, 32, 0); }, ErrorCode::kInvalidArgument, {"step 0"});
  auto text = nlohmann::json::parse(spec.to_json());
  text["inputs"][0]["step"] = {1, 1, 0, 1};
  expect_error([&] { (void)GraphSpec::from_json(text.dump()); }, ErrorCode::kInvalidArgument, {"step"});
}

TEST(GraphSpecBuilder, DeclaredRangeMustHoldWhatWasRecorded) {
  GraphSpecBuilder b;
  b.record({rec("ids", DType::kInt64, {1, 16})}, {}, 1);
  b.record({rec("ids", DType::kInt64, {1, 64})}, {}, 1);
  b.declare_range("ids", 1, 1, 32);
  expect_error([&] { (void)b.build(); }, ErrorCode::kInvalidArgument, {"ids", "axis 1", "1..32", "16..64"});
  GraphSpecBuilder unknown;
  unknown.record({rec("ids", DType::kInt64, {1, 16})}, {}, 1);
  unknown.declare_range("input_idz", 1, 1, 32);
  expect_error([&] { (void)unknown.build(); }, ErrorCode::kInvalidArgument, {"input_idz", "its inputs: ids"});
  GraphSpecBuilder rank;
  rank.record({rec("ids", DType::kInt64, {1, 16})}, {}, 1);
  rank.declare_range("ids", 2, 1, 32);
  expect_error([&] { (void)rank.build(); }, ErrorCode::kInvalidArgument, {"rank 2"});
  expect_error([&] { rank.declare_range("ids", 1, 8, 4); }, ErrorCode::kInvalidArgument, {"max 4 is below min 8"});
  expect_error([&] { rank.declare_range("ids", -1, 1, 4); }, ErrorCode::kInvalidArgument, {"axis must be >= 0"});
  expect_error([&] { rank.declare_range("ids", 1, -2, 4); }, ErrorCode::kInvalidArgument, {"negative"});
}

GraphSpec sample_spec() {
  GraphSpecBuilder b;
  for (int64_t n : {1, 2, 8}) {
    b.record({rec("input_ids", DType::kInt64, {n, 12}), rec("image", DType::kBFloat16, {n, 3, 16 * n, 16})},
             {rec("scores", DType::kFloat32, {n, 5})}, n);
  }
  GraphSpec spec = b.build();
  // An unbounded axis must survive the round trip too.
  spec.inputs[1].max_shape[2] = kUnbounded;
  return spec;
}

TEST(GraphSpec, JsonRoundTrip) {
  const GraphSpec spec = sample_spec();
  const std::string text = spec.to_json();
  SCOPED_TRACE(text);
  const auto parsed = nlohmann::json::parse(text);  // valid JSON
  EXPECT_TRUE(parsed.is_object());
  const GraphSpec back = GraphSpec::from_json(text);
  EXPECT_EQ(back, spec);
  EXPECT_EQ(back.inputs[1].max_shape[2], kUnbounded);
  EXPECT_EQ(back.inputs[0].batch_axis, 0);
  EXPECT_EQ(back.batch_sizes, (std::vector<int64_t>{1, 2, 8}));
  // Compact output parses to the same spec.
  EXPECT_EQ(GraphSpec::from_json(spec.to_json(-1)), spec);
  EXPECT_EQ(GraphSpec::from_json(spec.to_json(0)), spec);
}

TEST(GraphSpec, JsonRoundTripWithoutBatchAxis) {
  GraphSpec spec;
  TensorSpec t;
  t.name = "signal";
  t.dtype = DType::kFloat64;
  t.min_shape = {10};
  t.max_shape = {20};
  spec.inputs.push_back(t);
  t.name = "energy";
  t.min_shape = {};
  t.max_shape = {};
  spec.outputs.push_back(t);
  const GraphSpec back = GraphSpec::from_json(spec.to_json());
  EXPECT_EQ(back, spec);
  EXPECT_FALSE(back.inputs[0].batch_axis.has_value());
}

TEST(GraphSpec, FromJsonMissingFieldThrowsInvalidArgumentNamingIt) {
  const auto doc = nlohmann::json::parse(sample_spec().to_json());
  ASSERT_TRUE(doc.contains("inputs")) << doc.dump();
  {
    auto broken = doc;
    broken.erase("inputs");
    expect_error([&] { GraphSpec::from_json(broken.dump()); }, ErrorCode::kInvalidArgument, {"inputs"});
  }
  ASSERT_TRUE(doc["inputs"].is_array());
  ASSERT_TRUE(doc["inputs"][0].contains("dtype")) << doc.dump();
  {
    auto broken = doc;
    broken["inputs"][0].erase("dtype");
    expect_error([&] { GraphSpec::from_json(broken.dump()); }, ErrorCode::kInvalidArgument, {"dtype"});
  }
  ASSERT_TRUE(doc["inputs"][0].contains("name")) << doc.dump();
  {
    auto broken = doc;
    broken["inputs"][0].erase("name");
    expect_error([&] { GraphSpec::from_json(broken.dump()); }, ErrorCode::kInvalidArgument, {"name"});
  }
  {
    auto broken = doc;
    broken["inputs"][0]["dtype"] = "float33";
    expect_error([&] { GraphSpec::from_json(broken.dump()); }, ErrorCode::kInvalidArgument, {"float33"});
  }
  {
    auto broken = doc;
    broken["inputs"] = 5;
    expect_error([&] { GraphSpec::from_json(broken.dump()); }, ErrorCode::kInvalidArgument, {"inputs"});
  }
}

TEST(GraphSpec, FromJsonRejectsInconsistentTensorSpecs) {
  const auto doc = nlohmann::json::parse(sample_spec().to_json());
  ASSERT_TRUE(doc["inputs"][0].contains("min_shape")) << doc.dump();
  auto with = [&](const char* key, nlohmann::json value) {
    auto broken = doc;
    broken["inputs"][0][key] = std::move(value);
    return broken.dump();
  };
  // input_ids is [1..8, 12] with batch axis 0.
  expect_error([&] { GraphSpec::from_json(with("min_shape", {1, 12, 1})); }, ErrorCode::kInvalidArgument,
               {"min_shape"});
  expect_error([&] { GraphSpec::from_json(with("batch_axis", 2)); }, ErrorCode::kInvalidArgument, {"batch_axis"});
  expect_error([&] { GraphSpec::from_json(with("batch_axis", -1)); }, ErrorCode::kInvalidArgument, {"batch_axis"});
  {
    SCOPED_TRACE("min above max");
    expect_error([&] { GraphSpec::from_json(with("min_shape", {9, 12})); }, ErrorCode::kInvalidArgument);
  }
  {
    SCOPED_TRACE("negative minimum");
    expect_error([&] { GraphSpec::from_json(with("min_shape", {-1, 12})); }, ErrorCode::kInvalidArgument);
  }
}

TEST(GraphSpec, FromJsonMalformedThrowsInvalidArgument) {
  expect_error([] { GraphSpec::from_json("not json {"); }, ErrorCode::kInvalidArgument);
  expect_error([] { GraphSpec::from_json(""); }, ErrorCode::kInvalidArgument);
  expect_error([] { GraphSpec::from_json("[1, 2]"); }, ErrorCode::kInvalidArgument);
}

TEST(GraphSpec, FindInput) {
  const GraphSpec spec = sample_spec();
  EXPECT_EQ(spec.find_input("input_ids"), 0u);
  EXPECT_EQ(spec.find_input("image"), 1u);
  EXPECT_FALSE(spec.find_input("scores").has_value()) << "outputs are not inputs";
  EXPECT_FALSE(spec.find_input("").has_value());
}

TensorSpec bounded(Shape min, Shape max) {
  TensorSpec t;
  t.name = "pixels";
  t.min_shape = std::move(min);
  t.max_shape = std::move(max);
  return t;
}

TEST(TensorSpec, Accepts) {
  const TensorSpec t = bounded({1, 3}, {8, 3});
  EXPECT_TRUE(t.accepts({1, 3}));
  EXPECT_TRUE(t.accepts({4, 3}));
  EXPECT_TRUE(t.accepts({8, 3}));
  EXPECT_FALSE(t.accepts({9, 3})) << "above max";
  EXPECT_FALSE(t.accepts({0, 3})) << "below min";
  EXPECT_FALSE(t.accepts({4, 4})) << "static axis differs";
  EXPECT_FALSE(t.accepts({4})) << "lower rank";
  EXPECT_FALSE(t.accepts({4, 3, 1})) << "higher rank";
  EXPECT_FALSE(t.accepts({}));
}

TEST(TensorSpec, AcceptsUnboundedAxis) {
  const TensorSpec t = bounded({1, 16}, {kUnbounded, 16});
  EXPECT_TRUE(t.accepts({1, 16}));
  EXPECT_TRUE(t.accepts({1000000, 16}));
  EXPECT_FALSE(t.accepts({0, 16}));
  EXPECT_FALSE(t.accepts({5, 17}));
  EXPECT_TRUE(t.is_dynamic(0));
  EXPECT_FALSE(t.is_dynamic(1));
  EXPECT_EQ(t.dynamic_axes(), (std::vector<int>{0}));
}

TEST(TensorSpec, ScalarSpec) {
  const TensorSpec t = bounded({}, {});
  EXPECT_EQ(t.rank(), 0u);
  EXPECT_TRUE(t.accepts({}));
  EXPECT_FALSE(t.accepts({1}));
  EXPECT_TRUE(t.dynamic_axes().empty());
}

TEST(TensorSpec, ToString) {
  TensorSpec t = bounded({1, 3, 224, 224}, {8, 3, 224, 224});
  t.batch_axis = 0;
  const std::string s = t.to_string();
  EXPECT_EQ(s.rfind("float32[", 0), 0u) << s;
  EXPECT_NE(s.find("1..8"), std::string::npos) << s;
  EXPECT_NE(s.find("224"), std::string::npos) << s;
  EXPECT_NE(s.find('b'), std::string::npos) << "batch axis marked: " << s;
}


// ---- ShapeCondition: the guards an export was captured under ----

GraphSpec two_input_spec() {
  TensorSpec x{"x", DType::kFloat32, {1, 1}, {8, 64}, 0};
  TensorSpec y{"y", DType::kFloat32, {1}, {8}, 0};
  return GraphSpec{{x, y}, {}, {1, 8}};
}

TEST(ShapeCondition, EvaluatesWithPythonsFloorSemantics) {
  const GraphSpec spec = two_input_spec();
  auto holds = [&](const std::string& json, Shape x, Shape y = {1}) {
    return ShapeCondition::from_json(json).holds(spec, {x, y});
  };
  EXPECT_FALSE(holds(R"(["ne", ["dim", "x", 0], 3])", {3, 8}));
  EXPECT_TRUE(holds(R"(["ne", ["dim", "x", 0], 3])", {4, 8}));
  EXPECT_FALSE(holds(R"(["ne", ["mod", ["dim", "x", 1], 3], 0])", {1, 9}));
  EXPECT_TRUE(holds(R"(["ne", ["mod", ["dim", "x", 1], 3], 0])", {1, 8}));
  // (7 - 10) // 2 == -2 and (7 - 10) % 4 == 1, as Python computes them, not C++'s -1 and -3
  EXPECT_TRUE(holds(R"(["eq", ["floordiv", ["add", ["dim", "x", 1], -10], 2], -2])", {1, 7}));
  EXPECT_TRUE(holds(R"(["eq", ["mod", ["add", ["dim", "x", 1], -10], 4], 1])", {1, 7}));
  EXPECT_TRUE(holds(R"(["eq", ["ceildiv", ["dim", "x", 1], 4], 3])", {1, 9}));
  EXPECT_TRUE(holds(R"(["eq", ["min", 512, ["dim", "x", 1]], ["dim", "x", 1]])", {1, 64}));
  EXPECT_TRUE(holds(R"(["or", ["lt", ["dim", "x", 0], 2], ["eq", ["dim", "y", 0], ["dim", "x", 0]]])", {4, 8}, {4}));
  EXPECT_FALSE(holds(R"(["and", ["gt", ["dim", "x", 1], 1], ["eq", ["dim", "y", 0], ["dim", "x", 0]]])", {4, 8}, {2}));
  EXPECT_TRUE(holds(R"(["not", ["eq", ["pow", 2, ["dim", "x", 0]], 16]])", {3, 8}));
  EXPECT_FALSE(holds(R"(["not", ["eq", ["pow", 2, ["dim", "x", 0]], 16]])", {4, 8}));
  EXPECT_TRUE(holds("true", {1, 1}));
}

TEST(ShapeCondition, WhatCannotBeEvaluatedDoesNotHold) {
  const GraphSpec spec = two_input_spec();
  auto holds = [&](const std::string& json, Shape x) { return ShapeCondition::from_json(json).holds(spec, {x, {1}}); };
  EXPECT_FALSE(holds(R"(["eq", ["mod", ["dim", "x", 1], ["add", ["dim", "x", 0], -1]], 0])", {1, 8}));  // % 0
  EXPECT_FALSE(holds(R"(["gt", ["pow", ["dim", "x", 1], 64], 0])", {1, 8}));                         // overflow
  EXPECT_FALSE(holds(R"(["gt", ["dim", "x", 5], 0])", {1, 8}));                                      // no axis 5
  EXPECT_FALSE(holds(R"(["gt", ["dim", "z", 0], 0])", {1, 8}));                                      // no input z
}

TEST(ShapeCondition, JsonRoundTripsAndReadsAsPython) {
  const auto c = ShapeCondition::from_json(R"(["ne", ["mod", ["dim", "x", 1], 3], 0])");
  EXPECT_EQ(c.to_string(), "(x.shape[1] % 3) != 0");
  EXPECT_EQ(ShapeCondition::from_json(c.to_json()), c);
  EXPECT_EQ(ShapeCondition::from_json(R"(["and", ["le", ["max", ["dim", "a", 0], 2], 9], ["not", ["eq", ["dim", "b", 1], 1]]])")
                .to_string(),
            "(max(a.shape[0], 2) <= 9) and not (b.shape[1] == 1)");
  EXPECT_EQ(c.inputs(), (std::vector<std::string>{"x"}));
}

// The export repeats a guard per use: a report read `(x.shape[0] != 1) or (x.shape[0] != 1)
// or (x.shape[0] != 1) or (x.shape[0] != 1)` (a session-34 probe). Said once; the condition
// itself (its JSON, what it evaluates) is unchanged.
TEST(ShapeCondition, AnAndOrOrOfOneTermRepeatedReadsAsItOnce) {
  const auto repeated = ShapeCondition::from_json(
      R"(["or", ["ne", ["dim", "x", 0], 1], ["ne", ["dim", "x", 0], 1], ["ne", ["dim", "x", 0], 1]])");
  EXPECT_EQ(repeated.to_string(), "x.shape[0] != 1");
  EXPECT_EQ(ShapeCondition::from_json(repeated.to_json()), repeated);
  const auto mixed = ShapeCondition::from_json(
      R"(["and", ["gt", ["dim", "x", 1], 2], ["ne", ["dim", "x", 0], 1], ["gt", ["dim", "x", 1], 2]])");
  EXPECT_EQ(mixed.to_string(), "(x.shape[1] > 2) and (x.shape[0] != 1)");
}

TEST(ShapeCondition, MalformedJsonIsRefusedNamingWhat) {
  expect_error([] { ShapeCondition::from_json(R"(["xor", 1, 2])"); }, ErrorCode::kInvalidArgument, {"unknown operation 'xor'"});
  expect_error([] { ShapeCondition::from_json(R"(["ne", 1])"); }, ErrorCode::kInvalidArgument, {"'ne' takes 2..2 operands, got 1"});
  expect_error([] { ShapeCondition::from_json(R"(["dim", "x", -1])"); }, ErrorCode::kInvalidArgument, {"axis >= 0"});
  expect_error([] { ShapeCondition::from_json(R"("x")"); }, ErrorCode::kInvalidArgument, {"expected an integer"});
  expect_error([] { ShapeCondition::from_json(R"(["ne", 1.5, 2])"); }, ErrorCode::kInvalidArgument, {"expected an integer"});
  expect_error([] { ShapeCondition::from_json("[\"not\", " + std::string(200, '[') ); }, ErrorCode::kInvalidArgument);
}

TEST(ShapeCondition, HoldsThroughoutOnlyWhenEverySizeTheSpecAcceptsSatisfiesIt) {
  // x: batch 1..8 (axis 0), 1..64 on axis 1; y: batch 1..8
  GraphSpec spec = two_input_spec();
  auto throughout = [&](const std::string& json) { return ShapeCondition::from_json(json).holds_throughout(spec); };
  EXPECT_TRUE(throughout(R"(["lt", 0, ["mul", 3, ["dim", "x", 1]]])"));  // implied by the range
  EXPECT_FALSE(throughout(R"(["eq", ["mod", ["dim", "x", 1], 4], 0])"));  // 1..64 holds other sizes
  EXPECT_FALSE(throughout(R"(["lt", ["dim", "x", 1], 64])"));             // fails at the range's end only
  // The batch range may widen after tuning (the batch search): never implied by it.
  EXPECT_FALSE(throughout(R"(["ge", ["dim", "x", 0], 1])"));
  // An axis with a step takes only min + k * step: 4, 8, ..., 64 are all multiples of 4.
  spec.inputs[0].min_shape[1] = 4;
  spec.inputs[0].step = {1, 4};
  EXPECT_TRUE(throughout(R"(["eq", ["mod", ["dim", "x", 1], 4], 0])"));
  // An unbounded axis cannot be walked; more combinations than asked for neither.
  spec.inputs[0].max_shape[1] = kUnbounded;
  EXPECT_FALSE(throughout(R"(["lt", 0, ["dim", "x", 1]])"));
  spec.inputs[0].max_shape[1] = 64;
  EXPECT_FALSE(ShapeCondition::from_json(R"(["lt", 0, ["dim", "x", 1]])").holds_throughout(spec, 4));
  EXPECT_TRUE(ShapeCondition::from_json(R"(["lt", 0, ["dim", "x", 1]])").holds_throughout(spec, 16));
}

TEST(GraphSpec, ConditionsSurviveJsonAndAreChecked) {
  GraphSpec spec = two_input_spec();
  spec.conditions.push_back(ShapeCondition::from_json(R"(["ne", ["dim", "x", 0], 3])"));
  const GraphSpec back = GraphSpec::from_json(spec.to_json());
  EXPECT_EQ(back, spec);
  EXPECT_EQ(back.violated_condition({{4, 8}, {4}}), nullptr);
  ASSERT_NE(back.violated_condition({{3, 8}, {3}}), nullptr);
  expect_error([&] { back.check_conditions({{3, 8}, {3}}); }, ErrorCode::kShapeMismatch,
               {"x [3, 8]", "`x.shape[0] != 3`", "exported under"});
  // A condition of kilobytes (a probe's SEW: 4158 characters) is shown by its start.
  std::string many = R"(["ne", ["dim", "x", 0], 3])";
  for (int k = 0; k < 60; ++k) many = R"(["and", )" + many + R"(, ["ne", ["dim", "x", 1], )" + std::to_string(100 + k) + "]]";
  GraphSpec wide = two_input_spec();
  wide.conditions.push_back(ShapeCondition::from_json(many));
  const std::string said = expect_error([&] { wide.check_conditions({{3, 8}, {3}}); }, ErrorCode::kShapeMismatch,
                                        {"x [3, 8]", "characters", "`aitune inspect` of a checkpoint", "exported under"});
  EXPECT_LT(said.size(), 900u) << said;
  EXPECT_NE(said.find(" ...` ("), std::string::npos) << said;
  // A spec without conditions writes none (as specs were written before them).
  EXPECT_EQ(nlohmann::json::parse(two_input_spec().to_json()).contains("conditions"), false);
  auto text = nlohmann::json::parse(spec.to_json());
  text["conditions"][0] = nlohmann::json::parse(R"(["ne", ["dim", "w", 0], 3])");
  expect_error([&] { GraphSpec::from_json(text.dump()); }, ErrorCode::kInvalidArgument,
               {"conditions[0]", "input 'w'"});
  // Conditions that refuse every call (read as violated): a damaged spec, refused when read
  // (a checkpoint holding one loaded, then refused every call; a new-user probe).
  text["conditions"][0] = nlohmann::json::parse(R"(["eq", ["dim", "x", 7], 8])");
  expect_error([&] { GraphSpec::from_json(text.dump()); }, ErrorCode::kInvalidArgument,
               {"conditions[0]", "axis 7 of input 'x'", "rank 2"});
  text["conditions"][0] = nlohmann::json::parse(R"(["eq", ["mod", ["dim", "x", 1], 0], 0])");
  expect_error([&] { GraphSpec::from_json(text.dump()); }, ErrorCode::kInvalidArgument,
               {"conditions[0]", "divides by the constant 0"});
}

}  // namespace
}  // namespace aitune
