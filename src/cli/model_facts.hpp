// Private to the CLI: what `aitune tune` reads from an ONNX file for the candidate plan
// (the torch front end knows the same from the module): its operators and its precision.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "aitune/correctness.hpp"
#include "aitune/onnx_session.hpp"

namespace aitune::cli {

/// The operator types of every node of an ONNX model file: the main graph, subgraphs in
/// node attributes and local functions (the protobuf wire format walked; no protobuf
/// dependency). Error(kIo) when the file cannot be read, Error(kModelInvalid) when it is
/// not a well-formed protobuf along the walked path.
std::set<std::string> onnx_operator_types(const std::string& model_path);

/// True when `operators` has a convolution (Conv, ConvTranspose, ConvInteger, QLinearConv).
bool has_convolutions(const std::set<std::string>& operators);

/// What a model computes in by its own dtypes: FP16 / BF16 when every floating input and
/// output is that dtype (an fp16 / bf16 module's export), strict otherwise.
Precision model_precision(const std::vector<IoInfo>& inputs, const std::vector<IoInfo>& outputs);

}  // namespace aitune::cli
