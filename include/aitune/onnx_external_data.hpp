// External data of an ONNX model: the files beside a model that hold its tensors or its compiled engines.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace aitune {

/// Bounds of the ONNX protobuf walk in `onnx_external_data_locations`: a model nested
/// deeper than this (subgraphs in attributes in nodes ...) is refused, like protobuf's
/// own default recursion limit of 100 would.
inline constexpr std::size_t kOnnxMaxMessageDepth = 100;
/// Longest external data location accepted (a path; PATH_MAX on Linux).
inline constexpr std::size_t kOnnxMaxLocationBytes = 4096;

/// The external data files an ONNX model file references, as written in the model
/// (each tensor's "location" entry, relative to the model's directory), sorted and
/// without duplicates; empty for a model that keeps its tensors inline. ORT offers no
/// query for this, so the model's protobuf wire format is walked (no protobuf
/// dependency; the file is memory-mapped): ModelProto.graph, .functions and
/// .training_info; in every GraphProto the initializers, sparse initializers and node
/// attributes (t, tensors, sparse_tensor(s), g, graphs: subgraphs recursively); in
/// every TensorProto each external_data entry whose key is "location", whatever order
/// its fields are written in. Also the engine file of every EPContext node (a compiled
/// TensorRT or other EP context) with embed_mode=0, whose ep_cache_context attribute
/// names a file that ORT loads relative to the model's directory: a file the model
/// pulls in exactly as it does external data, so checkpoints copy, list and verify it
/// the same way. Every location is returned whatever the tensor's
/// data_location says (stricter than ORT, never laxer). The names are returned
/// unchecked: callers decide whether a location is acceptable (see
/// `is_safe_relative_path`). Throws Error(kIo) naming the file when it cannot be read,
/// Error(kModelInvalid) when its bytes are not a well-formed protobuf along the walked
/// path (truncated, nested deeper than kOnnxMaxMessageDepth, a location longer than
/// kOnnxMaxLocationBytes, an EPContext node with embed_mode=0 naming no file).
/// Thread safe.
std::vector<std::string> onnx_external_data_locations(const std::string& model_path);

/// The same walk over a serialized ModelProto held in memory; `what` names it in error
/// messages. Throws Error(kModelInvalid) as above.
std::vector<std::string> onnx_external_data_locations_in(std::string_view model_bytes, const std::string& what);

/// True when `path` is a non-empty relative path of '/'-separated components that
/// cannot leave the directory it is resolved against: not absolute, no empty, "." or
/// ".." component, no backslash or NUL. Checkpoint artifact paths and external data
/// locations inside a checkpoint must pass this.
bool is_safe_relative_path(const std::string& path) noexcept;

}  // namespace aitune
