// Tests that CUDA-graph sessions are capture-safe by construction: refused up front, typed failures, no capture left open.
#include <atomic>
#include <thread>

#include "cuda/cuda_stream.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {

using test::expect_allclose_f32;
using test::expect_error;
using test::fixture;

OnnxSessionConfig graph_config() {
  OnnxSessionConfig config = test::cuda_config();
  config.provider_options = {{"use_tf32", "0"}, {"enable_cuda_graph", "1"}};
  return config;
}

// Checked before any session exists, so it runs without a GPU too.
TEST(CudaGraphSafety, CpuFallbackCannotBeReenabledForAGraphSession) {
  OnnxSessionConfig config = graph_config();
  config.session_config["session.disable_cpu_ep_fallback"] = "0";
  expect_error([&] { OnnxSession::create(fixture("mlp.onnx"), config); },
               test::ErrorExpectation{{ErrorCode::kInvalidArgument}, {"enable_cuda_graph"},
                                      {"session.disable_cpu_ep_fallback"}});
}

TEST(CudaGraphSafety, ModelWithANodeOffTheCudaProviderIsRefusedBeforeCapture) {
  AITUNE_REQUIRE_CUDA();
  // ORT's CUDA provider has no Det kernel. Without a graph the node runs on the CPU...
  OnnxSessionConfig plain = graph_config();
  plain.provider_options.erase("enable_cuda_graph");
  auto fallback = OnnxSession::create(fixture("det.onnx"), plain);
  const Tensor m = test::make_host<float>(DType::kFloat32, {2, 3, 3},
                                          {2, 0, 0, 0, 2, 0, 0, 0, 2, 1, 2, 3, 0, 1, 4, 5, 6, 0});
  const Tensor d = fallback->to_host(fallback->infer({fallback->to_device(m).view()}).at(0));
  expect_allclose_f32(d, test::make_host<float>(DType::kFloat32, {2}, {8, 1}), 1e-4);
  // ...a graph session refuses it at creation, saying why, instead of capturing host work.
  const std::string message =
      expect_error([&] { OnnxSession::create(fixture("det.onnx"), graph_config()); },
                   test::ErrorExpectation{{ErrorCode::kCudaGraphCapture}, {"det.onnx"}, {"CPU"}});
  EXPECT_NE(message.find("CUDA graph"), std::string::npos) << message;
}

TEST(CudaGraphSafety, ReplaysLeaveNoCaptureOpen) {
  AITUNE_REQUIRE_CUDA();
  auto graph = OnnxSession::create(fixture("mlp.onnx"), graph_config());
  auto cpu = OnnxSession::create(fixture("mlp.onnx"), test::cpu_config());
  for (int call = 0; call < 6; ++call) {
    const Tensor x = test::make_pattern_f32({4, 64}, static_cast<uint32_t>(70 + call));
    const Tensor y = graph->infer({graph->to_device(x).view()}).at(0);
    EXPECT_FALSE(detail::stream_is_capturing(graph->cuda_stream())) << "call " << call;
    expect_allclose_f32(graph->to_host(y), cpu->infer({x.view()}).at(0), 1e-5);
  }
}

// to_device on a graph session synchronises the session's stream; a sync while another
// thread's call is capturing on that stream would invalidate the capture. to_device takes
// the runner's lock, so copies made while other threads capture new shapes never break them.
TEST(CudaGraphSafety, ToDeviceDuringCapturesLeavesThemIntact) {
  AITUNE_REQUIRE_CUDA();
  auto graph = OnnxSession::create(fixture("mlp.onnx"), graph_config());
  auto cpu = OnnxSession::create(fixture("mlp.onnx"), test::cpu_config());
  std::atomic<bool> stop{false};
  std::atomic<int> copies{0};
  std::thread copier([&] {
    const Tensor x = test::make_pattern_f32({2, 64}, 5);
    while (!stop) {
      (void)graph->to_device(x);
      ++copies;
    }
  });
  std::vector<std::string> failures;
  for (int round = 0; round < 3; ++round)
    for (int batch = 1; batch <= 6; ++batch) {  // every batch a new shape: a capture each first time
      const Tensor x = test::make_pattern_f32({batch, 64}, static_cast<uint32_t>(100 + batch));
      try {
        const Tensor y = graph->to_host(graph->infer({graph->to_device(x).view()}).at(0));
        expect_allclose_f32(y, cpu->infer({x.view()}).at(0), 1e-5);
      } catch (const Error& e) {
        failures.push_back(e.what());
      }
    }
  stop = true;
  copier.join();
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_GT(copies.load(), 0);
  EXPECT_FALSE(detail::stream_is_capturing(graph->cuda_stream()));
}

// NonZero's CUDA kernel copies a count to the host, which a stream cannot do while it
// captures. Whatever this ORT build does with it, a failure must be typed, the stream must
// not be left capturing, later calls must fail the same way, and CUDA must stay usable.
TEST(CudaGraphSafety, FailedCaptureIsTypedAndLeavesCudaUsable) {
  AITUNE_REQUIRE_CUDA();
  std::unique_ptr<OnnxSession> graph;
  try {
    graph = OnnxSession::create(fixture("nonzero.onnx"), graph_config());
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCudaGraphCapture) << e.what();
  }
  if (graph) {
    auto cpu = OnnxSession::create(fixture("nonzero.onnx"), test::cpu_config());
    std::optional<std::string> failure;
    for (int call = 0; call < 5 && !failure; ++call) {
      Tensor x = test::make_pattern_f32({4, 8}, static_cast<uint32_t>(30 + call));
      try {
        const Tensor got = graph->to_host(graph->infer({graph->to_device(x).view()}).at(0));
        const Tensor want = cpu->infer({x.view()}).at(0);
        EXPECT_EQ(got.shape(), want.shape()) << "call " << call;
        EXPECT_EQ(test::values_of<int64_t>(got), test::values_of<int64_t>(want)) << "call " << call;
      } catch (const Error& e) {
        failure = e.what();
        EXPECT_EQ(e.code(), ErrorCode::kCudaGraphCapture) << e.what();
        EXPECT_NE(failure->find("nonzero.onnx"), std::string::npos) << *failure;
      }
      EXPECT_FALSE(detail::stream_is_capturing(graph->cuda_stream())) << "call " << call;
    }
    if (failure) {
      const Tensor x = test::make_pattern_f32({4, 8}, 99);
      expect_error([&] { graph->infer({graph->to_device(x).view()}); },
                   test::ErrorExpectation{{ErrorCode::kCudaGraphCapture}, {}, {"deactivate"}});
      std::cout << "[ info ] the capture failed as a typed error: " << *failure << "\n";
    } else {
      std::cout << "[ info ] this ORT build captured NonZero and replayed it correctly\n";
    }
  }
  // The process's CUDA context is healthy: a new session, graphs included, still computes.
  auto after = OnnxSession::create(fixture("mlp.onnx"), graph_config());
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  expect_allclose_f32(after->to_host(after->infer({after->to_device(x).view()}).at(0)),
                      test::load_fixture_npy("mlp_y.npy"), 1e-4);
}

}  // namespace
}  // namespace aitune
