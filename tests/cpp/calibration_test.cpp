// Accuracy beyond the tolerance table: relative L2, cosine and top-1 per output, the
// calibrated rule (a reduced-precision candidate against eager's own error at its
// precision), the user's metric, and reference outputs that cannot judge.
#include <cmath>
#include <limits>
#include <stdexcept>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "aitune/calibration.hpp"
#include "aitune/error.hpp"
#include "aitune/tuner.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {
using namespace test;

constexpr int64_t kRows = 4, kClasses = 8;

// Logits [4, 8] with a clear winner per row (class r + 1), plus `noise` x a +-1 pattern
// (`flip` reverses the sign of every other element so two noises differ).
Tensor logits(double noise, bool flip = false, int winner_shift = 1) {
  std::vector<float> v(kRows * kClasses);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kClasses; ++c) {
      auto i = static_cast<std::size_t>(r * kClasses + c);
      double base = std::sin(static_cast<double>(i)) + (c == (r + winner_shift) % kClasses ? 5.0 : 0.0);
      double sign = ((i % 2 == 0) != flip) ? 1.0 : -1.0;
      v[i] = static_cast<float>(base + noise * sign);
    }
  return make_host(DType::kFloat32, {kRows, kClasses}, v);
}

TEST(AccuracyMetrics, RelativeL2CosineAndTop1AreMeasuredPerOutput) {
  auto expected = logits(0);
  auto same = compare_output("logits", expected.view(), expected.view(), {1e-4, 1e-4});
  EXPECT_EQ(same.rel_l2_error, 0);
  EXPECT_DOUBLE_EQ(same.cosine_similarity, 1.0);
  ASSERT_TRUE(same.top1_agreement.has_value());
  EXPECT_EQ(*same.top1_agreement, 1.0);

  auto noisy = compare_output("logits", logits(0.1).view(), expected.view(), {1e-4, 1e-4});
  EXPECT_GT(noisy.rel_l2_error, 0.01);
  EXPECT_LT(noisy.rel_l2_error, 0.1);
  EXPECT_LT(noisy.cosine_similarity, 1.0);
  EXPECT_GT(noisy.cosine_similarity, 0.99);
  EXPECT_EQ(*noisy.top1_agreement, 1.0);  // the winners are 5 apart: noise 0.1 keeps them
  EXPECT_TRUE(noisy.top1_flip_margins.empty());
  EXPECT_NEAR(noisy.max_row_error_spread, 0.2, 1e-6);  // +0.1 and -0.1 in one row

  auto wrong_class = compare_output("logits", logits(0, false, 2).view(), expected.view(), {1e-4, 1e-4});
  EXPECT_EQ(*wrong_class.top1_agreement, 0.0);  // every row's winner moved
  ASSERT_EQ(wrong_class.top1_flip_margins.size(), static_cast<std::size_t>(kRows));
  for (double margin : wrong_class.top1_flip_margins) EXPECT_GT(margin, 3.0);  // 5 +- two sines
  auto shifted = logits(0);  // a constant added to every logit moves no argmax: spread 0
  for (int64_t i = 0; i < kRows * kClasses; ++i) static_cast<float*>(shifted.data())[i] += 0.5f;
  EXPECT_NEAR(compare_output("logits", shifted.view(), expected.view(), {0, 0}).max_row_error_spread, 0, 1e-6);

  auto vector = make_host(DType::kFloat32, {3}, std::vector<float>{1, 2, 3});
  EXPECT_FALSE(compare_output("v", vector.view(), vector.view(), {0, 0}).top1_agreement.has_value())
      << "a rank-1 output has no classes";
}

CorrectnessReport candidate_report(double noise, bool flip) {
  auto expected = logits(0);
  CorrectnessReport r;
  r.samples.push_back(compare_sample("sample 0", {"logits"}, {logits(noise, flip).view()}, {expected.view()},
                                     ToleranceSpec{.precision = Precision::kFP16}));
  return r;
}

EagerAtPrecision eager_fp16(double noise) {
  auto expected = logits(0);
  EagerAtPrecision e;
  e.precision = Precision::kFP16;
  e.available = true;
  e.samples.push_back(compare_sample("sample 0", {"logits"}, {logits(noise).view()}, {expected.view()},
                                     ToleranceSpec{.precision = Precision::kFP16}));
  return e;
}

TEST(Calibration, AValueFailureWithinFactorTimesEagersErrorPasses) {
  auto within = candidate_report(0.15, true);  // fails the fp16 table (0.15 > 1e-2 x RMS ~ 0.02)
  ASSERT_FALSE(within.passed());
  apply_calibration(within, eager_fp16(0.1), 2.0);  // 1.5x eager fp16's error
  EXPECT_TRUE(within.passed()) << within.first_failure();
  const auto& o = within.samples[0].outputs[0];
  EXPECT_EQ(o.rule, "calibrated");
  ASSERT_TRUE(o.error_ratio.has_value());
  EXPECT_NEAR(*o.error_ratio, 1.5, 1e-3);
  EXPECT_NEAR(*o.eager_at_precision_max_abs_error, 0.1, 1e-6);
  EXPECT_EQ(within.calibrated_precision, Precision::kFP16);

  auto beyond = candidate_report(0.3, true);  // 3x eager's error
  apply_calibration(beyond, eager_fp16(0.1), 2.0);
  EXPECT_FALSE(beyond.passed());
  EXPECT_EQ(beyond.samples[0].outputs[0].rule, "calibrated-exceeded");
  EXPECT_NE(beyond.first_failure().find("ratio 3"), std::string::npos) << beyond.first_failure();

  auto looser = candidate_report(0.3, true);  // the factor is the user's to set
  apply_calibration(looser, eager_fp16(0.1), 4.0);
  EXPECT_TRUE(looser.passed()) << looser.first_failure();
  EXPECT_THROW(apply_calibration(looser, eager_fp16(0.1), 0.5), Error);
}

