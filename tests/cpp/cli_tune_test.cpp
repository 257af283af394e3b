// `aitune tune` in a separate process: random and .npy samples, the report, a
// checkpoint that `aitune run` loads, and the exit codes of bad input.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "aitune/npy.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {
using namespace test;

CommandResult tune(const std::string& args) {
  return run_command(std::string("'") + AITUNE_TEST_CLI + "' tune " + args + " --time-cap 0.5");
}

TEST(CliTune, TunesAModelWithRandomSamplesAndWritesTheReport) {
  ScopedTempDir tmp;
  const auto report = tmp.file("report.json");
  auto r = tune(fixture("mlp.onnx") + " --provider cpu --quiet --report '" + report + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("reference (cpu fp32)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cpu[intra_op_threads=1]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("decision: highest throughput"), std::string::npos) << r.output;
  std::ifstream in(report);
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["candidates"].size(), 3u);
  EXPECT_FALSE(j["winner"].is_null());
  EXPECT_EQ(j["strategy"], "max-throughput");
  for (const auto& c : j["candidates"]) {
    EXPECT_TRUE(c["correctness"]["passed"].get<bool>()) << c.dump();
    EXPECT_EQ(c["correctness"]["samples"].size(), 2u);  // --batch-sizes 1,2
  }
}

TEST(CliTune, SamplesFromNpyAndACheckpointThatRunLoads) {
  ScopedTempDir tmp;
  std::filesystem::create_directories(tmp.file("samples/a"));
  std::filesystem::create_directories(tmp.file("samples/b"));
  std::filesystem::copy_file(fixture("mlp_x.npy"), tmp.file("samples/a/x.npy"));
  save_npy(tmp.file("samples/b/x.npy"), make_pattern_f32({5, 64}, 3));
  const auto checkpoint = tmp.file("ckpt");
  auto r = tune(fixture("mlp.onnx") + " --provider cpu --strategy min-latency --no-variants --samples '" +
                tmp.file("samples") + "' --checkpoint '" + checkpoint + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(min-latency)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[1/1] cpu"), std::string::npos) << r.output;
  // The spec recorded batches 3 and 5: the checkpoint accepts 4 and rejects 6.
  save_npy(tmp.file("x4.npy"), make_pattern_f32({4, 64}, 4));
  save_npy(tmp.file("x6.npy"), make_pattern_f32({6, 64}, 6));
  auto ok = run_command(std::string("'") + AITUNE_TEST_CLI + "' run '" + checkpoint +
                        "' --iterations 1 --warmup 0 --input x=" + tmp.file("x4.npy"));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  auto too_big = run_command(std::string("'") + AITUNE_TEST_CLI + "' run '" + checkpoint +
                             "' --iterations 1 --warmup 0 --input x=" + tmp.file("x6.npy"));
  EXPECT_EQ(too_big.exit_code, 2) << too_big.output;
  // The report is in the checkpoint, as ait.save keeps it: `aitune report` renders it (it
  // refused the directory, which held none).
  auto page = run_command(std::string("'") + AITUNE_TEST_CLI + "' report '" + checkpoint + "' -o '" +
                          tmp.file("page.html") + "'");
  EXPECT_EQ(page.exit_code, 0) << page.output;
  EXPECT_TRUE(std::filesystem::is_regular_file(tmp.file("page.html")));
  // Without -o the page goes beside the checkpoint, not into it (a file there outside its
  // manifest is lost on the next save over it: a probe), and -o into it is refused.
  auto beside = run_command(std::string("'") + AITUNE_TEST_CLI + "' report '" + checkpoint + "'");
  EXPECT_EQ(beside.exit_code, 0) << beside.output;
  bool inside = false, next_to = false;
  for (const auto& f : std::filesystem::recursive_directory_iterator(checkpoint))
    inside = inside || f.path().extension() == ".html";
  for (const auto& f : std::filesystem::directory_iterator(tmp.path()))
    next_to = next_to || f.path().filename().string().ends_with(".tune_report.html");
  EXPECT_FALSE(inside);
  EXPECT_TRUE(next_to) << beside.output;
  auto into = run_command(std::string("'") + AITUNE_TEST_CLI + "' report '" + checkpoint + "' -o '" + checkpoint +
                          "/page.html'");
  EXPECT_EQ(into.exit_code, 2) << into.output;
  EXPECT_NE(into.output.find("into the checkpoint"), std::string::npos) << into.output;
  // So is `run --save-outputs` into it, or into the checkpoint directory itself: the .npy
  // files were written there (exit 0), and the next save over the checkpoint removed them.
  for (const std::string& dir : {checkpoint + "/outs", checkpoint}) {
    SCOPED_TRACE(dir);
    auto outputs = run_command(std::string("'") + AITUNE_TEST_CLI + "' run '" + checkpoint +
                               "' --iterations 1 --warmup 0 --save-outputs '" + dir + "'");
    EXPECT_EQ(outputs.exit_code, 2) << outputs.output;
    EXPECT_NE(outputs.output.find("refusing to write the outputs into the checkpoint '" + checkpoint + "'"),
              std::string::npos)
        << outputs.output;
    EXPECT_EQ(outputs.output.find("output y:"), std::string::npos) << "ran before refusing: " << outputs.output;
  }
  EXPECT_FALSE(std::filesystem::exists(checkpoint + "/outs"));
  EXPECT_FALSE(std::filesystem::exists(checkpoint + "/y.npy"));
}

TEST(CliTune, AnOutputExtentTheInputValuesDecideStaysFreeInTheCheckpoint) {
  // NonZero's count (declared `n`, a symbol no input has) was fixed at what the random
  // samples gave: the checkpoint and its Triton config claimed one output shape the model
  // does not keep (a probe: `dims: [5]` for Range(0, n)). The model's own extents stay.
  ScopedTempDir tmp;
  const auto checkpoint = tmp.file("ckpt");
  auto r = tune(fixture("nonzero.onnx") + " --provider cpu --quiet --no-variants --checkpoint '" + checkpoint + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto manifest = nlohmann::json::parse(std::ifstream(checkpoint + "/manifest.json"));
  const auto& output = manifest["graphs"][0]["graph_spec"]["outputs"][0];
  EXPECT_EQ(output["min_shape"], nlohmann::json({2, 0})) << output.dump();
  EXPECT_EQ(output["max_shape"], nlohmann::json({2, -1})) << output.dump();
}

TEST(CliTune, OnlyTheFirstInputsFirstAxisSymbolIsTheBatchOfRandomSamples) {
  // MatMul(a[M, K], b[K2, P]): K2 took the batch size too, every sample failed inside ONNX
  // Runtime (exit 1) whatever --dim K2 said; --dim on the batch symbol was ignored (a probe).
  auto r = tune(fixture("matmul.onnx") + " --provider cpu --quiet --no-variants");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("'K2' (b axis 0)"), std::string::npos) << r.output;  // said to hold 1
  auto given = tune(fixture("matmul.onnx") + " --provider cpu --quiet --no-variants --dim K=3 --dim K2=3");
  EXPECT_EQ(given.exit_code, 0) << given.output;
  auto batch = tune(fixture("matmul.onnx") + " --provider cpu --quiet --no-variants --dim M=5");
  EXPECT_EQ(batch.exit_code, 2) << batch.output;
  EXPECT_NE(batch.output.find("give --batch-sizes 5"), std::string::npos) << batch.output;
}

TEST(CliTune, AModelThatIsNotRepeatableIsSaidToBe) {
  // RandomNormalLike: every candidate was "incorrect ... would pass with atol=1.59", exit 1,
  // as if the candidates were at fault (a probe).
  auto r = tune(fixture("random.onnx") + " --provider cpu --quiet");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("when run twice on the same input"), std::string::npos) << r.output;
}

TEST(CliTune, BadInputGivesExitCodeAndReason) {
  ScopedTempDir tmp;
  auto strategy = tune(fixture("mlp.onnx") + " --provider cpu --strategy fastest");
  EXPECT_EQ(strategy.exit_code, 2) << strategy.output;
  EXPECT_NE(strategy.output.find("unknown strategy 'fastest'"), std::string::npos) << strategy.output;

  auto budget = tune(fixture("mlp.onnx") + " --provider cpu --strategy latency-budget");
  EXPECT_EQ(budget.exit_code, 2) << budget.output;
  EXPECT_NE(budget.output.find("--strategy latency-budget needs --latency-budget-ms MS"), std::string::npos)
      << budget.output;

  std::filesystem::create_directories(tmp.file("wrong"));
  save_npy(tmp.file("wrong/y.npy"), make_pattern_f32({1, 64}, 1));
  auto missing = tune(fixture("mlp.onnx") + " --provider cpu --samples '" + tmp.file("wrong") + "'");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("lacks x.npy"), std::string::npos) << missing.output;

  auto tolerance = tune(fixture("mlp.onnx") + " --provider cpu --output-tolerance y=0.1");
  EXPECT_EQ(tolerance.exit_code, 2) << tolerance.output;
  EXPECT_NE(tolerance.output.find("ATOL,RTOL"), std::string::npos) << tolerance.output;

  auto model = tune(tmp.file("absent.onnx") + " --provider cpu");
  EXPECT_EQ(model.exit_code, 4) << model.output;

  // A bad sample among several is named by its file (the session's refusal named none), and
  // sample files beside sample subdirectories are refused (they were left out silently).
  for (const char* d : {"many/a", "many/b", "many/c"}) std::filesystem::create_directories(tmp.file(d));
  save_npy(tmp.file("many/a/x.npy"), make_pattern_f32({1, 64}, 1));
  save_npy(tmp.file("many/b/x.npy"), make_host(DType::kFloat64, {1, 64}, std::vector<double>(64, 1.0)));
  save_npy(tmp.file("many/c/x.npy"), make_pattern_f32({1, 64}, 2));
  auto dtype = tune(fixture("mlp.onnx") + " --provider cpu --samples '" + tmp.file("many") + "'");
  EXPECT_EQ(dtype.exit_code, 2) << dtype.output;
  EXPECT_NE(dtype.output.find("many/b/x.npy' holds float64"), std::string::npos) << dtype.output;
  save_npy(tmp.file("many/b/x.npy"), make_pattern_f32({1, 32}, 1));
  auto shape = tune(fixture("mlp.onnx") + " --provider cpu --samples '" + tmp.file("many") + "'");
  EXPECT_EQ(shape.exit_code, 2) << shape.output;
  EXPECT_NE(shape.output.find("many/b/x.npy' has shape [1, 32]"), std::string::npos) << shape.output;
  save_npy(tmp.file("many/b/x.npy"), make_pattern_f32({1, 64}, 1));
  save_npy(tmp.file("many/x.npy"), make_pattern_f32({2, 64}, 1));
  auto mixed = tune(fixture("mlp.onnx") + " --provider cpu --samples '" + tmp.file("many") + "'");
  EXPECT_EQ(mixed.exit_code, 2) << mixed.output;
  EXPECT_NE(mixed.output.find("holds both sample files ('x.npy') and sample subdirectories"), std::string::npos)
      << mixed.output;
}

