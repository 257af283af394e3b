// aitune._core: the C++ engine exposed to Python.
#include <nanobind/stl/string.h>

#include <cstdlib>
#include <string_view>

#include "aitune/version.hpp"
#include "bindings.hpp"

NB_MODULE(_core, m) {
  m.doc() = "aitune's C++ engine: ONNX Runtime loader, graph specs, ONNX Runtime backend, CLI";
  m.attr("__version__") = std::string(aitune::version());
  m.attr("ort_api_version") = aitune::ort_api_version();
  // nanobind's "leaked N instances!" report at interpreter exit is a tool for whoever
  // changes the bindings, not a user's concern: objects a user's script keeps until
  // shutdown (a loaded module whose output dataclass lives in __main__, reachable from
  // torch's pytree registry until after this module is torn down) are not leaks. On
  // with AITUNE_LEAK_WARNINGS=1, as tests/python/test_quiet_exit.py runs its scripts.
  const char* leak_warnings = std::getenv("AITUNE_LEAK_WARNINGS");
  nanobind::set_leak_warnings(leak_warnings != nullptr && std::string_view(leak_warnings) == "1");
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