// Small values (near 1e-3) whose fp16 errors are within the table's absolute atol but beyond
// its relative bound: eager fp16's own relative error calibrates them like any value failure.
TEST(Calibration, ASmallOutputBeyondTheRelativeBoundIsCalibratedAgainstEager) {
  auto small = [](double relative_noise) {
    std::vector<float> v;
    for (int i = 0; i < 400; ++i) {
      const double e = 1e-3 * (1.5 + std::sin(0.3 * i));
      v.push_back(static_cast<float>(e * (1 + relative_noise * std::cos(1.7 * i))));
    }
    return make_host(DType::kFloat32, {400}, v);
  };
  const auto expected = small(0);
  const ToleranceSpec fp16{.precision = Precision::kFP16};
  auto report = [&](double noise) {
    CorrectnessReport r;
    r.samples.push_back(compare_sample("sample 0", {"p"}, {small(noise).view()}, {expected.view()}, fp16));
    return r;
  };
  EagerAtPrecision eager;
  eager.precision = Precision::kFP16;
  eager.available = true;
  eager.samples.push_back(compare_sample("sample 0", {"p"}, {small(0.04).view()}, {expected.view()}, fp16));
  auto within = report(0.06);
  ASSERT_FALSE(within.passed());
  EXPECT_EQ(within.samples[0].outputs[0].mismatched, 0);
  apply_calibration(within, eager, 2.0);
  EXPECT_TRUE(within.passed()) << within.first_failure();
  EXPECT_EQ(within.samples[0].outputs[0].rule, "calibrated");
  auto beyond = report(0.2);
  apply_calibration(beyond, eager, 2.0);
  EXPECT_FALSE(beyond.passed());
  EXPECT_EQ(beyond.samples[0].outputs[0].rule, "calibrated-exceeded");
  EXPECT_NE(beyond.first_failure().find("relative L2 error"), std::string::npos) << beyond.first_failure();
}

// A hidden state with a few massive activations (3000 among values near 0.5): eager fp16
// errs by ~1 on those, and that error excused a candidate 50x worse than eager on all the
// other elements. The rest is judged against eager's error on the rest.
TEST(Calibration, AFewHugeElementsDoNotExcuseErrorsOfTheRest) {
  constexpr int64_t rows = 8, width = 64;
  auto state = [&](double huge_error, double rest_error) {
    std::vector<float> v;
    for (int64_t i = 0; i < rows * width; ++i) {
      const double sign = i % 3 == 0 ? 1.0 : -1.0;
      v.push_back(i % 128 == 5 ? static_cast<float>(3000 + huge_error * sign)
                               : static_cast<float>(0.5 * std::sin(0.3 * static_cast<double>(i)) + rest_error * sign));
    }
    return make_host(DType::kFloat32, {rows, width}, v);
  };
  const auto expected = state(0, 0);
  const ToleranceSpec fp16{.precision = Precision::kFP16};
  EagerAtPrecision eager;
  eager.precision = Precision::kFP16;
  eager.available = true;
  eager.samples.push_back(compare_sample("sample 0", {"h"}, {state(1.0, 1e-3).view()}, {expected.view()}, fp16));
  auto judged = [&](double rest_error) {
    CorrectnessReport r;
    r.samples.push_back(compare_sample("sample 0", {"h"}, {state(1.0, rest_error).view()}, {expected.view()}, fp16));
    apply_calibration(r, eager, 2.0);
    return r;
  };
  const auto wrong = judged(0.05);  // 50x eager's error on the rest, below its error on the huge ones
  EXPECT_FALSE(wrong.passed());
  EXPECT_EQ(wrong.samples[0].outputs[0].scale_outliers, 4);
  EXPECT_NE(wrong.first_failure().find("on the 508 elements below its 4 huge ones"), std::string::npos)
      << wrong.first_failure();
  const auto json = nlohmann::json::parse(wrong.to_json())["samples"][0]["outputs"][0];
  EXPECT_EQ(json["atol_scale_outliers"], 4);
  EXPECT_NEAR(json["rest_max_abs_error"].get<double>(), 0.05, 1e-6);
  const auto fine = judged(1.5e-3);  // as eager fp16 on the rest
  EXPECT_TRUE(fine.passed()) << fine.first_failure();
}

// A bf16 candidate 2e-3 off passed "(calibrated)" where the user had given 1e-6 for the
// output: a tolerance the user gives is a limit, which eager's own error does not widen.
TEST(Calibration, AToleranceTheUserGaveIsALimitTheCalibratedRuleDoesNotWiden) {
  auto expected = logits(0);
  for (const bool per_output : {true, false}) {
    ToleranceSpec given{.precision = Precision::kFP16};
    if (per_output) given.per_output["logits"] = Tolerance{1e-6, 1e-6};
    else given.all = Tolerance{1e-6, 1e-6};
    CorrectnessReport r;
    r.samples.push_back(compare_sample("sample 0", {"logits"}, {logits(0.15, true).view()}, {expected.view()}, given));
    ASSERT_TRUE(r.samples[0].outputs[0].tolerance_given);
    apply_calibration(r, eager_fp16(0.1), 2.0);  // 1.5x eager fp16's error: the table alone would be excused
    EXPECT_FALSE(r.passed());
    EXPECT_NE(r.first_failure().find("the tolerance given for this output is a limit"), std::string::npos)
        << r.first_failure();
  }
  auto table = candidate_report(0.15, true);  // the table's tolerance: widened as before
  EXPECT_FALSE(table.samples[0].outputs[0].tolerance_given);
  apply_calibration(table, eager_fp16(0.1), 2.0);
  EXPECT_TRUE(table.passed()) << table.first_failure();
}

TEST(Calibration, TheTableIsAFloorAndNaNIsNeverExcused) {
  auto tiny = candidate_report(1e-4, true);  // passes the table even though eager's error is 0
  apply_calibration(tiny, eager_fp16(0), 2.0);
  EXPECT_TRUE(tiny.passed());
  EXPECT_EQ(tiny.samples[0].outputs[0].rule, "table");
  EXPECT_TRUE(std::isinf(*tiny.samples[0].outputs[0].error_ratio));

  auto expected = logits(0);
  auto nan = logits(0);
  static_cast<float*>(nan.data())[3] = std::numeric_limits<float>::quiet_NaN();
  CorrectnessReport r;
  r.samples.push_back(compare_sample("sample 0", {"logits"}, {nan.view()}, {expected.view()},
                                     ToleranceSpec{.precision = Precision::kFP16}));
  apply_calibration(r, eager_fp16(10.0), 100.0);
  EXPECT_FALSE(r.passed());
}

