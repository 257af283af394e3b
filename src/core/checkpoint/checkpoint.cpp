// Checkpoint directories: atomic save of a manifest and its files, verified load. The
// manifest format lives in checkpoint_manifest.cpp, the durable-file primitives in
// atomic_directory.cpp.
#include "aitune/checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>
#include <tuple>
#include <sys/stat.h>
#include <vector>

#include "aitune/error.hpp"
#include "aitune/onnx_external_data.hpp"
#include "aitune/process_directory.hpp"
#include "aitune/version.hpp"
#include "io/atomic_directory.hpp"
#include "session/spec_mismatch.hpp"
#include "base/bounded_json.hpp"
#include "checkpoint/checkpoint_manifest_rules.hpp"
#include "io/sha256.hpp"

namespace aitune {
namespace fs = std::filesystem;
using Json = detail::ManifestJson;
using detail::kMaxManifestBytes;
using detail::unsafe_path_reason;

namespace {

[[noreturn]] void fail(ErrorCode code, const std::string& message) { throw Error(code, message); }

std::string read_text_file(const fs::path& path, const char* what) {
  std::error_code ec;
  // A directory (or fifo) at the path: libstdc++'s stream would throw std::ios_base::failure
  // ("basic_filebuf::underflow"), untyped and naming nothing.
  if (const auto st = fs::status(path, ec); !ec && !fs::is_regular_file(st))
    fail(ErrorCode::kCheckpointCorrupt, std::string(what) + " '" + path.string() + "' is not a regular file");
  auto size = fs::file_size(path, ec);
  if (ec) fail(ErrorCode::kIo, std::string("cannot read ") + what + " '" + path.string() + "': " + ec.message());
  if (size > kMaxManifestBytes)
    fail(ErrorCode::kCheckpointCorrupt, path.string() + ": " + std::to_string(size) + " bytes, larger than any manifest (limit " +
                                            std::to_string(kMaxManifestBytes) + ")");
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) fail(ErrorCode::kIo, std::string("cannot read ") + what + " '" + path.string() + "'");
  return text;
}

// True when canonical `path` is `root` or lies below it (both canonical).
bool is_within(const fs::path& root, const fs::path& path) {
  auto r = root.begin(), p = path.begin();
  for (; r != root.end(); ++r, ++p)
    if (p == path.end() || *r != *p) return false;
  return true;
}

// Checks that root/relative stays inside `root` when symbolic links are followed and is
// a regular file; `what` names it in messages ("artifact 'x'").
fs::path resolve_inside(const fs::path& root, const std::string& relative, const std::string& what) {
  fs::path current = root;
  for (const auto& part : fs::path(relative)) {
    current /= part;
    std::error_code ec;
    auto st = fs::symlink_status(current, ec);
    if (ec || !fs::exists(st)) {
      fail(ErrorCode::kCheckpointCorrupt, what + " is missing: '" + current.string() + "' does not exist");
    }
    if (fs::is_symlink(st)) {
      auto target = fs::canonical(current, ec);
      if (ec)
        fail(ErrorCode::kCheckpointCorrupt,
             what + ": '" + current.string() + "' is a symbolic link that does not resolve: " + ec.message());
      if (!is_within(root, target))
        fail(ErrorCode::kCheckpointCorrupt, what + ": '" + current.string() + "' is a symbolic link to '" +
                                                target.string() + "', outside the checkpoint directory '" +
                                                root.string() + "'");
    }
  }
  std::error_code ec;
  auto resolved = fs::canonical(current, ec);
  if (ec) fail(ErrorCode::kIo, "cannot resolve " + what + " '" + current.string() + "': " + ec.message());
  if (!is_within(root, resolved))  // e.g. a link inside a linked directory
    fail(ErrorCode::kCheckpointCorrupt, what + ": '" + current.string() + "' resolves to '" + resolved.string() +
                                            "', outside the checkpoint directory '" + root.string() + "'");
  if (!fs::is_regular_file(resolved, ec))
    fail(ErrorCode::kCheckpointCorrupt, what + ": '" + current.string() + "' is not a regular file");
  return current;
}

std::string now_utc() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}


