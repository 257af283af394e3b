// Correctness checks: atol/rtol rule and its boundaries, NaN, Inf, shape, dtype,
// tolerance defaults and overrides, required tolerances, report JSON.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "aitune/correctness.hpp"
#include "aitune/error.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {
using namespace test;

Tensor f64(const std::vector<double>& v) { return make_host(DType::kFloat64, {static_cast<int64_t>(v.size())}, v); }
Tensor f32(const std::vector<float>& v) { return make_host(DType::kFloat32, {static_cast<int64_t>(v.size())}, v); }

TEST(Correctness, IdenticalOutputsPassWithZeroRequiredTolerance) {
  auto a = f32({1, -2, 3.5f});
  auto c = compare_output("y", a.view(), a.view(), {1e-4, 1e-4});
  EXPECT_TRUE(c.passed) << c.failure;
  EXPECT_EQ(c.max_abs_error, 0);
  EXPECT_EQ(c.required_atol, 0);
  EXPECT_EQ(c.required_rtol, 0);
  EXPECT_EQ(c.mismatched, 0);
}

TEST(Correctness, AnElementFailsOnlyWhenBeyondBothAtolAndRtol) {
  auto expected = f64({10.0});
  // diff 0.5: beyond atol 0.1 but within rtol 0.1 * 10 = 1 -> passes.
  auto within_rtol = compare_output("y", f64({10.5}).view(), expected.view(), {0.1, 0.1});
  EXPECT_TRUE(within_rtol.passed) << within_rtol.failure;
  // diff 0.5: beyond rtol 0.01 * 10 = 0.1 but within atol 1 -> passes.
  auto within_atol = compare_output("y", f64({10.5}).view(), expected.view(), {1.0, 0.01});
  EXPECT_TRUE(within_atol.passed) << within_atol.failure;
  // diff 0.5 beyond both 0.1 and 0.01 * 10 -> fails, and says what would have passed.
  auto beyond = compare_output("y", f64({10.5}).view(), expected.view(), {0.1, 0.01});
  EXPECT_FALSE(beyond.passed);
  EXPECT_EQ(beyond.mismatched, 1);
  EXPECT_DOUBLE_EQ(beyond.max_abs_error, 0.5);
  EXPECT_DOUBLE_EQ(beyond.max_rel_error, 0.05);
  EXPECT_DOUBLE_EQ(beyond.required_atol, 0.5);
  EXPECT_DOUBLE_EQ(beyond.required_rtol, 0.05);
  EXPECT_NE(beyond.failure.find("1 of 1 elements beyond atol=0.1 and rtol=0.01"), std::string::npos) << beyond.failure;
}

// An index output compared exactly was told "would pass with atol=48 or rtol=8" (topk
// indices over ties, a session-27 probe): advice that would make the check meaningless.
TEST(Correctness, AnExactOutputsFailureSaysItIsComparedExactly) {
  auto got = make_host(DType::kInt64, {3}, std::vector<int64_t>{0, 5, 2});
  auto want = make_host(DType::kInt64, {3}, std::vector<int64_t>{0, 1, 2});
  auto c = compare_output("ids", got.view(), want.view(), default_tolerance(DType::kInt64, Precision::kStrict));
  EXPECT_FALSE(c.passed);
  EXPECT_NE(c.failure.find("1 of 3 elements differ (max abs error 4; int64 outputs are compared exactly"),
            std::string::npos) << c.failure;
  EXPECT_EQ(c.failure.find("would pass with"), std::string::npos) << c.failure;
}

// A flag has no ties: a wrong bool output (signbit(-0.0) False where eager says True) was
// told "indices over ties may differ legitimately" (a session-35 probe).
TEST(Correctness, AWrongFlagIsNotExcusedByTies) {
  auto got = make_host(DType::kBool, {3}, std::vector<uint8_t>{1, 0, 0});
  auto want = make_host(DType::kBool, {3}, std::vector<uint8_t>{1, 1, 0});
  auto c = compare_output("negative", got.view(), want.view(), default_tolerance(DType::kBool, Precision::kStrict));
  EXPECT_FALSE(c.passed);
  EXPECT_NE(c.failure.find("bool outputs are compared exactly: a mask or flag is right or wrong)"), std::string::npos)
      << c.failure;
  EXPECT_EQ(c.failure.find("ties"), std::string::npos) << c.failure;
}