TEST(Calibration, TopOneDisagreementBeyondFactorFailsEvenWhenErrorsAreClose) {
  auto expected = logits(0);
  CorrectnessReport r;  // every row's winner moved: error ~5 per moved element
  r.samples.push_back(compare_sample("sample 0", {"logits"}, {logits(0, false, 2).view()}, {expected.view()},
                                     ToleranceSpec{.precision = Precision::kFP16}));
  EagerAtPrecision eager = eager_fp16(0);
  auto shifted = logits(0);  // eager errs by 3 everywhere, but keeps every row's winner
  for (int64_t i = 0; i < kRows * kClasses; ++i) static_cast<float*>(shifted.data())[i] += 3.0f;
  eager.samples[0] = compare_sample("sample 0", {"logits"}, {shifted.view()}, {expected.view()},
                                    ToleranceSpec{.precision = Precision::kFP16});
  ASSERT_EQ(*eager.samples[0].outputs[0].top1_agreement, 1.0);
  apply_calibration(r, eager, 2.0);
  EXPECT_LE(*r.samples[0].outputs[0].error_ratio, 2.0) << "the errors alone would pass";
  EXPECT_FALSE(r.passed());
  EXPECT_NE(r.first_failure().find("top-1"), std::string::npos) << r.first_failure();
}

TEST(Calibration, AFewNearTiedRowsMayFlipWhereEagerFlippedNone) {
  // 200 rows whose two best classes are 1e-3 apart: the candidate flips 1 row (0.5 %),
  // eager at fp16 flips none; both err by about as much. Under 1 % of rows is allowed.
  constexpr int64_t rows = 200, classes = 8;
  std::vector<float> ref(rows * classes), eager_v(rows * classes), cand(rows * classes);
  for (int64_t i = 0; i < rows * classes; ++i) {
    const int64_t c = i % classes;
    ref[i] = static_cast<float>(c == 0 ? 5.0 : c == 1 ? 4.999 : 0.5 * std::sin(static_cast<double>(i)));
    eager_v[i] = ref[i] + 0.02f;  // a uniform shift: every winner kept
    cand[i] = ref[i] + ((i / classes) % 2 ? 0.03f : -0.01f);
  }
  cand[1] = ref[0] + 0.01f;  // row 0: class 1 now wins
  auto expected = make_host(DType::kFloat32, {rows, classes}, ref);
  auto eager_t = make_host(DType::kFloat32, {rows, classes}, eager_v);
  auto cand_t = make_host(DType::kFloat32, {rows, classes}, cand);
  const ToleranceSpec fp16{.precision = Precision::kFP16};
  CorrectnessReport r;
  r.samples.push_back(compare_sample("sample 0", {"logits"}, {cand_t.view()}, {expected.view()}, fp16));
  ASSERT_FALSE(r.passed());
  ASSERT_NEAR(*r.samples[0].outputs[0].top1_agreement, 0.995, 1e-9);
  EagerAtPrecision eager;
  eager.precision = Precision::kFP16;
  eager.available = true;
  eager.samples.push_back(compare_sample("sample 0", {"logits"}, {eager_t.view()}, {expected.view()}, fp16));
  ASSERT_EQ(*eager.samples[0].outputs[0].top1_agreement, 1.0);
  apply_calibration(r, eager, 2.0);
  EXPECT_TRUE(r.passed()) << r.first_failure();
}

TEST(Calibration, EagerUnavailableKeepsTheTableAndSaysSo) {
  auto r = candidate_report(0.15, true);
  EagerAtPrecision none;
  none.precision = Precision::kTF32;
  none.reason = "TF32 is a CUDA setting";
  apply_calibration(r, none, 2.0);
  EXPECT_FALSE(r.passed());
  EXPECT_FALSE(r.calibrated_precision.has_value());
  EXPECT_NE(r.calibration_note.find("TF32 is a CUDA setting"), std::string::npos);
}

TEST(VacuousOutputs, AllNaNAndConstantOutputsAreNamed) {
  auto good = logits(0);
  auto zeros = make_host(DType::kFloat32, {2, 2}, std::vector<float>{0, 0, 0, 0});
  float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto nans = make_host(DType::kFloat32, {2, 2}, std::vector<float>{nan, inf, nan, -inf});
  auto found = vacuous_outputs({"logits", "zeros", "nans"}, {{good.view(), zeros.view(), nans.view()}});
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].name, "zeros");
  EXPECT_NE(found[0].why.find("constant"), std::string::npos);
  EXPECT_EQ(found[1].name, "nans");
  EXPECT_EQ(found[1].why, "all NaN/Inf");
}

TEST(VacuousOutputs, AnOutputBelowTheAbsoluteToleranceJudgesInProportion) {
  // Every value below 1e-4: named vacuous in sessions 27-33, since a graph returning twice
  // them passed the table's absolute atol. The relative L2 bound judges them now: not named,
  // and twice them fails.
  auto tiny = make_host(DType::kFloat32, {2, 2}, std::vector<float>{1e-6f, -3e-6f, 2e-6f, 0});
  auto twice = make_host(DType::kFloat32, {2, 2}, std::vector<float>{2e-6f, -6e-6f, 4e-6f, 0});
  EXPECT_TRUE(vacuous_outputs({"tiny"}, {{tiny.view()}}).empty());
  auto c = compare_output("tiny", twice.view(), tiny.view(), default_tolerance(DType::kFloat32));
  EXPECT_FALSE(c.passed);
  EXPECT_NE(c.failure.find("relative L2 error 1 > 0.001"), std::string::npos) << c.failure;
}