// What lies at the path a checkpoint is saved to.
enum class Target { kAbsent, kEmptyDir, kCheckpoint };

Target inspect_target(const fs::path& target) {
  std::error_code ec;
  auto st = fs::symlink_status(target, ec);
  if (ec || !fs::exists(st)) return Target::kAbsent;
  const std::string refuse = "refusing to save a checkpoint to '" + target.string() + "': it ";
  if (fs::is_symlink(st))
    fail(ErrorCode::kInvalidArgument, refuse + "is a symbolic link; save to the directory it points to");
  if (!fs::is_directory(st)) fail(ErrorCode::kInvalidArgument, refuse + "exists and is not a directory");
  if (fs::is_empty(target, ec)) return Target::kEmptyDir;
  // Whether `name` in the directory is a manifest whose "format" is `format`.
  auto manifest_of = [&](std::string_view name, std::string_view format) {
    const fs::path manifest = target / name;
    if (!fs::is_regular_file(fs::symlink_status(manifest, ec))) return false;
    try {
      auto j = detail::parse_bounded_json<Json>(read_text_file(manifest, "manifest"), ErrorCode::kInvalidArgument,
                                                "manifest");
      return j.is_object() && j.contains("format") && j.at("format") == format;
    } catch (const std::exception&) {
      return false;
    }
  };
  // A pipeline checkpoint (the front end's pipeline.json) is aitune's too: replaced like a
  // module's, as a pipeline save replaces a module's checkpoint.
  if (manifest_of(kPipelineManifestFile, kPipelineFormatName)) return Target::kCheckpoint;
  if (!fs::is_regular_file(fs::symlink_status(target / kCheckpointManifestFile, ec)))
    fail(ErrorCode::kInvalidArgument, refuse + "is a non-empty directory without " +
                                          std::string(kCheckpointManifestFile) + ", so not an aitune checkpoint");
  if (!manifest_of(kCheckpointManifestFile, kCheckpointFormatName))
    fail(ErrorCode::kInvalidArgument, refuse + "holds a manifest.json that is not an aitune checkpoint manifest "
                                               "(no \"format\": \"aitune-checkpoint\")");
  return Target::kCheckpoint;
}

// Swaps the finished temporary directory into place. After this returns, `tmp` no
// longer holds the new checkpoint (it is removed, or holds the old one to be removed).

std::string parent_of(const std::string& relative) {
  auto slash = relative.rfind('/');
  return slash == std::string::npos ? std::string() : relative.substr(0, slash);
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join_keys(const std::vector<CheckpointGraph>& graphs) {
  std::string out;
  for (const auto& g : graphs) out += (out.empty() ? "'" : ", '") + g.key + "'";
  return out.empty() ? "none" : out;
}

}  // namespace

// ---------------------------------------------------------------------------------
// Checkpoint

Checkpoint::Checkpoint(std::string directory, CheckpointManifest manifest)
    : directory_(std::move(directory)), manifest_(std::move(manifest)) {}

std::string Checkpoint::graph_directory(const std::string& key) { return "graphs/" + key; }

bool Checkpoint::is_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::exists(fs::path(dir) / kCheckpointManifestFile, ec);
}

