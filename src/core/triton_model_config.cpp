// Triton's config.pbtxt for one graph: its inputs and outputs, batching, and the tuned
// backend configuration mapped onto what Triton's ONNX Runtime backend reads.
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "aitune/error.hpp"
#include "aitune/triton_export.hpp"
#include "triton_text.hpp"

namespace aitune {
namespace {

using detail::join;
using detail::quote;
using detail::tensor_list;

bool truthy(const std::string& value) { return value == "1" || value == "true" || value == "True"; }

// The batch size Triton can batch on: the batch axis must be axis 0 of every input and
// output (Triton prepends the batch dimension); nullopt with the reason otherwise.
struct BatchAxis {
  bool usable = false;
  std::string why_not;
  int64_t recorded_max = 0;  // largest recorded batch (kUnbounded when unbounded)
  int64_t recorded_min = 0;
};

BatchAxis batch_axis_of(const GraphSpec& spec) {
  BatchAxis result;
  std::vector<std::string> problems;
  for (const auto* list : {&spec.inputs, &spec.outputs}) {
    for (const auto& t : *list) {
      if (!t.batch_axis) {
        problems.push_back("'" + t.name + "' has no batch axis");
      } else if (*t.batch_axis != 0) {
        problems.push_back("'" + t.name + "' has its batch axis at " + std::to_string(*t.batch_axis) +
                           " (Triton batches on axis 0)");
      }
    }
  }
  if (spec.inputs.empty()) problems.push_back("the graph has no inputs");
  if (!problems.empty()) {
    result.why_not = join(problems, "; ");
    return result;
  }
  result.usable = true;
  const auto& first = spec.inputs.front();
  result.recorded_min = first.min_shape.at(0);
  result.recorded_max = first.max_shape.at(0);
  return result;
}

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

// Why a per-process or aitune-only option has no place in a Triton model.
std::optional<std::string> process_local_option(const std::string& key, const std::string& value) {
  if (key == "user_compute_stream" || key == "has_user_compute_stream")
    return "provider option " + key + "=" + value +
           ": a stream of the tuning process; Triton gives each instance its own CUDA stream";
  if (key == "device_id")
    return "provider option device_id=" + value +
           ": Triton places each instance on the GPUs of its instance_group (all visible GPUs by default)";
  return std::nullopt;
}


}  // namespace

bool is_valid_triton_model_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 255 || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

TritonModelConfig triton_model_config(const CheckpointGraph& graph, const std::string& model_name,
                                      std::optional<int> max_batch_size, int instances,
                                      const std::map<std::string, std::string>& trt_paths) {
  if (!is_valid_triton_model_name(model_name))
    throw Error(ErrorCode::kInvalidArgument,
                "Triton model name '" + model_name +
                    "' is not a valid model directory name: use 1 to 255 characters of A-Z a-z 0-9 . _ - "
                    "(not starting with '.')");
  if (instances < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "instances must be >= 1 (the instance_group count), got " + std::to_string(instances));
  const auto& spec = graph.graph_spec;
  const auto& config = graph.backend_config;
  const std::string where = "graph '" + graph.key + "'";
  TritonModelConfig result;
  auto& notes = result.not_expressed;

  // -- batching -------------------------------------------------------------------
  BatchAxis batch = batch_axis_of(spec);
  int mbs = 0;
  if (max_batch_size) {
    if (*max_batch_size < 0)
      throw Error(ErrorCode::kInvalidArgument, "max_batch_size must be >= 0, got " + std::to_string(*max_batch_size));
    if (*max_batch_size > 0 && !batch.usable)
      throw Error(ErrorCode::kInvalidArgument, "max_batch_size " + std::to_string(*max_batch_size) + " for " + where +
                                                   ", which Triton cannot batch: " + batch.why_not +
                                                   " (pass max_batch_size 0, or leave it unset)");
    mbs = *max_batch_size;
    if (mbs > 0 && batch.recorded_max != kUnbounded && mbs > batch.recorded_max) {
      auto it = config.provider_options.find("trt_profile_max_shapes");
      auto trt_max = it == config.provider_options.end() ? std::nullopt : profile_batch(it->second);
      if (config.provider == ExecutionProvider::kTensorRT && trt_max && mbs > *trt_max)
        throw Error(ErrorCode::kInvalidArgument,
                    "max_batch_size " + std::to_string(mbs) + " for " + where + " exceeds the TensorRT profile's "
                    "largest batch, " + std::to_string(*trt_max) + " (trt_profile_max_shapes); an engine built "
                    "for that profile cannot run larger batches");
      notes.push_back("max_batch_size " + std::to_string(mbs) + " exceeds the batch sizes recorded while tuning (" +
                      std::to_string(batch.recorded_min) + ".." + std::to_string(batch.recorded_max) +
                      "): larger batches run with the tuned configuration but were never measured or checked");
    }
    if (mbs == 0 && batch.usable)
      notes.push_back("batching turned off (max_batch_size 0): the batch axis stays in dims as -1, and Triton "
                      "does not batch requests");
  } else if (batch.usable) {
    // Unbounded recordings have no maximum to serve up to: batching is off then.
    if (batch.recorded_max == kUnbounded || batch.recorded_max > std::numeric_limits<int>::max()) {
      notes.push_back("the batch axis has no recorded upper bound, so max_batch_size is 0 (pass max_batch_size "
                      "to batch)");
    } else {
      mbs = static_cast<int>(batch.recorded_max);
    }
  } else if (!spec.batch_sizes.empty() && spec.batch_sizes.size() > 1) {
    notes.push_back("no batching (max_batch_size 0): " + batch.why_not);
  }
  const bool batching = mbs > 0;
  result.max_batch_size = mbs;

  // -- what the backend configuration becomes -----------------------------------------
  std::map<std::string, std::string> accelerator;  // gpu_execution_accelerator parameters
  std::string accelerator_name;
  std::map<std::string, std::string> parameters;  // model-config parameters
  std::optional<int> graph_level;

  switch (config.graph_optimization_level) {
    case GraphOptimizationLevel::kAll: break;  // the backend's default
    case GraphOptimizationLevel::kExtended: graph_level = 1; break;
    case GraphOptimizationLevel::kBasic: graph_level = -1; break;
    case GraphOptimizationLevel::kDisableAll: graph_level = 2; break;
  }
  if (config.intra_op_threads > 0) parameters["intra_op_thread_count"] = std::to_string(config.intra_op_threads);
  if (config.inter_op_threads > 0) parameters["inter_op_thread_count"] = std::to_string(config.inter_op_threads);
  for (const auto& [key, value] : config.session_config) {
    if (key == "session.use_device_allocator_for_initializers")
      parameters[key] = value;
    else
      notes.push_back("session config entry " + key + "=" + value +
                      ": Triton's ONNX Runtime backend sets no session config entries other than "
                      "session.use_device_allocator_for_initializers");
  }

  if (config.provider == ExecutionProvider::kTensorRT) {
    accelerator_name = "tensorrt";
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
      if (auto why = process_local_option(key, value)) {
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
  } else if (config.provider == ExecutionProvider::kCUDA) {
    accelerator_name = "cuda";
    for (const auto& [key, value] : config.provider_options) {
      if (auto why = process_local_option(key, value)) {
        notes.push_back(*why);
      } else if (key == "enable_cuda_graph") {
        if (truthy(value))
          notes.push_back(
              "provider option enable_cuda_graph=" + value +
              ": not expressible. Triton's ONNX Runtime backend binds each request's own buffers, while ONNX "
              "Runtime replays a captured CUDA graph on the addresses of the run that captured it (aitune "
              "copies into fixed buffers for this); optimization.cuda.graphs is read only by Triton's "
              "TensorRT backend. The model runs without CUDA graphs");
      } else if (key == "cudnn_conv_algo_search") {
        // The backend resets these four whenever the model has `parameters`; as model
        // parameters (its older spelling) they hold in every case.
        static const std::map<std::string, std::string> codes = {
            {"EXHAUSTIVE", "0"}, {"HEURISTIC", "1"}, {"DEFAULT", "2"}};
        auto code = codes.find(value);
        if (code == codes.end())
          notes.push_back("provider option cudnn_conv_algo_search=" + value + ": not a value Triton takes");
        else
          parameters[key] = code->second;
      } else if (key == "arena_extend_strategy") {
        static const std::map<std::string, std::string> codes = {
            {"kNextPowerOfTwo", "0"}, {"kSameAsRequested", "1"}, {"0", "0"}, {"1", "1"}};
        auto code = codes.find(value);
        if (code == codes.end())
          notes.push_back("provider option arena_extend_strategy=" + value + ": not a value Triton takes");
        else
          parameters[key] = code->second;
      } else if (key == "gpu_mem_limit" || key == "do_copy_in_default_stream") {
        parameters[key] = value;
      } else {
        accelerator[key] = value;  // the "cuda" accelerator hands every other key to the CUDA provider
      }
    }
  } else {
    for (const auto& [key, value] : config.provider_options)
      notes.push_back("provider option " + key + "=" + value +
                      ": Triton's ONNX Runtime backend passes no options to the CPU provider");
  }
  if (config.provider != ExecutionProvider::kCPU && config.device_id != 0)
    notes.push_back("device_id " + std::to_string(config.device_id) +
                    " (where it was tuned): Triton places instances on the GPUs of instance_group");

  // -- the text -----------------------------------------------------------------------
  std::ostringstream out;
  out << "# Written by aitune from tuned graph " << quote(graph.key) << "; see README.md beside it.\n";
  out << "name: " << quote(model_name) << "\n";
  out << "platform: \"onnxruntime_onnx\"\n";
  out << "max_batch_size: " << mbs << "\n";
  out << tensor_list("input", spec.inputs, batching);
  out << tensor_list("output", spec.outputs, batching);
  if (batching) out << "dynamic_batching { }\n";
  out << "instance_group [\n  {\n    kind: " << (config.provider == ExecutionProvider::kCPU ? "KIND_CPU" : "KIND_GPU")
      << "\n    count: " << instances << "\n  }\n]\n";
  if (graph_level || !accelerator_name.empty()) {
    out << "optimization {\n";
    if (graph_level) out << "  graph { level: " << *graph_level << " }\n";
    if (!accelerator_name.empty()) {
      out << "  execution_accelerators {\n    gpu_execution_accelerator [\n      {\n        name: "
          << quote(accelerator_name) << "\n";
      for (const auto& [key, value] : accelerator)
        out << "        parameters { key: " << quote(key) << " value: " << quote(value) << " }\n";
      out << "      }\n    ]\n  }\n";
    }
    out << "}\n";
  }
  for (const auto& [key, value] : parameters)
    out << "parameters { key: " << quote(key) << " value: { string_value: " << quote(value) << " } }\n";
  result.text = out.str();
  return result;
}

}  // namespace aitune
