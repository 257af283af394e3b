// The TensorRT execution provider: V2 options (V1 struct where the build lacks them),
// fp16 variants, per-variant engine caches, Triton's "tensorrt" accelerator.
#include <list>
#include <set>
#include <unordered_map>

#include "aitune/error.hpp"
#include "aitune/tensorrt_options.hpp"
#include "ort/ort_runtime_impl.hpp"
#include "providers/provider_registry.hpp"
#include "providers/session_setup.hpp"

namespace aitune::providers {
namespace {

using detail::ort_call;

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

void append_tensorrt(detail::SessionSetup& setup, OrtRuntime& runtime, const OnnxSessionConfig& config) {
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

bool truthy(const std::string& value) { return value == "1" || value == "true" || value == "True"; }

// TensorRT provider options that Triton's "tensorrt" accelerator takes under the same
// name (onnxruntime_backend's parameter table).
const std::set<std::string>& tensorrt_same_name() {
  static const std::set<std::string> keys = {
      "trt_max_partition_iterations", "trt_min_subgraph_size", "trt_dla_enable", "trt_dla_core",
      "trt_engine_cache_enable", "trt_engine_cache_path", "trt_engine_cache_prefix", "trt_dump_subgraphs",
      "trt_force_sequential_engine_build", "trt_context_memory_sharing_enable", "trt_layer_norm_fp32_fallback",
      "trt_timing_cache_enable", "trt_timing_cache_path", "trt_force_timing_cache", "trt_detailed_build_log",
      "trt_build_heuristics_enable", "trt_sparsity_enable", "trt_builder_optimization_level",
      "trt_auxiliary_streams", "trt_tactic_sources", "trt_extra_plugin_lib_paths", "trt_profile_min_shapes",
      "trt_profile_max_shapes", "trt_profile_opt_shapes", "trt_cuda_graph_enable", "trt_dump_ep_context_model",
      "trt_ep_context_file_path", "trt_ep_context_embed_mode"};
  return keys;
}

// TensorRT options Triton takes under another name.
const std::map<std::string, std::string>& tensorrt_renamed() {
  static const std::map<std::string, std::string> keys = {
      {"trt_max_workspace_size", "max_workspace_size_bytes"},
      {"trt_int8_calibration_table_name", "int8_calibration_table_name"},
      {"trt_int8_use_native_calibration_table", "int8_use_native_calibration_table"}};
  return keys;
}

TritonProviderBlock triton_tensorrt(const OnnxSessionConfig& config,
                                    const std::map<std::string, std::string>& trt_paths) {
  TritonProviderBlock block;
  block.accelerator_name = "tensorrt";
  auto& accelerator = block.accelerator;
  auto& notes = block.notes;
  const auto& options = config.provider_options;
  auto on = [&](const char* key) {
    auto it = options.find(key);
    return it != options.end() && truthy(it->second);
  };
  if (on("trt_int8_enable")) {
    accelerator["precision_mode"] = "INT8";
    if (on("trt_fp16_enable"))
      notes.push_back("provider option trt_fp16_enable=1 together with INT8: Triton's precision_mode takes "
                      "one precision, INT8 was written");
    if (on("trt_bf16_enable"))
      notes.push_back("provider option trt_bf16_enable=1 together with INT8: Triton's precision_mode takes "
                      "one precision, INT8 was written");
  } else if (on("trt_fp16_enable")) {
    accelerator["precision_mode"] = "FP16";
    if (on("trt_bf16_enable"))
      notes.push_back("provider option trt_bf16_enable=1 together with FP16: Triton's precision_mode takes "
                      "one precision, FP16 was written");
  } else if (on("trt_bf16_enable")) {
    accelerator["precision_mode"] = "BF16";
  }
  for (const auto& [key, value] : options) {
    if (key == "trt_fp16_enable" || key == "trt_int8_enable" || key == "trt_bf16_enable") continue;
    if (auto why = detail::triton_process_local_option(key, value)) {
      notes.push_back(*why);
    } else if (auto renamed = tensorrt_renamed().find(key); renamed != tensorrt_renamed().end()) {
      accelerator[renamed->second] = value;
    } else if (tensorrt_same_name().count(key)) {
      auto path = trt_paths.find(key);
      accelerator[key] = path != trt_paths.end() ? path->second : value;
      if (path == trt_paths.end() && (key == "trt_engine_cache_path" || key == "trt_timing_cache_path"))
        notes.push_back("provider option " + key + "=" + value + " was written as it was tuned: a path on the "
                        "machine that tuned, whose cache the checkpoint does not hold");
    } else {
      notes.push_back("provider option " + key + "=" + value +
                      ": not among the TensorRT parameters Triton's ONNX Runtime backend accepts");
    }
  }
  return block;
}

// The batch extent of the first shape in a "name:AxBxC,..." profile string.
std::optional<int64_t> profile_batch(const std::string& shapes) {
  auto colon = shapes.find(':');
  if (colon == std::string::npos) return std::nullopt;
  try {
    return std::stoll(shapes.substr(colon + 1));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

ProviderDescription tensorrt() {
  ProviderDescription d;
  d.name = "tensorrt";
  d.ort_name = "TensorrtExecutionProvider";
  // TensorRT takes no contrib operators (all a fusion makes) and has its own fp16 mode.
  d.capabilities = {.device_memory = true, .cuda_graph = false, .fp16_model = false, .contrib_operators = false};
  d.option_names = {"trt_fp16_enable", "trt_int8_enable", "trt_builder_optimization_level", "trt_max_workspace_size",
                    "trt_engine_cache_enable", "trt_engine_cache_path", "trt_timing_cache_enable",
                    "trt_timing_cache_path", "trt_profile_min_shapes", "trt_profile_opt_shapes",
                    "trt_profile_max_shapes"};
  // fp32 and fp16 (FP16 tolerance), builder optimisation level 3 and 5.
  d.variants = [](const OnnxSessionConfig&, const GraphSpec&) {
    return std::vector<ProviderVariant>{
        {{{"trt_fp16_enable", "0"}}, Precision::kStrict, {}, {}},
        {{{"trt_fp16_enable", "1"}}, Precision::kFP16, {}, {}},
        {{{"trt_fp16_enable", "1"}, {"trt_builder_optimization_level", "5"}}, Precision::kFP16, {}, {}},
    };
  };
  d.fixed_precision = [](const std::map<std::string, std::string>& options) -> std::optional<Precision> {
    // A caller-fixed trt_fp16_enable decides the precision, not the variant.
    if (auto it = options.find("trt_fp16_enable"); it != options.end())
      return it->second == "1" || it->second == "true" ? Precision::kFP16 : Precision::kStrict;
    return std::nullopt;
  };
  d.cache_options = [](const GraphSpec& spec, const std::string& dir, const std::map<std::string, std::string>& options) {
    return tensorrt_provider_options(spec, dir, options);
  };
  d.probe = [](OrtRuntime::Impl& runtime) { return runtime.probe_tensorrt(); };
  d.append = append_tensorrt;
  d.triton = triton_tensorrt;
  d.max_batch = [](const OnnxSessionConfig& config) -> std::optional<int64_t> {
    auto it = config.provider_options.find("trt_profile_max_shapes");
    return it == config.provider_options.end() ? std::nullopt : profile_batch(it->second);
  };
  return d;
}

}  // namespace aitune::providers