namespace {

// The absolute path `save` writes to.
fs::path save_target(const std::string& dir) {
  if (dir.empty()) fail(ErrorCode::kInvalidArgument, "checkpoint path is empty");
  fs::path target = fs::absolute(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "ckpt/"
  return target;
}

}  // namespace

std::string Checkpoint::enclosing_checkpoint(const std::string& dir) {
  const fs::path target = save_target(dir);
  std::error_code ec;
  for (fs::path p = target.parent_path(); !p.empty(); p = p.parent_path()) {
    if (fs::is_regular_file(p / kPipelineManifestFile, ec)) return p.string();
    if (fs::is_regular_file(p / kCheckpointManifestFile, ec)) {
      try {
        auto j = detail::parse_bounded_json<Json>(read_text_file(p / kCheckpointManifestFile, "manifest"),
                                                  ErrorCode::kInvalidArgument, "manifest");
        if (j.is_object() && j.contains("format") && j.at("format") == kCheckpointFormatName) return p.string();
      } catch (const std::exception&) {
      }
    }
    if (p == p.parent_path()) break;
  }
  return {};
}

namespace {

// Refuses a target inside a checkpoint: the next save over that one would remove it.
void refuse_nested(const fs::path& target) {
  const std::string outer = Checkpoint::enclosing_checkpoint(target.string());
  if (!outer.empty())
    fail(ErrorCode::kInvalidArgument, "refusing to save a checkpoint to '" + target.string() +
                                          "': it lies inside the checkpoint '" + outer +
                                          "', and a save over that one replaces its directory whole, removing this "
                                          "one; save it outside '" + outer + "' (beside it)");
}

}  // namespace

void Checkpoint::check_save_target(const std::string& dir, const CheckpointSaveOptions& options) {
  const fs::path target = save_target(dir);
  refuse_nested(target);
  if (inspect_target(target) == Target::kCheckpoint && !options.overwrite)
    fail(ErrorCode::kInvalidArgument, "'" + target.string() + "' already holds a checkpoint and overwrite is off");
  // The nearest existing ancestor must be a directory for save to create the rest.
  std::error_code ec;
  fs::path existing;
  for (fs::path p = target.parent_path(); !p.empty(); p = p.parent_path()) {
    auto st = fs::status(p, ec);
    if (!fs::exists(st)) {
      if (p == p.parent_path()) break;
      continue;
    }
    if (!fs::is_directory(st))
      fail(ErrorCode::kIo, "cannot create the directory '" + target.parent_path().string() + "': '" + p.string() +
                               "' is not a directory");
    existing = p;
    break;
  }
  // And one save can create its staging directory in: a read-only file system (or a
  // directory the user may not write) failed only the save, after the work. Probed by
  // creating and removing what save creates first, the exact test (access(2) does not see
  // every refusal); nothing stays.
  if (existing.empty()) return;
  try {
    OwnedDirectory probe =
        OwnedDirectory::create(existing.string(), sibling_prefix(target.filename().string(), ".tmp-"));
    probe.remove();
  } catch (const Error& e) {
    fail(ErrorCode::kIo, "cannot create a temporary directory next to '" + target.string() + "': " + e.what());
  }
}

CheckpointManifest Checkpoint::save(const std::string& dir, const CheckpointManifest& manifest,
                                    const std::map<std::string, std::string>& files,
                                    const CheckpointSaveOptions& options) {
  const fs::path target = save_target(dir);
  refuse_nested(target);

  // The manifest as it will be written, minus artifacts.
  CheckpointManifest m = manifest;
  m.format_version = kCheckpointFormatVersion;
  m.aitune_version = std::string(version());
  m.created = now_utc();
  m.metadata_json = detail::parse_opaque_json(m.metadata_json, "{}", "metadata_json").dump();
  for (auto& g : m.graphs) {
    g.structure_json = detail::parse_opaque_json(g.structure_json, "null", "structure_json of graph '" + g.key + "'").dump();
    g.artifacts.clear();
    g.path_options.clear();
    // A CUDA stream is an address in this process: meaningless in the one that loads.
    g.backend_config.provider_options.erase("user_compute_stream");
    g.backend_config.provider_options.erase("has_user_compute_stream");
  }
  detail::validate_manifest(m, ErrorCode::kInvalidArgument, false);
  // No graph is allowed: a front end may keep only its own decisions in the metadata
  // (aitune.torch's torch.compile graphs are recompiled on load, docs/checkpoints.md).
  try {
    m.onnxruntime_version = (options.runtime ? options.runtime : OrtRuntime::load())->version();
  } catch (const Error&) {
    m.onnxruntime_version = "unknown";
  }

  // Plan: every file to write, relative path -> source, and which graph owns it.
  std::map<std::string, fs::path> plan;
  std::map<std::string, std::size_t> owner;
  auto graph_of = [&](const std::string& rel) -> std::size_t {
    for (std::size_t i = 0; i < m.graphs.size(); ++i)
      if (rel.rfind(graph_directory(m.graphs[i].key) + "/", 0) == 0) return i;
    fail(ErrorCode::kInvalidArgument, "artifact path '" + rel + "' is not under a graph's directory (graphs/<key>/ for "
                                          "one of the graph keys " + join_keys(m.graphs) + ")");
  };
  auto add = [&](const std::string& rel, const fs::path& source) {
    if (auto why = unsafe_path_reason(rel); !why.empty())
      fail(ErrorCode::kInvalidArgument, "artifact path '" + rel + "' " + why +
                                            "; artifact paths are relative, '/'-separated, without '.' or '..'");
    auto [it, inserted] = plan.emplace(rel, source);
    if (!inserted && it->second != source)
      fail(ErrorCode::kInvalidArgument, "artifact path '" + rel + "' is given twice: from '" + it->second.string() +
                                            "' and from '" + source.string() + "'");
    owner[rel] = graph_of(rel);
  };
  for (const auto& [rel, source] : files) {
    if (auto why = unsafe_path_reason(rel); !why.empty())
      fail(ErrorCode::kInvalidArgument, "artifact path '" + rel + "' " + why +
                                            "; artifact paths are relative, '/'-separated, without '.' or '..'");
    std::error_code ec;
    auto st = fs::status(source, ec);
    if (ec || !fs::exists(st))
      fail(ErrorCode::kIo, "source of artifact '" + rel + "' does not exist: '" + source + "'");
    if (fs::is_directory(st)) {
      graph_of(rel);
      std::vector<std::pair<std::string, fs::path>> found;
      for (auto it = fs::recursive_directory_iterator(source, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec))
        if (it->is_regular_file()) found.emplace_back(rel + "/" + it->path().lexically_relative(source).generic_string(), it->path());
      if (ec) fail(ErrorCode::kIo, "cannot list the directory '" + source + "' (artifact '" + rel + "'): " + ec.message());
      for (const auto& [r, p] : found) add(r, p);
    } else if (fs::is_regular_file(st)) {
      add(rel, source);
    } else {
      fail(ErrorCode::kInvalidArgument, "source of artifact '" + rel + "', '" + source +
                                            "', is neither a regular file nor a directory");
    }
  }
  // External data travels with its model, at the same place relative to it.
  for (const auto& [rel, source] : std::map<std::string, fs::path>(plan)) {
    if (!ends_with(rel, ".onnx")) continue;
    for (const auto& location : onnx_external_data_locations(source.string())) {
      if (auto why = unsafe_path_reason(location); !why.empty())
        fail(ErrorCode::kModelInvalid, "ONNX model '" + source.string() + "' references external data '" + location +
                                           "', which " + why + "; a checkpoint keeps external data in the model's directory");
      const std::string data_rel = parent_of(rel).empty() ? location : parent_of(rel) + "/" + location;
      if (plan.count(data_rel)) continue;
      const fs::path data_source = source.parent_path() / location;
      std::error_code ec;
      if (!fs::is_regular_file(data_source, ec))
        fail(ErrorCode::kModelInvalid, "ONNX model '" + source.string() + "' references external data file '" +
                                           data_source.string() + "', which does not exist");
      add(data_rel, data_source);
    }
  }
  // A file and a directory cannot share a path ("a" and "a/b").
  for (auto it = plan.begin(); it != plan.end(); ++it) {
    auto next = std::next(it);
    if (next != plan.end() && next->first.rfind(it->first + "/", 0) == 0)
      fail(ErrorCode::kInvalidArgument, "artifact path '" + it->first + "' is a file, but '" + next->first +
                                            "' needs it to be a directory");
  }
  // Models and path options, per graph.
  for (std::size_t i = 0; i < m.graphs.size(); ++i) {
    auto& g = m.graphs[i];
    if (const auto* section = find_checkpoint_section(g.backend); section && !section->runs_in_engine) {
      // A front end's graph: its section's fields, no model, no session options to resolve.
      if (!g.model.empty() && (!plan.count(g.model) || owner[g.model] != i))
        fail(ErrorCode::kInvalidArgument, "graph '" + g.key + "': model '" + g.model + "' is not among the files of " +
                                              graph_directory(g.key) + "/");
      continue;
    }
    if (g.model.empty()) {
      std::vector<std::string> models;
      for (const auto& [rel, idx] : owner)
        if (idx == i && ends_with(rel, ".onnx")) models.push_back(rel);
      if (models.size() != 1)
        fail(ErrorCode::kInvalidArgument, "graph '" + g.key + "' has " + std::to_string(models.size()) +
                                              " .onnx files; name its model in CheckpointGraph::model");
      g.model = models.front();
    } else if (!plan.count(g.model) || owner[g.model] != i) {
      fail(ErrorCode::kInvalidArgument, "graph '" + g.key + "': model '" + g.model + "' is not among the files of " +
                                            graph_directory(g.key) + "/");
    }
    for (const char* opt : detail::kPathOptions) {
      auto it = g.backend_config.provider_options.find(opt);
      if (it == g.backend_config.provider_options.end()) continue;
      std::error_code ec;
      const auto value = fs::weakly_canonical(it->second, ec);
      for (const auto& [rel, source] : files) {
        std::error_code ec2;
        bool same_source = !ec && fs::weakly_canonical(source, ec2) == value && !ec2;
        if ((rel == it->second || same_source) && graph_of(rel) == i) {
          it->second = rel;
          g.path_options.emplace_back(opt);
          break;
        }
      }
    }
  }
  for (const auto& [rel, idx] : owner) m.graphs[idx].artifacts.push_back({rel, 0, {}});
  for (const auto& [rel, sha] : options.expected_sha256) {
    if (sha.size() != 64 || sha.find_first_not_of("0123456789abcdef") != std::string::npos)
      fail(ErrorCode::kInvalidArgument, "expected_sha256 of '" + rel + "' is '" + sha +
                                            "', not a sha256 (64 lower-case hex digits)");
  }

  const Target existing = inspect_target(target);
  if (existing == Target::kCheckpoint && !options.overwrite)
    fail(ErrorCode::kInvalidArgument, "'" + target.string() + "' already holds a checkpoint and overwrite is off");
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) fail(ErrorCode::kIo, "cannot create the directory '" + target.parent_path().string() + "': " + ec.message());

