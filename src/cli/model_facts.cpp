// Reads the convolutions and the precision of an ONNX model for `aitune tune`'s candidate plan.
#include "model_facts.hpp"

namespace aitune::cli {

bool has_convolutions(const std::set<std::string>& operators) {
  for (const char* op : {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"})
    if (operators.contains(op)) return true;
  return false;
}

Precision model_precision(const std::vector<IoInfo>& inputs, const std::vector<IoInfo>& outputs) {
  std::set<DType> floating;
  for (const auto* ios : {&inputs, &outputs})
    for (const auto& io : *ios)
      if (dtype_is_floating(io.dtype)) floating.insert(io.dtype);
  if (floating == std::set<DType>{DType::kFloat16}) return Precision::kFP16;
  if (floating == std::set<DType>{DType::kBFloat16}) return Precision::kBF16;
  return Precision::kStrict;
}

}  // namespace aitune::cli
