// The provider registry is open: a provider registered here (a dummy, test-only) is seen
// by name parsing, the candidate plan, availability, `aitune doctor` and Triton export,
// with no edit anywhere else. Built-ins keep their descriptions.
#include <iostream>
#include <sstream>

#include "aitune/candidates.hpp"
#include "aitune/triton_export.hpp"
#include "providers/provider_registry.hpp"
#include "test_support.hpp"
#ifdef AITUNE_TEST_HAS_CLI
#include "cli.hpp"
#endif

namespace aitune {
namespace {

using test::expect_error;

// A provider with no session support: options, two variants, a Triton block, a doctor line.
ProviderDescription dummy_provider() {
  ProviderDescription d;
  d.name = "dummyep";
  d.ort_name = "DummyExecutionProvider";
  d.capabilities = {.device_memory = false, .cuda_graph = false, .fp16_model = false, .contrib_operators = false};
  d.option_names = {"dummy_level"};
  d.variants = [](const OnnxSessionConfig&, const GraphSpec&) {
    return std::vector<ProviderVariant>{{{{"dummy_level", "1"}}, Precision::kStrict, {}, {}},
                                        {{{"dummy_level", "2"}}, Precision::kFP16, {}, {}}};
  };
  d.probe = [](OrtRuntime::Impl&) {
    ProviderStatus s;
    s.reason = "dummyep is a test provider";
    return s;
  };
  d.doctor_details = [](const ProviderStatus&) { return std::vector<std::string>{"dummy doctor check"}; };
  d.triton = [](const OnnxSessionConfig& config, const std::map<std::string, std::string>&) {
    TritonProviderBlock block;
    block.accelerator_name = "dummy_accelerator";
    for (const auto& [k, v] : config.provider_options) block.accelerator[k] = v;
    return block;
  };
  return d;
}

const ExecutionProvider kDummy{"dummyep"};

GraphSpec static_spec() {
  GraphSpecBuilder b;
  b.record({{"x", DType::kFloat32, {4, 16}}}, {{"y", DType::kFloat32, {4, 8}}}, 4);
  return b.build();
}

class ProviderRegistry : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { register_execution_provider(dummy_provider()); }
};

TEST_F(ProviderRegistry, BuiltinsAreRegisteredFirst) {
  auto all = registered_execution_providers();
  ASSERT_GE(all.size(), 3u);
  EXPECT_EQ(all[0], ExecutionProvider::kCPU);
  EXPECT_EQ(all[1], ExecutionProvider::kCUDA);
  EXPECT_EQ(all[2], ExecutionProvider::kTensorRT);
  EXPECT_TRUE(provider_capabilities(ExecutionProvider::kCUDA).cuda_graph);
  EXPECT_FALSE(provider_capabilities(ExecutionProvider::kTensorRT).contrib_operators);
  EXPECT_FALSE(provider_capabilities(ExecutionProvider::kCPU).device_memory);
}

TEST_F(ProviderRegistry, ARegisteredProviderIsParsedAndListed) {
  EXPECT_EQ(parse_execution_provider("dummyep"), kDummy);
  EXPECT_EQ(parse_execution_provider("DummyExecutionProvider"), kDummy);
  EXPECT_EQ(execution_provider_ort_name(kDummy), "DummyExecutionProvider");
  auto all = registered_execution_providers();
  EXPECT_NE(std::find(all.begin(), all.end(), kDummy), all.end());
  expect_error([] { parse_execution_provider("rocm"); }, ErrorCode::kInvalidArgument, {"rocm", "dummyep"});
  // Its configuration round-trips through the session JSON.
  OnnxSessionConfig config;
  config.provider = parse_execution_provider("dummyep");
  EXPECT_EQ(OnnxSessionConfig::from_json(config.to_json()).provider, kDummy);
  EXPECT_EQ(config.device(), Device::cpu());
}

TEST_F(ProviderRegistry, NamesAreUnique) {
  auto twice = dummy_provider();
  expect_error([&] { register_execution_provider(twice); }, ErrorCode::kInvalidArgument, {"dummyep", "registered"});
  auto upper = dummy_provider();
  upper.name = "Other";
  expect_error([&] { register_execution_provider(upper); }, ErrorCode::kInvalidArgument, {"lower case"});
}

TEST_F(ProviderRegistry, TheCandidatePlanUsesItsVariantsAndCapabilities) {
  CandidateRequest request;
  request.base.provider = kDummy;
  request.spec = static_spec();
  auto plan = plan_candidates(request);
  // Its two variants; no fp16 model (fp16_model false), no fusions (no contrib operators).
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].name, "dummyep[dummy_level=1]");
  EXPECT_EQ(plan[0].precision, Precision::kStrict);
  EXPECT_EQ(plan[1].name, "dummyep[dummy_level=2]");
  EXPECT_EQ(plan[1].precision, Precision::kFP16);
  request.precision_limit = Precision::kStrict;
  EXPECT_EQ(plan_candidates(request).size(), 1u);
}

TEST_F(ProviderRegistry, AvailabilityAndDoctorComeFromItsDescription) {
  auto status = test::runtime()->provider_status(kDummy);
  EXPECT_FALSE(status.available);
  EXPECT_EQ(status.reason, "dummyep is a test provider");
  EXPECT_EQ(provider_doctor_details(status), std::vector<std::string>{"dummy doctor check"});
#ifdef AITUNE_TEST_HAS_CLI
  std::ostringstream out;
  auto* old = std::cout.rdbuf(out.rdbuf());
  int code = cli::run({"aitune", "doctor"});
  std::cout.rdbuf(old);
  EXPECT_EQ(code, 0) << out.str();
  EXPECT_NE(out.str().find("dummyep   unavailable: dummyep is a test provider"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("dummy doctor check"), std::string::npos) << out.str();
#endif
}

TEST_F(ProviderRegistry, SessionsNeedItsAppendHook) {
  OnnxSessionConfig config;
  config.provider = kDummy;
  expect_error([&] { OnnxSession::create(test::fixture("mlp.onnx"), config); }, ErrorCode::kProviderUnavailable,
               {"dummyep", "cannot create sessions"});
}

TEST_F(ProviderRegistry, TritonExportWritesItsBlock) {
  CheckpointGraph graph;
  graph.key = "g";
  graph.graph_spec = static_spec();
  graph.backend_config.provider = kDummy;
  graph.backend_config.provider_options = {{"dummy_level", "2"}};
  auto config = triton_model_config(graph, "m", std::nullopt, 1, {});
  EXPECT_NE(config.text.find("name: \"dummy_accelerator\""), std::string::npos) << config.text;
  EXPECT_NE(config.text.find("key: \"dummy_level\" value: \"2\""), std::string::npos) << config.text;
  EXPECT_NE(config.text.find("KIND_CPU"), std::string::npos) << config.text;
}

}  // namespace
}  // namespace aitune