  detail::remove_stale_beside(target);  // debris of saves whose process died
  auto staging = detail::create_directory_beside(target);
  const fs::path tmp = staging.path();
  try {
    std::set<fs::path> dirs{tmp};
    std::size_t written = 0;
    for (auto& g : m.graphs) {
      for (auto& a : g.artifacts) {
        const fs::path dest = tmp / a.path;
        fs::create_directories(dest.parent_path());
        for (fs::path d = dest.parent_path(); d != tmp; d = d.parent_path()) dirs.insert(d);
        auto digest = detail::copy_and_hash(plan.at(a.path), dest);
        if (auto e = options.expected_sha256.find(a.path);
            e != options.expected_sha256.end() && e->second != digest.sha256)
          fail(ErrorCode::kState, "artifact '" + a.path + "' was copied from '" + plan.at(a.path).string() +
                                      "', whose content changed (sha256 " + digest.sha256 + ", expected " + e->second +
                                      "): the save to '" + target.string() +
                                      "' was abandoned and what was there is as it was");
        a.size = digest.size;
        a.sha256 = digest.sha256;
        if (options.on_file_written) options.on_file_written(a.path, ++written);
      }
    }
    detail::validate_manifest(m, ErrorCode::kInternal, true);  // what save built must load
    detail::write_durable_file(tmp / kCheckpointManifestFile, m.to_json(2) + "\n");
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) detail::sync_directory(*it);
    try {
      detail::replace_directory(tmp, target, existing != Target::kAbsent);
    } catch (const Error&) {
      // Another process may have saved a checkpoint to the path since it was found free:
      // replace it as if it had been there from the start, or refuse as then.
      if (existing != Target::kAbsent || inspect_target(target) != Target::kCheckpoint) throw;
      if (!options.overwrite)
        fail(ErrorCode::kInvalidArgument, "'" + target.string() + "' already holds a checkpoint and overwrite is off");
      detail::replace_directory(tmp, target, true);
    }
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  detail::sync_directory(target.parent_path());
  return m;
}

