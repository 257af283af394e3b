// The floor aitune is measured against: a bare ONNX Runtime C++ IOBinding loop, no
// aitune code. Inputs are bound once on the device; outputs are bound to device memory
// and allocated by ORT each run, as aitune's path does; one sync per call.
//
//   raw_ort_loop MODEL.onnx PROVIDER(cpu|cuda) BATCH ITERATIONS [KEY=VALUE ...]
// Prints "p50_us=<x> p90_us=<y> mean_us=<z>". Needs libonnxruntime.so at link time and
// the CUDA provider next to it for `cuda`.
#include <dlfcn.h>
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s MODEL PROVIDER BATCH ITERATIONS [KEY=VALUE ...]\n", argv[0]);
    return 2;
  }
  std::string model = argv[1], provider = argv[2];
  int64_t batch = std::stoll(argv[3]);
  int iterations = std::stoi(argv[4]);
  std::unordered_map<std::string, std::string> options;
  for (int i = 5; i < argc; ++i) {
    std::string kv = argv[i];
    options[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  }
  Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "raw");
  Ort::SessionOptions so;
  Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
  const OrtMemoryInfo* device_mem = cpu;
  std::vector<Ort::ConstEpDevice> devices;
  if (provider == "cuda") {
    auto lib = std::filesystem::path(std::getenv("ORT_LIB_DIR") ? std::getenv("ORT_LIB_DIR") : ".") /
               "libonnxruntime_providers_cuda.so";
    env.RegisterExecutionProviderLibrary("cuda", lib.string());
    for (auto d : env.GetEpDevices())
      if (std::string(d.EpName()) == "CUDAExecutionProvider") devices.push_back(d);
    so.AppendExecutionProvider_V2(env, {devices.at(0)}, options);
    device_mem = devices[0].GetMemoryInfo(OrtDeviceMemoryType_DEFAULT);
  }
  Ort::Session session(env, model.c_str(), so);
  Ort::AllocatorWithDefaultOptions alloc;
  Ort::IoBinding binding(session);
  std::vector<Ort::Value> host_inputs, inputs;
  std::vector<std::string> names;
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<std::vector<float>> buffers;
  // Device tensors return their memory to this allocator, so it outlives them.
  std::optional<Ort::Allocator> dev_alloc;
  if (provider == "cuda") dev_alloc.emplace(session, device_mem);
  for (size_t i = 0; i < session.GetInputCount(); ++i) {
    auto shape = session.GetInputTypeInfo(i).GetTensorTypeAndShapeInfo().GetShape();
    for (auto& d : shape)
      if (d < 0) d = batch;
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    auto& buf = buffers.emplace_back(n);
    for (auto& v : buf) v = dist(rng);
    host_inputs.push_back(Ort::Value::CreateTensor<float>(cpu, buf.data(), n, shape.data(), shape.size()));
    if (provider == "cuda") {
      inputs.push_back(Ort::Value::CreateTensor(*dev_alloc, shape.data(), shape.size(),
                                                ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT));
    }
    names.push_back(session.GetInputNameAllocated(i, alloc).get());
  }
  if (provider == "cuda") {
    Ort::Status st = env.CopyTensors(host_inputs, inputs, nullptr);
    if (!st.IsOK()) throw Ort::Exception(st.GetErrorMessage(), st.GetErrorCode());
  } else {
    inputs = std::move(host_inputs);
  }
  for (size_t i = 0; i < inputs.size(); ++i) binding.BindInput(names[i].c_str(), inputs[i]);
  std::vector<std::string> out_names;
  for (size_t i = 0; i < session.GetOutputCount(); ++i) out_names.push_back(session.GetOutputNameAllocated(i, alloc).get());
  for (auto& n : out_names) binding.BindOutput(n.c_str(), Ort::ConstMemoryInfo(device_mem));
  Ort::RunOptions run_options;
  for (int i = 0; i < 20; ++i) {
    session.Run(run_options, binding);
    binding.SynchronizeOutputs();
  }
  std::vector<double> samples;
  for (int i = 0; i < iterations; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    session.Run(run_options, binding);
    binding.SynchronizeOutputs();
    samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(samples.begin(), samples.end());
  double mean = 0;
  for (double s : samples) mean += s / samples.size();
  std::printf("p50_us=%.1f p90_us=%.1f mean_us=%.1f\n", samples[samples.size() / 2], samples[samples.size() * 9 / 10],
              mean);
  return 0;
}
