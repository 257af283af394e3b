// `aitune run` / `aitune tune` in a separate process on hostile or careless input: every
// number outside its range, every unknown name and every parse error exits with the
// documented code (2 usage, 3 provider unavailable, 6 I/O) and one readable line, and
// output files never leave --save-outputs DIR (issue 17).
#include <cstring>
#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>

#include "aitune/npy.hpp"
#include "aitune/ort_runtime.hpp"
#include "onnx_wire.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {
using namespace test;
namespace fs = std::filesystem;

CommandResult cli(const std::string& args) { return run_command(std::string("'") + AITUNE_TEST_CLI + "' " + args); }

// Exit `code`, no "internal error", and the output names what was wrong.
void expect_exit(const std::string& args, int code, const std::string& names) {
  SCOPED_TRACE(args);
  auto r = cli(args);
  EXPECT_EQ(r.exit_code, code) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  EXPECT_TRUE(contains_icase(r.output, names)) << "expected '" << names << "' in: " << r.output;
}

TEST(CliValidation, RunNumbersAndNamesOutOfRange) {
  const std::string mlp = fixture("mlp.onnx") + " --iterations 1 --warmup 0";
  expect_exit("run " + mlp + " --dim batch=1000000000", 2, "random input 'x'");       // was std::bad_alloc
  expect_exit("run " + mlp + " --dim batch=10000000000000000000000", 2, "--dim batch");  // was stoll
  expect_exit("run " + mlp + " --dim batch=0", 2, "--dim batch");
  expect_exit("run " + mlp + " --dim nosuch=3", 2, "nosuch");
  expect_exit("run " + mlp + " --device-id -7", 2, "--device-id");
  expect_exit("run " + mlp + " --device-id 99999999999", 2, "--device-id");
  expect_exit("run " + fixture("mlp.onnx") + " --iterations 0", 2, "--iterations");
  expect_exit("run " + fixture("mlp.onnx") + " --iterations 1e3", 2, "--iterations");
  expect_exit("run " + fixture("mlp.onnx") + " --warmup -1", 2, "--warmup");
  expect_exit("run " + mlp + " --no-such-flag", 2, "no-such-flag");  // CLI11's code was 109
  expect_exit("run", 2, "model");                                       // CLI11's code was 106
  expect_exit("run " + mlp + " --input nosuch=" + fixture("mlp_x.npy"), 2, "nosuch");
  // An input named without its file: said so (it was "NAME one of the model's inputs: 'x'").
  expect_exit("run " + mlp + " --input x", 2, "--input 'x' gives 'x' no value: write --input x=VALUE");
  // One input given twice: refused, not the later file silently used.
  expect_exit("run " + mlp + " --input x=" + fixture("mlp_x.npy") + " --input x=" + fixture("mlp_x.npy"), 2,
              "'x' more than once");
  expect_exit("debug-precision " + fixture("mlp.onnx") + " --input x=" + fixture("mlp_x.npy") + " --input x=" +
                  fixture("mlp_x.npy"),
              2, "'x' more than once");
  // debug-precision reads --input as run does: an unknown name is refused listing the inputs.
  expect_exit("debug-precision " + fixture("mlp.onnx") + " --input nosuch=" + fixture("mlp_x.npy"), 2,
              "model's inputs: 'x'");
  // A missing --candidate-model is a missing model (4), as a missing MODEL is; it was an I/O error (6).
  expect_exit("debug-precision " + fixture("mlp.onnx") + " --candidate-model /nonexistent-dir/candidate.onnx", 4,
              "--candidate-model '/nonexistent-dir/candidate.onnx': model file not found");
  {  // --json's directory missing: refused before the comparison, with the reason (it ran the whole comparison first)
    auto r = cli("debug-precision " + fixture("mlp.onnx") + " --json /nonexistent-dir/x.json");
    EXPECT_EQ(r.exit_code, 6) << r.output;
    EXPECT_TRUE(contains_icase(r.output, "its directory '/nonexistent-dir' does not exist")) << r.output;
    EXPECT_EQ(r.output.find("compared"), std::string::npos) << r.output;
  }
  {  // An empty model file is an invalid model (4), as a truncated one is; it was a usage error (2).
    ScopedTempDir tmp;
    write_file_bytes(tmp.file("empty.onnx"), "");
    expect_exit("run " + tmp.file("empty.onnx") + " --iterations 1", 4, "empty");
    expect_exit("tune " + tmp.file("empty.onnx") + " --provider cpu --quiet", 4, "empty");
  }
  // A valid --dim still works.
  auto r = cli("run " + mlp + " --dim batch=3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains_icase(r.output, "input x: float32[3, 64] random")) << r.output;
  const auto help = cli("--help");
  EXPECT_EQ(help.exit_code, 0);
  // what each exit code means, where a script's author looks (listed nowhere before)
  EXPECT_TRUE(contains_icase(help.output, "5 a corrupt checkpoint")) << help.output;
  EXPECT_EQ(cli("--version").exit_code, 0);
}

// A valid graph of an element type aitune does not run (uint16, string) is no invalid model
// (exit 4 said so, and ONNX Runtime runs it): exit 3, "cannot run here ... a dtype".
TEST(CliValidation, AnElementTypeAituneLacksIsCannotRunHereNotInvalid) {
  ScopedTempDir tmp;
  for (const auto& [type, name] : std::vector<std::pair<std::uint64_t, std::string>>{{4, "uint16"}, {8, "string"}}) {
    SCOPED_TRACE(name);
    const std::string model = tmp.file(name + ".onnx");
    write_file_bytes(model, onnx_wire::identity_model("y", type));
    expect_exit("tune " + model + " --provider cpu --quiet", 3, "input 'x' has ONNX element type " + name);
    expect_exit("run " + model + " --iterations 1", 3, "input 'x' has ONNX element type " + name);
  }
}

// Words that are not what they were taken for (a session-26 probe): an unknown command was
// answered "A subcommand is required", a non-number "not in range", /dev/null "not found".
TEST(CliValidation, UnknownCommandsNonNumbersAndNonFilesAreNamed) {
  expect_exit("bogus", 2, "unknown command 'bogus' for aitune (commands: doctor");
  expect_exit("cache bogus", 2, "unknown command 'bogus' for aitune cache");
  expect_exit("run " + fixture("mlp.onnx") + " --iterations abc", 2, "Failed parsing abc as a");
  expect_exit("run " + fixture("mlp.onnx") + " --iterations 0", 2, "not in range");
  expect_exit("run /dev/null --iterations 1", 4, "not a regular file");
  EXPECT_NE(cli("doctor").exit_code, 2);  // a known command still parses
}

// One input given at batch 3, the other random: the random one was made at batch 1 and the
// run failed inside ONNX Runtime; it now takes the given input's extent of the shared symbol,
// and two given inputs that disagree are refused naming both (a session-26 probe).
TEST(CliValidation, RandomInputsFollowTheSymbolsGivenInputsFix) {
  ScopedTempDir tmp;
  Tensor three = Tensor::empty_host(DType::kFloat32, Shape{3, 4});
  Tensor one = Tensor::empty_host(DType::kFloat32, Shape{1, 4});
  std::memset(three.data(), 0, 3 * 4 * sizeof(float));
  std::memset(one.data(), 0, 4 * sizeof(float));
  save_npy(tmp.file("x3.npy"), three);
  save_npy(tmp.file("y1.npy"), one);
  auto r = cli("run " + fixture("add.onnx") + " --iterations 1 --warmup 0 --input x=" + tmp.file("x3.npy"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains_icase(r.output, "input y: float32[3, 4] random")) << r.output;
  expect_exit("run " + fixture("add.onnx") + " --iterations 1 --input x=" + tmp.file("x3.npy") + " --input y=" +
                  tmp.file("y1.npy"),
              2, "--input y has 1 on the model's symbolic dimension 'batch', but --input x gives 3");
  expect_exit("run " + fixture("add.onnx") + " --iterations 1 --dim batch=2 --input x=" + tmp.file("x3.npy"), 2,
              "but --dim batch gives 2");
  // tune's --samples are held to the same: ORT broadcast x[3, 4] + y[1, 4], and the tune
  // wrote a checkpoint of spec x[3, 4], y[1, 4] that `aitune run` refused for every input.
  std::filesystem::create_directory(tmp.file("samples"));
  save_npy(tmp.file("samples/x.npy"), three);
  save_npy(tmp.file("samples/y.npy"), one);
  expect_exit("tune " + fixture("add.onnx") + " --provider cpu --quiet --samples " + tmp.file("samples") +
                  " --checkpoint " + tmp.file("ck"),
              2, "y.npy has 1 on the model's symbolic dimension 'batch', but x.npy gives 3");
  EXPECT_FALSE(std::filesystem::exists(tmp.file("ck")));
}

TEST(CliValidation, CacheDirectoryThatIsNotOneIsNamedNotListedAsClean) {
  ScopedTempDir tmp;
  // A mistyped --dir was listed as an empty cache with "0 stale directories" (exit 0):
  // the operator was told all was clean.
  expect_exit("cache list --dir " + tmp.file("no-such-cache"), 2, "no-such-cache");
  expect_exit("cache clean --dir " + tmp.file("no-such-cache"), 2, "no-such-cache");
  write_file_bytes(tmp.file("a-file"), "x");
  expect_exit("cache list --dir " + tmp.file("a-file"), 2, "not a directory");
  expect_exit("cache clean --dir " + tmp.file("a-file"), 2, "not a directory");
  // --dir "$UNSET" (empty) listed and cleaned the default cache.
  expect_exit("cache list --dir ''", 2, "is empty");
  expect_exit("cache clean --dir ''", 2, "is empty");
  // A module directory whose .module_name is not a file: listed under its directory name
  // (the stream threw an untyped "basic_filebuf::underflow" before: "internal error").
  fs::create_directories(tmp.path() / "cache" / "m1" / ".module_name");
  auto r = cli("cache list --dir " + tmp.file("cache"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("module 'm1'"), std::string::npos) << r.output;
  // A directory without a .module_name (the build's ORT header downloads share the default
  // root) was listed as "module 'downloads'".
  fs::create_directories(tmp.path() / "cache" / "downloads");
  write_file_bytes((tmp.path() / "cache" / "downloads" / "headers.tgz").string(), "x");
  r = cli("cache list --dir " + tmp.file("cache"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("module 'downloads'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not a module's directory: downloads"), std::string::npos) << r.output;
}

TEST(CliValidation, TuneNumbersAndNamesOutOfRange) {
  const std::string mlp = "tune " + fixture("mlp.onnx") + " --provider cpu --quiet --time-cap 0.2";
  expect_exit(mlp + " --batch-sizes 1000000000", 2, "--batch-sizes");  // was std::bad_alloc
  expect_exit(mlp + " --batch-sizes 0", 2, "--batch-sizes");
  expect_exit(mlp + " --batch-sizes 10000000000000000000000", 2, "--batch-sizes");
  expect_exit(mlp + " --dim nosuch=3", 2, "nosuch");
  expect_exit(mlp + " --output-tolerance nosuch=1,1", 2, "nosuch");
  expect_exit(mlp + " --output-tolerance y=nan,1", 2, "--output-tolerance");
  expect_exit(mlp + " --max-batch-size -5", 2, "--max-batch-size");
  expect_exit(mlp + " --atol nan", 2, "--atol");
  expect_exit(mlp + " --rtol inf", 2, "--rtol");
  expect_exit(mlp + " --atol -1", 2, "--atol");
  expect_exit(mlp + " --device-id -7", 2, "--device-id");
  // They shape random samples only; with --samples they were ignored without a word.
  expect_exit(mlp + " --samples " + fixture("") + " --batch-sizes 4", 2, "--samples excludes --batch-sizes");
  expect_exit(mlp + " --samples " + fixture("") + " --dim seq=4", 2, "--samples excludes --dim");
  expect_exit(mlp + " --strategy latency-budget --latency-budget-ms nan", 2, "--latency-budget-ms");
  expect_exit(mlp + " --dim batch=4 --dim batch=8", 2, "--dim batch is given twice");
  // a budget without its strategy was ignored: the default max-throughput ran
  expect_exit(mlp + " --latency-budget-ms 5", 2, "--latency-budget-ms is the budget of --strategy latency-budget");
  expect_exit("tune " + fixture("mlp.onnx") + " --time-cap nan", 2, "--time-cap");
  expect_exit("tune " + fixture("mlp.onnx") + " --time-cap -1", 2, "--time-cap");
}

TEST(CliValidation, TuneOnAnUnavailableProviderExits3) {
  if (OrtRuntime::load()->provider_status(ExecutionProvider::kCUDA).available)
    GTEST_SKIP() << "CUDA is available here";
  expect_exit("tune " + fixture("mlp.onnx") + " --provider cuda --quiet --time-cap 0.2", 3, "cuda");
}

TEST(CliValidation, DebugPrecisionSkipsValuesTheCandidateLacks) {
  // A candidate model whose intermediate values are named otherwise: those values are not
  // compared (as documented), instead of the run failing on its temporary debug copy
  // ("Graph output (h_pre) does not exist", exit 4).
  auto r = cli("debug-precision " + fixture("mlp.onnx") + " --candidate-model " + fixture("mlp_renamed.onnx") +
               " --input x=" + fixture("mlp_x.npy"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains_icase(r.output, "compared 1 node outputs")) << r.output;
  EXPECT_TRUE(contains_icase(r.output, "(2 not compared")) << r.output;
  EXPECT_EQ(r.output.find(".debug-"), std::string::npos) << r.output;
}

TEST(CliValidation, HostileNpyInputsAreUsageErrors) {
  ScopedTempDir tmp;
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::string(30000, ' ') + "3, 64), }\n";
  std::string bytes = "\x93NUMPY\x01";
  bytes += '\0';
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  write_file_bytes(tmp.file("x.npy"), bytes + header + std::string(3 * 64 * 4, '\0'));
  expect_exit("run " + fixture("mlp.onnx") + " --iterations 1 --input x=" + tmp.file("x.npy"), 2, "x.npy");  // was 139
  fs::create_directories(tmp.file("samples"));
  fs::copy_file(tmp.file("x.npy"), tmp.file("samples/x.npy"));
  expect_exit("tune " + fixture("mlp.onnx") + " --provider cpu --quiet --samples " + tmp.file("samples"), 2, "x.npy");
}

TEST(CliValidation, SaveOutputsStaysInsideItsDirectory) {
  ScopedTempDir tmp;
  // Output names that are paths: each becomes one escaped file inside DIR.
  const std::vector<std::pair<std::string, std::string>> names = {
      {"../../escaped", "%2E.%2F..%2Fescaped.npy"},
      {tmp.file("abs_escaped"), ""},
      {".hidden", "%2Ehidden.npy"},
      {"y", "y.npy"},
  };
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& [name, file] = names[i];
    SCOPED_TRACE(name);
    const std::string model = tmp.file("m" + std::to_string(i) + ".onnx");
    write_file_bytes(model, onnx_wire::identity_model(name));
    const std::string out = tmp.file("out" + std::to_string(i));
    auto r = cli("run '" + model + "' --iterations 1 --warmup 0 --save-outputs '" + out + "'");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::vector<std::string> written;
    for (const auto& e : fs::recursive_directory_iterator(out)) written.push_back(e.path().filename().string());
    ASSERT_EQ(written.size(), 1u) << r.output;
    if (!file.empty()) EXPECT_EQ(written[0], file);
    EXPECT_EQ(load_npy(out + "/" + written[0]).shape(), (Shape{2}));
  }
  EXPECT_FALSE(fs::exists(tmp.path().parent_path().parent_path() / "escaped.npy"));
  EXPECT_FALSE(fs::exists(tmp.file("abs_escaped.npy")));
  // A bfloat16 output: refused before the run, nothing written (y.npy was saved, then z failed).
  expect_exit("run " + fixture("bf16_out.onnx") + " --iterations 1 --save-outputs '" + tmp.file("bf16") + "'", 2,
              "output 'z' is bfloat16");
  EXPECT_FALSE(fs::exists(tmp.file("bf16/y.npy")));
  // DIR that is a file: an I/O error (6), not "internal error: filesystem error".
  write_file_bytes(tmp.file("a_file"), "x");
  expect_exit("run " + fixture("mlp.onnx") + " --iterations 1 --save-outputs '" + tmp.file("a_file") + "'", 6,
              "not a directory");
}

// --provider takes "auto" (its default) besides the engine's providers: an unknown one was
// answered with "valid values: cpu, cuda, tensorrt", leaving auto out (a session-27 probe).
TEST(CliValidation, EmptyPathsAreRefusedNotTakenAsLeftOut) {
  // `--checkpoint "$UNSET"` was the option left out: the tune ran, nothing was written, exit 0.
  const std::string mlp = fixture("mlp.onnx");
  expect_exit("tune " + mlp + " --provider cpu --quiet --checkpoint ''", 2, "--checkpoint: an empty path");
  expect_exit("tune " + mlp + " --provider cpu --quiet --report ''", 2, "--report: an empty path");
  expect_exit("tune " + mlp + " --provider cpu --quiet --samples ''", 2, "--samples: an empty path");
  expect_exit("run " + mlp + " --iterations 1 --save-outputs ''", 2, "--save-outputs: an empty path");
  expect_exit("debug-precision " + mlp + " --json ''", 2, "--json: an empty path");
  expect_exit("report ''", 2, "an empty path");
  expect_exit("inspect ''", 2, "an empty path");
}

TEST(CliValidation, ARefusedRunLeavesNoOutputDirectory) {
  // --save-outputs DIR was made before the run, and left empty when the run was refused.
  ScopedTempDir tmp;
  expect_exit("run " + fixture("mlp.onnx") + " --iterations 1 --input x=" + fixture("npy_bool.npy") +
                  " --save-outputs " + tmp.file("out/nested"),
              2, "x");
  EXPECT_FALSE(std::filesystem::exists(tmp.file("out")));
  auto r = cli("run " + fixture("mlp.onnx") + " --iterations 1 --warmup 0 --save-outputs " + tmp.file("out/nested"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::is_regular_file(tmp.file("out/nested/y.npy"))) << r.output;
  expect_exit("run " + fixture("mlp.onnx") + " --iterations 1 --save-outputs " + fixture("mlp.onnx") + "/out", 6,
              "is not a directory");
}

TEST(CliValidation, NaNOutputsAreCountedInTheSummary) {
  // An all-NaN output read "min inf, max -inf, mean nan" (a probe).
  ScopedTempDir tmp;
  Tensor x = Tensor::empty_host(DType::kFloat32, Shape{3, 64});
  auto* p = static_cast<float*>(x.data());
  for (int i = 0; i < 3 * 64; ++i) p[i] = i < 64 ? NAN : 0.5f;  // row 0 NaN: its 16 outputs NaN
  save_npy(tmp.file("some.npy"), x);
  auto some = cli("run " + fixture("mlp.onnx") + " --iterations 1 --warmup 0 --input x=" + tmp.file("some.npy"));
  EXPECT_EQ(some.exit_code, 0) << some.output;
  EXPECT_TRUE(contains_icase(some.output, "(of the values that are not NaN; 16 NaN)")) << some.output;
  for (int i = 0; i < 3 * 64; ++i) p[i] = NAN;
  save_npy(tmp.file("all.npy"), x);
  auto all = cli("run " + fixture("mlp.onnx") + " --iterations 1 --warmup 0 --input x=" + tmp.file("all.npy"));
  EXPECT_EQ(all.exit_code, 0) << all.output;
  EXPECT_TRUE(contains_icase(all.output, "all 48 values NaN")) << all.output;
}

TEST(CliValidation, TheSessionsSettingsAreTakenAsProviderOptions) {
  // The CPU provider's refusal named intra_op_threads, which no flag took (a probe); and in
  // tune an unknown option failed every candidate, exit 1, instead of being refused (2).
  const std::string mlp = fixture("mlp.onnx");
  auto r = cli("run " + mlp + " --iterations 1 --warmup 0 --provider-option intra_op_threads=1 "
               "--provider-option graph_optimization_level=basic");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_exit("run " + mlp + " --iterations 1 --provider-option intra_op_threads=-1", 2, "intra_op_threads");
  expect_exit("tune " + mlp + " --provider cpu --quiet --provider-option nosuch=1", 2,
              "takes no provider options (got 'nosuch')");
  // A key given twice kept the first value silently (the invalid second never checked).
  expect_exit("run " + mlp + " --iterations 1 --provider-option intra_op_threads=2 --provider-option "
              "intra_op_threads=abc", 2, "intra_op_threads is given twice ('2' and 'abc')");
  expect_exit("tune " + mlp + " --provider cpu --quiet --provider-option intra_op_threads=1 --provider-option "
              "intra_op_threads=2", 2, "given twice");
  // On a checkpoint the same settings go to the session (they were refused as provider
  // options there, exit 2, by a message pointing at --provider-option itself: a probe).
  ScopedTempDir tmp;
  auto tuned = cli("tune " + mlp + " --provider cpu --quiet --checkpoint " + tmp.file("ck"));
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  auto again = cli("run " + tmp.file("ck") + " --iterations 1 --warmup 0 --provider-option intra_op_threads=2 "
                   "--provider-option graph_optimization_level=basic");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  expect_exit("run " + tmp.file("ck") + " --iterations 1 --provider-option intra_op_threads=-1", 2, "intra_op_threads");
}

TEST(CliValidation, AReportPageIsNeverWrittenOverItsReport) {
  // `aitune report r.json -o r.json` replaced the JSON with the page (exit 0): the report was gone.
  ScopedTempDir tmp;
  const std::string report = tmp.file("r.json");
  auto tuned = cli("tune " + fixture("mlp.onnx") + " --provider cpu --quiet --report " + report);
  ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
  const std::string before = read_file_bytes(report);
  expect_exit("report " + report + " -o " + report, 2, "over the report it is made from");
  EXPECT_EQ(read_file_bytes(report), before);
}

TEST(CliValidation, AnUnknownProviderListsAutoToo) {
  expect_exit("run " + fixture("add.onnx") + " --iterations 1 --provider bogus", 2,
              "unknown execution provider 'bogus'; valid values: cpu, cuda, tensorrt, auto");
}

}  // namespace
}  // namespace aitune

