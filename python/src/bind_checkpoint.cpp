// Checkpoint, its manifest types, save options and backend overrides (a device_map).
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "aitune/checkpoint.hpp"
#include "aitune/onnx_external_data.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {

void bind_checkpoint(nb::module_& m) {
  m.attr("CHECKPOINT_FORMAT_VERSION") = kCheckpointFormatVersion;
  m.attr("CHECKPOINT_MANIFEST_FILE") = std::string(kCheckpointManifestFile);
  m.attr("CHECKPOINT_FORMAT_NAME") = std::string(kCheckpointFormatName);
  m.attr("ONNX_RUNTIME_BACKEND_NAME") = std::string(kOnnxRuntimeBackendName);
  m.attr("TORCH_COMPILE_BACKEND_NAME") = std::string(kTorchCompileBackendName);
  m.attr("EAGER_BACKEND_NAME") = std::string(kEagerBackendName);

  nb::class_<CheckpointArtifact>(m, "CheckpointArtifact", "One file of a checkpoint: relative path, size, sha256.")
      .def(
          "__init__",
          [](CheckpointArtifact* self, std::string path, std::uint64_t size, std::string sha256) {
            new (self) CheckpointArtifact{std::move(path), size, std::move(sha256)};
          },
          nb::arg("path") = "", nb::arg("size") = 0, nb::arg("sha256") = "")
      .def_rw("path", &CheckpointArtifact::path)
      .def_rw("size", &CheckpointArtifact::size)
      .def_rw("sha256", &CheckpointArtifact::sha256)
      .def("__eq__", [](const CheckpointArtifact& a, const CheckpointArtifact& b) { return a == b; })
      .def("__repr__", [](const CheckpointArtifact& a) {
        return "CheckpointArtifact(" + a.path + ", " + std::to_string(a.size) + " bytes)";
      });

  nb::class_<CheckpointGraph>(m, "CheckpointGraph",
                              "One saved graph: key, graph spec, backend configuration, structure, files.")
      .def(
          "__init__",
          [](CheckpointGraph* self, std::string key, GraphSpec graph_spec, OnnxSessionConfig backend_config,
             std::string structure_json, std::string model, std::string backend) {
            auto* g = new (self) CheckpointGraph{};
            g->key = std::move(key);
            g->graph_spec = std::move(graph_spec);
            g->backend_config = std::move(backend_config);
            g->structure_json = std::move(structure_json);
            g->model = std::move(model);
            g->backend = std::move(backend);
          },
          nb::arg("key") = "", nb::arg("graph_spec") = GraphSpec{},
          nb::arg("backend_config") = OnnxSessionConfig{}, nb::arg("structure_json") = "null",
          nb::arg("model") = "", nb::arg("backend") = std::string(kOnnxRuntimeBackendName))
      .def_rw("key", &CheckpointGraph::key)
      .def_rw("graph_spec", &CheckpointGraph::graph_spec)
      .def_rw("backend", &CheckpointGraph::backend)
      .def_rw("section_version", &CheckpointGraph::section_version)
      .def_rw("section_json", &CheckpointGraph::section_json)
      .def_rw("backend_config", &CheckpointGraph::backend_config)
      .def_rw("path_options", &CheckpointGraph::path_options)
      .def_rw("model", &CheckpointGraph::model)
      .def_rw("structure_json", &CheckpointGraph::structure_json)
      .def_rw("artifacts", &CheckpointGraph::artifacts)
      .def("__eq__", [](const CheckpointGraph& a, const CheckpointGraph& b) { return a == b; })
      .def("__repr__", [](const CheckpointGraph& g) {
        return "CheckpointGraph(" + g.key + ", " + std::to_string(g.artifacts.size()) + " artifacts)";
      });

  nb::class_<CheckpointManifest>(m, "CheckpointManifest", "The contents of a checkpoint's manifest.json.")
      .def(
          "__init__",
          [](CheckpointManifest* self, std::string module_name, std::string metadata_json,
             std::vector<CheckpointGraph> graphs) {
            auto* man = new (self) CheckpointManifest{};
            man->module_name = std::move(module_name);
            man->metadata_json = std::move(metadata_json);
            man->graphs = std::move(graphs);
          },
          nb::arg("module_name") = "", nb::arg("metadata_json") = "{}",
          nb::arg("graphs") = std::vector<CheckpointGraph>{})
      .def_rw("format_version", &CheckpointManifest::format_version)
      .def_rw("aitune_version", &CheckpointManifest::aitune_version)
      .def_rw("onnxruntime_version", &CheckpointManifest::onnxruntime_version)
      .def_rw("module_name", &CheckpointManifest::module_name)
      .def_rw("created", &CheckpointManifest::created)
      .def_rw("metadata_json", &CheckpointManifest::metadata_json)
      .def_rw("graphs", &CheckpointManifest::graphs)
      .def("find_graph", &CheckpointManifest::find_graph, nb::arg("key"), nb::rv_policy::reference_internal,
           "The graph with `key`, or None.")
      .def("to_json", &CheckpointManifest::to_json, nb::arg("indent") = 2)
      .def_static("from_json", &CheckpointManifest::from_json, nb::arg("text"),
                  "Parses and validates manifest JSON; CheckpointCorruptError naming the field otherwise.")
      .def("__eq__", [](const CheckpointManifest& a, const CheckpointManifest& b) { return a == b; });

  nb::class_<CheckpointSaveOptions>(m, "CheckpointSaveOptions", "Options of Checkpoint.save.")
      .def(
          "__init__",
          [](CheckpointSaveOptions* self, bool overwrite,
             std::function<void(const std::string&, std::size_t)> on_file_written,
             std::map<std::string, std::string> expected_sha256) {
            new (self)
                CheckpointSaveOptions{overwrite, nullptr, std::move(on_file_written), std::move(expected_sha256)};
          },
          nb::arg("overwrite") = true, nb::arg("on_file_written").none() = nb::none(),
          nb::arg("expected_sha256") = std::map<std::string, std::string>{})
      .def_rw("overwrite", &CheckpointSaveOptions::overwrite)
      .def_rw("runtime", &CheckpointSaveOptions::runtime, nb::for_setter(nb::arg("value").none()),
              "OrtRuntime whose version is recorded (None: the default).")
      .def_rw("on_file_written", &CheckpointSaveOptions::on_file_written, nb::for_setter(nb::arg("value").none()),
              "Called as on_file_written(path, files_written) after each file is flushed (with the GIL "
              "taken); an exception raised there aborts the save and leaves a previous checkpoint intact.")
      .def_rw("expected_sha256", &CheckpointSaveOptions::expected_sha256,
              "Artifact path -> the sha256 its copied bytes must have; otherwise StateError, nothing replaced.");

  nb::class_<CheckpointBackendOverrides>(m, "CheckpointBackendOverrides",
                                         "Changes to a saved backend configuration on load (a device_map).")
      .def(
          "__init__",
          [](CheckpointBackendOverrides* self, std::optional<ExecutionProvider> provider,
             std::optional<int> device_id, std::optional<std::map<std::string, std::string>> provider_options) {
            new (self) CheckpointBackendOverrides{provider, device_id, std::move(provider_options)};
          },
          nb::arg("provider").none() = nb::none(), nb::arg("device_id").none() = nb::none(),
          nb::arg("provider_options").none() = nb::none())
      .def_rw("provider", &CheckpointBackendOverrides::provider)
      .def_rw("device_id", &CheckpointBackendOverrides::device_id)
      .def_rw("provider_options", &CheckpointBackendOverrides::provider_options);

  nb::class_<Checkpoint>(m, "Checkpoint", "A loaded, verified checkpoint directory (immutable).")
      .def_static(
          "save",
          [](const std::string& dir, const CheckpointManifest& manifest,
             const std::map<std::string, std::string>& files, const CheckpointSaveOptions& options) {
            nb::gil_scoped_release release;
            return Checkpoint::save(dir, manifest, files, options);
          },
          nb::arg("dir"), nb::arg("manifest"), nb::arg("files"), nb::arg("options") = CheckpointSaveOptions{},
          "Writes a checkpoint directory atomically; returns the manifest as written. files: artifact path in "
          "the checkpoint -> source file or directory.")
      .def_static("enclosing_checkpoint", &Checkpoint::enclosing_checkpoint, nb::arg("dir"),
                  "The checkpoint directory `dir` lies inside ('' when none); save refuses such a `dir`.")
      .def_static(
          "load",
          [](const std::string& dir) {
            nb::gil_scoped_release release;
            return Checkpoint::load(dir);
          },
          nb::arg("dir"), "Opens and verifies a checkpoint directory (sizes, sha256, paths); runs nothing.")
      .def_static("is_checkpoint", &Checkpoint::is_checkpoint, nb::arg("dir"))
      .def_static("graph_directory", &Checkpoint::graph_directory, nb::arg("key"))
      .def_prop_ro("directory", &Checkpoint::directory)
      .def("is_current", &Checkpoint::is_current,
           "True while the directory still holds the version this object verified (no save replaced it since).")
      .def_prop_ro("manifest", &Checkpoint::manifest, nb::rv_policy::reference_internal)
      .def("graph_keys", &Checkpoint::graph_keys)
      .def("graph", &Checkpoint::graph, nb::arg("key"), nb::rv_policy::reference_internal)
      .def("artifact_path", &Checkpoint::artifact_path, nb::arg("relative"))
      .def("model_path", &Checkpoint::model_path, nb::arg("key"))
      .def("runs_in_engine", &Checkpoint::runs_in_engine, nb::arg("key"),
           "Whether this engine runs the graph (an onnxruntime section); else BackendUnavailableError on create.")
      .def("backend_config", &Checkpoint::backend_config, nb::arg("key"),
           nb::arg("overrides") = CheckpointBackendOverrides{})
      .def(
          "create_session",
          [](const Checkpoint& c, const std::string& key, const CheckpointBackendOverrides& overrides,
             std::shared_ptr<OrtRuntime> runtime) {
            nb::gil_scoped_release release;
            return c.create_session(key, overrides, std::move(runtime));
          },
          nb::arg("key"), nb::arg("overrides") = CheckpointBackendOverrides{}, nb::arg("runtime").none() = nb::none(),
          "Creates graph `key`'s OnnxSession with the saved configuration and graph spec, then `overrides`.")
      .def("__repr__", [](const Checkpoint& c) {
        return "Checkpoint(" + c.directory() + ", " + std::to_string(c.manifest().graphs.size()) + " graphs)";
      });

  m.def("onnx_external_data_locations", &onnx_external_data_locations, nb::arg("model_path"),
        "The files an ONNX model references beside it (external data, an EPContext engine), as written in it.");
}

}  // namespace aitune::python
