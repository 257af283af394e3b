// Checkpoint: tuned graphs saved as a directory (JSON manifest + ONNX models and cache
// files with sizes and sha256), written atomically and loaded without running any code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <string_view>
#include <vector>

#include "aitune/execution_provider.hpp"
#include "aitune/graph_spec.hpp"
#include "aitune/onnx_session.hpp"
#include "aitune/ort_runtime.hpp"

namespace aitune {

/// The manifest format this aitune writes, and the newest it reads (it reads 1..this).
/// 2: a graph names its backend's section (any of checkpoint_sections()), with the
/// section's version and own fields; 1: every graph is an ONNX Runtime graph.
inline constexpr int kCheckpointFormatVersion = 2;
/// Name of the manifest inside a checkpoint directory.
inline constexpr std::string_view kCheckpointManifestFile = "manifest.json";
/// Name of the manifest of a pipeline checkpoint (ait.save of an object holding several
/// ait.Modules): each module is a checkpoint of its own in a directory under `modules/`.
/// `Checkpoint::load` of the pipeline's directory names those (kInvalidArgument).
inline constexpr std::string_view kPipelineManifestFile = "pipeline.json";
/// Value of a pipeline manifest's "format" field.
inline constexpr std::string_view kPipelineFormatName = "aitune-pipeline-checkpoint";
/// Value of the manifest's "format" field, which marks a directory as an aitune checkpoint.
inline constexpr std::string_view kCheckpointFormatName = "aitune-checkpoint";
/// The backend name a graph run by OnnxSession is saved under.
inline constexpr std::string_view kOnnxRuntimeBackendName = "onnxruntime";
/// The backend names of graphs only the Python front end runs (ait.load): torch.compile
/// (its section holds the configuration it is compiled again with) and eager PyTorch.
inline constexpr std::string_view kTorchCompileBackendName = "torch_compile";
inline constexpr std::string_view kEagerBackendName = "eager";

/// A backend's section of a manifest: the name a graph's `backend` field holds, the
/// newest version of its fields this aitune reads, and who runs its graphs. The loader
/// dispatches on the name; a graph of a section this engine does not run loads (the
/// checkpoint is verified as a whole) but creating it is Error(kBackendUnavailable).
struct CheckpointSection {
  std::string_view name;
  int version = 1;
  bool runs_in_engine = false;   ///< an OnnxSession runs it (an ONNX model among its artifacts)
  std::string_view runs_where;   ///< who runs it otherwise ("the Python front end (ait.load)")
};
/// The sections this aitune knows: onnxruntime, torch_compile, eager.
const std::vector<CheckpointSection>& checkpoint_sections();
/// The section called `name`, or nullptr.
const CheckpointSection* find_checkpoint_section(std::string_view name) noexcept;

/// One file of a checkpoint. Value type.
struct CheckpointArtifact {
  std::string path;        ///< relative to the checkpoint directory, '/'-separated
  std::uint64_t size = 0;  ///< bytes
  std::string sha256;      ///< 64 lower-case hex digits

  bool operator==(const CheckpointArtifact&) const = default;
};

/// One saved graph: what it accepts, how its backend was configured, its files. Value type.
struct CheckpointGraph {
  /// Identifies the graph within the checkpoint; 1 to 255 characters of [A-Za-z0-9._-],
  /// not "." or "..". Its files live under `Checkpoint::graph_directory(key)`.
  std::string key;
  /// Bounds the inputs the loaded backend accepts.
  GraphSpec graph_spec;
  /// Which backend runs the graph: the name of its section (checkpoint_sections()).
  std::string backend = std::string(kOnnxRuntimeBackendName);
  /// The version of the section's fields the graph was written with (1..its section's version).
  int section_version = 1;
  /// The section's own fields, opaque JSON ("null" for onnxruntime, whose fields are the
  /// ones below; torch_compile: the configuration it is compiled with). Returned compact.
  std::string section_json = "null";
  /// The backend's full configuration, provider options included, as saved (path
  /// options named in `path_options` hold checkpoint-relative paths here).
  OnnxSessionConfig backend_config;
  /// Keys of provider options whose values are paths relative to the checkpoint
  /// directory (a TensorRT engine or timing cache saved as an artifact); they are made
  /// absolute by `Checkpoint::backend_config`. Filled in by `Checkpoint::save`.
  std::vector<std::string> path_options;
  /// Relative path of the graph's ONNX model among `artifacts`. Empty on save means
  /// "the graph's only .onnx artifact".
  std::string model;
  /// The front end's description of the graph's input/output structure: opaque JSON
  /// text (aitune stores it as JSON inside the manifest; "" means null). Returned
  /// compact ("{\"a\":1}"), whatever spacing it was given with.
  std::string structure_json = "null";
  /// The graph's files. Filled in by `Checkpoint::save` (ignored in its input).
  std::vector<CheckpointArtifact> artifacts;

