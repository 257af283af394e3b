// Triton export: a checkpoint's tuned graphs written as a Triton Inference Server model
// repository (config.pbtxt + 1/model.onnx per graph), the tuned configuration kept.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "aitune/checkpoint.hpp"

namespace aitune {

/// Options of `export_triton`. Value type.
struct TritonExportOptions {
  /// Name of the model in the repository (its directory name). Empty: the checkpoint's
  /// module_name. Must pass `is_valid_triton_model_name`. With several graphs, each
  /// graph's model is "<model_name>_<graph key>" and an ensemble (where there is one)
  /// is "<model_name>".
  std::string model_name;
  /// Triton's max_batch_size. Unset: the largest batch size recorded on the graphs'
  /// batch axis (0 when a graph has no batch axis usable by Triton: one that is axis 0
  /// of every input and output). 0 turns batching off (the batch axis stays in dims).
  /// A positive value for a graph without such a batch axis is an error; one above a
  /// TensorRT profile's maximum batch is an error; one above the recorded range is
  /// written with a note in the model's README.md (untuned sizes).
  std::optional<int> max_batch_size;
  /// instance_group count (>= 1).
  int instances = 1;
  /// Replace existing entries of the repository with the same names. Without it an
  /// existing non-empty entry is refused.
  bool overwrite = false;
  /// What each model's README.md names as its source. Empty: the checkpoint's directory
  /// (ait.export_triton saves to a scratch checkpoint first, which it names instead).
  std::string source;
};

/// One model written into the repository. Value type.
struct TritonModelExport {
  std::string name;       ///< the model's name (its directory under the repository)
  std::string graph_key;  ///< the checkpoint graph it serves; empty for an ensemble
  std::string directory;  ///< absolute path of the model's directory
  int max_batch_size = 0;
  /// What of the tuned configuration config.pbtxt could not express, one sentence each
  /// (also listed in the model's README.md).
  std::vector<std::string> not_expressed;
};

/// What `export_triton` wrote. Value type.
struct TritonExportResult {
  std::string repository;                ///< absolute path of the repository
  std::vector<TritonModelExport> models;  ///< graph models in checkpoint order, then the ensemble
  /// Name of the ensemble model; empty when none was written.
  std::string ensemble;
  /// Notes on the export as a whole: why no ensemble was written (several graphs), and
  /// graphs of the checkpoint that were not exported (graphs a front end keeps eager).
  std::vector<std::string> notes;
};

/// config.pbtxt of one graph and what it could not express. Value type.
struct TritonModelConfig {
  std::string text;  ///< protobuf text format of inference.ModelConfig
  int max_batch_size = 0;
  std::vector<std::string> not_expressed;
};

/// True for a name usable as a Triton model directory: 1 to 255 characters of
/// [A-Za-z0-9._-], not starting with '.' (hidden; temporary entries use that).
bool is_valid_triton_model_name(std::string_view name) noexcept;

/// The ModelConfig text of `graph` served as `model_name`: platform
/// "onnxruntime_onnx", inputs and outputs from its graph spec (TYPE_* dtypes, -1 for
/// dynamic axes, the batch axis dropped when batching), max_batch_size (see
/// TritonExportOptions), dynamic_batching when batching, instance_group (KIND_CPU for
/// the CPU provider, KIND_GPU otherwise) of `instances`, and the backend
/// configuration where Triton's ONNX Runtime backend reads it: TensorRT options as a
/// "tensorrt" gpu_execution_accelerator (precision_mode, caches, profiles...), CUDA
/// options as a "cuda" accelerator or, for the four the backend resets whenever a model
/// has `parameters` (cudnn_conv_algo_search, gpu_mem_limit, arena_extend_strategy,
/// do_copy_in_default_stream), as model parameters; thread counts as parameters; the
/// graph optimisation level as optimization.graph.level. `trt_paths` maps provider
/// options holding paths (trt_engine_cache_path, trt_timing_cache_path) to the value to
/// write (the export points them into the repository). Everything else lands in
/// `not_expressed`. Pure function. Error(kInvalidArgument) for an invalid name,
/// instances < 1, or a max_batch_size the graph cannot take.
TritonModelConfig triton_model_config(const CheckpointGraph& graph, const std::string& model_name,
                                      std::optional<int> max_batch_size, int instances,
                                      const std::map<std::string, std::string>& trt_paths = {});

/// Writes the graphs of `checkpoint` into the Triton model repository `repository`
/// (created if missing; other entries are left alone). Per graph a model directory:
/// config.pbtxt, 1/model.onnx (the checkpoint's model file byte for byte, which is the
/// file that won tuning) with its external data beside it, TensorRT caches the
/// checkpoint holds under 1/ (the options pointing at them by absolute path), and a
/// README.md listing what config.pbtxt could not express. Several graphs: an ensemble
/// "<model_name>" chaining them when they form a plain chain (each graph's inputs are
/// exactly the previous graph's outputs, by name and dtype, and batching agrees);
/// otherwise `notes` says which graphs were written and why there is no ensemble.
///
/// Nothing is half-written: every model is first written into a temporary directory in
/// the repository (".<name>.tmp-..."), then renamed into place; an existing entry being
/// replaced (overwrite) is renamed aside first and put back if a later rename fails.
/// Error(kInvalidArgument): invalid or defaulted-but-invalid model name, instances < 1,
/// a bad max_batch_size, an existing non-empty entry without `overwrite` (or an entry
/// that is not a directory), a repository path that is a file. Error(kState): a
/// checkpoint without graphs (nothing was tuned). Error(kIo): a failed write.
TritonExportResult export_triton(const Checkpoint& checkpoint, const std::string& repository,
                                 const TritonExportOptions& options = {});

}  // namespace aitune
