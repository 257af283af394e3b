// The measured search for the smallest set of nodes an fp16 model keeps in fp32, and
// when it is tried (the all-fp16 model of the same configuration was rejected).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include <gtest/gtest.h>

#include "aitune/error.hpp"
#include "aitune/fp32_node_search.hpp"

namespace aitune {
namespace {

std::vector<std::string> names(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("n" + std::to_string(i));
  return out;
}

bool contains(const std::vector<std::string>& set, const std::string& name) {
  return std::find(set.begin(), set.end(), name) != set.end();
}

TEST(Fp32NodeSearch, FindsExactlyTheNodesThatMustStayFp32) {
  // The model passes only while n5 (an Exp that overflows) and n11 (its consumer) stay fp32.
  int checks = 0;
  auto passes = [&](const std::vector<std::string>& kept) {
    ++checks;
    return contains(kept, "n5") && contains(kept, "n11");
  };
  auto result = search_fp32_nodes(names(16), passes, 64);
  EXPECT_TRUE(result.passed);
  EXPECT_EQ(result.kept, (std::vector<std::string>{"n5", "n11"}));
  EXPECT_EQ(result.evaluations, checks);
  EXPECT_LT(checks, 40) << "bisection, not one check per subset";
  EXPECT_NE(result.note.find("minimal"), std::string::npos) << result.note;
}

TEST(Fp32NodeSearch, StopsAtItsBudgetWithAPassingSet) {
  auto passes = [](const std::vector<std::string>& kept) { return contains(kept, "n3"); };
  auto result = search_fp32_nodes(names(64), passes, 4);
  EXPECT_TRUE(result.passed);
  EXPECT_EQ(result.evaluations, 4);
  EXPECT_TRUE(contains(result.kept, "n3"));
  EXPECT_LT(result.kept.size(), 64u);
  EXPECT_NE(result.note.find("stopped after 4"), std::string::npos);
}

TEST(Fp32NodeSearch, StopsAtItsTimeBoundWithThePassingSetFoundSoFar) {
  // Each check takes 10 s on a fake clock (a 2 GB model converted and loaded); the bound is
  // 35 s: the checks starting at 0, 10, 20 and 30 s run, none starts at 40 s.
  double clock = 0;
  std::vector<std::vector<std::string>> passing;
  auto passes = [&](const std::vector<std::string>& kept) {
    clock += 10;
    bool ok = contains(kept, "n3");
    if (ok) passing.push_back(kept);
    return ok;
  };
  auto result = search_fp32_nodes(names(64), passes, 24, 35.0, [&] { return clock; });
  EXPECT_TRUE(result.passed);
  EXPECT_EQ(result.evaluations, 4);
  EXPECT_DOUBLE_EQ(result.seconds, 40.0);
  EXPECT_EQ(result.note, "stopped after 40.0 s (4 checks)");
  ASSERT_FALSE(passing.empty());
  EXPECT_EQ(result.kept, passing.back()) << "the last set that passed, not one never checked";
  EXPECT_LT(result.kept.size(), 64u);
}

TEST(Fp32NodeSearch, TheFirstCheckRunsWhateverTheBound) {
  // Without the every-node check nothing is known to pass: it runs even past the bound.
  double clock = 0;
  auto passes = [&](const std::vector<std::string>&) {
    clock += 100;
    return true;
  };
  auto result = search_fp32_nodes(names(8), passes, 24, 1.0, [&] { return clock; });
  EXPECT_TRUE(result.passed);
  EXPECT_EQ(result.evaluations, 1);
  EXPECT_EQ(result.kept, names(8));
  EXPECT_EQ(result.note, "stopped after 100.0 s (1 check)");
}

TEST(Fp32NodeSearch, BoundedByTheRealClock) {
  // The default clock: checks of ~20 ms against a 0.1 s bound end the search long before
  // its 64 evaluations (a 64-node search with one node to keep runs ~20 checks).
  auto passes = [](const std::vector<std::string>& kept) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return contains(kept, "n40");
  };
  auto result = search_fp32_nodes(names(64), passes, 64, 0.1);
  EXPECT_TRUE(result.passed);
  EXPECT_LT(result.evaluations, 64);
  EXPECT_GE(result.seconds, 0.1);
  EXPECT_NE(result.note.find(" s ("), std::string::npos) << result.note;
  EXPECT_TRUE(contains(result.kept, "n40"));
}

TEST(Fp32NodeSearch, BadBoundsAreRefused) {
  auto passes = [](const std::vector<std::string>&) { return true; };
  for (double bad : {0.0, -1.0, std::nan("")}) {
    try {
      search_fp32_nodes(names(4), passes, 24, bad);
      ADD_FAILURE() << "max_seconds " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("max_seconds"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(search_fp32_nodes(names(4), passes, 0), Error);
  auto unbounded = search_fp32_nodes(names(4), passes, 24, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(unbounded.passed);
}

TEST(Fp32NodeSearch, AModelThatFailsEvenInFp32IsReported) {
  auto result = search_fp32_nodes(names(4), [](const std::vector<std::string>&) { return false; });
  EXPECT_FALSE(result.passed);
  EXPECT_EQ(result.evaluations, 1);
  EXPECT_NE(result.note.find("every node in fp32"), std::string::npos);
}

TEST(Fp32NodeSearch, AModelThatCannotBeBuiltIsNotReportedAsFailingInFp32) {
  // The H200 run's "fails even with every node in fp32": the probe keeping every node was
  // refused by ONNX Runtime (two nodes with one name), which the search took for a failed check.
  auto refused = [](const std::vector<std::string>&) -> bool {
    throw Error(ErrorCode::kModelInvalid, "two nodes with same node name (w_cast_to_fp32_node)");
  };
  auto result = search_fp32_nodes(names(4), refused);
  EXPECT_FALSE(result.passed);
  EXPECT_EQ(result.evaluations, 1);
  EXPECT_EQ(result.unrunnable, 1);
  EXPECT_EQ(result.note.find("fails even"), std::string::npos) << result.note;
  EXPECT_NE(result.note.find("could not be built or run: two nodes with same node name"), std::string::npos)
      << result.note;
}

TEST(Fp32NodeSearch, AProbeThatCannotRunKeepsItsNodesAndIsCounted) {
  // n2 must stay fp32; any probe without n0 cannot be built (a converter bug, say).
  auto passes = [](const std::vector<std::string>& kept) {
    if (!contains(kept, "n0")) throw Error(ErrorCode::kModelInvalid, "converter bug");
    return contains(kept, "n2");
  };
  auto result = search_fp32_nodes(names(8), passes, 64);
  EXPECT_TRUE(result.passed);
  EXPECT_EQ(result.kept, (std::vector<std::string>{"n0", "n2"}));
  EXPECT_GT(result.unrunnable, 0);
  EXPECT_NE(result.note.find("could not be built or run (first: converter bug)"), std::string::npos) << result.note;
}

TEST(Fp32NodeSearch, TriedOnlyWhereTheAllFp16ModelOfThatConfigurationWasRejected) {
  OnnxSessionConfig cuda;
  cuda.provider = ExecutionProvider::kCUDA;
  cuda.provider_options = {{"use_tf32", "1"}};
  OnnxSessionConfig other = cuda;
  other.provider_options["prefer_nhwc"] = "1";
  TuneReport report;
  CandidateResult fp16;
  fp16.transform = std::string(model_transform::kFp16);
  OnnxSessionConfig with_stream = cuda;  // the session adds its stream options
  with_stream.provider_options["user_compute_stream"] = "1234";
  fp16.config_json = with_stream.to_json(-1);
  fp16.status = CandidateStatus::kPassed;
  report.candidates.push_back(fp16);
  EXPECT_FALSE(rejected_fp16_candidate(report, cuda).has_value()) << "all-fp16 passed: nothing to search";
  report.candidates[0].status = CandidateStatus::kIncorrect;
  EXPECT_EQ(rejected_fp16_candidate(report, cuda), std::optional<std::size_t>(0));
  EXPECT_FALSE(rejected_fp16_candidate(report, other).has_value()) << "another configuration";
  report.candidates[0].transform = "";
  EXPECT_FALSE(rejected_fp16_candidate(report, cuda).has_value()) << "not the fp16 model";
}

}  // namespace
}  // namespace aitune
