// Tests that failures are classified by ErrorCode where they are raised (ORT, CUDA), and the enum name tables.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "aitune/error.hpp"
#include "aitune/execution_provider.hpp"
#include "aitune/onnx_session.hpp"
#include "aitune/strategy.hpp"
#include "cuda/cuda_runtime.hpp"
#include "base/enum_names.hpp"
#include "ort/ort_api.hpp"

namespace aitune {
namespace {

TEST(ErrorCodeNames, EveryCodeHasItsOwnName) {
  std::set<std::string_view> names;
  for (int i = 0; i <= static_cast<int>(ErrorCode::kUnsupportedDType); ++i) {
    const auto name = error_code_name(static_cast<ErrorCode>(i));
    EXPECT_TRUE(names.insert(name).second) << "duplicate name " << name << " for code " << i;
  }
  EXPECT_EQ(error_code_name(ErrorCode::kOutOfMemory), "out_of_memory");
  EXPECT_EQ(error_code_name(ErrorCode::kCudaGraphCapture), "cuda_graph_capture");
  EXPECT_EQ(error_code_name(ErrorCode::kBackendUnavailable), "backend_unavailable");
  EXPECT_EQ(error_code_name(ErrorCode::kUnsupportedDType), "unsupported_dtype");
  EXPECT_EQ(error_code_name(ErrorCode::kInvalidArgument), "invalid_argument");
}

// ORT has no code for a failed allocation: the ORT boundary classifies it once.
TEST(OrtFailureCode, AllocationFailuresAreOutOfMemory) {
  for (const char* message :
       {"Failed to allocate memory for requested buffer of size 1073741824",
        "CUDA failure 2: out of memory ; GPU=0 ; hostname=h ; expr=cudaMalloc((void**)&p, size);",
        "std::bad_alloc", "Exception during initialization: BAD_ALLOC"}) {
    EXPECT_EQ(detail::ort_failure_code(Ort::Exception(message, ORT_RUNTIME_EXCEPTION), ErrorCode::kInternal),
              ErrorCode::kOutOfMemory)
        << message;
    EXPECT_EQ(detail::ort_failure_code(Ort::Exception(message, ORT_FAIL), ErrorCode::kCudaGraphCapture),
              ErrorCode::kOutOfMemory)
        << message;
  }
}

TEST(OrtFailureCode, OtherFailuresKeepOrtsCodeOrTheFallback) {
  EXPECT_EQ(detail::ort_failure_code(Ort::Exception("bad option", ORT_INVALID_ARGUMENT), ErrorCode::kInternal),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(detail::ort_failure_code(Ort::Exception("not a model", ORT_INVALID_PROTOBUF), ErrorCode::kInternal),
            ErrorCode::kModelInvalid);
  EXPECT_EQ(detail::ort_failure_code(Ort::Exception("This session contains graph nodes that are assigned to the "
                                                    "default CPU EP, but fallback to CPU EP has been explicitly "
                                                    "disabled by the user.",
                                                    ORT_FAIL),
                                     ErrorCode::kCudaGraphCapture),
            ErrorCode::kCudaGraphCapture);
  EXPECT_EQ(detail::ort_failure_code(Ort::Exception("kernel failed", ORT_FAIL), ErrorCode::kInternal),
            ErrorCode::kInternal);
}

TEST(OrtFailureCode, OrtCallRaisesTheClassifiedCodeWithContext) {
  try {
    detail::ort_call(ErrorCode::kInternal, "running 'm.onnx'",
                     [] { throw Ort::Exception("Failed to allocate memory for requested buffer", ORT_FAIL); });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_EQ(std::string(e.what()).rfind("running 'm.onnx': ", 0), 0u) << e.what();
  }
}

TEST(OrtFailureCode, OrtsSourceLocationAndSignatureLeaveItsMessage) {
  // A probe's opset-99 model: the CLI printed ORT's file, line and a C++ signature.
  const std::string load =
      "Load model from m.onnx failed:/onnxruntime_src/onnxruntime/core/graph/model_load_utils.h:46 void "
      "onnxruntime::model_load_utils::ValidateOpsetForDomain(const std::unordered_map<std::__cxx11::basic_string<char>, "
      "int>&, const onnxruntime::logging::Logger&, bool, const std::string&, int) ONNX Runtime only *guarantees* ...";
  EXPECT_EQ(detail::readable_ort_message(load), "Load model from m.onnx failed:ONNX Runtime only *guarantees* ...");
  const std::string run =
      "Non-zero status code returned while running Add node. Name:'' Status Message: /onnxruntime_src/onnxruntime/core/"
      "providers/cpu/math/element_wise_ops.h:563 void onnxruntime::BroadcastIterator::Init(ptrdiff_t, ptrdiff_t) "
      "axis == 1 || axis == largest was false. Attempting to broadcast an axis by a dimension other than 1. 2 by 3";
  EXPECT_EQ(detail::readable_ort_message(run),
            "Non-zero status code returned while running Add node. Name:'' Status Message: axis == 1 || axis == largest "
            "was false. Attempting to broadcast an axis by a dimension other than 1. 2 by 3");
  EXPECT_EQ(detail::readable_ort_message("no location here (x)"), "no location here (x)");
  try {
    detail::ort_call(ErrorCode::kInternal, "loading", [&] { throw Ort::Exception(std::string(load), ORT_FAIL); });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("onnxruntime_src"), std::string::npos) << e.what();
  }
}

TEST(CudaCheck, MemoryAllocationStatusIsOutOfMemory) {
  EXPECT_NO_THROW(detail::cuda_check(0, "cudaMalloc"));
  try {
    detail::cuda_check(detail::kCudaErrorMemoryAllocation, "cudaMallocAsync");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("cudaMallocAsync failed"), std::string::npos) << e.what();
  }
  try {
    detail::cuda_check(700, "cudaMemcpyAsync");  // cudaErrorIllegalAddress
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
  }
}

enum class Color { kRed, kGreen, kBlue };
constexpr detail::EnumNames<Color, 3> kColors{{{Color::kRed, "red"}, {Color::kGreen, "green"}, {Color::kBlue, "blue"}}};

TEST(EnumNames, NamesParsingAndTheErrorListingValidValues) {
  static_assert(detail::enum_name(kColors, Color::kGreen) == "green");
  static_assert(detail::enum_value(kColors, "blue") == Color::kBlue);
  EXPECT_EQ(detail::enum_name(kColors, static_cast<Color>(7)), "?");
  EXPECT_EQ(detail::enum_name(kColors, static_cast<Color>(7), "red"), "red");
  EXPECT_FALSE(detail::enum_value(kColors, "Blue").has_value());  // exact spelling only
  EXPECT_EQ(detail::enum_names_list(kColors), "red, green, blue");
  EXPECT_EQ(detail::parse_enum(kColors, "red", "color"), Color::kRed);
  try {
    detail::parse_enum(kColors, "mauve", "color");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()), "unknown color 'mauve'; valid values: red, green, blue");
  }
}

