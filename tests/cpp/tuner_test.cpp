// The tuning engine end to end on the CPU provider: variants, correctness rejection,
// tolerance overrides, performance validation, batch search, failing candidates.
#include <chrono>
#include <cstring>
#include <stdexcept>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "aitune/error.hpp"
#include "aitune/tuner.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {
using namespace test;

// The first `rows` rows of a [N, C] float32 host tensor.
Tensor rows_of(const Tensor& t, int64_t rows) {
  Tensor out = Tensor::empty_host(DType::kFloat32, {rows, t.shape()[1]});
  std::memcpy(out.data(), t.data(), out.nbytes());
  return out;
}

struct MlpSamples {
  Tensor x3 = load_fixture_npy("mlp_x.npy"), y3 = load_fixture_npy("mlp_y.npy");
  Tensor x1 = rows_of(x3, 1), y1 = rows_of(y3, 1);

  GraphSpec spec() const {
    GraphSpecBuilder b;
    b.record({{"x", DType::kFloat32, x1.shape()}}, {{"y", DType::kFloat32, y1.shape()}}, 1);
    b.record({{"x", DType::kFloat32, x3.shape()}}, {{"y", DType::kFloat32, y3.shape()}}, 3);
    return b.build();
  }
  std::vector<TuneSample> samples(const Tensor* y3_override = nullptr) const {
    return {{{x1.view()}, {y1.view()}, 1}, {{x3.view()}, {(y3_override ? *y3_override : y3).view()}, 3}};
  }
};

TunerOptions quick_options() {
  TunerOptions o;
  o.profile.warmup_calls = 2;
  o.profile.window_calls = 10;
  o.profile.time_cap_s = 0.5;
  return o;
}

OnnxSessionConfig cpu() {
  OnnxSessionConfig c;
  c.provider = ExecutionProvider::kCPU;
  return c;
}

StrategyConfig max_throughput(bool validation = false) {
  StrategyConfig s;
  s.performance_validation = validation;
  return s;
}

void busy_wait_us(double us) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(us);
  while (std::chrono::steady_clock::now() < end) {
  }
}

TEST(Tuner, CpuVariantsAreCheckedProfiledAndTheWinnerRuns) {
  MlpSamples m;
  GraphTuner tuner("mlp", m.spec(), m.samples(), quick_options());
  auto variants = provider_variants(cpu(), tuner.spec());
  ASSERT_EQ(variants.size(), 3u);
  EXPECT_EQ(variants[0].name, "cpu");
  EXPECT_EQ(variants[1].name, "cpu[intra_op_threads=1]");
  EXPECT_EQ(variants[2].name, "cpu[graph_optimization_level=extended]");
  for (const auto& v : variants) tuner.evaluate_onnx(fixture("mlp.onnx"), v, "ONNXRuntimeBackend", 0);
  const auto& report = tuner.select(max_throughput());
  ASSERT_TRUE(report.winner.has_value()) << report.decision;
  for (const auto& c : report.candidates) {
    EXPECT_TRUE(c.correctness.has_value());
    EXPECT_TRUE(c.correctness->passed()) << c.name << ": " << c.correctness->first_failure();
    EXPECT_EQ(c.correctness->samples.size(), 2u);
    ASSERT_TRUE(c.profile.has_value());
    EXPECT_EQ(c.profile->batch_size, 3);  // profiled on the largest batch
    EXPECT_GT(c.profile->throughput, 0);
    EXPECT_GT(c.session_creation_ms, 0);
    EXPECT_GT(c.first_run_ms, 0);
    EXPECT_FALSE(c.config_json.empty());
  }
  EXPECT_EQ(report.candidates[*report.winner].status, CandidateStatus::kSelected);

  auto backend = tuner.take_winner();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->state(), SessionState::kActive);
  auto out = backend->infer({m.x3.view()});
  expect_allclose_f32(out.at(0), m.y3, 1e-4);
  EXPECT_EQ(tuner.take_winner(), nullptr);  // handed over once

  auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["candidates"].size(), 3u);
  EXPECT_EQ(j["winner"], report.candidates[*report.winner].name);
  EXPECT_TRUE(j["candidates"][0]["profile"]["host_us"].contains("p99"));
  auto table = report.summary_table();
  for (const auto& v : variants) EXPECT_NE(table.find(v.name), std::string::npos) << table;
  EXPECT_NE(table.find("decision: "), std::string::npos);
}

