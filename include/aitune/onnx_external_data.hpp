// External data of an ONNX model: the files beside a model that hold its tensors.
#pragma once

#include <string>
#include <vector>

namespace aitune {

/// The external data files an ONNX model file references, as written in the model
/// (each tensor's "location", relative to the model's directory), sorted and without
/// duplicates; empty for a model that keeps its tensors inline. ORT offers no query
/// for this, so the model's bytes are scanned for the protobuf record of a "location"
/// entry (no protobuf dependency; the file is memory-mapped, not parsed). The names are
/// returned unchecked: callers decide whether a location is acceptable (see
/// `is_safe_relative_path`). Throws Error(kIo) naming the file when it cannot be read.
/// Thread safe.
std::vector<std::string> onnx_external_data_locations(const std::string& model_path);

/// True when `path` is a non-empty relative path of '/'-separated components that
/// cannot leave the directory it is resolved against: not absolute, no empty, "." or
/// ".." component, no backslash or NUL. Checkpoint artifact paths and external data
/// locations inside a checkpoint must pass this.
bool is_safe_relative_path(const std::string& path) noexcept;

}  // namespace aitune
