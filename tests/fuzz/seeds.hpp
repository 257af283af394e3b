// Built-in seeds of the fuzz targets (the fixtures directory adds the test models).
#pragma once

#include <string>
#include <vector>

namespace aitune::fuzz {

std::vector<std::string> npy_seeds();
std::vector<std::string> manifest_seeds();
std::vector<std::string> graph_spec_seeds();
std::vector<std::string> onnx_seeds();

}  // namespace aitune::fuzz