TEST(Correctness, ExactlyAtTheBoundaryPasses) {
  auto c = compare_output("y", f64({1.5}).view(), f64({1.0}).view(), {0.5, 0});
  EXPECT_TRUE(c.passed) << c.failure;
  auto r = compare_output("y", f64({1.5}).view(), f64({1.0}).view(), {0, 0.5});
  EXPECT_TRUE(r.passed) << r.failure;
  auto just_beyond = compare_output("y", f64({1.5000001}).view(), f64({1.0}).view(), {0.5, 0.5});
  EXPECT_FALSE(just_beyond.passed);
}

TEST(Correctness, RequiredToleranceIsTheSmallestThatPasses) {
  auto expected = f64({1.0, 100.0, 0.0});
  auto actual = f64({1.2, 101.0, 0.05});
  auto c = compare_output("y", actual.view(), expected.view(), {0.0, 0.0});
  ASSERT_FALSE(c.passed);
  // With rtol 0, everything must be covered by atol: the largest diff, 1.0.
  EXPECT_DOUBLE_EQ(c.required_atol, 1.0);
  auto again = compare_output("y", actual.view(), expected.view(), {c.required_atol, 0.0});
  EXPECT_TRUE(again.passed) << again.failure;
  auto smaller = compare_output("y", actual.view(), expected.view(), {c.required_atol * 0.99, 0.0});
  EXPECT_FALSE(smaller.passed);
  // With rtol 0.01, 101 vs 100 is covered; atol must cover 0.2 (1.2 vs 1) and 0.05 (vs 0).
  auto at_rtol = compare_output("y", actual.view(), expected.view(), {0.0, 0.01});
  EXPECT_DOUBLE_EQ(at_rtol.required_atol, 0.2);
}

TEST(Correctness, NaNFailsUnlessTheReferenceHasNaNThere) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto unexpected = compare_output("logits", f64({1.0, nan}).view(), f64({1.0, 2.0}).view(), {1, 1});
  EXPECT_FALSE(unexpected.passed);
  EXPECT_EQ(unexpected.unexpected_nan, 1);
  EXPECT_NE(unexpected.failure.find("NaN"), std::string::npos) << unexpected.failure;
  EXPECT_TRUE(std::isinf(unexpected.required_atol));
  EXPECT_NE(unexpected.failure.find("1 is NaN here where the reference is not"), std::string::npos)
      << unexpected.failure;
  // The other side named (ONNX Runtime's ReduceMax drops a NaN torch.amax keeps: "NaN in one
  // output but not in the other" did not say which, a session-36 probe).
  auto missing = compare_output("logits", f64({1.0, 2.0}).view(), f64({1.0, nan}).view(), {1, 1});
  EXPECT_FALSE(missing.passed);
  EXPECT_NE(missing.failure.find("1 is NaN in the reference where this output is a number"), std::string::npos)
      << missing.failure;
  auto both = compare_output("logits", f64({1.0, nan}).view(), f64({1.0, nan}).view(), {0, 0});
  EXPECT_TRUE(both.passed) << both.failure;
}

TEST(Correctness, InfFailsUnlessTheReferenceHasTheSameInf) {
  const double inf = std::numeric_limits<double>::infinity();
  auto unexpected = compare_output("y", f64({inf}).view(), f64({3.0}).view(), {1e9, 1e9});
  EXPECT_FALSE(unexpected.passed);
  EXPECT_EQ(unexpected.unexpected_inf, 1);
  EXPECT_NE(unexpected.failure.find("infinite"), std::string::npos) << unexpected.failure;
  EXPECT_FALSE(compare_output("y", f64({inf}).view(), f64({-inf}).view(), {1e9, 1e9}).passed);
  EXPECT_TRUE(compare_output("y", f64({-inf}).view(), f64({-inf}).view(), {0, 0}).passed);
}

