// OnnxSessionConfig's names and JSON, and the ORT session options it makes per provider.
#include "session_options.hpp"

#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "aitune/error.hpp"
#include "enum_names.hpp"
#include "ort_runtime_impl.hpp"
#include "session_limits.hpp"

namespace aitune {

using detail::ort_call;

namespace {

constexpr detail::EnumNames<GraphOptimizationLevel, 4> kLevelNames{{
    {GraphOptimizationLevel::kDisableAll, "disable_all"},
    {GraphOptimizationLevel::kBasic, "basic"},
    {GraphOptimizationLevel::kExtended, "extended"},
    {GraphOptimizationLevel::kAll, "all"},
}};

}  // namespace

std::string_view graph_optimization_level_name(GraphOptimizationLevel level) noexcept {
  return detail::enum_name(kLevelNames, level, "all");
}

GraphOptimizationLevel parse_graph_optimization_level(std::string_view text) {
  return detail::parse_enum(kLevelNames, text, "graph optimization level");
}

Device OnnxSessionConfig::device() const {
  return provider == ExecutionProvider::kCPU ? Device::cpu() : Device::cuda(device_id);
}

std::string OnnxSessionConfig::to_json(int indent) const {
  nlohmann::json j{{"provider", execution_provider_name(provider)},
                   {"device_id", device_id},
                   {"graph_optimization_level", graph_optimization_level_name(graph_optimization_level)},
                   {"intra_op_threads", intra_op_threads},
                   {"inter_op_threads", inter_op_threads},
                   {"provider_options", provider_options},
                   {"session_config", session_config}};
  return j.dump(indent);
}

OnnxSessionConfig OnnxSessionConfig::from_json(const std::string& text) {
  OnnxSessionConfig c;
  try {
    auto j = nlohmann::json::parse(text);
    c.provider = parse_execution_provider(j.at("provider").get<std::string>());
    c.device_id = j.value("device_id", 0);
    c.graph_optimization_level = parse_graph_optimization_level(j.value("graph_optimization_level", "all"));
    c.intra_op_threads = j.value("intra_op_threads", 0);
    c.inter_op_threads = j.value("inter_op_threads", 0);
    c.provider_options = j.value("provider_options", std::map<std::string, std::string>{});
    c.session_config = j.value("session_config", std::map<std::string, std::string>{});
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, std::string("backend config JSON is malformed: ") + e.what());
  }
  return c;
}