TEST(Tuner, WrongReferenceOutputsRejectEveryCandidateWithTheirReport) {
  MlpSamples m;
  Tensor wrong = Tensor::empty_host(DType::kFloat32, m.y3.shape());
  std::memcpy(wrong.data(), m.y3.data(), wrong.nbytes());
  static_cast<float*>(wrong.data())[17] += 0.05f;  // one element of sample 1
  GraphTuner tuner("mlp", m.spec(), m.samples(&wrong), quick_options());
  for (const auto& v : provider_variants(cpu(), tuner.spec()))
    tuner.evaluate_onnx(fixture("mlp.onnx"), v, "ONNXRuntimeBackend", 0);
  const auto& report = tuner.select(max_throughput());
  EXPECT_FALSE(report.winner.has_value());
  for (const auto& c : report.candidates) {
    EXPECT_EQ(c.status, CandidateStatus::kIncorrect);
    EXPECT_EQ(c.reason.rfind("sample 1 (batch 3): y: 1 of 48 elements", 0), 0u) << c.reason;
    EXPECT_FALSE(c.profile.has_value());  // incorrect candidates are not profiled
    EXPECT_TRUE(c.correctness->samples[0].passed());
    EXPECT_NEAR(c.correctness->required_tolerances().at("y").atol, 0.05, 1e-3);
  }
  EXPECT_EQ(tuner.take_winner(), nullptr);
}

TEST(Tuner, PerOutputToleranceOverrideAcceptsAKnownDeviation) {
  MlpSamples m;
  Tensor off = Tensor::empty_host(DType::kFloat32, m.y3.shape());
  std::memcpy(off.data(), m.y3.data(), off.nbytes());
  static_cast<float*>(off.data())[0] += 0.05f;
  auto options = quick_options();
  options.tolerances.per_output["y"] = {0.1, 0};
  GraphTuner tuner("mlp", m.spec(), m.samples(&off), options);
  tuner.evaluate_onnx(fixture("mlp.onnx"), provider_variants(cpu(), tuner.spec())[0], "ONNXRuntimeBackend", 0);
  EXPECT_TRUE(tuner.select(max_throughput()).winner.has_value());
}

TEST(Tuner, PerformanceValidationComparesWithTheReference) {
  MlpSamples m;
  {
    GraphTuner slow_eager("mlp", m.spec(), m.samples(), quick_options());
    int calls = 0;
    slow_eager.profile_reference([&](const std::vector<TensorView>& inputs) {
      ASSERT_EQ(inputs.size(), 1u);
      EXPECT_EQ(inputs[0].shape, (Shape{3, 64}));  // the largest-batch sample
      ++calls;
      busy_wait_us(3000);
    });
    EXPECT_GT(calls, 0);
    slow_eager.evaluate_onnx(fixture("mlp.onnx"), provider_variants(cpu(), slow_eager.spec())[0], "ORT", 0);
    const auto& r = slow_eager.select(max_throughput(true));
    ASSERT_TRUE(r.winner.has_value()) << r.decision;
    EXPECT_GT(r.candidates[0].speedup_vs_eager, 1.01);
    EXPECT_NE(r.summary_table().find("eager"), std::string::npos);
  }
  {
    GraphTuner instant_eager("mlp", m.spec(), m.samples(), quick_options());
    instant_eager.profile_reference([](const std::vector<TensorView>&) {});  // nothing is faster
    instant_eager.evaluate_onnx(fixture("mlp.onnx"), provider_variants(cpu(), instant_eager.spec())[0], "ORT", 0);
    const auto& r = instant_eager.select(max_throughput(true));
    EXPECT_FALSE(r.winner.has_value());
    EXPECT_EQ(r.candidates[0].status, CandidateStatus::kSlowerThanEager);
    EXPECT_NE(r.decision.find("eager kept"), std::string::npos) << r.decision;
    EXPECT_EQ(instant_eager.take_winner(), nullptr);
  }
}