// A random-weight deep MLP's output is its last bias plus an input-dependent part far below
// the tolerance: a graph that ignored its inputs would pass (a session-36 probe). Named, once
// two samples of one shape show it; an output that moves with its inputs is not.
TEST(VacuousOutputs, AnOutputThatBarelyMovesBetweenSamplesIsNamed) {
  auto a = make_host(DType::kFloat32, {2, 2}, std::vector<float>{0.077f, -0.05f, 0.1f, 0.02f});
  auto b = make_host(DType::kFloat32, {2, 2}, std::vector<float>{0.077f + 4e-6f, -0.05f, 0.1f - 3e-6f, 0.02f});
  auto moving = make_host(DType::kFloat32, {2, 2}, std::vector<float>{0.08f, -0.05f, 0.1f, 0.02f});
  auto found = vacuous_outputs({"y"}, {{a.view()}, {b.view()}});
  ASSERT_EQ(found.size(), 1u);
  EXPECT_NE(found[0].why.find("nearly constant"), std::string::npos) << found[0].why;
  EXPECT_TRUE(vacuous_outputs({"y"}, {{a.view()}, {moving.view()}}).empty());
  EXPECT_TRUE(vacuous_outputs({"y"}, {{a.view()}}).empty());  // one sample says nothing
}

// Small values that move by all they are (`fc(x) * 1e-6`) were called nearly constant ("a
// graph that ignored its inputs would pass") because the movement was below the absolute
// atol; the relative L2 bound fails such a graph (a session-37 probe), so they are not named.
TEST(VacuousOutputs, SmallValuesThatMoveInProportionAreNotNearlyConstant) {
  auto a = make_host(DType::kFloat32, {2, 2}, std::vector<float>{1e-6f, -3e-6f, 2e-6f, 0.5e-6f});
  auto b = make_host(DType::kFloat32, {2, 2}, std::vector<float>{-2e-6f, 1e-6f, -1e-6f, 2.5e-6f});
  EXPECT_TRUE(vacuous_outputs({"small"}, {{a.view()}, {b.view()}}).empty());
  // the graph ignoring its inputs (each element's mean) fails the check
  auto mean = make_host(DType::kFloat32, {2, 2}, std::vector<float>{-0.5e-6f, -1e-6f, 0.5e-6f, 1.5e-6f});
  EXPECT_FALSE(compare_output("small", mean.view(), a.view(), default_tolerance(DType::kFloat32)).passed);
}

TEST(VacuousOutputs, AConstantMaskIsSaidAsABool) {
  // A bool output (y > 0) that is False everywhere was "constant (every element is 0)".
  auto mask = make_host(DType::kBool, {2, 2}, std::vector<uint8_t>{0, 0, 0, 0});
  auto ids = make_host(DType::kInt64, {2}, std::vector<int64_t>{3, 3});
  auto found = vacuous_outputs({"mask", "ids"}, {{mask.view(), ids.view()}});
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].why, "constant (every element is false)");
  EXPECT_EQ(found[1].why, "constant (every element is 3)");
}

// The engine end to end through the test seam for a candidate's precision: external
// candidates at fp16 and fp32 whose outputs carry a known error.
struct Graph {
  Tensor x = make_pattern_f32({kRows, 3}, 1);
  Tensor y = logits(0);
  GraphSpec spec() const {
    GraphSpecBuilder b;
    b.record({{"x", DType::kFloat32, x.shape()}}, {{"logits", DType::kFloat32, y.shape()}}, kRows);
    return b.build();
  }
  std::vector<TuneSample> samples() const { return {{{x.view()}, {y.view()}, kRows}}; }
};

TunerOptions quick() {
  TunerOptions o;
  o.profile.warmup_calls = 1;
  o.profile.window_calls = 5;
  o.profile.time_cap_s = 0.2;
  return o;
}

ExternalCandidate with_noise(std::string name, Precision precision, double noise) {
  return {std::move(name), "{}", precision, [noise](std::size_t) { return std::vector<Tensor>{logits(noise, true)}; },
          [] {}};
}

TEST(CalibratedTuning, ReducedPrecisionCandidatesAreJudgedAgainstEagerAtTheirPrecision) {
  Graph g;
  TunerOptions options = quick();
  int asked = 0;
  options.eager_at_precision = [&](Precision p, std::string& reason) -> std::optional<std::vector<std::vector<Tensor>>> {
    ++asked;
    if (p == Precision::kTF32) {
      reason = "TF32 is a CUDA setting";
      return std::nullopt;
    }
    // strict: the module run wider, whose distance from the reference is eager's own fp32
    // error, far below fp16's
    return std::vector<std::vector<Tensor>>{{logits(p == Precision::kStrict ? 0.001 : 0.1)}};
  };
  GraphTuner tuner("g", g.spec(), g.samples(), options);
  auto fp16_ok = tuner.evaluate_external(with_noise("fp16 1.5x", Precision::kFP16, 0.15), "B", 0);
  auto fp16_bad = tuner.evaluate_external(with_noise("fp16 3x", Precision::kFP16, 0.3), "B", 0);
  auto fp32 = tuner.evaluate_external(with_noise("fp32 1.5x", Precision::kStrict, 0.15), "B", 0);
  auto tf32 = tuner.evaluate_external(with_noise("tf32 1.5x", Precision::kTF32, 0.15), "B", 0);
  EXPECT_EQ(asked, 3) << "eager is asked once per precision (strict: where a strict candidate fails the table)";
  const auto& report = tuner.select(StrategyConfig{.performance_validation = false});
  const auto& c = report.candidates;
  EXPECT_EQ(c[fp16_ok].status, CandidateStatus::kSelected) << c[fp16_ok].reason;
  EXPECT_EQ(c[fp16_bad].status, CandidateStatus::kIncorrect);
  EXPECT_EQ(c[fp32].status, CandidateStatus::kIncorrect) << "150x eager's own fp32 error";
  EXPECT_EQ(c[tf32].status, CandidateStatus::kIncorrect) << "no eager TF32 here: the table decides";

  auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["accuracy_factor"], 2.0);
  EXPECT_EQ(j["eager_at_precision"]["fp16"]["available"], true);
  EXPECT_NEAR(j["eager_at_precision"]["fp16"]["outputs"][0]["max_abs_error"].get<double>(), 0.1, 1e-6);
  EXPECT_EQ(j["eager_at_precision"]["tf32"]["available"], false);
  EXPECT_EQ(j["eager_at_precision"]["tf32"]["reason"], "TF32 is a CUDA setting");
  const auto& out = j["candidates"][fp16_ok]["correctness"]["outputs"][0];
  EXPECT_EQ(out["name"], "logits");
  EXPECT_EQ(out["rule"], "calibrated");
  EXPECT_EQ(out["verdict"], "passed");
  EXPECT_NEAR(out["error_ratio"].get<double>(), 1.5, 1e-3);
  EXPECT_NEAR(out["eager_at_precision_max_abs_error"].get<double>(), 0.1, 1e-6);
  EXPECT_EQ(j["candidates"][fp16_ok]["correctness"]["calibrated_precision"], "fp16");
  EXPECT_EQ(j["candidates"][fp16_bad]["correctness"]["outputs"][0]["verdict"], "failed");
  EXPECT_NE(j["candidates"][tf32]["correctness"]["calibration_note"].get<std::string>().find("TF32"),
            std::string::npos);
  auto table = report.summary_table();
  EXPECT_NE(table.find("vs eager fp16, factor 2.0"), std::string::npos) << table;
  EXPECT_NE(table.find("ratio 1.50 passed (calibrated)"), std::string::npos) << table;
}