TEST(Correctness, ShapeAndDTypeMismatchFailWithBothSides) {
  auto shape = compare_output("y", f32({1, 2}).view(), f32({1, 2, 3}).view(), {1, 1});
  EXPECT_FALSE(shape.passed);
  EXPECT_NE(shape.failure.find("shape [2], expected [3]"), std::string::npos) << shape.failure;
  auto dtype = compare_output("y", f32({1}).view(), f64({1}).view(), {1, 1});
  EXPECT_FALSE(dtype.passed);
  EXPECT_NE(dtype.failure.find("dtype float32, expected float64"), std::string::npos) << dtype.failure;
}

TEST(Correctness, IntegersMustMatchExactly) {
  auto a = make_host<int64_t>(DType::kInt64, {3}, {1, 2, 3});
  auto b = make_host<int64_t>(DType::kInt64, {3}, {1, 2, 4});
  auto c = compare_output("ids", a.view(), b.view(), default_tolerance(DType::kInt64));
  EXPECT_FALSE(c.passed);
  EXPECT_EQ(c.mismatched, 1);
  EXPECT_TRUE(compare_output("ids", a.view(), a.view(), default_tolerance(DType::kInt64)).passed);
}

// int64 values beyond 2^53 (token ids, hashes) are distinct integers a double cannot tell
// apart: compared through doubles, 2^53 and 2^53 + 1 read as equal and a wrong id passed.
TEST(Correctness, LargeInt64ValuesAreComparedExactly) {
  const int64_t big = int64_t{1} << 53;
  auto a = make_host<int64_t>(DType::kInt64, {2}, {big + 1, -big - 1});
  auto b = make_host<int64_t>(DType::kInt64, {2}, {big, -big - 1});
  auto c = compare_output("ids", a.view(), b.view(), default_tolerance(DType::kInt64));
  EXPECT_FALSE(c.passed);
  EXPECT_EQ(c.mismatched, 1);
  EXPECT_GE(c.max_abs_error, 1);
  auto extremes = make_host<int64_t>(DType::kInt64, {1}, {std::numeric_limits<int64_t>::max()});
  auto low = make_host<int64_t>(DType::kInt64, {1}, {std::numeric_limits<int64_t>::min()});
  EXPECT_FALSE(compare_output("ids", extremes.view(), low.view(), {0, 0}).passed);
}

// A tolerance for every output (`ait.tune(tolerance=...)`, `--atol`) loosens the floating
// outputs it is meant for, not integer or bool outputs (argmax indices, counts, masks), which
// stay exact; a per-output tolerance naming an integer output still applies to it.
TEST(Correctness, ToleranceForEveryOutputLeavesIntegersAndBoolsExact) {
  ToleranceSpec spec;
  spec.all = Tolerance{1.0, 0.5};
  EXPECT_EQ(spec.for_output("ids", DType::kInt64), (Tolerance{0, 0}));
  EXPECT_EQ(spec.for_output("mask", DType::kBool), (Tolerance{0, 0}));
  EXPECT_EQ(spec.for_output("x", DType::kFloat32), (Tolerance{1.0, 0.5}));
  spec.per_output["count"] = {1, 0};
  EXPECT_EQ(spec.for_output("count", DType::kInt32), (Tolerance{1, 0}));
  auto ids = make_host<int64_t>(DType::kInt64, {3}, {1, 2, 3});
  auto off_by_one = make_host<int64_t>(DType::kInt64, {3}, {1, 2, 4});
  auto check = compare_sample("sample 0", {"ids"}, {off_by_one.view()}, {ids.view()}, spec);
  EXPECT_FALSE(check.passed());
}

TEST(Correctness, HalfPrecisionValuesAreCompared) {
  // 1.0 = 0x3c00, 1.0009765625 = 0x3c01 (one ulp), 2.0 = 0x4000 in float16.
  auto one = make_host<uint16_t>(DType::kFloat16, {1}, {0x3c00});
  auto ulp = make_host<uint16_t>(DType::kFloat16, {1}, {0x3c01});
  auto two = make_host<uint16_t>(DType::kFloat16, {1}, {0x4000});
  auto tol = default_tolerance(DType::kFloat16);
  EXPECT_TRUE(compare_output("h", ulp.view(), one.view(), tol).passed);
  auto far = compare_output("h", two.view(), one.view(), tol);
  EXPECT_FALSE(far.passed);
  EXPECT_DOUBLE_EQ(far.max_abs_error, 1.0);
  // bfloat16: 1.0 = 0x3f80, 2.0 = 0x4000.
  auto b1 = make_host<uint16_t>(DType::kBFloat16, {1}, {0x3f80});
  auto b2 = make_host<uint16_t>(DType::kBFloat16, {1}, {0x4000});
  EXPECT_DOUBLE_EQ(compare_output("b", b2.view(), b1.view(), tol).max_abs_error, 1.0);
}