namespace {
// Which directory a path names now: (device, inode) and the directory's ctime (a new
// directory reusing a removed one's inode number was made, renamed into place, later, so
// its ctime differs); zeros when it names none.
std::tuple<std::uint64_t, std::uint64_t, std::int64_t, std::int64_t> version_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {0, 0, 0, 0};
  return {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
          static_cast<std::int64_t>(st.st_ctim.tv_sec), static_cast<std::int64_t>(st.st_ctim.tv_nsec)};
}
constexpr int kLoadAttempts = 20;

// The manifest's bytes now ("" when there is none): a load that failed compares them with
// what they were when it began, since (device, inode) alone can repeat: a save's new
// directory may get the inode number of a version removed a moment earlier.
std::string manifest_bytes(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(dir) / kCheckpointManifestFile, ec)) return {};
  std::ifstream in(fs::path(dir) / kCheckpointManifestFile, std::ios::binary);
  if (!in) return {};
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
}  // namespace

Checkpoint Checkpoint::load(const std::string& dir) {
  for (int attempt = 1;; ++attempt) {
    const auto version_before = version_of(dir);
    const std::string manifest_before = manifest_bytes(dir);
    try {
      Checkpoint checkpoint = load_once(dir);
      if (version_of(dir) == version_before) {
        checkpoint.version_ = version_before;
        detail::remove_stale_beside(fs::path(checkpoint.directory_));
        return checkpoint;
      }
    } catch (const Error&) {
      // What failed was read from one version: a failure is the checkpoint's own only
      // when no save replaced it meanwhile.
      if (version_of(dir) == version_before && manifest_bytes(dir) == manifest_before) throw;
    }
    if (attempt == kLoadAttempts)
      fail(ErrorCode::kIo, "checkpoint '" + dir + "' was replaced by concurrent saves " + std::to_string(attempt) +
                               " times while it was being loaded; load it when the saves are done");
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * attempt));
  }
}

