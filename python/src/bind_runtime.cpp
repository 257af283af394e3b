// OrtRuntime, OrtWheel and ProviderStatus.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "aitune/ort_runtime.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {

void bind_runtime(nb::module_& m) {
  nb::class_<OrtWheel>(m, "OrtWheel", "ONNX Runtime installed as a Python package (the PyPI wheel).")
      .def(nb::init<>())
      .def_rw("distribution", &OrtWheel::distribution)
      .def_rw("version", &OrtWheel::version)
      .def_rw("capi_dir", &OrtWheel::capi_dir)
      .def_rw("warning", &OrtWheel::warning)
      .def("__repr__", [](const OrtWheel& w) {
        return "OrtWheel(" + w.distribution + " " + w.version + ", " + w.capi_dir + ")";
      });

  nb::class_<ProviderStatus>(m, "ProviderStatus", "Whether an execution provider works here, and if not why.")
      .def_ro("provider", &ProviderStatus::provider)
      .def_ro("available", &ProviderStatus::available)
      .def_ro("library", &ProviderStatus::library)
      .def_ro("reason", &ProviderStatus::reason)
      .def_ro("cuda_libraries", &ProviderStatus::cuda_libraries)
      .def("__repr__", [](const ProviderStatus& s) {
        return "ProviderStatus(" + std::string(execution_provider_name(s.provider)) +
               (s.available ? ", available)" : ", unavailable: " + s.reason + ")");
      });

  nb::class_<OrtRuntime>(m, "OrtRuntime", "The process's ONNX Runtime, loaded once at run time.")
      .def_static(
          "load",
          [](const std::string& library_path, const std::string& providers_dir,
             const std::vector<std::string>& cuda_library_dirs) {
            return OrtRuntime::load(OrtRuntimeOptions{library_path, providers_dir, cuda_library_dirs});
          },
          nb::arg("library_path") = "", nb::arg("providers_dir") = "",
          nb::arg("cuda_library_dirs") = std::vector<std::string>{})
      .def_static(
          "use_python_packages",
          [](const OrtWheel& wheel, const std::vector<std::string>& cuda_library_dirs) {
            OrtRuntime::use_python_packages(OrtPythonPackages{wheel, cuda_library_dirs});
          },
          nb::arg("wheel"), nb::arg("cuda_library_dirs"),
          "Registers the Python environment's ONNX Runtime wheel and CUDA library folders (aitune/_ort_wheel.py).")
      .def_static("python_packages",
                  [] {
                    auto p = OrtRuntime::python_packages();
                    return std::make_pair(p.onnxruntime, p.cuda_library_dirs);
                  })
      .def_static(
          "search_paths",
          [](const std::string& library_path) { return OrtRuntime::search_paths(OrtRuntimeOptions{library_path}); },
          nb::arg("library_path") = "")
      .def_static("foreign_provider_bridge", &OrtRuntime::foreign_provider_bridge, nb::arg("shared_library"),
                  "The library the process's provider bridge comes from when it is not shared_library, else None.")
      .def_static("live_sessions", &OrtRuntime::live_sessions,
                  "ORT sessions the engine created that are still alive (backends and the tensors they handed out).")
      .def_prop_ro("library_path", &OrtRuntime::library_path)
      .def_prop_ro("wheel", &OrtRuntime::wheel)
      .def_prop_ro("providers_dir", &OrtRuntime::providers_dir)
      .def_prop_ro("cuda_library_dirs", &OrtRuntime::cuda_library_dirs)
      .def_prop_ro("version", &OrtRuntime::version)
      .def("compiled_providers", &OrtRuntime::compiled_providers)
      .def("provider_status", &OrtRuntime::provider_status, nb::arg("provider"),
           nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace aitune::python