TEST(Correctness, DocumentedDefaults) {
  EXPECT_EQ(default_tolerance(DType::kFloat32), (Tolerance{1e-4, 1e-4, true}));
  EXPECT_EQ(default_tolerance(DType::kFloat16), (Tolerance{1e-2, 1e-2, true}));
  EXPECT_EQ(default_tolerance(DType::kBFloat16), (Tolerance{1e-2, 1e-2, true}));
  EXPECT_EQ(default_tolerance(DType::kFloat64), (Tolerance{1e-6, 1e-6, true}));
  EXPECT_EQ(default_tolerance(DType::kInt32), (Tolerance{0, 0}));
  EXPECT_EQ(default_tolerance(DType::kFloat32, Precision::kTF32), (Tolerance{5e-3, 5e-3, true}));
  EXPECT_EQ(default_tolerance(DType::kFloat32, Precision::kFP16), (Tolerance{1e-2, 1e-2, true}));
}

TEST(Correctness, AtolScaleIsTheRmsOfTheFiniteExpectedValuesAtLeastOne) {
  EXPECT_DOUBLE_EQ(atol_scale(f64({300, -400}).view()), std::sqrt((300.0 * 300 + 400.0 * 400) / 2));
  EXPECT_DOUBLE_EQ(atol_scale(f64({0.1, -0.2}).view()), 1.0);  // small outputs keep the absolute atol
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_DOUBLE_EQ(atol_scale(f64({10, inf, nan}).view()), 10.0);
  EXPECT_DOUBLE_EQ(atol_scale(f64({nan}).view()), 1.0);
  auto ints = make_host<int64_t>(DType::kInt64, {2}, {1000, 2000});
  EXPECT_DOUBLE_EQ(atol_scale(ints.view()), 1.0);
}

// The case of a network with large activations: logits of RMS ~100 from a TF32 candidate
// carry rounding errors of ~1e-1 near zero crossings. Against an exact reference the scaled
// default passes them, the absolute atol would not, and a wrong result still fails.
TEST(Correctness, ScaledAtolFollowsTheOutputsMagnitude) {
  std::vector<double> reference, tf32_like, wrong;
  for (int i = 0; i < 1000; ++i) {
    double e = 100.0 * std::sin(0.37 * i);  // RMS ~70.7, many elements near zero
    reference.push_back(e);
    tf32_like.push_back(e + 0.15 * std::cos(1.3 * i));  // error 2e-3 of the RMS
    wrong.push_back(i == 500 ? -e : e);               // one sign flipped
  }
  const auto expected = f64(reference);
  const Tolerance tf32 = default_tolerance(DType::kFloat32, Precision::kTF32);
  auto scaled = compare_output("logits", f64(tf32_like).view(), expected.view(), tf32);
  EXPECT_TRUE(scaled.passed) << scaled.failure;
  EXPECT_NEAR(scaled.scale, 100.0 / std::sqrt(2.0), 0.5);
  EXPECT_DOUBLE_EQ(scaled.atol_applied, 5e-3 * scaled.scale);
  auto absolute = compare_output("logits", f64(tf32_like).view(), expected.view(), {5e-3, 5e-3});
  EXPECT_FALSE(absolute.passed);  // the unscaled rule rejects a correct TF32 result
  auto flipped = compare_output("logits", f64(wrong).view(), expected.view(), tf32);
  EXPECT_FALSE(flipped.passed);
  EXPECT_EQ(flipped.mismatched, 1);
  EXPECT_NE(flipped.failure.find("x output RMS"), std::string::npos) << flipped.failure;
  // Overrides a user gives stay absolute.
  ToleranceSpec spec;
  spec.all = Tolerance{5e-3, 5e-3};
  EXPECT_FALSE(spec.for_output("logits", DType::kFloat32).scaled);
}

