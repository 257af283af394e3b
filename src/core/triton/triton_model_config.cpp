// Triton's config.pbtxt for one graph: its inputs and outputs, batching, and the tuned
// backend configuration mapped onto what Triton's ONNX Runtime backend reads.
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "aitune/serving_batches.hpp"
#include "aitune/error.hpp"
#include "aitune/triton_export.hpp"
#include "providers/provider_registry.hpp"
#include "triton/triton_text.hpp"

namespace aitune {
namespace {

using detail::join;
using detail::quote;
using detail::tensor_list;

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
  // Triton's dynamic batcher joins requests as aitune's server would: a model whose rows mix
  // (a batch mean, `a @ b.T`) would answer each with part of the others' (GraphSpec::batch_rows).
  if (problems.empty() && spec.batch_rows == BatchRows::kCoupled) problems.push_back(requests_apart_reason(spec));
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
      const auto& provider = provider_description(config.provider);
      auto trt_max = provider.max_batch ? provider.max_batch(config) : std::nullopt;
      if (trt_max && mbs > *trt_max)
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
    if (const auto apart = requests_apart_reason(spec); !apart.empty()) {  // unchecked: coupled ones are unusable
      notes.push_back("batching off (max_batch_size 0): " + apart + "; or pass max_batch_size to batch anyway");
    } else if (batch.recorded_max == kUnbounded || batch.recorded_max > std::numeric_limits<int>::max()) {
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
  // A dynamic axis other than the batch is -1 in dims: Triton then sends any extent, where
  // the graph was tuned and checked over a range only (a session-26 probe found the README
  // saying "Nothing" for such a model).
  for (auto [kind, list] : {std::pair{"input", &spec.inputs}, std::pair{"output", &spec.outputs}})
    for (const auto& t : *list)
      for (std::size_t i = 0; i < t.rank(); ++i) {
        if (t.batch_axis && static_cast<std::size_t>(*t.batch_axis) == i) continue;
        const int64_t lo = t.min_shape[i], hi = t.max_shape[i];
        if (lo == hi || (lo <= 1 && hi == kUnbounded)) continue;  // static, or any extent
        notes.push_back(std::string(kind) + " '" + t.name + "' axis " + std::to_string(i) +
                        " was tuned and checked over " + std::to_string(lo) + ".." +
                        (hi == kUnbounded ? std::string("unbounded") : std::to_string(hi)) +
                        "; config.pbtxt's dims have -1 there, so Triton accepts any extent");
      }

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

  // The provider's own block (registry): its accelerator, parameters, and what has no place.
  if (const auto& provider = provider_description(config.provider); provider.triton) {
    auto block = provider.triton(config, trt_paths);
    accelerator_name = std::move(block.accelerator_name);
    accelerator = std::move(block.accelerator);
    for (auto& [key, value] : block.parameters) parameters[key] = std::move(value);
    notes.insert(notes.end(), block.notes.begin(), block.notes.end());
  } else {
    for (const auto& [key, value] : config.provider_options)
      notes.push_back("provider option " + key + "=" + value + ": the " + provider.name +
                      " provider has no Triton configuration; the option was not written");
  }
  const bool on_gpu = provider_capabilities(config.provider).device_memory;
  if (on_gpu && config.device_id != 0)
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
  out << "instance_group [\n  {\n    kind: " << (on_gpu ? "KIND_GPU" : "KIND_CPU")
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
