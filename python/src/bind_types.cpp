// Value types shared by the bound classes: the execution provider handle (the registry's
// names), the graph optimisation level.
#include <nanobind/operators.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <functional>

#include "aitune/execution_provider.hpp"
#include "aitune/onnx_session.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {

void bind_types(nb::module_& m) {
  // A class, not an enum: providers are registered (C++ provider registry), so the set is
  // open. CPU / CUDA / TENSORRT stay as attributes for the built-ins.
  nb::class_<ExecutionProvider>(m, "ExecutionProvider",
                                "A registered ONNX Runtime execution provider (by name: 'cpu', 'cuda', 'tensorrt', ...).")
      .def_prop_ro_static("CPU", [](nb::handle) { return ExecutionProvider::kCPU; })
      .def_prop_ro_static("CUDA", [](nb::handle) { return ExecutionProvider::kCUDA; })
      .def_prop_ro_static("TENSORRT", [](nb::handle) { return ExecutionProvider::kTensorRT; })
      .def_prop_ro("name", [](ExecutionProvider p) { return std::string(p.name()); }, "'cpu', 'cuda', 'tensorrt', ...")
      .def_prop_ro("ort_name", [](ExecutionProvider p) { return std::string(execution_provider_ort_name(p)); })
      .def("__eq__", [](ExecutionProvider a, ExecutionProvider b) { return a == b; })
      .def("__eq__", [](ExecutionProvider, nb::handle) { return false; })
      .def("__hash__", [](ExecutionProvider p) { return std::hash<std::string_view>{}(p.name()); })
      .def("__str__", [](ExecutionProvider p) { return std::string(p.name()); })
      .def("__repr__", [](ExecutionProvider p) { return "ExecutionProvider('" + std::string(p.name()) + "')"; })
      // Pickled by name (nanobind's __getstate__ / __setstate__ pattern); the name is
      // looked up in the registry again when unpickled.
      .def("__getstate__", [](ExecutionProvider p) { return std::string(p.name()); })
      .def("__setstate__", [](ExecutionProvider& p, const std::string& name) {
        new (&p) ExecutionProvider(parse_execution_provider(name));
      });
  m.def("parse_execution_provider", [](const std::string& text) { return parse_execution_provider(text); }, nb::arg("text"),
        "Parses a registered provider's name ('cpu' / 'cuda' / 'tensorrt', case-insensitive; ORT's names too); "
        "InvalidArgumentError otherwise.");
  m.def("execution_provider_name", [](ExecutionProvider p) { return std::string(execution_provider_name(p)); });
  m.def("registered_execution_providers", [] { return registered_execution_providers(); },
        "Every registered provider, the built-ins first.");
  m.def(
      "provider_capabilities",
      [](ExecutionProvider p) {
        const auto& c = provider_capabilities(p);
        nb::dict d;
        d["device_memory"] = c.device_memory;
        d["cuda_graph"] = c.cuda_graph;
        d["fp16_model"] = c.fp16_model;
        d["contrib_operators"] = c.contrib_operators;
        return d;
      },
      nb::arg("provider"), "What a provider can do (its registry entry's capabilities).");

  nb::enum_<GraphOptimizationLevel>(m, "GraphOptimizationLevel", "ONNX Runtime graph optimisation level.")
      .value("DISABLE_ALL", GraphOptimizationLevel::kDisableAll)
      .value("BASIC", GraphOptimizationLevel::kBasic)
      .value("EXTENDED", GraphOptimizationLevel::kExtended)
      .value("ALL", GraphOptimizationLevel::kAll);
}

}  // namespace aitune::python