// A softmax over a 32k vocabulary (values near 3e-5, RMS below 1): the table's absolute atol
// of 1e-4 is above every value, and a graph at another temperature passed element by
// element (a session-33 probe). Its relative L2 error is tens of percent: it fails; float
// rounding of the same probabilities passes; fp16's table judges at its own rtol, and a
// tolerance the user gave stays the only bound.
TEST(Correctness, ASmallOutputIsJudgedInProportionToItsSize) {
  const int64_t rows = 4, vocab = 32000;
  std::vector<float> reference, hotter, rounded;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> logits(static_cast<std::size_t>(vocab));
    for (int64_t v = 0; v < vocab; ++v) logits[static_cast<std::size_t>(v)] = 2.0 * std::sin(0.37 * static_cast<double>(v * (r + 1)));
    for (double temperature : {1.0, 1.5}) {
      double sum = 0;
      for (double l : logits) sum += std::exp(l / temperature);
      for (int64_t v = 0; v < vocab; ++v) {
        const double p = std::exp(logits[static_cast<std::size_t>(v)] / temperature) / sum;
        (temperature == 1.0 ? reference : hotter).push_back(static_cast<float>(p));
        if (temperature == 1.0) rounded.push_back(static_cast<float>(p * (1 + 3e-7 * std::cos(static_cast<double>(v)))));
      }
    }
  }
  auto probs = [&](const std::vector<float>& v) { return make_host(DType::kFloat32, {rows, vocab}, v); };
  const auto expected = probs(reference);
  const Tolerance fp32 = default_tolerance(DType::kFloat32, Precision::kStrict);
  auto wrong = compare_output("probs", probs(hotter).view(), expected.view(), fp32);
  EXPECT_FALSE(wrong.passed);
  EXPECT_EQ(wrong.mismatched, 0);  // every element within the absolute atol
  EXPECT_TRUE(wrong.rel_l2_beyond);
  ASSERT_TRUE(wrong.rel_l2_limit.has_value());
  EXPECT_DOUBLE_EQ(*wrong.rel_l2_limit, 1e-3);
  EXPECT_GT(wrong.rel_l2_error, 0.1);
  EXPECT_NE(wrong.failure.find("relative L2 error"), std::string::npos) << wrong.failure;
  EXPECT_NE(wrong.failure.find("output_tolerances"), std::string::npos) << wrong.failure;
  auto fine = compare_output("probs", probs(rounded).view(), expected.view(), fp32);
  EXPECT_TRUE(fine.passed) << fine.failure;
  // fp16's table (rtol 1e-2) rejects the other temperature too.
  auto half = compare_output("probs", probs(hotter).view(), expected.view(),
                             default_tolerance(DType::kFloat32, Precision::kFP16));
  EXPECT_FALSE(half.passed);
  EXPECT_DOUBLE_EQ(*half.rel_l2_limit, 1e-2);
  // A tolerance the user gives is absolute and the only bound.
  auto given = compare_output("probs", probs(hotter).view(), expected.view(), {1e-4, 1e-4});
  EXPECT_TRUE(given.passed) << given.failure;
  EXPECT_FALSE(given.rel_l2_limit.has_value());
  // An all-zero reference leaves the atol to rule (no relative error of nothing).
  auto zeros = make_host(DType::kFloat32, {2, 2}, std::vector<float>{0, 0, 0, 0});
  auto dust = make_host(DType::kFloat32, {2, 2}, std::vector<float>{1e-9f, 0, 0, -1e-9f});
  EXPECT_TRUE(compare_output("z", dust.view(), zeros.view(), fp32).passed);
}

