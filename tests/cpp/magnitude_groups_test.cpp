// Magnitude groups: an output whose parts are of very different sizes along one axis
// (a YOLO head's pixel boxes beside its [0, 1] scores) is judged part by part, in the
// tolerance table and in the calibrated rule; an output of one size is not split.
#include <cmath>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "aitune/calibration.hpp"
#include "aitune/correctness.hpp"
#include "aitune/magnitude_groups.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {
using namespace test;

constexpr int64_t kChannels = 6, kAnchors = 50;  // 4 box coordinates, 2 class scores

// A YOLO-style head [1, 6, 50]: channels 0-3 box coordinates in pixels (100-600),
// channels 4-5 sigmoid scores in (0, 1). `score_shift` is added to every score (a graph
// computing other scores), `box_error` to every coordinate, `score_error` alternately
// +-, to every score (rounding).
Tensor head(double score_shift = 0, double box_error = 0, double score_error = 0) {
  std::vector<float> v(kChannels * kAnchors);
  for (int64_t c = 0; c < kChannels; ++c)
    for (int64_t a = 0; a < kAnchors; ++a) {
      const auto i = static_cast<std::size_t>(c * kAnchors + a);
      const double x = static_cast<double>(i);
      if (c < 4) {
        v[i] = static_cast<float>(350 + 250 * std::sin(x) + box_error);
      } else {
        const double score = 1 / (1 + std::exp(-3 * std::cos(x)));
        v[i] = static_cast<float>(score + score_shift + (a % 2 ? score_error : -score_error));
      }
    }
  return make_host(DType::kFloat32, {1, kChannels, kAnchors}, v);
}

TEST(MagnitudeGroups, AYoloHeadSplitsIntoItsBoxesAndItsScores) {
  auto expected = head();
  const auto groups = magnitude_groups(expected.view());
  ASSERT_TRUE(groups.split());
  EXPECT_EQ(groups.axis, 1);
  ASSERT_EQ(groups.scale.size(), 2u);
  EXPECT_EQ(groups.indices(0), "4:6");  // the scores: the smallest values first
  EXPECT_EQ(groups.indices(1), "0:4");
  EXPECT_DOUBLE_EQ(groups.scale[0], 1.0);  // below 1: the table's own atol
  EXPECT_GT(groups.scale[1], 300.0);
}

TEST(MagnitudeGroups, OutputsOfOneSizeAreNotSplit) {
  // Logits of an untrained classifier: per class an offset of any size (N(0, 70)), small
  // classes near 0 among them, per row a little noise: their sizes spread continuously.
  std::mt19937 rng(7);
  std::normal_distribution<double> offset(0, 70), noise(0, 1);
  std::vector<double> bias(1000);
  for (auto& b : bias) b = offset(rng);
  std::vector<float> v;
  for (int r = 0; r < 16; ++r)
    for (double b : bias) v.push_back(static_cast<float>(b + noise(rng)));
  EXPECT_FALSE(magnitude_groups(make_host(DType::kFloat32, {16, 1000}, v).view()).split());
  EXPECT_FALSE(magnitude_groups(make_host(DType::kFloat32, {16000}, v).view()).split()) << "rank 1: no slices";
  std::vector<int64_t> ids(12, 3);
  ids[0] = 5000;
  EXPECT_FALSE(magnitude_groups(make_host(DType::kInt64, {2, 6}, ids).view()).split()) << "integers stay exact";
}