TEST(Tuner, BatchSearchWidensTheBatchRangeOfTheWinner) {
  MlpSamples m;
  auto options = quick_options();
  options.batch_search.enabled = true;
  options.batch_search.max_batch_size = 24;
  options.batch_search.min_gain = -1;  // never stop on gain: search up to the limit
  GraphTuner tuner("mlp", m.spec(), m.samples(), options);
  tuner.evaluate_onnx(fixture("mlp.onnx"), provider_variants(cpu(), tuner.spec())[0], "ORT", 0);
  const auto& r = tuner.select(max_throughput());
  ASSERT_TRUE(r.winner.has_value());
  ASSERT_TRUE(r.batch_search.has_value());
  const auto& search = *r.batch_search;
  EXPECT_EQ(search.recorded_max_batch, 3);
  ASSERT_EQ(search.steps.size(), 3u);  // 6, 12, 24
  EXPECT_EQ(search.steps[2].batch_size, 24);
  EXPECT_EQ(search.max_batch, 24);
  EXPECT_EQ(search.correctness, "passed");
  EXPECT_NE(search.stop_reason.find("limit of 24"), std::string::npos) << search.stop_reason;

  auto backend = tuner.take_winner();
  ASSERT_NE(backend, nullptr);
  const auto& x = backend->graph_spec().inputs.at(0);
  EXPECT_EQ(x.max_shape[0], 24);
  Tensor big = tile_along_axis(m.x3.view(), 0, 8);
  Tensor expected = tile_along_axis(m.y3.view(), 0, 8);
  expect_allclose_f32(backend->infer({big.view()}).at(0), expected, 1e-4);
  Tensor too_big = tile_along_axis(m.x1.view(), 0, 25);
  expect_error([&] { backend->infer({too_big.view()}); }, ErrorCode::kShapeMismatch, {"x"});
}

TEST(Tuner, BatchSearchStopsWhenThroughputStopsGrowing) {
  MlpSamples m;
  auto options = quick_options();
  options.batch_search.enabled = true;
  options.batch_search.min_gain = 1e9;  // no batch can be this much faster: stop at the first step
  GraphTuner tuner("mlp", m.spec(), m.samples(), options);
  tuner.evaluate_onnx(fixture("mlp.onnx"), provider_variants(cpu(), tuner.spec())[0], "ORT", 0);
  const auto& search = *tuner.select(max_throughput()).batch_search;
  ASSERT_EQ(search.steps.size(), 1u);
  EXPECT_EQ(search.max_batch, 6);
  EXPECT_NE(search.stop_reason.find("gain"), std::string::npos) << search.stop_reason;
}

TEST(Tuner, FailingCandidatesAreReportedAndTheOthersCompete) {
  MlpSamples m;
  GraphTuner tuner("mlp", m.spec(), m.samples(), quick_options());
  tuner.add_failed("export", "ONNXRuntimeBackend[trace]", 0, "torch.onnx.export failed: boom");
  // A candidate whose model transform failed keeps the precision it would have computed in.
  auto half = tuner.add_failed("cuda fp16 model", "ORT", 0, "fp16 conversion failed", Precision::kFP16);
  auto bad_model = tuner.evaluate_onnx(fixture("corrupt.onnx"), provider_variants(cpu(), tuner.spec())[0], "ORT", 1);
  auto good = tuner.evaluate_onnx(fixture("mlp.onnx"), provider_variants(cpu(), tuner.spec())[0], "ORT", 1);
  const auto& r = tuner.select(max_throughput());
  EXPECT_EQ(r.candidates[0].status, CandidateStatus::kFailed);
  EXPECT_EQ(r.candidates[0].precision, Precision::kStrict);
  EXPECT_EQ(r.candidates[half].status, CandidateStatus::kFailed);
  EXPECT_EQ(r.candidates[half].precision, Precision::kFP16);
  EXPECT_EQ(r.candidates[bad_model].status, CandidateStatus::kFailed);
  EXPECT_NE(r.candidates[bad_model].reason.find("corrupt.onnx"), std::string::npos) << r.candidates[bad_model].reason;
  EXPECT_EQ(r.winner, good);
}

TEST(Tuner, SamplesAreValidatedAgainstTheSpec) {
  MlpSamples m;
  expect_error([&] { GraphTuner("mlp", m.spec(), {}, quick_options()); }, ErrorCode::kInvalidArgument,
               {"mlp", "sample"});
  Tensor ints = Tensor::empty_host(DType::kInt64, {1, 64});
  expect_error([&] { GraphTuner("mlp", m.spec(), {{{ints.view()}, {m.y1.view()}, 1}}, quick_options()); },
               ErrorCode::kDTypeMismatch, {"x", "int64", "float32"});
  Tensor wide = Tensor::empty_host(DType::kFloat32, {1, 65});
  expect_error([&] { GraphTuner("mlp", m.spec(), {{{wide.view()}, {m.y1.view()}, 1}}, quick_options()); },
               ErrorCode::kShapeMismatch, {"x"});
  expect_error([&] { GraphTuner("mlp", m.spec(), {{{m.x1.view()}, {}, 1}}, quick_options()); },
               ErrorCode::kInvalidArgument, {"expected"});
}