// The relative bound per part: a small group beside a large one along an axis, and the
// elements below a few huge ones, are each judged in proportion to their own size.
TEST(Correctness, TheRelativeBoundJudgesEachMagnitudeGroupAndTheRestOnTheirOwn) {
  // Boxes in pixels (rows 0:4, ~300) beside scores near 1e-3 (rows 4:8): the scores doubled.
  std::vector<float> reference, doubled_scores;
  for (int r = 0; r < 8; ++r)
    for (int a = 0; a < 50; ++a) {
      const float e = r < 4 ? 300.0f + static_cast<float>(a) : 1e-3f * (1.5f + std::sin(static_cast<float>(r * 50 + a)));
      reference.push_back(e);
      doubled_scores.push_back(r < 4 ? e : 2 * e);
    }
  const auto expected = make_host(DType::kFloat32, {8, 50}, reference);
  const Tolerance fp32 = default_tolerance(DType::kFloat32, Precision::kStrict);
  auto c = compare_output("head", make_host(DType::kFloat32, {8, 50}, doubled_scores).view(), expected.view(), fp32);
  EXPECT_FALSE(c.passed);
  EXPECT_TRUE(c.rel_l2_beyond);
  EXPECT_NE(c.failure.find("on indices 4:8 of axis 0, relative L2 error"), std::string::npos) << c.failure;
  // Sentinels of -1e9 beside small values: the small ones halved.
  std::vector<float> masked, halved;
  for (int i = 0; i < 300; ++i) {
    const float e = i % 3 == 0 ? -1e9f : 1e-3f * static_cast<float>(2 + std::sin(i));
    masked.push_back(e);
    halved.push_back(i % 3 == 0 ? e : e / 2);
  }
  auto m = compare_output("scores", make_host(DType::kFloat32, {300}, halved).view(),
                          make_host(DType::kFloat32, {300}, masked).view(), fp32);
  EXPECT_FALSE(m.passed);
  EXPECT_NE(m.failure.find("on the 200 elements below its 100 huge ones, relative L2 error"), std::string::npos)
      << m.failure;
}

// A 1e6 diagonal over values near 1: the RMS of the whole (1.25e5) made an fp32 atol of 12.5
// that passed a graph doubling every off-diagonal value. The diagonal is left out of the
// scale (the rtol judges it); a float32-sized error still passes.
TEST(Correctness, AFewHugeElementsDoNotSetTheAtolOfTheRest) {
  const int64_t n = 64;
  std::vector<float> reference, doubled, noisy;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < n; ++c) {
      const float e = r == c ? 1e6f : static_cast<float>(std::sin(0.7 * static_cast<double>(r * n + c)));
      reference.push_back(e);
      doubled.push_back(r == c ? e : 2 * e);
      noisy.push_back(e + (r == c ? 0.5f : 1e-6f) * static_cast<float>(std::cos(static_cast<double>(r + c))));
    }
  auto matrix = [&](const std::vector<float>& v) { return make_host(DType::kFloat32, {n, n}, v); };
  const auto expected = matrix(reference);
  const Tolerance fp32 = default_tolerance(DType::kFloat32, Precision::kStrict);
  const AtolScale scale = measure_atol_scale(expected.view());
  EXPECT_EQ(scale.outliers, n);
  EXPECT_DOUBLE_EQ(scale.scale, 1.0);  // the sines' RMS is below 1
  auto wrong = compare_output("out", matrix(doubled).view(), expected.view(), fp32);
  EXPECT_FALSE(wrong.passed);
  EXPECT_EQ(wrong.scale_outliers, n);
  EXPECT_NE(wrong.failure.find("all but its 64 elements far above the rest"), std::string::npos) << wrong.failure;
  auto fine = compare_output("out", matrix(noisy).view(), expected.view(), fp32);
  EXPECT_TRUE(fine.passed) << fine.failure;
  // A third of the elements 100x larger is a scale, not outliers; masked to -1e9, sentinels.
  std::vector<float> thirds, masked;
  for (int i = 0; i < 300; ++i) {
    thirds.push_back(i % 3 == 0 ? 100.0f : 1.0f);
    masked.push_back(i % 3 == 0 ? -1e9f : static_cast<float>(std::sin(i)));
  }
  EXPECT_EQ(measure_atol_scale(make_host(DType::kFloat32, {300}, thirds).view()).outliers, 0);
  const AtolScale sentinels = measure_atol_scale(make_host(DType::kFloat32, {300}, masked).view());
  EXPECT_EQ(sentinels.outliers, 100);
  EXPECT_DOUBLE_EQ(sentinels.scale, 1.0);
  // Values all of one size (1e9 give or take) have no outliers: the RMS is theirs.
  std::vector<float> large;
  for (int i = 0; i < 300; ++i) large.push_back(static_cast<float>(1e9 * (1 + 0.5 * std::sin(i))));
  EXPECT_EQ(measure_atol_scale(make_host(DType::kFloat32, {300}, large).view()).outliers, 0);
  // Sparse values of a ReLU (most zeros, the rest spread up to 100) keep the whole RMS.
  std::vector<float> sparse;
  for (int i = 0; i < 1000; ++i) sparse.push_back(i % 20 == 0 ? static_cast<float>(i % 100 + 1) : 0.0f);
  const AtolScale relu = measure_atol_scale(make_host(DType::kFloat32, {1000}, sparse).view());
  EXPECT_EQ(relu.outliers, 0);
  EXPECT_GT(relu.scale, 10.0);
}