TEST(MagnitudeGroups, WrongScoresBesideLargeBoxesFailTheTable) {
  auto expected = head();
  const auto fp16 = default_tolerance(DType::kFloat32, Precision::kFP16);
  // The whole output's RMS (~280) would give every element atol 2.8: scores off by 0.3 passed.
  EXPECT_GT(atol_scale(expected.view()) * fp16.atol, 0.3 * 5);
  auto wrong = compare_output("output0", head(0.3).view(), expected.view(), fp16);
  EXPECT_FALSE(wrong.passed);
  EXPECT_EQ(wrong.magnitude_axis, 1);
  EXPECT_EQ(wrong.mismatched, 2 * kAnchors);
  EXPECT_NE(wrong.failure.find("on indices 4:6 of axis 1"), std::string::npos) << wrong.failure;
  EXPECT_NE(wrong.failure.find("different sizes along axis 1"), std::string::npos) << wrong.failure;
  EXPECT_DOUBLE_EQ(wrong.atol_applied, fp16.atol);  // the scores' (the smallest group's)
  ASSERT_EQ(wrong.magnitude_groups.size(), 2u);
  EXPECT_EQ(wrong.magnitude_groups[0].mismatched, 2 * kAnchors);
  EXPECT_EQ(wrong.magnitude_groups[1].mismatched, 0);
  // Rounding of the boxes' size (1 pixel, within 1e-2 x their RMS) with exact scores passes.
  auto rounded = compare_output("output0", head(0, 1.0).view(), expected.view(), fp16);
  EXPECT_TRUE(rounded.passed) << rounded.failure;
  // The report JSON lists the groups.
  CorrectnessReport report;
  report.samples.push_back({"sample 0", {wrong}});
  const auto json = nlohmann::json::parse(report.to_json());
  const auto& out = json["samples"][0]["outputs"][0];
  EXPECT_EQ(out["magnitude_axis"], 1);
  EXPECT_EQ(out["magnitude_groups"][0]["indices"], "4:6");
  EXPECT_EQ(out["magnitude_groups"][0]["mismatched"], 2 * kAnchors);
}

EagerAtPrecision eager_fp16(const Tensor& eager, const Tensor& expected) {
  EagerAtPrecision e;
  e.precision = Precision::kFP16;
  e.available = true;
  e.samples.push_back(compare_sample("sample 0", {"output0"}, {eager.view()}, {expected.view()},
                                     ToleranceSpec{.precision = Precision::kFP16}));
  return e;
}

CorrectnessReport candidate(const Tensor& actual, const Tensor& expected) {
  CorrectnessReport r;
  r.samples.push_back(compare_sample("sample 0", {"output0"}, {actual.view()}, {expected.view()},
                                     ToleranceSpec{.precision = Precision::kFP16}));
  return r;
}

TEST(MagnitudeGroups, TheCalibratedRuleJudgesEachGroupAgainstEagersErrorOnIt) {
  auto expected = head();
  // eager fp16: boxes off by 5 pixels (beyond their table atol 3.5 and rtol 1e-2 of the
  // smaller coordinates), scores by 1e-3.
  auto eager = eager_fp16(head(0, 5.0, 1e-3), expected);
  // Wrong scores (+0.02, beyond the scores' atol 1e-2), boxes as eager's: over the whole
  // output the errors (max abs 5, rel L2) are eager's, a ratio of 1; the scores' own error
  // is 20x eager's on them.
  auto wrong = candidate(head(0.02, 5.0), expected);
  apply_calibration(wrong, eager, 2.0);
  const auto& w = wrong.samples[0].outputs[0];
  EXPECT_FALSE(w.passed);
  EXPECT_EQ(w.rule, "calibrated-exceeded");
  EXPECT_GT(*w.error_ratio, 10.0);
  EXPECT_NE(w.failure.find("on indices 4:6 of axis 1"), std::string::npos) << w.failure;
  // Boxes off by 6 (beyond the table, 1.2x eager's), scores within their table: passes.
  auto close = candidate(head(0, 6.0, 2e-3), expected);
  apply_calibration(close, eager, 2.0);
  const auto& c = close.samples[0].outputs[0];
  EXPECT_TRUE(c.passed) << c.failure;
  EXPECT_EQ(c.rule, "calibrated");
  EXPECT_NEAR(*c.error_ratio, 1.2, 0.01);
  ASSERT_TRUE(c.magnitude_groups[1].error_ratio.has_value());
}

}  // namespace
}  // namespace aitune
