// Enums shared by the bound classes.
#include <nanobind/stl/string.h>

#include "aitune/execution_provider.hpp"
#include "aitune/onnx_session.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {

void bind_types(nb::module_& m) {
  nb::enum_<ExecutionProvider>(m, "ExecutionProvider", "ONNX Runtime execution provider driven by aitune.")
      .value("CPU", ExecutionProvider::kCPU)
      .value("CUDA", ExecutionProvider::kCUDA)
      .value("TENSORRT", ExecutionProvider::kTensorRT);
  m.def("parse_execution_provider", [](const std::string& text) { return parse_execution_provider(text); }, nb::arg("text"),
        "Parses 'cpu' / 'cuda' / 'tensorrt' (case-insensitive); InvalidArgumentError otherwise.");
  m.def("execution_provider_name", [](ExecutionProvider p) { return std::string(execution_provider_name(p)); });

  nb::enum_<GraphOptimizationLevel>(m, "GraphOptimizationLevel", "ONNX Runtime graph optimisation level.")
      .value("DISABLE_ALL", GraphOptimizationLevel::kDisableAll)
      .value("BASIC", GraphOptimizationLevel::kBasic)
      .value("EXTENDED", GraphOptimizationLevel::kExtended)
      .value("ALL", GraphOptimizationLevel::kAll);
}

}  // namespace aitune::python