// aitune's own crop between the recorded sizes (a probe) landing across a branch on a
// size: the graph keeps the condition and refuses the probe's sizes, instead of being
// judged (and failed) there; a recorded sample across it leaves it out, as before.
TEST(Tuner, AProbeAcrossAShapeConditionKeepsItAndIsNotRunThroughTheGraph) {
  MlpSamples m;
  Tensor x2 = rows_of(m.x3, 2), y2 = rows_of(m.y3, 2);
  const auto not_two = ShapeCondition::from_json(R"(["ne", ["dim", "x", 0], 2])");
  for (bool probe : {true, false}) {
    auto samples = m.samples();
    samples.push_back({{x2.view()}, {y2.view()}, 2});
    samples.back().probe = probe;
    GraphTuner tuner("mlp", m.spec(), samples, quick_options());
    const auto left_out = tuner.set_shape_conditions({not_two});
    tuner.evaluate_onnx(fixture("mlp.onnx"), provider_variants(cpu(), tuner.spec())[0], "ORT", 0);
    const auto& c = tuner.report().candidates.at(0);
    ASSERT_TRUE(c.correctness.has_value()) << c.reason;
    EXPECT_TRUE(c.correctness->passed()) << c.correctness->first_failure();
    const auto& check = c.correctness->samples.at(2);
    if (probe) {
      EXPECT_TRUE(left_out.empty());
      ASSERT_EQ(tuner.spec().conditions.size(), 1u);
      EXPECT_EQ(tuner.report().shape_conditions, std::vector<std::string>{"x.shape[0] != 2"});
      EXPECT_TRUE(check.outputs.empty());
      EXPECT_NE(check.not_run.find("`x.shape[0] != 2`"), std::string::npos) << check.not_run;
      EXPECT_NE(check.sample.find("aitune's probe"), std::string::npos) << check.sample;
      auto j = nlohmann::json::parse(c.correctness->to_json());
      EXPECT_EQ(j["samples"][2]["not_run"], check.not_run);
      // the winner refuses the probe's sizes as it would a user's call
      tuner.select(max_throughput());
      auto winner = tuner.take_winner();
      ASSERT_NE(winner, nullptr);
      // (and keeps refusing them once other shapes were accepted: the session remembers
      // accepted shapes only, AcceptedShapes)
      for (int call = 0; call < 2; ++call) {
        expect_allclose_f32(winner->infer({m.x3.view()}).at(0), m.y3, 1e-4);
        expect_error([&] { winner->infer({x2.view()}); }, ErrorCode::kShapeMismatch, {"x.shape[0] != 2"});
      }
    } else {
      ASSERT_EQ(left_out.size(), 1u);
      EXPECT_TRUE(tuner.spec().conditions.empty());
      ASSERT_EQ(check.outputs.size(), 1u);  // run and compared
      EXPECT_TRUE(check.not_run.empty());
    }
  }
}

TEST(Tuner, AProbeIsNeverTheProfiledSample) {
  MlpSamples m;
  auto samples = m.samples();
  // larger than every recorded batch, yet aitune's own: the user's largest call is timed
  samples.push_back({{m.x3.view()}, {m.y3.view()}, 3});
  samples[1].batch_size = 2;
  samples.back().probe = true;
  GraphTuner tuner("mlp", m.spec(), samples, quick_options());
  tuner.evaluate_onnx(fixture("mlp.onnx"), provider_variants(cpu(), tuner.spec())[0], "ORT", 0);
  const auto& c = tuner.report().candidates.at(0);
  ASSERT_TRUE(c.profile.has_value()) << c.reason;
  EXPECT_EQ(c.profile->batch_size, 2);
}

