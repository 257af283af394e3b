// GPU diagnostic (not part of the library): which ONNX Runtime CUDA-provider set-ups give
// correct outputs with CUDA graphs when inputs change between replays, and whether the
// provider honours a caller's stream (user_compute_stream). Each case prints one line.
//
//   probe_cuda_graph MODEL.onnx BATCH
// Build: g++ -O2 -std=c++20 -I$ORT/include -I/usr/local/cuda/include probe_cuda_graph.cpp
//        -L$ORT/lib -l:libonnxruntime.so.1 -L/usr/local/cuda/lib64 -lcudart
#include <cuda_runtime.h>
#include <onnxruntime_cxx_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(3);
  }
}

struct Probe {
  Ort::Env env{ORT_LOGGING_LEVEL_WARNING, "probe"};
  Ort::ConstEpDevice device{nullptr};
  std::string model;
  std::vector<int64_t> in_shape, out_shape;
  std::string in_name, out_name;
  size_t in_n = 0, out_n = 0;
  std::vector<std::vector<float>> xs, refs;

  Ort::Session session(std::unordered_map<std::string, std::string> options) {
    Ort::SessionOptions so;
    so.AppendExecutionProvider_V2(env, {device}, options);
    return Ort::Session(env, model.c_str(), so);
  }
  Ort::MemoryInfo gpu_mem() const { return Ort::MemoryInfo("Cuda", OrtDeviceAllocator, 0, OrtMemTypeDefault); }
  const OrtMemoryInfo* ep_mem() const { return device.GetMemoryInfo(OrtDeviceMemoryType_DEFAULT); }

