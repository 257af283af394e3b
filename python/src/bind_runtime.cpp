// OrtRuntime and ProviderStatus.
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "aitune/ort_runtime.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {

void bind_runtime(nb::module_& m) {
  nb::class_<ProviderStatus>(m, "ProviderStatus", "Whether an execution provider works here, and if not why.")
      .def_ro("provider", &ProviderStatus::provider)
      .def_ro("available", &ProviderStatus::available)
      .def_ro("library", &ProviderStatus::library)
      .def_ro("reason", &ProviderStatus::reason)
      .def("__repr__", [](const ProviderStatus& s) {
        return "ProviderStatus(" + std::string(execution_provider_name(s.provider)) +
               (s.available ? ", available)" : ", unavailable: " + s.reason + ")");
      });

  nb::class_<OrtRuntime>(m, "OrtRuntime", "The process's ONNX Runtime, loaded once at run time.")
      .def_static(
          "load",
          [](const std::string& library_path, const std::string& providers_dir) {
            return OrtRuntime::load(OrtRuntimeOptions{library_path, providers_dir});
          },
          nb::arg("library_path") = "", nb::arg("providers_dir") = "")
      .def_static(
          "search_paths",
          [](const std::string& library_path) { return OrtRuntime::search_paths(OrtRuntimeOptions{library_path}); },
          nb::arg("library_path") = "")
      .def_prop_ro("library_path", &OrtRuntime::library_path)
      .def_prop_ro("providers_dir", &OrtRuntime::providers_dir)
      .def_prop_ro("version", &OrtRuntime::version)
      .def("compiled_providers", &OrtRuntime::compiled_providers)
      .def("provider_status", &OrtRuntime::provider_status, nb::arg("provider"),
           nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace aitune::python