  bool operator==(const CheckpointGraph&) const = default;
};

/// The contents of manifest.json. Value type; thread-compatible.
struct CheckpointManifest {
  /// Format of the manifest. `Checkpoint::save` writes kCheckpointFormatVersion.
  int format_version = kCheckpointFormatVersion;
  /// aitune::version() of the writer (set by `Checkpoint::save`).
  std::string aitune_version;
  /// ONNX Runtime version of the writer, "unknown" when none could be loaded (set by save).
  std::string onnxruntime_version;
  /// Name of the tuned module (free-form).
  std::string module_name;
  /// When the checkpoint was written, UTC, "2025-12-02T12:34:56Z" (set by save).
  std::string created;
  /// Free-form front-end metadata: opaque JSON text, stored as JSON ("" means {}).
  /// Returned compact.
  std::string metadata_json = "{}";
  /// The graphs, in the order given to save.
  std::vector<CheckpointGraph> graphs;

  /// The graph with `key`, or nullptr.
  const CheckpointGraph* find_graph(const std::string& key) const noexcept;

  /// The manifest as JSON text (what manifest.json holds).
  std::string to_json(int indent = 2) const;
  /// Parses and validates manifest JSON: the "format" marker, a supported
  /// format_version (1..kCheckpointFormatVersion; a newer one is refused first, before
  /// any other field is read), every field's presence and type, graph keys, safe and
  /// unique artifact paths, sha256 digests of 64 hex digits, `model` among the graph's
  /// artifacts, `path_options` naming provider options that hold safe relative paths,
  /// at least one graph, thread counts in 0..1024 and device ids in 0..1023 (integers,
  /// not 1.5 or 2^32 + 1). JSON nested deeper than 128 levels or text over 64 MB is
  /// refused while parsing. Throws Error(kCheckpointCorrupt) naming the field and what
  /// is wrong.
  static CheckpointManifest from_json(const std::string& text);