namespace detail {
namespace {

::GraphOptimizationLevel to_ort(GraphOptimizationLevel level) {
  switch (level) {
    case GraphOptimizationLevel::kDisableAll: return ORT_DISABLE_ALL;
    case GraphOptimizationLevel::kBasic: return ORT_ENABLE_BASIC;
    case GraphOptimizationLevel::kExtended: return ORT_ENABLE_EXTENDED;
    case GraphOptimizationLevel::kAll: return ORT_ENABLE_ALL;
  }
  return ORT_ENABLE_ALL;
}

// The V1 TensorRT options struct holds only these; unknown keys are an error here
// rather than silently ignored.
void apply_tensorrt_option(OrtTensorRTProviderOptions& o, const std::string& key, const std::string& value,
                           std::list<std::string>& keep_alive) {
  auto as_int = [&] {
    try {
      return std::stoi(value);
    } catch (...) {
      throw Error(ErrorCode::kInvalidArgument, "TensorRT option " + key + "='" + value + "' is not an integer");
    }
  };
  if (key == "trt_fp16_enable") o.trt_fp16_enable = as_int();
  else if (key == "trt_int8_enable") o.trt_int8_enable = as_int();
  else if (key == "trt_max_workspace_size") o.trt_max_workspace_size = static_cast<size_t>(std::stoull(value));
  else if (key == "trt_max_partition_iterations") o.trt_max_partition_iterations = as_int();
  else if (key == "trt_min_subgraph_size") o.trt_min_subgraph_size = as_int();
  else if (key == "trt_engine_cache_enable") o.trt_engine_cache_enable = as_int();
  else if (key == "trt_engine_cache_path") o.trt_engine_cache_path = keep_alive.emplace_back(value).c_str();
  else if (key == "trt_dump_subgraphs") o.trt_dump_subgraphs = as_int();
  else if (key == "trt_force_sequential_engine_build") o.trt_force_sequential_engine_build = as_int();
  else
    throw Error(ErrorCode::kInvalidArgument,
                "unsupported TensorRT option '" + key +
                    "' (this ONNX Runtime build cannot create TensorRT V2 options, so only the V1 "
                    "struct's fields are available); supported: trt_fp16_enable, trt_int8_enable, trt_max_workspace_size, "
                    "trt_max_partition_iterations, trt_min_subgraph_size, trt_engine_cache_enable, "
                    "trt_engine_cache_path, trt_dump_subgraphs, trt_force_sequential_engine_build");
}

void append_cpu(SessionSetup& setup, const OnnxSessionConfig& config) {
  if (!config.provider_options.empty())
    throw Error(ErrorCode::kInvalidArgument, "the CPU execution provider takes no provider options (got '" +
                                                 config.provider_options.begin()->first +
                                                 "'); use intra_op_threads / graph_optimization_level");
  setup.owned_memory_info.emplace(Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault));
  setup.memory_info = *setup.owned_memory_info;
}

void append_cuda(SessionSetup& setup, OrtRuntime::Impl& rt, const OnnxSessionConfig& config) {
  // Plugin-EP route: the only one in this ORT build that takes every CUDA option as a string.
  const auto& devices = rt.cuda_ep_devices();
  if (config.device_id < 0 || static_cast<std::size_t>(config.device_id) >= devices.size())
    throw Error(ErrorCode::kInvalidArgument, "device_id " + std::to_string(config.device_id) + " but " +
                                                 std::to_string(devices.size()) + " CUDA device(s) are present");
  const auto& device = devices[config.device_id];
  std::unordered_map<std::string, std::string> options(config.provider_options.begin(), config.provider_options.end());
  // The session runs on a stream aitune knows, so calls can be ordered with the
  // caller's stream by events. Verified on an H200: this plugin route honours
  // user_compute_stream only together with has_user_compute_stream=1 (without it,
  // cuBLAS crashed in the first run).
  if (auto it = options.find("user_compute_stream"); it != options.end()) {
    try {
      setup.stream = static_cast<std::uintptr_t>(std::stoull(it->second));
    } catch (const std::exception&) {
      throw Error(ErrorCode::kInvalidArgument,
                  "provider option user_compute_stream='" + it->second + "' is not a stream address");
    }
  } else {
    // Blocking: torch's default stream is the legacy stream, and calls from there are
    // then ordered by CUDA with no events (two record/wait pairs less per call).
    setup.owned_stream = CudaStream::create(config.device_id, StreamSync::kWithLegacyStream);
    setup.stream = setup.owned_stream->handle();
    setup.stream_syncs_with_legacy = true;
    options["user_compute_stream"] = std::to_string(setup.stream);
  }
  options["has_user_compute_stream"] = "1";
  ort_call(ErrorCode::kInvalidArgument, "CUDA provider options",
           [&] { setup.options.AppendExecutionProvider_V2(*rt.env, {device}, options); });
  setup.memory_info = device.GetMemoryInfo(OrtDeviceMemoryType_DEFAULT);
}

void append_tensorrt(SessionSetup& setup, OrtRuntime& runtime, const OnnxSessionConfig& config) {
  auto status = runtime.provider_status(ExecutionProvider::kTensorRT);
  if (!status.available) throw Error(ErrorCode::kProviderUnavailable, status.reason);
  // The V2 options object takes every TensorRT option as a string (profiles, timing
  // cache, builder level); an ORT build without it fails to create the object
  // (CreateTensorRTProviderOptions), and then the V1 struct takes the subset it has
  // fields for and names any other option as unsupported.
  std::optional<Ort::TensorRTProviderOptions> v2;
  try {
    v2.emplace();
  } catch (const Ort::Exception&) {
    v2.reset();  // this build cannot create V2 options: the V1 struct below
  }
  if (v2) {
    std::unordered_map<std::string, std::string> all(config.provider_options.begin(), config.provider_options.end());
    all["device_id"] = std::to_string(config.device_id);
    ort_call(ErrorCode::kInvalidArgument, "TensorRT provider options", [&] { v2->Update(all); });
    ort_call(ErrorCode::kProviderUnavailable, "TensorRT execution provider",
             [&] { setup.options.AppendExecutionProvider_TensorRT_V2(**v2); });
  } else {
    OrtTensorRTProviderOptions trt{};
    trt.device_id = config.device_id;
    trt.trt_max_partition_iterations = 1000;
    trt.trt_min_subgraph_size = 1;
    trt.trt_max_workspace_size = size_t{1} << 30;
    for (const auto& [k, v] : config.provider_options) apply_tensorrt_option(trt, k, v, setup.keep_alive);
    ort_call(ErrorCode::kProviderUnavailable, "TensorRT execution provider",
             [&] { setup.options.AppendExecutionProvider_TensorRT(trt); });
  }
  OrtCUDAProviderOptions cuda{};  // fallback for nodes TensorRT does not take, as the AITune ONNX Runtime backend guide does
  cuda.device_id = config.device_id;
  ort_call(ErrorCode::kProviderUnavailable, "CUDA fallback of the TensorRT execution provider",
           [&] { setup.options.AppendExecutionProvider_CUDA(cuda); });
  setup.owned_memory_info.emplace("Cuda", OrtDeviceAllocator, config.device_id, OrtMemTypeDefault);
  setup.memory_info = *setup.owned_memory_info;
}

}  // namespace