TEST(Correctness, PerOutputOverrideWinsOverAllWhichWinsOverDefaults) {
  ToleranceSpec spec;
  EXPECT_EQ(spec.for_output("a", DType::kFloat32), (Tolerance{1e-4, 1e-4, true}));
  spec.precision = Precision::kTF32;
  EXPECT_EQ(spec.for_output("a", DType::kFloat32), (Tolerance{5e-3, 5e-3, true}));
  spec.all = Tolerance{1e-3, 0};
  EXPECT_EQ(spec.for_output("a", DType::kFloat32), (Tolerance{1e-3, 0}));
  spec.per_output["b"] = {0.5, 0.5};
  EXPECT_EQ(spec.for_output("b", DType::kFloat32), (Tolerance{0.5, 0.5}));
  EXPECT_EQ(spec.for_output("a", DType::kFloat32), (Tolerance{1e-3, 0}));

  // In a sample comparison the override lets one output pass while another fails.
  auto exp_a = f32({1}), act_a = f32({1.01f}), exp_b = f32({1}), act_b = f32({1.2f});
  ToleranceSpec overrides;
  overrides.per_output["b"] = {0.5, 0};
  auto check = compare_sample("sample 0", {"a", "b"}, {act_a.view(), act_b.view()}, {exp_a.view(), exp_b.view()},
                              overrides);
  ASSERT_EQ(check.outputs.size(), 2u);
  EXPECT_FALSE(check.outputs[0].passed);
  EXPECT_TRUE(check.outputs[1].passed) << check.outputs[1].failure;
  EXPECT_FALSE(check.passed());
}

TEST(Correctness, SampleWithWrongOutputCountFails) {
  auto a = f32({1});
  auto check = compare_sample("sample 0", {"a", "b"}, {a.view()}, {a.view(), a.view()}, {});
  EXPECT_FALSE(check.passed());
  EXPECT_NE(check.outputs.at(0).failure.find("1 outputs, expected 2"), std::string::npos);
}

TEST(Correctness, DeviceMemoryIsRejectedNotRead) {
  TensorView device_view;
  device_view.data = reinterpret_cast<void*>(0x1000);  // never dereferenced
  device_view.shape = {4};
  device_view.device = Device::cuda(0);
  auto host = f32({1, 2, 3, 4});
  expect_error([&] { compare_output("y", device_view, host.view(), {}); }, ErrorCode::kInvalidArgument,
               {"y", "cuda"});
}

TEST(Correctness, ReportSummarisesSamples) {
  auto e = f64({1.0, 2.0});
  auto good = f64({1.0, 2.0});
  auto bad = f64({1.0, 2.5});
  CorrectnessReport report;
  report.samples.push_back(compare_sample("sample 0 (batch 1)", {"y"}, {good.view()}, {e.view()}, {}));
  report.samples.push_back(compare_sample("sample 1 (batch 2)", {"y"}, {bad.view()}, {e.view()}, {}));
  EXPECT_FALSE(report.passed());
  EXPECT_DOUBLE_EQ(report.max_abs_error(), 0.5);
  auto failure = report.first_failure();
  EXPECT_EQ(failure.rfind("sample 1 (batch 2): y: ", 0), 0u) << failure;
  EXPECT_DOUBLE_EQ(report.required_tolerances().at("y").atol, 0.5);
  auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["passed"], false);
  EXPECT_EQ(j["samples"].size(), 2u);
  EXPECT_EQ(j["samples"][1]["outputs"][0]["mismatched"], 1);
}