  // Which recorded input the output matches best, and by how much it misses the right one.
  std::string judge(const std::vector<float>& out, size_t k) const {
    double err_right = 0;
    int best = -1;
    double best_err = 1e30;
    for (size_t j = 0; j < refs.size(); ++j) {
      double e = 0;
      for (size_t i = 0; i < out_n; ++i) e = std::max(e, std::fabs(double(out[i]) - refs[j][i]));
      if (j == k) err_right = e;
      if (e < best_err) best_err = e, best = int(j);
    }
    char buf[160];
    std::snprintf(buf, sizeof buf, "call %zu: err %.2e%s", k, err_right,
                  best == int(k) ? "" : (" STALE(matches input " + std::to_string(best) + ")").c_str());
    return buf;
  }
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void CUDART_CB sleep_host(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

// A CUDA graph case: fixed device input/output buffers bound once, inputs written before
// each call by `write_input`, outputs read by `read_output`.
void graph_case(Probe& p, const char* label, std::unordered_map<std::string, std::string> options,
                cudaStream_t stream, bool own_output_buffer, bool disable_sync, bool churn) {
  auto s = p.session(options);
  float *d_in = nullptr, *d_out = nullptr;
  cuda_check(cudaMalloc(&d_in, p.in_n * 4), "malloc in");
  auto mem = p.gpu_mem();
  Ort::Value in = Ort::Value::CreateTensor<float>(mem, d_in, p.in_n, p.in_shape.data(), p.in_shape.size());
  Ort::Value out{nullptr};
  Ort::IoBinding b(s);
  b.BindInput(p.in_name.c_str(), in);
  if (own_output_buffer) {
    cuda_check(cudaMalloc(&d_out, p.out_n * 4), "malloc out");
    out = Ort::Value::CreateTensor<float>(mem, d_out, p.out_n, p.out_shape.data(), p.out_shape.size());
    b.BindOutput(p.out_name.c_str(), out);
  } else {
    b.BindOutput(p.out_name.c_str(), Ort::ConstMemoryInfo(p.ep_mem()));
  }
  Ort::RunOptions ro;
  ro.AddConfigEntry("gpu_graph_id", "1");
  if (disable_sync) ro.AddConfigEntry("disable_synchronize_execution_providers", "1");
  Ort::Allocator arena(s, p.ep_mem());
  std::string line = std::string(label) + ":";
  std::vector<float> host(p.out_n);
  for (size_t k = 0; k < p.xs.size(); ++k) {
    cuda_check(cudaMemcpyAsync(d_in, p.xs[k].data(), p.in_n * 4, cudaMemcpyHostToDevice, stream), "copy in");
    if (stream == nullptr) cuda_check(cudaDeviceSynchronize(), "sync");
    try {
      s.Run(ro, b);
    } catch (const Ort::Exception& e) {
      std::printf("%s RUN FAILED at call %zu: %s\n", label, k, e.what());
      return;
    }
    const float* src = own_output_buffer ? d_out : b.GetOutputValues()[0].GetTensorData<float>();
    cuda_check(cudaMemcpyAsync(host.data(), src, p.out_n * 4, cudaMemcpyDeviceToHost, stream), "copy out");
    if (stream) cuda_check(cudaStreamSynchronize(stream), "stream sync");
    cuda_check(cudaDeviceSynchronize(), "sync");
    line += " [" + p.judge(host, k) + "]";
    if (churn) {  // what handing out copies did: allocations from the session's arena
      std::vector<Ort::Value> junk;
      for (int j = 0; j < 4; ++j)
        junk.push_back(Ort::Value::CreateTensor<float>(arena, p.out_shape.data(), p.out_shape.size()));
      for (auto& v : junk) cuda_check(cudaMemset(v.GetTensorMutableData<float>(), 0x7f, p.out_n * 4), "memset");
      cuda_check(cudaDeviceSynchronize(), "sync");
    }
  }
  std::printf("%s\n", line.c_str());
  cudaFree(d_in);
  if (d_out) cudaFree(d_out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  Probe p;
  p.model = argv[1];
  int64_t batch = std::stoll(argv[2]);
  const char* ort_dir = std::getenv("ORT_LIB_DIR");
  p.env.RegisterExecutionProviderLibrary("cuda", (std::filesystem::path(ort_dir ? ort_dir : ".") /
                                                  "libonnxruntime_providers_cuda.so").string());
  for (auto d : p.env.GetEpDevices())
    if (std::string(d.EpName()) == "CUDAExecutionProvider") p.device = d;
  {
    Ort::Session s = p.session({{"use_tf32", "0"}});
    Ort::AllocatorWithDefaultOptions a;
    p.in_name = s.GetInputNameAllocated(0, a).get();
    p.out_name = s.GetOutputNameAllocated(0, a).get();
    p.in_shape = s.GetInputTypeInfo(0).GetTensorTypeAndShapeInfo().GetShape();
    for (auto& d : p.in_shape) if (d < 0) d = batch;
    p.in_n = 1;
    for (auto d : p.in_shape) p.in_n *= size_t(d);
    std::mt19937 rng(0);
    std::uniform_real_distribution<float> dist(-1, 1);
    Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
    for (int k = 0; k < 5; ++k) {
      auto& x = p.xs.emplace_back(p.in_n);
      for (auto& v : x) v = dist(rng);
      Ort::Value xv = Ort::Value::CreateTensor<float>(cpu, x.data(), p.in_n, p.in_shape.data(), p.in_shape.size());
      const char* in_names[] = {p.in_name.c_str()};
      const char* out_names[] = {p.out_name.c_str()};
      auto outs = s.Run(Ort::RunOptions{nullptr}, in_names, &xv, 1, out_names, 1);
      p.out_shape = outs[0].GetTensorTypeAndShapeInfo().GetShape();
      p.out_n = outs[0].GetTensorTypeAndShapeInfo().GetElementCount();
      p.refs.emplace_back(outs[0].GetTensorData<float>(), outs[0].GetTensorData<float>() + p.out_n);
    }
  }
  // The caller's stream: an OrtSyncStream of the EP device (PROBE_OWN_STREAM=1: cudaStreamCreate).
  cudaStream_t user = nullptr;
  Ort::SyncStream user_sync{nullptr};
  if (std::getenv("PROBE_OWN_STREAM")) {
    cuda_check(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking), "stream");
  } else {
    user_sync = p.device.CreateSyncStream();
    user = static_cast<cudaStream_t>(user_sync.GetHandle());
  }
  std::string user_str = std::to_string(reinterpret_cast<uintptr_t>(user));

  // 1. Is user_compute_stream honoured? A 300 ms host callback queued on the stream first:
  // if ORT runs there, Run (which synchronises its stream) takes >= 300 ms.
  const std::string cases = std::getenv("PROBE_CASES") ? std::getenv("PROBE_CASES") : "123";
  for (bool disable_sync : {false, true}) {
    if (cases.find('1') == std::string::npos) break;
    auto s = p.session({{"use_tf32", "0"}, {"has_user_compute_stream", "1"}, {"user_compute_stream", user_str}});
    float* d_in = nullptr;
    cuda_check(cudaMalloc(&d_in, p.in_n * 4), "malloc");
    cuda_check(cudaMemcpy(d_in, p.xs[0].data(), p.in_n * 4, cudaMemcpyHostToDevice), "copy");
    auto mem = p.gpu_mem();
    Ort::Value in = Ort::Value::CreateTensor<float>(mem, d_in, p.in_n, p.in_shape.data(), p.in_shape.size());
    Ort::IoBinding b(s);
    b.BindInput(p.in_name.c_str(), in);
    b.BindOutput(p.out_name.c_str(), Ort::ConstMemoryInfo(p.ep_mem()));
    Ort::RunOptions ro;
    if (disable_sync) ro.AddConfigEntry("disable_synchronize_execution_providers", "1");
    s.Run(ro, b);  // warm-up
    cuda_check(cudaDeviceSynchronize(), "sync");
    b.ClearBoundOutputs();
    b.BindOutput(p.out_name.c_str(), Ort::ConstMemoryInfo(p.ep_mem()));
    cuda_check(cudaLaunchHostFunc(user, sleep_host, nullptr), "host func");
    auto t0 = std::chrono::steady_clock::now();
    s.Run(ro, b);
    double run_ms = ms_since(t0);
    cuda_check(cudaStreamSynchronize(user), "sync");
    double total_ms = ms_since(t0);
    std::vector<float> host(p.out_n);
    cuda_check(cudaMemcpy(host.data(), b.GetOutputValues()[0].GetTensorData<float>(), p.out_n * 4,
                          cudaMemcpyDeviceToHost), "copy out");
    std::printf("user_compute_stream%s: Run took %.1f ms, stream drained after %.1f ms -> %s; %s\n",
                disable_sync ? " + disable_synchronize_execution_providers" : "", run_ms, total_ms,
                run_ms >= 290 ? "ORT ran on the user stream and waited for it"
                              : (total_ms >= 290 ? "Run returned before the stream drained" : "NOT on the user stream"),
                p.judge(host, 0).c_str());
    cudaFree(d_in);
  }
  // 1b. The same through the V1 options struct (provider bridge) instead of the plugin route.
  if (cases.find('4') != std::string::npos) {
    Ort::SessionOptions so;
    OrtCUDAProviderOptions cuda{};
    cuda.device_id = 0;
    cuda.has_user_compute_stream = 1;
    cuda.user_compute_stream = user;
    so.AppendExecutionProvider_CUDA(cuda);
    Ort::Session s(p.env, p.model.c_str(), so);
    float* d_in = nullptr;
    cuda_check(cudaMalloc(&d_in, p.in_n * 4), "malloc");
    cuda_check(cudaMemcpy(d_in, p.xs[1].data(), p.in_n * 4, cudaMemcpyHostToDevice), "copy");
    auto mem = p.gpu_mem();
    Ort::Value in = Ort::Value::CreateTensor<float>(mem, d_in, p.in_n, p.in_shape.data(), p.in_shape.size());
    Ort::IoBinding b(s);
    b.BindInput(p.in_name.c_str(), in);
    b.BindOutput(p.out_name.c_str(), mem);
    Ort::RunOptions ro;
    s.Run(ro, b);
    cuda_check(cudaDeviceSynchronize(), "sync");
    b.ClearBoundOutputs();
    b.BindOutput(p.out_name.c_str(), mem);
    cuda_check(cudaLaunchHostFunc(user, sleep_host, nullptr), "host func");
    auto t0 = std::chrono::steady_clock::now();
    s.Run(ro, b);
    double run_ms = ms_since(t0);
    cuda_check(cudaStreamSynchronize(user), "sync");
    std::vector<float> host(p.out_n);
    cuda_check(cudaMemcpy(host.data(), b.GetOutputValues()[0].GetTensorData<float>(), p.out_n * 4,
                          cudaMemcpyDeviceToHost), "copy out");
    std::printf("V1 struct user stream: Run took %.1f ms -> %s; %s (default use_tf32)\n", run_ms,
                run_ms >= 290 ? "ORT ran on the user stream" : "NOT on the user stream", p.judge(host, 1).c_str());
    cudaFree(d_in);
  }
  // 1c. Plugin route, user_compute_stream = the handle of an OrtSyncStream of the EP device
  // (the pattern the provider's factory describes), has_user_compute_stream=1.
  if (cases.find('5') != std::string::npos) {
    Ort::SyncStream sync = p.device.CreateSyncStream();
    auto handle = static_cast<cudaStream_t>(sync.GetHandle());
    auto s = p.session({{"use_tf32", "0"}, {"has_user_compute_stream", "1"},
                        {"user_compute_stream", std::to_string(reinterpret_cast<uintptr_t>(handle))}});
    std::printf("session created\n");
    std::fflush(stdout);
    float* d_in = nullptr;
    cuda_check(cudaMalloc(&d_in, p.in_n * 4), "malloc");
    cuda_check(cudaMemcpy(d_in, p.xs[2].data(), p.in_n * 4, cudaMemcpyHostToDevice), "copy");
    auto mem = p.gpu_mem();
    Ort::Value in = Ort::Value::CreateTensor<float>(mem, d_in, p.in_n, p.in_shape.data(), p.in_shape.size());
    const char* in_names[] = {p.in_name.c_str()};
    const char* out_names[] = {p.out_name.c_str()};
    cuda_check(cudaLaunchHostFunc(handle, sleep_host, nullptr), "host func");
    auto t0 = std::chrono::steady_clock::now();
    auto outs = s.Run(Ort::RunOptions{nullptr}, in_names, &in, 1, out_names, 1);
    double run_ms = ms_since(t0);
    cuda_check(cudaDeviceSynchronize(), "sync");
    // A Run without IoBinding returns outputs in host memory.
    std::vector<float> host(outs[0].GetTensorData<float>(), outs[0].GetTensorData<float>() + p.out_n);
    std::printf("plugin route, OrtSyncStream handle as user stream: Run took %.1f ms -> %s; %s\n", run_ms,
                run_ms >= 290 ? "ORT ran on the stream" : "NOT on the stream", p.judge(host, 2).c_str());
  }
  // 2. RunOptions::SetSyncStream with an OrtSyncStream of the EP device.
  if (cases.find('2') != std::string::npos) {
    auto s = p.session({{"use_tf32", "0"}});
    std::printf("SetSyncStream case starts\n");
    std::fflush(stdout);
    try {
      Ort::SyncStream sync = p.device.CreateSyncStream();
      std::printf("sync stream created\n");
      std::fflush(stdout);
      auto handle = static_cast<cudaStream_t>(sync.GetHandle());
      float* d_in = nullptr;
      cuda_check(cudaMalloc(&d_in, p.in_n * 4), "malloc");
      cuda_check(cudaMemcpy(d_in, p.xs[0].data(), p.in_n * 4, cudaMemcpyHostToDevice), "copy");
      auto mem = p.gpu_mem();
      Ort::Value in = Ort::Value::CreateTensor<float>(mem, d_in, p.in_n, p.in_shape.data(), p.in_shape.size());
      Ort::IoBinding b(s);
      b.BindInput(p.in_name.c_str(), in);
      b.BindOutput(p.out_name.c_str(), Ort::ConstMemoryInfo(p.ep_mem()));
      Ort::RunOptions ro;
      ro.SetSyncStream(sync);
      s.Run(ro, b);
      cuda_check(cudaDeviceSynchronize(), "sync");
      b.ClearBoundOutputs();
      b.BindOutput(p.out_name.c_str(), Ort::ConstMemoryInfo(p.ep_mem()));
      cuda_check(cudaLaunchHostFunc(handle, sleep_host, nullptr), "host func");
      auto t0 = std::chrono::steady_clock::now();
      s.Run(ro, b);
      double run_ms = ms_since(t0);
      cuda_check(cudaDeviceSynchronize(), "sync");
      std::printf("RunOptions::SetSyncStream: Run took %.1f ms -> %s\n", run_ms,
                  run_ms >= 290 ? "ORT ran on (or waited for) the given stream" : "the given stream was not used");
      cudaFree(d_in);
    } catch (const Ort::Exception& e) {
      std::printf("RunOptions::SetSyncStream: %s\n", e.what());
    }
  }
  // 3. CUDA graphs.
  std::unordered_map<std::string, std::string> graph{{"use_tf32", "0"}, {"enable_cuda_graph", "1"}};
  auto with_user = graph;
  with_user["user_compute_stream"] = user_str;
  with_user["has_user_compute_stream"] = "1";
  if (cases.find('3') == std::string::npos) return 0;
  if (cases.find('6') != std::string::npos) {
    graph_case(p, "graph, ORT stream, ORT-allocated output, device syncs", graph, nullptr, false, false, false);
    graph_case(p, "graph, ORT stream, own output buffer, device syncs", graph, nullptr, true, false, false);
    graph_case(p, "graph, ORT stream, ORT-allocated output, arena churn", graph, nullptr, false, false, true);
  }
  graph_case(p, "graph, user stream, ORT-allocated output", with_user, user, false, false, false);
  graph_case(p, "graph, user stream, own output buffer", with_user, user, true, false, false);
  graph_case(p, "graph, user stream, own output buffer, no sync", with_user, user, true, true, false);
  graph_case(p, "graph, user stream, ORT-allocated output, arena churn", with_user, user, false, false, true);
  return 0;
}
