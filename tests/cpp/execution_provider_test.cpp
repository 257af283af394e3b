// Tests for ExecutionProvider names and parsing.
#include "test_support.hpp"

namespace aitune {
namespace {

using test::expect_error;

const std::vector<ExecutionProvider> kAll = {ExecutionProvider::kCPU, ExecutionProvider::kCUDA,
                                             ExecutionProvider::kTensorRT};

TEST(ExecutionProvider, Names) {
  EXPECT_EQ(execution_provider_name(ExecutionProvider::kCPU), "cpu");
  EXPECT_EQ(execution_provider_name(ExecutionProvider::kCUDA), "cuda");
  EXPECT_EQ(execution_provider_name(ExecutionProvider::kTensorRT), "tensorrt");
  EXPECT_EQ(execution_provider_ort_name(ExecutionProvider::kCPU), "CPUExecutionProvider");
  EXPECT_EQ(execution_provider_ort_name(ExecutionProvider::kCUDA), "CUDAExecutionProvider");
  EXPECT_EQ(execution_provider_ort_name(ExecutionProvider::kTensorRT), "TensorrtExecutionProvider");
}

TEST(ExecutionProvider, ParseSpellings) {
  EXPECT_EQ(parse_execution_provider("cpu"), ExecutionProvider::kCPU);
  EXPECT_EQ(parse_execution_provider("CPU"), ExecutionProvider::kCPU);
  EXPECT_EQ(parse_execution_provider("cuda"), ExecutionProvider::kCUDA);
  EXPECT_EQ(parse_execution_provider("CUDA"), ExecutionProvider::kCUDA);
  EXPECT_EQ(parse_execution_provider("Cuda"), ExecutionProvider::kCUDA);
  EXPECT_EQ(parse_execution_provider("tensorrt"), ExecutionProvider::kTensorRT);
  EXPECT_EQ(parse_execution_provider("TensorRT"), ExecutionProvider::kTensorRT);
  EXPECT_EQ(parse_execution_provider("TENSORRT"), ExecutionProvider::kTensorRT);
  EXPECT_EQ(parse_execution_provider("CPUExecutionProvider"), ExecutionProvider::kCPU);
  EXPECT_EQ(parse_execution_provider("CUDAExecutionProvider"), ExecutionProvider::kCUDA);
  EXPECT_EQ(parse_execution_provider("cudaexecutionprovider"), ExecutionProvider::kCUDA);
  EXPECT_EQ(parse_execution_provider("TensorrtExecutionProvider"), ExecutionProvider::kTensorRT);
}

TEST(ExecutionProvider, NamesRoundTrip) {
  for (ExecutionProvider p : kAll) {
    SCOPED_TRACE(std::string(execution_provider_name(p)));
    EXPECT_EQ(parse_execution_provider(execution_provider_name(p)), p);
    EXPECT_EQ(parse_execution_provider(execution_provider_ort_name(p)), p);
  }
}

TEST(ExecutionProvider, UnknownThrowsInvalidArgumentListingValues) {
  expect_error([] { parse_execution_provider("rocm"); }, ErrorCode::kInvalidArgument,
               {"rocm", "cpu", "cuda", "tensorrt"});
  expect_error([] { parse_execution_provider(""); }, ErrorCode::kInvalidArgument, {"cpu", "cuda", "tensorrt"});
  expect_error([] { parse_execution_provider("ROCMExecutionProvider"); }, ErrorCode::kInvalidArgument,
               {"ROCMExecutionProvider"});
  expect_error([] { parse_execution_provider("cudax"); }, ErrorCode::kInvalidArgument, {"cudax"});
}

}  // namespace
}  // namespace aitune
