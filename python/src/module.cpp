// aitune._core: the C++ engine exposed to Python.
#include <nanobind/stl/string.h>

#include "aitune/version.hpp"
#include "bindings.hpp"

NB_MODULE(_core, m) {
  m.doc() = "aitune's C++ engine: ONNX Runtime loader, graph specs, ONNX Runtime backend, CLI";
  m.attr("__version__") = std::string(aitune::version());
  m.attr("ort_api_version") = aitune::ort_api_version();
  aitune::python::bind_errors(m);
  aitune::python::bind_types(m);
  aitune::python::bind_graph_spec(m);
  aitune::python::bind_runtime(m);
  aitune::python::bind_session(m);
  aitune::python::bind_checkpoint(m);
  aitune::python::bind_cli(m);
  aitune::python::bind_process_directory(m);
  aitune::python::bind_tuning(m);
  aitune::python::bind_torch_dispatch(m);
  aitune::python::bind_triton(m);
  aitune::python::bind_serving(m);
}