TEST(Precision, NamesLimitsAndBf16Tolerance) {
  EXPECT_EQ(precision_name(Precision::kStrict), "fp32");
  EXPECT_EQ(precision_name(Precision::kBF16), "bf16");
  for (auto p : {Precision::kStrict, Precision::kTF32, Precision::kFP16, Precision::kBF16})
    EXPECT_EQ(parse_precision(precision_name(p)), p);
  EXPECT_EQ(parse_precision("strict"), Precision::kStrict);
  EXPECT_THROW(parse_precision("fp8"), Error);
  EXPECT_FALSE(parse_precision_limit("any").has_value());
  EXPECT_EQ(precision_limit_name(parse_precision_limit("tf32")), "tf32");
  EXPECT_THROW(parse_precision_limit("half"), Error);
  const PrecisionLimit fp32 = Precision::kStrict, tf32 = Precision::kTF32, fp16 = Precision::kFP16,
                       bf16 = Precision::kBF16;
  EXPECT_TRUE(precision_allowed(Precision::kBF16, std::nullopt));
  EXPECT_TRUE(precision_allowed(Precision::kStrict, fp32));
  EXPECT_FALSE(precision_allowed(Precision::kTF32, fp32));
  EXPECT_TRUE(precision_allowed(Precision::kTF32, tf32));
  EXPECT_FALSE(precision_allowed(Precision::kFP16, tf32));
  EXPECT_TRUE(precision_allowed(Precision::kTF32, fp16));
  EXPECT_FALSE(precision_allowed(Precision::kBF16, fp16));
  EXPECT_FALSE(precision_allowed(Precision::kFP16, bf16));
  EXPECT_TRUE(precision_allowed(Precision::kStrict, bf16));
  EXPECT_EQ(default_tolerance(DType::kFloat32, Precision::kBF16), (Tolerance{5e-2, 5e-2, true}));
}

}  // namespace
}  // namespace aitune

namespace aitune {
namespace {

// A user metric scores what it looks at (a top-1 over the logits): it decides the values, but
// an output it ignores coming back NaN, or past a tolerance the user gave it, fails anyway
// (a session-33 probe: a candidate NaN in its second output was selected on the metric alone).
TEST(Correctness, TheUsersMetricDoesNotExcuseNanOrAToleranceTheUserGave) {
  std::vector<float> eager = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<float> off = {1.0f, 2.5f, 3.0f, 4.0f};
  std::vector<float> nan = {1.0f, std::nanf(""), 3.0f, 4.0f};
  auto view = [](std::vector<float>& v) { return TensorView{v.data(), DType::kFloat32, {4}, {}, Device{}}; };
  auto report_with = [&](std::vector<float>& actual, const ToleranceSpec& tolerances) {
    CorrectnessReport report;
    report.samples.push_back(compare_sample("sample 0", {"aux"}, {view(actual)}, {view(eager)}, tolerances));
    report.user_metric = UserMetricResult{1.0, 1.0, 0.0};  // the metric: no drop
    return report;
  };
  ToleranceSpec defaults;
  EXPECT_TRUE(report_with(off, defaults).passed());  // values: the metric decides
  const auto with_nan = report_with(nan, defaults);
  EXPECT_FALSE(with_nan.passed());
  EXPECT_NE(with_nan.first_failure().find("does not excuse NaN"), std::string::npos) << with_nan.first_failure();
  ToleranceSpec given;
  given.per_output["aux"] = Tolerance{1e-3, 1e-3};
  const auto beyond = report_with(off, given);
  EXPECT_FALSE(beyond.passed());
  EXPECT_NE(beyond.first_failure().find("a tolerance given for this output"), std::string::npos)
      << beyond.first_failure();
}

}  // namespace
}  // namespace aitune