TEST(Tuner, TileAlongAxisRepeatsTheTensor) {
  auto t = make_host<float>(DType::kFloat32, {2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(values_of<float>(tile_along_axis(t.view(), 0, 2)), (std::vector<float>{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(values_of<float>(tile_along_axis(t.view(), 1, 2)), (std::vector<float>{1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6}));
  EXPECT_EQ(tile_along_axis(t.view(), 1, 3).shape(), (Shape{2, 9}));
  expect_error([&] { tile_along_axis(t.view(), 2, 2); }, ErrorCode::kInvalidArgument, {"axis"});
}

TEST(Tuner, CudaAndTensorRtVariantsAreDocumentedSets) {
  MlpSamples m;
  OnnxSessionConfig cuda;
  auto v = provider_variants(cuda, m.spec());
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].config.provider_options.at("use_tf32"), "0");
  EXPECT_EQ(v[0].precision, Precision::kStrict);
  EXPECT_EQ(v[1].config.provider_options.at("cudnn_conv_algo_search"), "HEURISTIC");
  EXPECT_EQ(v[2].config.provider_options.at("prefer_nhwc"), "1");
  EXPECT_EQ(v[3].precision, Precision::kTF32);
  // A dynamic batch: no CUDA-graph variant (a graph per shape seen).
  for (const auto& c : v) EXPECT_FALSE(c.config.provider_options.count("enable_cuda_graph")) << c.name;
  // Static shapes add CUDA graphs, strict and TF32.
  GraphSpecBuilder one;
  one.record({{"x", DType::kFloat32, m.x1.shape()}}, {{"y", DType::kFloat32, m.y1.shape()}}, 1);
  auto with_graphs = provider_variants(cuda, one.build());
  ASSERT_EQ(with_graphs.size(), 6u);
  EXPECT_EQ(with_graphs[4].config.provider_options.at("enable_cuda_graph"), "1");
  EXPECT_EQ(with_graphs[4].precision, Precision::kStrict);
  EXPECT_EQ(with_graphs[5].config.provider_options.at("enable_cuda_graph"), "1");
  EXPECT_EQ(with_graphs[5].precision, Precision::kTF32);
  // A caller-fixed option is kept in every variant and decides the precision.
  cuda.provider_options["use_tf32"] = "1";
  for (const auto& c : provider_variants(cuda, m.spec())) {
    EXPECT_EQ(c.config.provider_options.at("use_tf32"), "1");
    EXPECT_EQ(c.precision, Precision::kTF32);
  }
  EXPECT_EQ(provider_variants(cuda, m.spec()).size(), 3u);  // {tf32=1} twice collapsed into one
  OnnxSessionConfig trt;
  trt.provider = ExecutionProvider::kTensorRT;
  auto t = provider_variants(trt, m.spec());
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[1].precision, Precision::kFP16);
  EXPECT_EQ(t[2].config.provider_options.at("trt_builder_optimization_level"), "5");
}

TEST(Tuner, ExternalCandidatesAreCheckedProfiledAndReportedWithTheirPrecision) {
  MlpSamples m;
  GraphTuner tuner("mlp", m.spec(), m.samples(), quick_options());
  int runs = 0;
  ExternalCandidate right{"compiled", "{\"mode\":\"default\"}", Precision::kTF32,
                          [&](std::size_t i) { return std::vector<Tensor>{i == 0 ? m.y1 : m.y3}; },
                          [&] { ++runs; }};
  ExternalCandidate wrong = right;
  wrong.name = "wrong";
  wrong.outputs = [&](std::size_t) { return std::vector<Tensor>{m.y3}; };  // sample 0 has 1 row, not 3
  ExternalCandidate throws = right;
  throws.name = "throws";
  throws.run = [] { throw std::runtime_error("compile failed"); };
  auto a = tuner.evaluate_external(right, "TorchCompileBackend", 1);
  auto b = tuner.evaluate_external(wrong, "TorchCompileBackend", 1);
  auto c = tuner.evaluate_external(throws, "TorchCompileBackend", 1);
  EXPECT_THROW(tuner.evaluate_external(ExternalCandidate{"empty"}, "X", 1), Error);
  auto variants = provider_variants(cpu(), tuner.spec());
  variants[0].transform = "ort_fusions";
  variants[0].fused_operators = {{"Attention", 2}, {"SkipLayerNormalization", 4}};
  tuner.evaluate_onnx(fixture("mlp.onnx"), variants[0], "ONNXRuntimeBackend", 0);
  const auto& report = tuner.select(max_throughput());
  const auto& r = report.candidates;
  EXPECT_EQ(r[a].status == CandidateStatus::kSelected || r[a].status == CandidateStatus::kNotChosen, true)
      << r[a].reason;
  EXPECT_GT(runs, 10);  // first run + profile
  EXPECT_EQ(r[a].precision, Precision::kTF32);
  EXPECT_EQ(r[b].status, CandidateStatus::kIncorrect);
  EXPECT_EQ(r[c].status, CandidateStatus::kFailed);
  EXPECT_NE(r[c].reason.find("compile failed"), std::string::npos);
  auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["candidates"][a]["precision"], "tf32");
  EXPECT_EQ(j["candidates"][a]["config"]["mode"], "default");
  EXPECT_EQ(j["candidates"][3]["transform"], "ort_fusions");
  EXPECT_EQ(j["candidates"][3]["fused_operators"]["Attention"], 2);
  auto table = report.summary_table();
  EXPECT_NE(table.find("precision"), std::string::npos) << table;
  EXPECT_NE(table.find("tf32"), std::string::npos) << table;
  EXPECT_NE(table.find("ort_fusions (Attention: 2, SkipLayerNormalization: 4)"), std::string::npos) << table;
}

TEST(Tuner, TheFinalRoundCallsOnnxSessionsAgainAndTheWinnerStillRuns) {
  // Every passed session a finalist (margin 10x): the final round calls each session again
  // on the inputs its first profile used (kept alive by the call), after the evaluation
  // that made them has returned; then the batch search and take_winner on the winner.
  MlpSamples m;
  TunerOptions options = quick_options();
  options.profile.final_round_margin = 10;
  options.profile.final_round_windows = 2;
  options.batch_search.enabled = true;
  options.batch_search.max_batch_size = 12;
  std::vector<std::string> lines;
  options.log = [&](const std::string& line) { lines.push_back(line); };
  GraphTuner tuner("mlp", m.spec(), m.samples(), options);
  auto variants = provider_variants(cpu(), tuner.spec());
  for (const auto& v : variants) tuner.evaluate_onnx(fixture("mlp.onnx"), v, "ONNXRuntimeBackend", 0);
  ExternalCandidate ext{"compiled", "{}", Precision::kStrict,
                        [&](std::size_t i) { return std::vector<Tensor>{i == 0 ? m.y1 : m.y3}; },
                        [] { busy_wait_us(5000); }};  // far slower than the sessions: not a finalist
  auto slow = tuner.evaluate_external(ext, "TorchCompileBackend", 1);
  const auto& report = tuner.select(max_throughput());
  ASSERT_TRUE(report.winner.has_value()) << report.decision;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const auto& c = report.candidates[i];
    ASSERT_TRUE(c.first_profile.has_value()) << c.name;
    EXPECT_EQ(c.profile->stop_reason, "final round") << c.name;
    EXPECT_EQ(c.profile->windows, 2) << c.name;
    EXPECT_EQ(c.profile->measured_calls, 2 * options.profile.window_calls) << c.name;
    EXPECT_GT(c.profile->host_us.p50, 0) << c.name;
  }
  EXPECT_FALSE(report.candidates[slow].first_profile.has_value());
  int final_lines = 0;
  for (const auto& line : lines) final_lines += line.find("final round: cpu") != std::string::npos;
  EXPECT_EQ(final_lines, 3);
  ASSERT_TRUE(report.batch_search.has_value());
  EXPECT_GE(report.batch_search->max_batch, 3);
  auto winner = tuner.take_winner();
  ASSERT_NE(winner, nullptr);
  auto out = winner->infer({m.x3.view()});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), m.y3.shape());
}

TEST(Tuner, AnExternalWinnerHasNoSessionAndNoBatchSearch) {
  MlpSamples m;
  TunerOptions options = quick_options();
  options.batch_search.enabled = true;
  GraphTuner tuner("mlp", m.spec(), m.samples(), options);
  ExternalCandidate ext{"compiled", "{}", Precision::kStrict,
                        [&](std::size_t i) { return std::vector<Tensor>{i == 0 ? m.y1 : m.y3}; }, [] {}};
  tuner.evaluate_external(ext, "TorchCompileBackend", 0);
  const auto& report = tuner.select(max_throughput());
  ASSERT_TRUE(report.winner.has_value()) << report.decision;
  ASSERT_TRUE(report.batch_search.has_value());
  EXPECT_NE(report.batch_search->stop_reason.find("outside ONNX Runtime"), std::string::npos);
  EXPECT_EQ(tuner.take_winner(), nullptr);
}

}  // namespace
}  // namespace aitune