// The engine's tables: every value's name parses back to it.
TEST(EnumNames, EngineTablesRoundTrip) {
  for (auto p : {ExecutionProvider::kCPU, ExecutionProvider::kCUDA, ExecutionProvider::kTensorRT}) {
    EXPECT_EQ(parse_execution_provider(execution_provider_name(p)), p);
    EXPECT_EQ(parse_execution_provider(execution_provider_ort_name(p)), p);
  }
  for (auto k : {StrategyKind::kOneBackend, StrategyKind::kFirstWins, StrategyKind::kMaxThroughput,
                 StrategyKind::kMinLatency, StrategyKind::kLatencyBudget})
    EXPECT_EQ(parse_strategy_kind(strategy_kind_name(k)), k);
  for (auto l : {GraphOptimizationLevel::kDisableAll, GraphOptimizationLevel::kBasic, GraphOptimizationLevel::kExtended,
                 GraphOptimizationLevel::kAll})
    EXPECT_EQ(parse_graph_optimization_level(graph_optimization_level_name(l)), l);
  std::set<std::string_view> statuses;
  for (int i = 0; i <= static_cast<int>(CandidateStatus::kSlowerThanEager); ++i)
    EXPECT_TRUE(statuses.insert(candidate_status_name(static_cast<CandidateStatus>(i))).second) << i;
  EXPECT_EQ(session_state_name(SessionState::kInactive), "inactive");
}

}  // namespace
}  // namespace aitune