// A strict candidate the table rejects is judged against eager's own fp32 error (the module
// run wider: torch.cdist's matmul form in eager lost small distances ONNX Runtime's exact
// graph kept, a session-34 probe); eager is asked for it only once a strict candidate fails.
TEST(CalibratedTuning, AStrictCandidateTheTableRejectsIsJudgedAgainstEagersOwnError) {
  Graph g;
  TunerOptions options = quick();
  std::vector<Precision> asked;
  options.eager_at_precision = [&](Precision p, std::string&) -> std::optional<std::vector<std::vector<Tensor>>> {
    asked.push_back(p);
    return std::vector<std::vector<Tensor>>{{logits(0.1)}};
  };
  GraphTuner tuner("g", g.spec(), g.samples(), options);
  auto exact = tuner.evaluate_external(with_noise("fp32 exact", Precision::kStrict, 0.0), "B", 0);
  EXPECT_TRUE(asked.empty()) << "a strict candidate the table passes asks nothing";
  auto close = tuner.evaluate_external(with_noise("fp32 1.5x", Precision::kStrict, 0.15), "B", 0);
  auto rounds = tuner.evaluate_external(with_noise("fp32 3x", Precision::kStrict, 0.3), "B", 0);
  auto far = tuner.evaluate_external(with_noise("fp32 5x", Precision::kStrict, 0.5), "B", 0);
  ASSERT_EQ(asked, std::vector<Precision>{Precision::kStrict}) << "asked once";
  const auto& report = tuner.select(StrategyConfig{.performance_validation = false});
  const auto& c = report.candidates;
  EXPECT_NE(c[exact].status, CandidateStatus::kIncorrect);
  EXPECT_NE(c[close].status, CandidateStatus::kIncorrect) << c[close].reason;
  EXPECT_NE(c[rounds].status, CandidateStatus::kIncorrect)
      << "strict candidates may err up to 4x eager's own fp32 error (a few more roundings): " << c[rounds].reason;
  EXPECT_EQ(c[far].status, CandidateStatus::kIncorrect);
  EXPECT_NE(c[far].reason.find("(ratio 5 > 4)"), std::string::npos) << c[far].reason;
  EXPECT_NE(c[far].reason.find("vs eager fp32 (its own error, against the module run wider)'s"), std::string::npos)
      << c[far].reason;
  auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["candidates"][close]["correctness"]["outputs"][0]["rule"], "calibrated");
  EXPECT_EQ(j["candidates"][close]["correctness"]["calibrated_precision"], "fp32");
  EXPECT_TRUE(j["candidates"][exact]["correctness"]["calibrated_precision"].is_null());
}

// Eager's own fp32 error is a level, the largest over the samples: one rounding of a large
// intermediate lands anywhere within half an ulp, and a correct graph measured 3.2x eager's
// lucky error on one sample and 1.0x on the next (a session-34 probe).
TEST(CalibratedTuning, EagersOwnFp32ErrorIsItsLevelOverTheSamples) {
  Graph g;
  TunerOptions options = quick();
  options.eager_at_precision = [&](Precision, std::string&) -> std::optional<std::vector<std::vector<Tensor>>> {
    return std::vector<std::vector<Tensor>>{{logits(0.02)}, {logits(0.1)}};  // a lucky sample, then its level
  };
  const auto one = g.samples().front();
  GraphTuner tuner("g", g.spec(), {one, one}, options);
  // 0.15 on both samples: 7.5x eager's error on the first alone, 1.5x its level
  auto index = tuner.evaluate_external(with_noise("fp32 rounds once more", Precision::kStrict, 0.15), "B", 0);
  const auto& report = tuner.select(StrategyConfig{.performance_validation = false});
  EXPECT_NE(report.candidates[index].status, CandidateStatus::kIncorrect) << report.candidates[index].reason;
  auto j = nlohmann::json::parse(report.to_json());
  EXPECT_NEAR(j["eager_at_precision"]["fp32"]["outputs"][0]["max_abs_error"].get<double>(), 0.1, 1e-6);
}

TEST(CalibratedTuning, TheUsersMetricDecidesWithItsMaximumDrop) {
  Graph g;
  TunerOptions options = quick();
  // Top-1 agreement with the reference over every sample: 1.0 for the reference itself.
  options.accuracy_metric = [&](const std::vector<std::vector<TensorView>>& outputs) {
    auto c = compare_output("logits", outputs[0][0], g.y.view(), {0, 0});
    return *c.top1_agreement;
  };
  options.max_accuracy_drop = 0.0;
  GraphTuner tuner("g", g.spec(), g.samples(), options);
  // Far beyond every tolerance but the same classes: the metric accepts it.
  auto noisy = tuner.evaluate_external(with_noise("noisy", Precision::kStrict, 1.0), "B", 0);
  ExternalCandidate moved{"moved", "{}", Precision::kStrict,
                          [](std::size_t) { return std::vector<Tensor>{logits(0, false, 2)}; }, [] {}};
  auto wrong = tuner.evaluate_external(moved, "B", 0);
  const auto& report = tuner.select(StrategyConfig{.performance_validation = false});
  EXPECT_EQ(report.candidates[noisy].status, CandidateStatus::kSelected) << report.candidates[noisy].reason;
  EXPECT_EQ(report.candidates[wrong].status, CandidateStatus::kIncorrect);
  EXPECT_NE(report.candidates[wrong].reason.find("user accuracy metric 0"), std::string::npos)
      << report.candidates[wrong].reason;
  auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["candidates"][noisy]["correctness"]["user_metric"]["baseline"], 1.0);
  EXPECT_EQ(j["candidates"][wrong]["correctness"]["user_metric"]["drop"], 1.0);
}

