// Triton export: config.pbtxt text from a graph spec and its backend configuration, and
// the model repository written from a checkpoint through temporary directories.
#include "aitune/triton_export.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "aitune/error.hpp"
#include "aitune/onnx_external_data.hpp"

namespace aitune {
namespace fs = std::filesystem;
namespace {

// Triton's DataType enum spelling for each dtype aitune handles.
std::string_view triton_dtype(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "TYPE_BOOL";
    case DType::kInt8: return "TYPE_INT8";
    case DType::kInt16: return "TYPE_INT16";
    case DType::kInt32: return "TYPE_INT32";
    case DType::kInt64: return "TYPE_INT64";
    case DType::kUInt8: return "TYPE_UINT8";
    case DType::kFloat16: return "TYPE_FP16";
    case DType::kBFloat16: return "TYPE_BF16";
    case DType::kFloat32: return "TYPE_FP32";
    case DType::kFloat64: return "TYPE_FP64";
  }
  return "TYPE_INVALID";
}

// A protobuf text-format string literal: C escapes, non-printable bytes as octal.
std::string quote(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\%03o", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? std::string(sep) : "") + items[i];
  return out;
}

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

// dims of one tensor: -1 for dynamic axes; the batch axis dropped when batching.
std::vector<int64_t> triton_dims(const TensorSpec& t, bool batching) {
  std::vector<int64_t> dims;
  for (std::size_t axis = batching ? 1 : 0; axis < t.rank(); ++axis)
    dims.push_back(t.is_dynamic(axis) ? -1 : t.min_shape[axis]);
  return dims;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

// One input/output entry; a scalar (or a batched rank-1 tensor) gets dims [1] and an
// empty reshape, as Triton's own auto-complete writes it.
std::string tensor_entry(const TensorSpec& t, bool batching) {
  auto dims = triton_dims(t, batching);
  std::ostringstream out;
  out << "  {\n    name: " << quote(t.name) << "\n    data_type: " << triton_dtype(t.dtype) << "\n";
  if (dims.empty()) {
    out << "    dims: [1]\n";
    if (batching) out << "    reshape { shape: [] }\n";
  } else {
    out << "    dims: " << dims_text(dims) << "\n";
  }
  out << "  }";
  return out.str();
}

std::string tensor_list(const char* field, const std::vector<TensorSpec>& tensors, bool batching) {
  std::vector<std::string> entries;
  for (const auto& t : tensors) entries.push_back(tensor_entry(t, batching));
  return std::string(field) + " [\n" + join(entries, ",\n") + "\n]\n";
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

namespace {

std::string random_suffix() {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  std::ostringstream out;
  out << std::hex << rng();
  return out.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) throw Error(ErrorCode::kIo, "cannot write '" + path.string() + "'");
}

void copy_into(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  if (!ec) fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot copy '" + from.string() + "' to '" + to.string() + "': " + ec.message());
}

// One model being written: its temporary directory and final place.
struct Staged {
  fs::path tmp, target, aside;
  bool renamed = false;
};

// The README.md of one graph model: where it came from and what config.pbtxt lacks.
std::string model_readme(const std::string& name, const CheckpointGraph& graph, const Checkpoint& checkpoint,
                         const TritonModelConfig& config) {
  std::ostringstream out;
  out << "# " << name << "\n\n"
      << "Exported by aitune from graph `" << graph.key << "` of the checkpoint `" << checkpoint.directory()
      << "` (module `" << checkpoint.manifest().module_name << "`).\n\n"
      << "- `1/model.onnx` is the ONNX model that won tuning (`" << graph.model << "`), byte for byte, with its "
      << "external data beside it.\n"
      << "- Tuned on the " << execution_provider_name(graph.backend_config.provider) << " execution provider; "
      << "max_batch_size " << config.max_batch_size << ".\n";
  for (auto [title, list] : {std::pair{"input", &graph.graph_spec.inputs}, std::pair{"output", &graph.graph_spec.outputs}})
    for (const auto& t : *list) out << "- " << title << " `" << t.name << "`: " << t.to_string() << "\n";
  out << "\n## Not expressed in config.pbtxt\n\n";
  if (config.not_expressed.empty()) {
    out << "Nothing: every setting of the tuned configuration is in config.pbtxt.\n";
  } else {
    for (const auto& note : config.not_expressed) out << "- " << note << "\n";
  }
  return out.str();
}

// A plain chain: graphs ordered so that each one's inputs are exactly the previous one's
// outputs (names and dtypes), batching agreeing. The order, or the reason there is none.
std::vector<std::size_t> chain_order(const std::vector<const CheckpointGraph*>& graphs,
                                     const std::vector<int>& batch_sizes, std::string& why_not) {
  auto signature = [](const std::vector<TensorSpec>& tensors) {
    std::map<std::string, DType> out;
    for (const auto& t : tensors) out[t.name] = t.dtype;
    return out;
  };
  const std::size_t n = graphs.size();
  std::vector<std::optional<std::size_t>> next(n);
  std::vector<int> predecessors(n, 0);
  for (std::size_t a = 0; a < n; ++a)
    for (std::size_t b = 0; b < n; ++b)
      if (a != b && signature(graphs[a]->graph_spec.outputs) == signature(graphs[b]->graph_spec.inputs)) {
        if (next[a]) {
          why_not = "the outputs of graph '" + graphs[a]->key + "' are the inputs of more than one graph";
          return {};
        }
        next[a] = b;
        ++predecessors[b];
      }
  std::vector<std::size_t> heads;
  for (std::size_t i = 0; i < n; ++i)
    if (predecessors[i] == 0) heads.push_back(i);
  if (heads.size() != 1) {
    std::vector<std::string> unfed;
    for (auto i : heads) unfed.push_back("'" + graphs[i]->key + "'");
    why_not = heads.empty() ? "the graphs feed each other in a cycle"
                            : "no plain chain: graphs " + join(unfed, ", ") +
                                  " take inputs that no other graph produces (an ensemble needs each graph's "
                                  "inputs to be exactly the previous graph's outputs, by name and dtype)";
    return {};
  }
  std::vector<std::size_t> order{heads.front()};
  while (next[order.back()] && order.size() <= n) order.push_back(*next[order.back()]);
  if (order.size() != n) {
    why_not = "the graphs do not form one chain (it ends after " + std::to_string(order.size()) + " of " +
              std::to_string(n) + " graphs)";
    return {};
  }
  std::set<std::string> produced;
  for (const auto& t : graphs[order.front()]->graph_spec.inputs) produced.insert(t.name);
  for (auto i : order)
    for (const auto& t : graphs[i]->graph_spec.outputs)
      if (!produced.insert(t.name).second) {
        why_not = "tensor '" + t.name + "' would be produced twice in the ensemble (graph '" + graphs[i]->key + "')";
        return {};
      }
  for (std::size_t i = 1; i < n; ++i)
    if ((batch_sizes[order[i]] > 0) != (batch_sizes[order[0]] > 0)) {
      why_not = "graph '" + graphs[order[i]]->key + "' and graph '" + graphs[order[0]]->key +
                "' disagree on batching (max_batch_size " + std::to_string(batch_sizes[order[i]]) + " vs " +
                std::to_string(batch_sizes[order[0]]) + ")";
      return {};
    }
  return order;
}

std::string ensemble_config(const std::string& name, const std::vector<const CheckpointGraph*>& graphs,
                            const std::vector<std::string>& names, const std::vector<std::size_t>& order,
                            int max_batch_size) {
  const bool batching = max_batch_size > 0;
  std::ostringstream out;
  out << "# Written by aitune: the chain " << join([&] {
    std::vector<std::string> steps;
    for (auto i : order) steps.push_back(names[i]);
    return steps;
  }(), " -> ") << ".\n";
  out << "name: " << quote(name) << "\nplatform: \"ensemble\"\nmax_batch_size: " << max_batch_size << "\n";
  out << tensor_list("input", graphs[order.front()]->graph_spec.inputs, batching);
  out << tensor_list("output", graphs[order.back()]->graph_spec.outputs, batching);
  out << "ensemble_scheduling {\n  step [\n";
  for (std::size_t s = 0; s < order.size(); ++s) {
    const auto& spec = graphs[order[s]]->graph_spec;
    out << "    {\n      model_name: " << quote(names[order[s]]) << "\n      model_version: -1\n";
    for (const auto& t : spec.inputs)
      out << "      input_map { key: " << quote(t.name) << " value: " << quote(t.name) << " }\n";
    for (const auto& t : spec.outputs)
      out << "      output_map { key: " << quote(t.name) << " value: " << quote(t.name) << " }\n";
    out << "    }" << (s + 1 < order.size() ? "," : "") << "\n";
  }
  out << "  ]\n}\n";
  return out.str();
}

// Graphs a front end recorded in the metadata as kept out of ONNX Runtime (aitune.torch's
// eager graphs), so the export can say they were not exported.
std::vector<std::string> eager_graph_notes(const CheckpointManifest& manifest) {
  std::vector<std::string> notes;
  auto metadata = nlohmann::json::parse(manifest.metadata_json, nullptr, false);
  if (!metadata.is_object() || !metadata.contains("aitune.torch")) return notes;
  const auto& torch = metadata["aitune.torch"];
  if (!torch.is_object() || !torch.contains("eager_graphs") || !torch["eager_graphs"].is_array()) return notes;
  for (const auto& entry : torch["eager_graphs"]) {
    std::string key = entry.is_object() && entry.contains("key") && entry["key"].is_string()
                          ? entry["key"].get<std::string>()
                          : "?";
    std::string why = entry.is_object() && entry.contains("note") && entry["note"].is_string()
                          ? entry["note"].get<std::string>()
                          : "TorchEagerBackend";
    notes.push_back("graph '" + key + "' runs eagerly in PyTorch (" + why +
                    "); it has no ONNX model and was not exported");
  }
  return notes;
}

}  // namespace

TritonExportResult export_triton(const Checkpoint& checkpoint, const std::string& repository,
                                 const TritonExportOptions& options) {
  const auto& manifest = checkpoint.manifest();
  if (manifest.graphs.empty())
    throw Error(ErrorCode::kState, "checkpoint '" + checkpoint.directory() +
                                       "' holds no tuned graphs; there is nothing to export to Triton");
  std::string base = options.model_name.empty() ? manifest.module_name : options.model_name;
  if (!is_valid_triton_model_name(base))
    throw Error(ErrorCode::kInvalidArgument,
                (options.model_name.empty() ? "the checkpoint's module name '" + base +
                                                  "' is not a valid Triton model name; pass a model name"
                                            : "Triton model name '" + base + "' is not valid") +
                    " (1 to 255 characters of A-Z a-z 0-9 . _ -, not starting with '.')");
  if (options.instances < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "instances must be >= 1 (the instance_group count), got " + std::to_string(options.instances));

  // -- decide everything before writing anything ----------------------------------------
  std::vector<const CheckpointGraph*> graphs;
  for (const auto& g : manifest.graphs) graphs.push_back(&g);
  const bool several = graphs.size() > 1;
  std::vector<std::string> names;
  for (const auto* g : graphs) names.push_back(several ? base + "_" + g->key : base);
  for (const auto& name : names)
    if (!is_valid_triton_model_name(name))
      throw Error(ErrorCode::kInvalidArgument, "Triton model name '" + name + "' (model name + graph key) is not "
                                               "valid: at most 255 characters of A-Z a-z 0-9 . _ -");

  std::error_code ec;
  fs::path repo = fs::absolute(repository, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot resolve repository path '" + repository + "': " + ec.message());
  if (fs::exists(repo, ec) && !fs::is_directory(repo, ec))
    throw Error(ErrorCode::kInvalidArgument, "Triton repository '" + repo.string() + "' is a file, not a directory");

  TritonExportResult result;
  std::vector<TritonModelConfig> configs;
  std::vector<std::map<std::string, std::string>> trt_sources(graphs.size());  // option -> cache dir in checkpoint
  std::vector<int> batch_sizes;
  for (std::size_t i = 0; i < graphs.size(); ++i) {
    const auto& g = *graphs[i];
    std::map<std::string, std::string> trt_paths;
    for (const auto& option : g.path_options) {
      auto it = g.backend_config.provider_options.find(option);
      if (it == g.backend_config.provider_options.end()) continue;
      std::string dir = option == "trt_engine_cache_path" ? "trt_engine_cache" : "trt_timing_cache";
      trt_sources[i][dir] = it->second;  // relative to the checkpoint
      trt_paths[option] = (repo / names[i] / "1" / dir).string();
    }
    configs.push_back(triton_model_config(g, names[i], options.max_batch_size, options.instances, trt_paths));
    for (const auto& [option, path] : trt_paths)
      configs.back().not_expressed.push_back(
          "provider option " + option + " points at " + path +
          " by absolute path (Triton reads it as given): edit it in config.pbtxt when the repository moves, "
          "e.g. into a container");
    batch_sizes.push_back(configs.back().max_batch_size);
  }

  std::optional<std::string> ensemble_text;
  std::vector<std::size_t> order;
  for (auto& note : eager_graph_notes(manifest)) result.notes.push_back(std::move(note));
  if (several) {
    std::string why_not;
    if (!result.notes.empty())
      why_not = "some graphs of the module run eagerly and were not exported";
    else
      order = chain_order(graphs, batch_sizes, why_not);
    if (!order.empty()) {
      int mbs = *std::min_element(batch_sizes.begin(), batch_sizes.end());
      ensemble_text = ensemble_config(base, graphs, names, order, mbs);
    } else {
      result.notes.push_back("wrote " + std::to_string(graphs.size()) + " models, one per graph (" +
                             join(names, ", ") + "), and no ensemble: " + why_not);
    }
  }

  std::vector<std::string> entries = names;
  if (ensemble_text) entries.push_back(base);
  for (const auto& name : entries) {
    fs::path target = repo / name;
    if (fs::is_symlink(target, ec) || (fs::exists(target, ec) && !fs::is_directory(target, ec)))
      throw Error(ErrorCode::kInvalidArgument,
                  "repository entry '" + target.string() + "' exists and is not a directory; remove it first");
    if (fs::is_directory(target, ec) && !fs::is_empty(target, ec) && !options.overwrite)
      throw Error(ErrorCode::kInvalidArgument, "repository entry '" + target.string() +
                                                   "' exists and is not empty; pass overwrite to replace it");
  }

  // -- write into temporary directories, then rename into place -------------------------
  fs::create_directories(repo, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot create Triton repository '" + repo.string() + "': " + ec.message());
  std::vector<Staged> staged;
  auto cleanup = [&] {
    for (auto it = staged.rbegin(); it != staged.rend(); ++it) {
      std::error_code ignore;
      if (it->renamed) {  // put the previous entry back
        fs::remove_all(it->target, ignore);
        if (!it->aside.empty()) fs::rename(it->aside, it->target, ignore);
      } else if (!it->aside.empty() && !fs::exists(it->target, ignore)) {
        fs::rename(it->aside, it->target, ignore);
      }
      fs::remove_all(it->tmp, ignore);
    }
  };
  const std::string suffix = ".tmp-" + std::to_string(::getpid()) + "-" + random_suffix();
  try {
    for (std::size_t i = 0; i < graphs.size(); ++i) {
      const auto& g = *graphs[i];
      staged.push_back({repo / ("." + names[i] + suffix), repo / names[i], {}});
      const fs::path& tmp = staged.back().tmp;
      fs::create_directories(tmp / "1");
      fs::path model = checkpoint.model_path(g.key);
      copy_into(model, tmp / "1" / "model.onnx");
      for (const auto& location : onnx_external_data_locations(model.string()))
        copy_into(model.parent_path() / location, tmp / "1" / location);
      for (const auto& [dir, relative] : trt_sources[i]) {
        fs::path source = fs::path(checkpoint.directory()) / relative;
        fs::create_directories(tmp / "1" / dir);
        if (fs::is_directory(source, ec))
          fs::copy(source, tmp / "1" / dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
      }
      write_text(tmp / "config.pbtxt", configs[i].text);
      write_text(tmp / "README.md", model_readme(names[i], g, checkpoint, configs[i]));
      result.models.push_back({names[i], g.key, (repo / names[i]).string(), configs[i].max_batch_size,
                               configs[i].not_expressed});
    }
    if (ensemble_text) {
      staged.push_back({repo / ("." + base + suffix), repo / base, {}});
      const fs::path& tmp = staged.back().tmp;
      fs::create_directories(tmp / "1");  // Triton wants a version directory, empty for an ensemble
      write_text(tmp / "config.pbtxt", *ensemble_text);
      write_text(tmp / "README.md", "# " + base + "\n\nExported by aitune: an ensemble running the graph models " +
                                        [&] {
                                          std::vector<std::string> steps;
                                          for (auto i : order) steps.push_back("`" + names[i] + "`");
                                          return join(steps, " -> ");
                                        }() + " in a chain, each graph's outputs feeding the next one's inputs.\n");
      int mbs = *std::min_element(batch_sizes.begin(), batch_sizes.end());
      result.models.push_back({base, "", (repo / base).string(), mbs, {}});
      result.ensemble = base;
    }
    for (auto& s : staged) {
      if (fs::exists(s.target, ec)) {
        s.aside = s.target.parent_path() / ("." + s.target.filename().string() + suffix + ".old");
        fs::rename(s.target, s.aside);
      }
      fs::rename(s.tmp, s.target);
      s.renamed = true;
    }
  } catch (const fs::filesystem_error& e) {
    cleanup();
    throw Error(ErrorCode::kIo, std::string("Triton export into '") + repo.string() + "' failed: " + e.what());
  } catch (...) {
    cleanup();
    throw;
  }
  for (auto& s : staged)
    if (!s.aside.empty()) fs::remove_all(s.aside, ec);
  result.repository = repo.string();
  return result;
}

}  // namespace aitune