// (device, inode) alone repeat: on ext4 a save's new directory took the inode number of the
// version just removed, and a load whose sessions read the next version's files passed
// (a probe: outputs of neither model, silently).
bool Checkpoint::is_current() const { return version_of(directory_) == version_; }

Checkpoint Checkpoint::load_once(const std::string& dir) {
  std::error_code ec;
  auto st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) fail(ErrorCode::kIo, "checkpoint '" + dir + "' does not exist");
  if (!fs::is_directory(st))
    fail(ErrorCode::kInvalidArgument, "checkpoint '" + dir + "' is not a directory (a checkpoint is a directory "
                                                             "holding manifest.json)");
  const fs::path root = fs::canonical(dir, ec);
  if (ec) fail(ErrorCode::kIo, "cannot resolve checkpoint '" + dir + "': " + ec.message());

  const fs::path manifest_path = root / kCheckpointManifestFile;
  if (!fs::exists(fs::symlink_status(manifest_path, ec)) && fs::exists(root / kPipelineManifestFile, ec)) {
    // a pipeline checkpoint: not corrupt, but not one checkpoint; its sections are
    std::vector<std::string> sections;
    for (const auto& entry : fs::directory_iterator(root / "modules", ec))
      if (fs::exists(entry.path() / kCheckpointManifestFile, ec)) sections.push_back(entry.path().string());
    std::sort(sections.begin(), sections.end());
    std::string listed;
    for (const auto& s : sections) listed += (listed.empty() ? "" : ", ") + s;
    fail(ErrorCode::kInvalidArgument,
         "checkpoint '" + root.string() + "' is a pipeline checkpoint (" + std::string(kPipelineManifestFile) +
             ": ait.save of an object holding several ait.Modules), which loads with ait.load into the pipeline; "
             "each of its modules is a checkpoint of its own: " +
             (listed.empty() ? std::string("none found under modules/") : listed));
  }
  if (!fs::exists(fs::symlink_status(manifest_path, ec))) {
    // Saves are atomic (written aside, then renamed): a folder without the manifest is a damaged
    // checkpoint where it holds a checkpoint's graphs/ folder, and no checkpoint at all otherwise
    // (a folder of .onnx files given by mistake: a bad argument, not a corrupt checkpoint).
    if (!fs::is_directory(root / "graphs", ec))
      fail(ErrorCode::kInvalidArgument, "'" + root.string() + "' is a folder without " +
                                            std::string(kCheckpointManifestFile) +
                                            " or graphs/: not an aitune checkpoint (give a checkpoint folder, or an "
                                            ".onnx file)");
    fail(ErrorCode::kCheckpointCorrupt, "checkpoint '" + root.string() + "' has no " +
                                            std::string(kCheckpointManifestFile) +
                                            " beside its graphs/: a damaged checkpoint (its manifest was removed)");
  }
  resolve_inside(root, std::string(kCheckpointManifestFile), "manifest '" + manifest_path.string() + "'");
  CheckpointManifest m;
  try {
    m = CheckpointManifest::from_json(read_text_file(manifest_path, "manifest"));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCheckpointCorrupt) throw;
    fail(ErrorCode::kCheckpointCorrupt, "checkpoint manifest '" + manifest_path.string() + "': " + e.what());
  }

  std::set<std::string> artifact_paths;
  for (const auto& g : m.graphs) {
    for (const auto& a : g.artifacts) {
      const std::string what = "checkpoint '" + root.string() + "', graph '" + g.key + "': artifact '" + a.path + "'";
      // Every file of a graph lies under its own directory, as save writes it: a manifest
      // naming another's (a key edited by hand) would run one graph's model as another's.
      if (a.path.rfind(graph_directory(g.key) + "/", 0) != 0)
        fail(ErrorCode::kCheckpointCorrupt, what + " is not under the graph's directory '" + graph_directory(g.key) +
                                                "/' (a save writes each graph's files there)");
      const fs::path path = resolve_inside(root, a.path, what);
      const auto size = fs::file_size(path, ec);
      if (ec) fail(ErrorCode::kIo, "cannot read " + what + ": " + ec.message());
      if (size != a.size)
        fail(ErrorCode::kCheckpointCorrupt, what + " is " + std::to_string(size) + " bytes, the manifest says " +
                                                std::to_string(a.size) +
                                                (size < a.size ? " (truncated)" : " (the file was changed)"));
      const auto digest = detail::sha256_file(path.string());
      if (digest.sha256 != a.sha256)
        fail(ErrorCode::kCheckpointCorrupt, what + " has sha256 " + digest.sha256 + ", the manifest says " + a.sha256 +
                                                " (the file was changed or damaged)");
      artifact_paths.insert(a.path);
    }
  }
  // A model must not pull in data from outside the verified set of files.
  for (const auto& g : m.graphs) {
    if (g.model.empty()) continue;  // a graph of a section that runs outside this engine
    for (const auto& location : onnx_external_data_locations((root / g.model).string())) {
      const std::string what = "checkpoint '" + root.string() + "', graph '" + g.key + "': model '" + g.model +
                               "' references external data '" + location + "'";
      if (auto why = unsafe_path_reason(location); !why.empty())
        fail(ErrorCode::kCheckpointCorrupt, what + ", which " + why + " (it must lie beside the model)");
      const std::string rel = parent_of(g.model).empty() ? location : parent_of(g.model) + "/" + location;
      if (!artifact_paths.count(rel))
        fail(ErrorCode::kCheckpointCorrupt, what + ", which is not an artifact of the checkpoint ('" + rel +
                                                "' has no size and sha256 in the manifest)");
    }
  }
  return Checkpoint(root.string(), std::move(m));
}

