// Checks that leave out undefined (padded) positions: padding may differ, a defined
// position that differs still fails, the report counts what was left out, bad masks fail.
#include <gtest/gtest.h>

#include "aitune/valid_positions.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {
using namespace test;

// logits [batch 2, seq 3, vocab 2]; row 0 left-padded by one, row 1 right-padded by one.
Tensor logits(std::vector<float> v) { return make_host(DType::kFloat32, {2, 3, 2}, v); }
Tensor mask() { return make_host(DType::kInt64, {2, 3}, std::vector<int64_t>{0, 1, 1, 1, 1, 0}); }

const std::vector<float> kExpected = {9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9};

SampleCheck check(const Tensor& actual, const Tensor& expected, const Tensor& m) {
  ValidPositions valid{{m.view()}, "attention_mask"};
  ToleranceSpec tolerances;
  tolerances.all = Tolerance{1e-4, 1e-4};
  return compare_sample_at_valid_positions("sample 0", {"logits"}, {actual.view()}, {expected.view()}, valid,
                                           tolerances);
}

TEST(ValidPositions, PaddedPositionsMayDifferAndAreCounted) {
  auto expected = logits(kExpected);
  auto actual = logits({-50, 70, 1, 2, 3, 4, 5, 6, 7, 8, 123, -4});  // only the padded positions differ
  auto c = check(actual, expected, mask());
  EXPECT_TRUE(c.passed()) << c.outputs[0].failure;
  EXPECT_EQ(c.outputs[0].max_abs_error, 0);
  EXPECT_NE(c.sample.find("2 of 6 positions undefined by attention_mask"), std::string::npos) << c.sample;
  // without the mask the same outputs fail
  auto plain = compare_sample("sample 0", {"logits"}, {actual.view()}, {expected.view()}, ToleranceSpec{});
  EXPECT_FALSE(plain.passed());
}

TEST(ValidPositions, ADefinedPositionThatDiffersStillFails) {
  auto expected = logits(kExpected);
  auto actual = logits({9, 9, 1, 2, 3, 4, 5, 6, 7, 8.5f, 9, 9});  // row 1, position 1: defined
  auto c = check(actual, expected, mask());
  EXPECT_FALSE(c.passed());
  EXPECT_EQ(c.outputs[0].mismatched, 1);
  EXPECT_NEAR(c.outputs[0].max_abs_error, 0.5, 1e-6);
}

TEST(ValidPositions, AMaskThatDoesNotPrefixTheOutputFails) {
  auto expected = logits(kExpected);
  auto wrong = make_host(DType::kInt64, {3, 2}, std::vector<int64_t>{1, 1, 1, 1, 1, 1});
  auto c = check(expected, expected, wrong);
  ASSERT_FALSE(c.passed());
  EXPECT_NE(c.outputs[0].failure.find("does not"), std::string::npos);
}

}  // namespace
}  // namespace aitune