TEST(CliTune, UnwritableDestinationsAreRefusedBeforeTuning) {
  // --checkpoint / --report that cannot be written were refused only after every
  // candidate had been tuned and measured.
  ScopedTempDir tmp;
  write_file_bytes(tmp.file("a_file"), "keep");
  const std::string mlp = fixture("mlp.onnx") + " --provider cpu --quiet --no-variants";
  // A checkpoint this tune does not write, to put a report into.
  const auto other = tmp.file("other");
  ASSERT_EQ(tune(mlp + " --checkpoint '" + other + "'").exit_code, 0);
  struct Case {
    std::string args;
    int code;
    std::string names;
    std::string not_said = {};
  };
  const std::vector<Case> cases = {
      {"--checkpoint '" + tmp.file("a_file") + "'", 2, "exists and is not a directory"},
      {"--checkpoint '" + tmp.file("a_file/ckpt") + "'", 6, "is not a directory"},
      {"--report '" + tmp.file("no_dir/report.json") + "'", 6, "does not exist"},
      {"--report '" + tmp.path().string() + "'", 6, "is a directory"},
      // inside the checkpoint it saves: the save replaced the directory and the report with it,
      // after "report: ..." was printed
      {"--checkpoint '" + tmp.file("ckpt") + "' --report '" + tmp.file("ckpt/r.json") + "'", 2,
       "is inside the checkpoint '" + tmp.file("ckpt") + "'"},
      {"--checkpoint '" + tmp.file("ckpt") + "' --report '" + tmp.file("ckpt/r.json") + "'", 2,
       "keeps its own copy, graphs/graph_0/tune_report.json"},
      // inside a checkpoint this tune does not write: it keeps no copy of this report (the
      // message said it did, naming a file of the checkpoint --checkpoint would have written)
      {"--report '" + other + "/r.json'", 2, "is inside the checkpoint '" + other + "'", "own copy"},
      {"--checkpoint '" + tmp.file("ckpt") + "' --report '" + other + "/r.json'", 2,
       "a save over it removes any file its manifest does not list", "tune_report.json"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    auto r = tune(mlp + " " + c.args);
    EXPECT_EQ(r.exit_code, c.code) << r.output;
    EXPECT_NE(r.output.find(c.names), std::string::npos) << r.output;
    if (!c.not_said.empty()) {
      EXPECT_EQ(r.output.find(c.not_said), std::string::npos) << r.output;
    }
    EXPECT_EQ(r.output.find("decision:"), std::string::npos) << "tuned before refusing: " << r.output;
  }
  EXPECT_EQ(read_file_bytes(tmp.file("a_file")), "keep");
}

TEST(CliTune, ZeroToleranceAcceptsOnlyExactOutputs) {
  // The multi-dtype model's outputs (an integer add, a bool cast to float) are exact on
  // every variant, so even atol = rtol = 0 passes.
  auto r = tune(fixture("multi_dtype.onnx") + " --provider cpu --quiet --atol 0 --rtol 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("selected"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("incorrect"), std::string::npos) << r.output;
}

// An ONNX-only tune has no eager PyTorch: its reference is the CPU provider at fp32, and every
// line says so ("speed-up vs eager ...; eager kept" and "4 finalists" counting the reference
// among "the 3 fastest" did not: a probe).
TEST(CliTune, AnOnnxOnlyTuneNamesItsReferenceNotEager) {
  // The tiny MLP's candidates all run at the reference's speed: none beats it by 1.01x, so
  // performance validation keeps it, or the rare winner is named against it.
  auto r = tune(fixture("mlp.onnx") + " --provider cpu --performance-validation");
  EXPECT_EQ(r.output.find("eager"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("finalist(s) and reference (cpu fp32)"), std::string::npos) << r.output;
  if (r.exit_code == 1) {  // kept: the reason and the table say against what
    EXPECT_NE(r.output.find("speed-up vs reference (cpu fp32)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("; reference (cpu fp32) kept"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("slower than reference"), std::string::npos) << r.output;
  } else {
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
}

}  // namespace
}  // namespace aitune