std::vector<std::string> Checkpoint::graph_keys() const {
  std::vector<std::string> keys;
  for (const auto& g : manifest_.graphs) keys.push_back(g.key);
  return keys;
}

const CheckpointGraph& Checkpoint::graph(const std::string& key) const {
  if (const auto* g = manifest_.find_graph(key)) return *g;
  fail(ErrorCode::kInvalidArgument, "checkpoint '" + directory_ + "' has no graph '" + key + "'; its graphs: " +
                                        join_keys(manifest_.graphs));
}

std::string Checkpoint::artifact_path(const std::string& relative) const {
  for (const auto& g : manifest_.graphs)
    for (const auto& a : g.artifacts)
      if (a.path == relative) return (fs::path(directory_) / a.path).string();
  fail(ErrorCode::kInvalidArgument, "checkpoint '" + directory_ + "' has no artifact '" + relative + "'");
}

bool Checkpoint::runs_in_engine(const std::string& key) const {
  const auto* section = find_checkpoint_section(graph(key).backend);
  return section && section->runs_in_engine;
}

std::string Checkpoint::model_path(const std::string& key) const {
  const auto& g = graph(key);
  const auto* section = find_checkpoint_section(g.backend);
  if (!section || !section->runs_in_engine)
    fail(ErrorCode::kBackendUnavailable,
         "checkpoint '" + directory_ + "', graph '" + key + "' is a '" + g.backend + "' graph, which " +
             (section ? "runs in " + std::string(section->runs_where) : std::string("this aitune does not know")) +
             ", not in this engine (it runs '" + std::string(kOnnxRuntimeBackendName) + "' graphs)");
  return (fs::path(directory_) / g.model).string();
}