  bool operator==(const CheckpointManifest&) const = default;
};

/// Options of `Checkpoint::save`.
struct CheckpointSaveOptions {
  /// Replace an aitune checkpoint already at the path (the default). When false, an
  /// existing checkpoint there is refused too.
  bool overwrite = true;
  /// Runtime whose version is recorded. Null: `OrtRuntime::load()` (which loads ORT
  /// with default options if nothing loaded it yet); "unknown" when that fails.
  std::shared_ptr<OrtRuntime> runtime;
  /// Called after each artifact file was written and flushed to disk, with its relative
  /// path and how many files were written so far. An exception thrown from it aborts
  /// the save like any other failure: the temporary directory is removed and a previous
  /// checkpoint at the path stays as it was (progress reporting; tests inject failures).
  std::function<void(const std::string& path, std::size_t files_written)> on_file_written;
  /// The content some artifacts must have: relative path in the checkpoint -> sha256
  /// (64 lower-case hex digits). Each is compared with the digest of the bytes actually
  /// copied, so a source replaced or rewritten after the caller decided to save it (a
  /// module loaded from a checkpoint saving its files, read from that checkpoint) fails
  /// the save with Error(kState) naming the artifact, its source and the target, before
  /// anything at the target is replaced. A path this save does not write is not checked
  /// (a caller that expects its model's files lists the model too, whose bytes change
  /// when the files it references do); a value that is not a sha256 is kInvalidArgument
  /// before anything is written.
  std::map<std::string, std::string> expected_sha256;
};

/// Changes applied to a saved graph's backend configuration when loading it (a
/// `device_map`). Unset fields keep the saved values.
struct CheckpointBackendOverrides {
  /// Run on this provider. When it differs from the saved one and `provider_options`
  /// is unset, the saved provider options are dropped (they belong to the saved
  /// provider).
  std::optional<ExecutionProvider> provider;
  std::optional<int> device_id;
  /// Provider options merged over the saved ones (a key given here replaces the saved value).
  std::optional<std::map<std::string, std::string>> provider_options;
  /// Session settings replacing the saved ones (`aitune run CHECKPOINT --provider-option
  /// intra_op_threads=2`, as for an .onnx file).
  std::optional<int> intra_op_threads;
  std::optional<int> inter_op_threads;
  std::optional<GraphOptimizationLevel> graph_optimization_level;
};

/// A loaded, verified checkpoint directory. Holds the manifest and the directory's
/// canonical path; no files are kept open. Immutable after `load`, so thread safe.
class Checkpoint {
 public:
  /// Writes a checkpoint directory at `dir` (parents are created).
  ///
  /// `manifest` describes the module and its graphs; save fills in format_version,
  /// aitune_version, onnxruntime_version, created, each graph's artifacts and
  /// path_options, and an empty `model`. `files` maps each artifact's relative path in
  /// the checkpoint to the file or directory it is copied from. Every path must lie
  /// under a graph's directory, "graphs/<key>/..." (see `graph_directory`), and that
  /// graph owns it. A directory source (e.g. a TensorRT engine cache) contributes each
  /// regular file under it, recursively (empty directories are not stored). An .onnx
  /// source brings its external data files along: each location the model references
  /// is added beside the model unless `files` names that path already. A provider
  /// option trt_engine_cache_path / trt_timing_cache_path whose value is one of the
  /// graph's `files` keys, or the source path of one, is stored as that relative path
  /// and listed in the graph's path_options, so that loading points it into the
  /// checkpoint. structure_json and metadata_json must be JSON.
  ///
  /// Atomic: everything is written into a fresh temporary sibling directory
  /// (".<name>.tmp-..."), each file and directory fsync'ed, then swapped into place
  /// (renameat2 RENAME_EXCHANGE; where the file system lacks it, the old directory is
  /// renamed aside first) and the previous checkpoint removed. On any failure before
  /// the swap the temporary directory is removed and a previous checkpoint stays intact.
  ///
  /// Refuses (Error(kInvalidArgument)) a `dir` that exists and is not an aitune
  /// checkpoint: a file, a symbolic link, or a non-empty directory without an aitune
  /// manifest.json; an existing checkpoint when `options.overwrite` is false; invalid
  /// keys, paths outside a graph's directory, a `files` path given twice, a file and a
  /// directory at one path, a graph without an ONNX model, JSON fields that do not
  /// parse. Error(kIo) for a missing or unreadable source or a failed write (naming
  /// the file); Error(kModelInvalid) for an ONNX model whose external data is missing
  /// or lies outside its directory. Returns the manifest as written. Saves to different
  /// paths may run concurrently; of concurrent saves to one path, the last swap wins.
  static CheckpointManifest save(const std::string& dir, const CheckpointManifest& manifest,
                                 const std::map<std::string, std::string>& files,
                                 const CheckpointSaveOptions& options = {});

  /// Checks, leaving nothing written, that `save(dir, ..., options)` would not refuse `dir`:
  /// the refusals of `save` (a file, a symbolic link, a non-empty directory that is no
  /// aitune checkpoint, an existing checkpoint with overwrite off: kInvalidArgument) and
  /// an existing ancestor of `dir` that is not a directory (kIo), as `save` reports
  /// them, and a directory save cannot create its staging directory in (a read-only file
  /// system: kIo), probed by creating and removing one. For callers that save only after
  /// long work (`aitune tune --checkpoint`).
  static void check_save_target(const std::string& dir, const CheckpointSaveOptions& options = {});

  /// The checkpoint directory `dir` lies inside (an ancestor holding a `manifest.json` of
  /// format "aitune-checkpoint", or a `pipeline.json`), "" when none. `save` and
  /// `check_save_target` refuse such a `dir` with kInvalidArgument naming both: a save
  /// over the enclosing checkpoint replaces its directory whole, which would remove the
  /// checkpoint inside it.
  static std::string enclosing_checkpoint(const std::string& dir);

