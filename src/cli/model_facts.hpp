// Private to the CLI: what `aitune tune` reads from an ONNX file for the candidate plan
// (the torch front end knows the same from the module): its operators and its precision.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "aitune/correctness.hpp"
#include "aitune/onnx_operators.hpp"  // onnx_operator_types, what has_convolutions reads
#include "aitune/onnx_session.hpp"

namespace aitune::cli {

/// True when `operators` has a convolution (Conv, ConvTranspose, ConvInteger, QLinearConv).
bool has_convolutions(const std::set<std::string>& operators);

/// What a model computes in by its own dtypes: FP16 / BF16 when every floating input and
/// output is that dtype (an fp16 / bf16 module's export), strict otherwise.
Precision model_precision(const std::vector<IoInfo>& inputs, const std::vector<IoInfo>& outputs);

}  // namespace aitune::cli