OnnxSessionConfig Checkpoint::backend_config(const std::string& key,
                                                    const CheckpointBackendOverrides& overrides) const {
  const auto& g = graph(key);
  OnnxSessionConfig config = g.backend_config;
  for (const auto& opt : g.path_options)
    config.provider_options[opt] = (fs::path(directory_) / config.provider_options.at(opt)).string();
  if (overrides.provider && *overrides.provider != config.provider) {
    config.provider = *overrides.provider;
    config.provider_options.clear();
  }
  if (overrides.device_id) config.device_id = *overrides.device_id;
  if (overrides.provider_options)
    for (const auto& [k, v] : *overrides.provider_options) config.provider_options[k] = v;
  if (overrides.intra_op_threads) config.intra_op_threads = *overrides.intra_op_threads;
  if (overrides.inter_op_threads) config.inter_op_threads = *overrides.inter_op_threads;
  if (overrides.graph_optimization_level) config.graph_optimization_level = *overrides.graph_optimization_level;
  return config;
}

std::unique_ptr<OnnxSession> Checkpoint::create_session(const std::string& key,
                                                               const CheckpointBackendOverrides& overrides,
                                                               std::shared_ptr<OrtRuntime> runtime) const {
  const auto& g = graph(key);
  const std::string model = model_path(key);  // Error(kBackendUnavailable) for a graph this engine does not run
  auto config = backend_config(key, overrides);
  auto replaced = [&] {
    return Error(ErrorCode::kIo, "checkpoint '" + directory_ + "' was replaced by another save since it was loaded, "
                                     "while graph '" + key + "' was being created; load it again");
  };
  std::unique_ptr<OnnxSession> session;
  try {
    session = OnnxSession::create(model, config, g.graph_spec, std::move(runtime));
  } catch (const SpecMismatchError& e) {
    if (!is_current()) throw replaced();
    throw Error(ErrorCode::kCheckpointCorrupt, "checkpoint '" + directory_ + "', graph '" + key +
                                                   "': the manifest's " + e.what() + " (damaged checkpoint)");
  } catch (const Error& e) {
    if (!is_current()) throw replaced();
    throw Error(e.code(), "checkpoint '" + directory_ + "', graph '" + key + "': " + e.what());
  }
  // The session read its files by path: a save that replaced the checkpoint meanwhile gave
  // it the next version's (under this manifest's spec), which no caller may run.
  if (!is_current()) throw replaced();
  return session;
}

}  // namespace aitune
