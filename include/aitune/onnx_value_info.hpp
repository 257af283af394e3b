// What an ONNX model file declares of its graph's inputs and outputs beyond what ONNX
// Runtime's API tells: ORT gives a value declared without any shape as rank 0, the same
// as a scalar.
#pragma once

#include <set>
#include <string>
#include <string_view>

namespace aitune {

/// The names of the main graph's inputs and outputs whose tensor type declares no shape
/// at all (rank unknown; not a scalar, which declares an empty shape), read from the
/// protobuf wire format. Error(kIo) when the file cannot be read, Error(kModelInvalid)
/// when it is not a well-formed protobuf along the walked path.
std::set<std::string> onnx_values_without_rank(const std::string& model_path);

/// The same over a model's bytes in memory; `what` names it in errors.
std::set<std::string> onnx_values_without_rank_in(std::string_view model_bytes, const std::string& what);

}  // namespace aitune