// A metric that scores a candidate inf or NaN measures nothing: inf was an accept (drop
// -inf <= max). One that cannot score eager's own outputs (NaN, or raising) is the metric's
// fault: the evaluation throws it (the backend fails with it), instead of a NaN baseline
// refusing each candidate as if its outputs were wrong ("drop nan > maximum 0").
// Integer and bool outputs (argmax indices, counts, masks) under a reduced precision: how far
// an index moved says nothing (class 9 instead of 0 is no worse than 1 instead of 0), how
// many elements moved does. The rule compared max abs / rel L2 of the indices: a candidate
// moving one index as eager bf16 does, but to a farther class, was refused (ratio 5), and one
// moving four times as many indices by 1 was accepted (ratios 1 and 2).
TEST(Calibration, IntegerOutputsAreJudgedByTheFractionOfElementsThatDiffer) {
  auto indices = [](std::vector<int64_t> v) { return make_host<int64_t>(DType::kInt64, {8}, v); };
  auto expected = indices({0, 1, 2, 3, 4, 5, 6, 7});
  auto judge = [&](const Tensor& candidate, const Tensor& eager) {
    const ToleranceSpec bf16{.precision = Precision::kBF16};
    CorrectnessReport r;
    r.samples.push_back(compare_sample("sample 0", {"ids"}, {candidate.view()}, {expected.view()}, bf16));
    EagerAtPrecision e;
    e.precision = Precision::kBF16;
    e.available = true;
    e.samples.push_back(compare_sample("sample 0", {"ids"}, {eager.view()}, {expected.view()}, bf16));
    apply_calibration(r, e, 2.0);
    return r.samples[0].outputs[0];
  };
  auto eager = indices({1, 1, 2, 3, 4, 5, 6, 7});  // eager bf16 moves one index, by 1
  auto farther = judge(indices({5, 1, 2, 3, 4, 5, 6, 7}), eager);
  EXPECT_TRUE(farther.passed) << farther.failure;
  EXPECT_EQ(farther.rule, "calibrated");
  ASSERT_TRUE(farther.error_ratio.has_value());
  EXPECT_DOUBLE_EQ(*farther.error_ratio, 1.0);
  auto more = judge(indices({1, 2, 3, 4, 4, 5, 6, 7}), eager);
  EXPECT_FALSE(more.passed);
  EXPECT_EQ(more.rule, "calibrated-exceeded");
  EXPECT_NE(more.failure.find("4 of 8 elements differ vs eager bf16's 1 (ratio 4 > 2"), std::string::npos) << more.failure;
  // Eager at the precision matching exactly: only the table (exact) can pass.
  EXPECT_FALSE(judge(indices({1, 1, 2, 3, 4, 5, 6, 7}), expected).passed);
}

// A mask `scores > 0` at a reduced precision flips where a score sits within the
// precision's error of 0; eager's own rounding may happen to spare every such element
// (ratio 1 / 0, a session-36 probe). Up to 1 % of the elements may differ, as top-1 rows may;
// not at fp32 (strict), and not more than that.
TEST(Calibration, AFewMaskFlipsAtAReducedPrecisionPassWhereEagerFlippedNone) {
  std::vector<uint8_t> bits(256, 0);
  for (std::size_t i = 0; i < bits.size(); i += 3) bits[i] = 1;
  auto mask = [&](int flips) {
    auto v = bits;
    for (int i = 0; i < flips; ++i) v[static_cast<std::size_t>(7 * i + 1)] ^= 1;
    return make_host<uint8_t>(DType::kBool, {16, 16}, v);
  };
  auto expected = mask(0);
  auto judge = [&](int flips, Precision precision) {
    const ToleranceSpec spec{.precision = precision};
    CorrectnessReport r;
    auto candidate = mask(flips);
    r.samples.push_back(compare_sample("sample 0", {"mask"}, {candidate.view()}, {expected.view()}, spec));
    EagerAtPrecision e;
    e.precision = precision;
    e.available = true;
    e.samples.push_back(compare_sample("sample 0", {"mask"}, {expected.view()}, {expected.view()}, spec));
    apply_calibration(r, e, 2.0);
    return r.samples[0].outputs[0];
  };
  auto one = judge(1, Precision::kBF16);
  EXPECT_TRUE(one.passed) << one.failure;
  EXPECT_EQ(one.rule, "calibrated");
  auto two = judge(2, Precision::kFP16);  // 2 of 256 < 2.56
  EXPECT_TRUE(two.passed) << two.failure;
  auto many = judge(3, Precision::kBF16);  // above 1 %
  EXPECT_FALSE(many.passed);
  EXPECT_NE(many.failure.find("and above 1 % of the elements"), std::string::npos) << many.failure;
  EXPECT_FALSE(judge(1, Precision::kStrict).passed);  // fp32: eager's none is the bound
}

