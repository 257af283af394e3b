// The operator types of an ONNX model file, read from its protobuf wire format.
#pragma once

#include <set>
#include <string>

namespace aitune {

/// The operator types of every node of an ONNX model file: the main graph, subgraphs in
/// node attributes and local functions (the protobuf wire format walked; no protobuf
/// dependency). Error(kIo) when the file cannot be read, Error(kModelInvalid) when it is
/// not a well-formed protobuf along the walked path.
std::set<std::string> onnx_operator_types(const std::string& model_path);

}  // namespace aitune