void check_cuda_graph_config(const OnnxSessionConfig& config) {
  if (!provider_option_on(config, "enable_cuda_graph")) return;
  auto it = config.session_config.find(kDisableCpuEpFallback);
  if (it != config.session_config.end() && it->second != "1")
    throw Error(ErrorCode::kInvalidArgument,
                std::string("enable_cuda_graph=1 needs every node on the CUDA provider, but session config ") +
                    kDisableCpuEpFallback + "='" + it->second +
                    "' would let nodes fall back to the CPU inside a captured graph; leave it unset (aitune sets it "
                    "to 1 for CUDA-graph sessions)");
}

bool provider_option_on(const OnnxSessionConfig& config, const char* key) {
  auto it = config.provider_options.find(key);
  return it != config.provider_options.end() && it->second != "0" && it->second != "false";
}

void check_thread_counts(const OnnxSessionConfig& config) {
  // The same range a checkpoint's manifest is held to: a caller (Python included) that
  // asks for 100,000 threads gets a clear error, not a session that hangs creating them.
  for (auto [name, value] : {std::pair{"intra_op_threads", config.intra_op_threads},
                             std::pair{"inter_op_threads", config.inter_op_threads}})
    if (value < 0 || value > kMaxSessionThreads)
      throw Error(ErrorCode::kInvalidArgument, std::string(name) + " is " + std::to_string(value) +
                                                   "; allowed: 0 (ORT's default) to " + std::to_string(kMaxSessionThreads));
}

SessionSetup make_session_setup(OrtRuntime& runtime, const OnnxSessionConfig& config) {
  check_thread_counts(config);
  SessionSetup setup;
  auto& so = setup.options;
  so.SetGraphOptimizationLevel(to_ort(config.graph_optimization_level));
  if (config.intra_op_threads > 0) so.SetIntraOpNumThreads(config.intra_op_threads);
  if (config.inter_op_threads > 0) so.SetInterOpNumThreads(config.inter_op_threads);
  for (const auto& [k, v] : config.session_config)
    ort_call(ErrorCode::kInvalidArgument, "session config entry '" + k + "'", [&] { so.AddConfigEntry(k.c_str(), v.c_str()); });
  setup.cuda_graph = config.provider == ExecutionProvider::kCUDA && provider_option_on(config, "enable_cuda_graph");
  // Safe by construction: a node the CUDA provider cannot place would run on the CPU
  // inside a captured graph (host work and copies a replay does not redo), so a session
  // that will be captured refuses it at creation instead (check_cuda_graph_config).
  if (setup.cuda_graph) so.AddConfigEntry(kDisableCpuEpFallback, "1");
  switch (config.provider) {
    case ExecutionProvider::kCPU: append_cpu(setup, config); break;
    case ExecutionProvider::kCUDA: append_cuda(setup, detail::runtime_impl(runtime), config); break;
    case ExecutionProvider::kTensorRT: append_tensorrt(setup, runtime, config); break;
  }
  return setup;
}

}  // namespace detail
}  // namespace aitune