// fp32: eager's own error is its level over the samples for integer outputs too. A quantizer's
// codes (`round(y * 3000).int()`) differ from the module run wider by one code on some samples
// and none on others; a correct graph differing by one code on a sample where eager happened
// to differ by none was refused "1 of 4096 elements differ vs ... 0 (ratio inf)" (a
// session-37 probe) while max abs and rel L2 were already raised to their level.
TEST(Calibration, AnIntegerOutputsCountOfDifferingElementsIsRaisedToItsLevelOverTheSamples) {
  auto codes = [](std::vector<int32_t> v) { return make_host<int32_t>(DType::kInt32, {8}, v); };
  auto expected = codes({0, 1, 2, 3, 4, 5, 6, 7});
  const ToleranceSpec strict{.precision = Precision::kStrict};
  EagerAtPrecision e;
  e.precision = Precision::kStrict;
  e.available = true;
  auto spared = expected;                       // sample 0: eager differs on none
  auto one_off = codes({0, 1, 2, 4, 4, 5, 6, 7});  // sample 1: eager differs on one
  e.samples.push_back(compare_sample("sample 0", {"codes"}, {spared.view()}, {expected.view()}, strict));
  e.samples.push_back(compare_sample("sample 1", {"codes"}, {one_off.view()}, {expected.view()}, strict));
  raise_to_level_over_samples(e);
  EXPECT_EQ(e.samples[0].outputs[0].mismatched, 1);
  auto candidate = codes({0, 1, 2, 3, 4, 6, 6, 7});  // one code off on sample 0
  CorrectnessReport r;
  r.samples.push_back(compare_sample("sample 0", {"codes"}, {candidate.view()}, {expected.view()}, strict));
  r.samples.push_back(compare_sample("sample 1", {"codes"}, {expected.view()}, {expected.view()}, strict));
  apply_calibration(r, e, 2.0);
  EXPECT_TRUE(r.samples[0].outputs[0].passed) << r.samples[0].outputs[0].failure;
  // Three times eager's level still fails.
  auto three = codes({1, 2, 3, 3, 4, 5, 6, 7});
  CorrectnessReport wrong;
  wrong.samples.push_back(compare_sample("sample 0", {"codes"}, {three.view()}, {expected.view()}, strict));
  apply_calibration(wrong, e, 2.0);
  EXPECT_FALSE(wrong.samples[0].outputs[0].passed);
}

TEST(CalibratedTuning, TheUsersMetricMustReturnFiniteNumbers) {
  Graph g;
  TunerOptions options = quick();
  int calls = 0;
  options.accuracy_metric = [&](const std::vector<std::vector<TensorView>>&) {
    return ++calls == 1 ? 1.0 : std::numeric_limits<double>::infinity();
  };
  GraphTuner tuner("g", g.spec(), g.samples(), options);
  auto inf = tuner.evaluate_external(with_noise("inf", Precision::kStrict, 0.0), "B", 0);
  const auto& report = tuner.report();
  EXPECT_EQ(report.candidates[inf].status, CandidateStatus::kIncorrect) << report.candidates[inf].reason;
  EXPECT_NE(report.candidates[inf].reason.find("user accuracy metric returned inf for this candidate, not a finite number"),
            std::string::npos)
      << report.candidates[inf].reason;

  TunerOptions nan_options = quick();
  nan_options.accuracy_metric = [](const std::vector<std::vector<TensorView>>&) {
    return std::numeric_limits<double>::quiet_NaN();
  };
  GraphTuner nan_tuner("g", g.spec(), g.samples(), nan_options);
  try {
    nan_tuner.evaluate_external(with_noise("c", Precision::kStrict, 0.0), "B", 0);
    FAIL() << "a NaN baseline was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("scored eager's own outputs (the baseline) NaN"), std::string::npos) << e.what();
  }

  TunerOptions raising = quick();
  raising.accuracy_metric = [](const std::vector<std::vector<TensorView>>&) -> double {
    throw std::runtime_error("metric bug");
  };
  GraphTuner raising_tuner("g", g.spec(), g.samples(), raising);
  EXPECT_THROW(raising_tuner.evaluate_external(with_noise("c", Precision::kStrict, 0.0), "B", 0), std::runtime_error);
}

// A flipped top-1 on a near-tie is noise, a flip on a wide margin a wrong class. Seen on
// the H200 (torch 2.11): a bf16 candidate erring 1.5x eager bf16's own error (factor 2)
// was refused only because the argmax of its one 8-class row moved between two near-tied
// logits where eager's had not ("top-1 agreement 0 vs eager bf16's 1"). A flip counts only
// when the reference ranks the candidate's class more than factor x eager's largest
// within-row error spread below its own top-1: a flip no error of the allowed size moves.
// Rows 0-2: classes 0 and 1 are 0.1 apart; row 3: 1.0 apart.
Tensor tie_reference() {
  std::vector<float> v(kRows * kClasses);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kClasses; ++c) {
      auto i = static_cast<std::size_t>(r * kClasses + c);
      v[i] = static_cast<float>(c == 0 ? 3.0 : c == 1 ? (r == 3 ? 2.0 : 2.9) : 0.3 * std::sin(static_cast<double>(i)));
    }
  return make_host(DType::kFloat32, {kRows, kClasses}, v);
}

// The reference plus, per element, scale x (-0.04 for class 0, +0.04 for class 1, +-0.04
// alternating for the others) plus `row_shift` on every element: a within-row spread of
// 0.08 x scale, whatever the shift (a constant added to a row moves no argmax).
Tensor tie_noise(double scale, double row_shift = 0) {
  auto t = tie_reference();
  auto* v = static_cast<float*>(t.data());
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kClasses; ++c) {
      double d = c == 0 ? -0.04 : c == 1 ? 0.04 : (c % 2 ? 0.04 : -0.04);
      v[r * kClasses + c] += static_cast<float>(scale * d + row_shift);
    }
  return t;
}

struct TieGraph {
  Tensor x = make_pattern_f32({kRows, 3}, 1);
  Tensor y = tie_reference();
  GraphSpec spec() const {
    GraphSpecBuilder b;
    b.record({{"x", DType::kFloat32, x.shape()}}, {{"logits", DType::kFloat32, y.shape()}}, kRows);
    return b.build();
  }
  std::vector<TuneSample> samples() const { return {{{x.view()}, {y.view()}, kRows}}; }
};

ExternalCandidate returning(std::string name, Tensor out) {
  return {std::move(name), "{}", Precision::kFP16, [out](std::size_t) { return std::vector<Tensor>{out}; }, [] {}};
}

