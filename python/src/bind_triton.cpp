// Triton export: export_triton over a checkpoint, its options and result, the config text.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "aitune/triton_export.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {

void bind_triton(nb::module_& m) {
  nb::class_<TritonExportOptions>(m, "TritonExportOptions", "Options of export_triton (see triton_export.hpp).")
      .def(
          "__init__",
          [](TritonExportOptions* self, std::string model_name, std::optional<int> max_batch_size, int instances,
             bool overwrite) {
            new (self) TritonExportOptions{std::move(model_name), max_batch_size, instances, overwrite};
          },
          nb::arg("model_name") = "", nb::arg("max_batch_size").none() = nb::none(), nb::arg("instances") = 1,
          nb::arg("overwrite") = false)
      .def_rw("model_name", &TritonExportOptions::model_name)
      .def_rw("max_batch_size", &TritonExportOptions::max_batch_size)
      .def_rw("instances", &TritonExportOptions::instances)
      .def_rw("overwrite", &TritonExportOptions::overwrite)
      .def_rw("source", &TritonExportOptions::source);

  nb::class_<TritonModelExport>(m, "TritonModelExport", "One model written into a Triton repository.")
      .def_ro("name", &TritonModelExport::name)
      .def_ro("graph_key", &TritonModelExport::graph_key)
      .def_ro("directory", &TritonModelExport::directory)
      .def_ro("max_batch_size", &TritonModelExport::max_batch_size)
      .def_ro("not_expressed", &TritonModelExport::not_expressed)
      .def("__repr__", [](const TritonModelExport& e) {
        return "TritonModelExport(" + e.name + ", " + (e.graph_key.empty() ? "ensemble" : "graph " + e.graph_key) +
               ", max_batch_size " + std::to_string(e.max_batch_size) + ")";
      });

  nb::class_<TritonExportResult>(m, "TritonExportResult", "What export_triton wrote.")
      .def_ro("repository", &TritonExportResult::repository)
      .def_ro("models", &TritonExportResult::models)
      .def_ro("ensemble", &TritonExportResult::ensemble)
      .def_ro("notes", &TritonExportResult::notes)
      .def("__repr__", [](const TritonExportResult& r) {
        return "TritonExportResult(" + r.repository + ", " + std::to_string(r.models.size()) + " models)";
      });

  nb::class_<TritonModelConfig>(m, "TritonModelConfig", "config.pbtxt text of one graph and what it lacks.")
      .def_ro("text", &TritonModelConfig::text)
      .def_ro("max_batch_size", &TritonModelConfig::max_batch_size)
      .def_ro("not_expressed", &TritonModelConfig::not_expressed);

  m.def("is_valid_triton_model_name", [](const std::string& name) { return is_valid_triton_model_name(name); },
        nb::arg("name"));
  m.def("triton_model_config", &triton_model_config, nb::arg("graph"), nb::arg("model_name"),
        nb::arg("max_batch_size").none() = nb::none(), nb::arg("instances") = 1,
        nb::arg("trt_paths") = std::map<std::string, std::string>{},
        "config.pbtxt text (Triton's ModelConfig, protobuf text format) for one checkpoint graph.");
  m.def(
      "export_triton",
      [](const Checkpoint& checkpoint, const std::string& repository, const TritonExportOptions& options) {
        nb::gil_scoped_release release;
        return export_triton(checkpoint, repository, options);
      },
      nb::arg("checkpoint"), nb::arg("repository"), nb::arg("options") = TritonExportOptions{},
      "Writes the checkpoint's graphs into a Triton model repository (atomically per model).");
}

}  // namespace aitune::python