  /// Opens the checkpoint directory `dir` and verifies all of it before returning:
  /// manifest.json present and valid (`CheckpointManifest::from_json`); every artifact
  /// inside the directory (symbolic links may not lead outside it), present, a regular
  /// file, of the recorded size and sha256; each model's external data locations
  /// relative, inside the checkpoint and listed as artifacts. Nothing is executed and
  /// no session is created. Throws Error(kCheckpointCorrupt) naming the file and what
  /// was wrong, Error(kIo) when `dir` does not exist or a file cannot be read,
  /// Error(kInvalidArgument) when `dir` is not a directory.
  ///
  /// Consistent under concurrent saves to `dir`: a save replaces the directory in one
  /// step (a new inode at the path), so the load notes which directory the path names
  /// before it starts and retries when the path names another one afterwards, also
  /// when a check failed meanwhile (the files read may belong to the next version): a
  /// healthy checkpoint being overwritten is never reported corrupt. After 20 replaces
  /// in a row, Error(kIo) saying the checkpoint kept being replaced. Also removes what
  /// saves that died left beside `dir` (see `save`).
  static Checkpoint load(const std::string& dir);

  /// True when `dir` is a directory holding a manifest.json (nothing is verified).
  static bool is_checkpoint(const std::string& dir);

  /// "graphs/<key>": the relative directory holding a graph's files.
  static std::string graph_directory(const std::string& key);

  /// Canonical absolute path of the checkpoint directory.
  const std::string& directory() const noexcept { return directory_; }
  /// The verified manifest as stored (path options still relative; see `backend_config`).
  const CheckpointManifest& manifest() const noexcept { return manifest_; }
  /// Keys of the graphs, in manifest order.
  std::vector<std::string> graph_keys() const;
  /// The graph with `key`; Error(kInvalidArgument) naming it and listing the keys there are.
  const CheckpointGraph& graph(const std::string& key) const;
  /// Absolute path of the artifact with relative path `relative`;
  /// Error(kInvalidArgument) when the checkpoint has no such artifact.
  std::string artifact_path(const std::string& relative) const;
  /// Absolute path of the ONNX model of graph `key`.
  std::string model_path(const std::string& key) const;

  /// Whether this engine can run graph `key` (its section runs in the engine).
  bool runs_in_engine(const std::string& key) const;

  /// The configuration a backend for graph `key` is created with: the saved one, its
  /// path options made absolute inside this directory, then `overrides` applied.
  OnnxSessionConfig backend_config(const std::string& key,
                                          const CheckpointBackendOverrides& overrides = {}) const;

  /// Creates the backend for graph `key` (`OnnxSession::create` on the model
  /// with `backend_config(key, overrides)` and the saved graph spec). Errors are those
  /// of `OnnxSession::create`, prefixed with the checkpoint and graph;
  /// Error(kBackendUnavailable) naming the section and who runs it for a graph of a
  /// section this engine does not run (a torch.compile graph), as for `model_path`.
  /// When a save replaced the checkpoint since it was loaded (`is_current()` false), a
  /// failure is Error(kIo) saying so instead of blaming the model.
  std::unique_ptr<OnnxSession> create_session(const std::string& key,
                                                     const CheckpointBackendOverrides& overrides = {},
                                                     std::shared_ptr<OrtRuntime> runtime = nullptr) const;

  /// True while `directory()` still names the directory this object verified: no save
  /// has replaced it since. Sessions created (or files read) from a checkpoint that is
  /// no longer current may mix two versions; a caller loads again (ait.load does).
  bool is_current() const;

 private:
  Checkpoint(std::string directory, CheckpointManifest manifest);
  static Checkpoint load_once(const std::string& dir);
  std::string directory_;
  CheckpointManifest manifest_;
  // st_dev, st_ino and st_ctim of the directory verified: a save's new directory may reuse
  // the inode number of the version it removed a moment before, but not its ctime.
  std::tuple<std::uint64_t, std::uint64_t, std::int64_t, std::int64_t> version_{};
};

}  // namespace aitune