TEST(CalibratedTuning, ATopOneFlipOnANearTieWithinTheCalibratedBoundPasses) {
  TieGraph g;
  TunerOptions options = quick();
  // Eager fp16 errs by 0.04 and keeps every row's winner (0.1 > 0.08).
  options.eager_at_precision = [](Precision, std::string&) -> std::optional<std::vector<std::vector<Tensor>>> {
    return std::vector<std::vector<Tensor>>{{tie_noise(1)}};
  };
  GraphTuner tuner("g", g.spec(), g.samples(), options);
  // 1.5x eager's error: rows 0-2 flip (0.06 + 0.06 > 0.1), row 3 keeps its winner.
  auto c = tuner.evaluate_external(returning("fp16 1.5x", tie_noise(1.5)), "B", 0);
  const auto& report = tuner.select(StrategyConfig{.performance_validation = false});
  const auto& cand = report.candidates[c];
  EXPECT_EQ(cand.status, CandidateStatus::kSelected) << cand.reason;
  ASSERT_TRUE(cand.correctness.has_value());
  const auto& o = cand.correctness->samples[0].outputs[0];
  ASSERT_NEAR(*o.top1_agreement, 0.25, 1e-9) << "the test needs three flipped rows";
  EXPECT_EQ(o.rule, "calibrated");
  EXPECT_NEAR(*o.error_ratio, 1.5, 1e-3);
  EXPECT_EQ(o.top1_flip_margins.size(), 3u);
  ASSERT_TRUE(o.top1_near_ties.has_value());
  EXPECT_EQ(*o.top1_near_ties, 3);
  ASSERT_TRUE(o.top1_near_tie_bound.has_value());
  EXPECT_NEAR(*o.top1_near_tie_bound, 0.16, 1e-6);  // 2 x eager's within-row spread 0.08
  auto j = nlohmann::json::parse(report.to_json());
  const auto& out = j["candidates"][c]["correctness"]["outputs"][0];
  EXPECT_EQ(out["top1_flips"], 3);
  EXPECT_EQ(out["top1_near_ties"], 3);
  EXPECT_EQ(j["candidates"][c]["correctness"]["samples"][0]["outputs"][0]["top1_near_ties"], 3);
  auto table = report.summary_table();
  EXPECT_NE(table.find("3 of 3 top-1 flips near-ties, ignored"), std::string::npos) << table;
}

TEST(CalibratedTuning, ATopOneFlipOnAWideMarginIsAWrongClassEvenWithinTheErrorBound) {
  TieGraph g;
  TunerOptions options = quick();
  // Eager fp16 shifts every logit by 0.6 (its max abs error 0.64) but within a row its
  // errors spread over 0.08 only: it can move no winner whose margin is above that.
  options.eager_at_precision = [](Precision, std::string&) -> std::optional<std::vector<std::vector<Tensor>>> {
    return std::vector<std::vector<Tensor>>{{tie_noise(1, 0.6)}};
  };
  GraphTuner tuner("g", g.spec(), g.samples(), options);
  // 1.5x eager's within-row noise (three near-tied flips), and row 3's winner moved across
  // a margin of 1.0 by errors of 0.55, below eager's 0.64: the errors alone pass.
  auto wrong = tie_noise(1.5);
  static_cast<float*>(wrong.data())[3 * kClasses + 0] -= 0.49f;
  static_cast<float*>(wrong.data())[3 * kClasses + 1] += 0.49f;
  auto c = tuner.evaluate_external(returning("fp16 wrong class", wrong), "B", 0);
  // The same wrong class with errors beyond the bound too: the reason names both.
  auto far = tie_noise(1.5);
  static_cast<float*>(far.data())[3 * kClasses + 0] -= 1.5f;
  static_cast<float*>(far.data())[3 * kClasses + 1] += 1.5f;
  auto f = tuner.evaluate_external(returning("fp16 far", far), "B", 0);
  const auto& report = tuner.select(StrategyConfig{.performance_validation = false});
  const auto& cand = report.candidates[c];
  EXPECT_EQ(cand.status, CandidateStatus::kIncorrect) << cand.reason;
  const auto& o = cand.correctness->samples[0].outputs[0];
  EXPECT_LE(*o.error_ratio, 2.0) << "the errors alone would pass";
  EXPECT_EQ(o.rule, "calibrated-exceeded");
  ASSERT_TRUE(o.top1_near_ties.has_value());
  EXPECT_EQ(*o.top1_near_ties, 3);
  EXPECT_NE(cand.reason.find("top-1 agreement 0 vs eager fp16's 1: 1 of 4 rows moved to a class the reference ranks"
                             " more than 0.16 below its top-1"),
            std::string::npos)
      << cand.reason;
  EXPECT_NE(cand.reason.find("3 near-tied flips ignored"), std::string::npos) << cand.reason;
  EXPECT_EQ(cand.reason.find("ratio"), std::string::npos) << "the errors were within the bound: " << cand.reason;

  const auto& far_cand = report.candidates[f];
  EXPECT_EQ(far_cand.status, CandidateStatus::kIncorrect) << far_cand.reason;
  EXPECT_NE(far_cand.reason.find("> 2)"), std::string::npos) << far_cand.reason;
  EXPECT_NE(far_cand.reason.find("1 of 4 rows moved"), std::string::npos) << far_cand.reason;
}

TEST(CalibratedTuning, AWinnerOverAVacuousReferenceIsToldInTheDecision) {
  Tensor x = make_pattern_f32({2, 3}, 1);
  Tensor zeros = make_host(DType::kFloat32, {2, 2}, std::vector<float>{0, 0, 0, 0});
  GraphSpecBuilder b;
  b.record({{"x", DType::kFloat32, x.shape()}}, {{"y", DType::kFloat32, zeros.shape()}}, 2);
  GraphTuner tuner("g", b.build(), {{{x.view()}, {zeros.view()}, 2}}, quick());
  ASSERT_EQ(tuner.report().vacuous_outputs.size(), 1u);
  tuner.evaluate_external({"c", "{}", Precision::kStrict, [&](std::size_t) { return std::vector<Tensor>{zeros}; }, [] {}},
                          "B", 0);
  const auto& report = tuner.select(StrategyConfig{.performance_validation = false});
  ASSERT_TRUE(report.winner.has_value());
  EXPECT_NE(report.decision.find("vacuous"), std::string::npos) << report.decision;
  EXPECT_NE(report.decision.find("y: constant"), std::string::npos) << report.decision;
  auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["vacuous_outputs"][0]["name"], "y");
  EXPECT_NE(report.summary_table().find("warning: eager output y cannot judge"), std::string::npos);
}

}  // namespace
}  // namespace aitune
