// Checkpoint directories: manifest JSON, validation, atomic save, verified load.
#include "aitune/checkpoint.hpp"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <vector>

#include "aitune/error.hpp"
#include "aitune/onnx_external_data.hpp"
#include "aitune/version.hpp"
#include "sha256.hpp"

namespace aitune {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // keeps the manifest's fields in a readable order

namespace {

// Provider options that name files or directories: saved as artifacts, they are
// re-rooted into the checkpoint on load.
const char* const kPathOptions[] = {"trt_engine_cache_path", "trt_timing_cache_path"};
constexpr std::uintmax_t kMaxManifestBytes = 64u << 20;  // far above any real manifest

[[noreturn]] void fail(ErrorCode code, const std::string& message) { throw Error(code, message); }

std::string errno_text() { return std::strerror(errno); }

// ---------------------------------------------------------------------------------
// Validation shared by save (kInvalidArgument: the caller's input) and load
// (kCheckpointCorrupt: the file's contents).

// Why `path` is not an acceptable relative path, or "" when it is.
std::string unsafe_path_reason(const std::string& path) {
  if (is_safe_relative_path(path)) return {};
  if (path.empty()) return "is empty";
  if (path.front() == '/') return "is absolute";
  if (path.find('\\') != std::string::npos || path.find('\0') != std::string::npos)
    return "contains a backslash or NUL character";
  for (std::size_t start = 0; start <= path.size();) {
    std::size_t end = std::min(path.find('/', start), path.size());
    if (path.compare(start, end - start, "..") == 0) return "contains '..'";
    start = end + 1;
  }
  return "has an empty or '.' component";
}

void check_key(const std::string& key, ErrorCode code, const std::string& where) {
  bool ok = !key.empty() && key.size() <= 255 && key != "." && key != "..";
  for (char c : key) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  if (!ok)
    fail(code, where + ": graph key '" + key +
                   "' is not allowed (1 to 255 characters of A-Z a-z 0-9 . _ -, not '.' or '..')");
}

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::string graph_where(const CheckpointGraph& g, std::size_t i) {
  return "graphs[" + std::to_string(i) + "] ('" + g.key + "')";
}

// Keys and backends; with `artifacts`, also every artifact path, digest, the model and
// the path options.
void validate(const CheckpointManifest& m, ErrorCode code, bool artifacts) {
  std::set<std::string> keys, paths;
  for (std::size_t i = 0; i < m.graphs.size(); ++i) {
    const auto& g = m.graphs[i];
    const std::string where = graph_where(g, i);
    check_key(g.key, code, "graphs[" + std::to_string(i) + "]");
    if (!keys.insert(g.key).second) fail(code, where + ": graph key '" + g.key + "' appears twice");
    if (g.backend != kOnnxRuntimeBackendName)
      fail(code, where + ": unknown backend '" + g.backend + "'; this aitune knows: " +
                     std::string(kOnnxRuntimeBackendName));
    if (!artifacts) continue;
    bool has_model = false;
    for (std::size_t k = 0; k < g.artifacts.size(); ++k) {
      const auto& a = g.artifacts[k];
      const std::string at = where + ".artifacts[" + std::to_string(k) + "]";
      if (auto why = unsafe_path_reason(a.path); !why.empty())
        fail(code, at + ": path '" + a.path + "' " + why + "; artifact paths must stay inside the checkpoint");
      if (a.path == kCheckpointManifestFile) fail(code, at + ": an artifact may not be named manifest.json");
      if (!paths.insert(a.path).second) fail(code, at + ": path '" + a.path + "' is listed twice");
      if (!is_sha256_hex(a.sha256))
        fail(code, at + " ('" + a.path + "'): sha256 '" + a.sha256 + "' is not 64 lower-case hex digits");
      has_model = has_model || a.path == g.model;
    }
    if (!has_model)
      fail(code, where + ": model '" + g.model + "' is not among the graph's artifacts");
    std::set<std::string> seen;
    for (const auto& opt : g.path_options) {
      auto it = g.backend_config.provider_options.find(opt);
      if (!seen.insert(opt).second || it == g.backend_config.provider_options.end())
        fail(code, where + ": path_options names '" + opt + "', which is " +
                       (it == g.backend_config.provider_options.end() ? "not a provider option of the graph"
                                                                       : "listed twice"));
      if (auto why = unsafe_path_reason(it->second); !why.empty())
        fail(code, where + ": provider option " + opt + "='" + it->second + "' " + why +
                       "; a path option must be relative to the checkpoint");
    }
  }
}

// JSON text given by the front end, parsed (empty text means `empty`).
Json parse_opaque(const std::string& text, const char* empty, const std::string& what) {
  try {
    return Json::parse(text.empty() ? std::string(empty) : text);
  } catch (const Json::exception& e) {
    fail(ErrorCode::kInvalidArgument, what + " is not JSON: " + e.what());
  }
}

// ---------------------------------------------------------------------------------
// Manifest fields (load side).

std::string field_name(const std::string& where, const char* key) { return where.empty() ? key : where + "." + key; }

const Json& field(const Json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) fail(ErrorCode::kCheckpointCorrupt, (where.empty() ? "manifest" : where) + " is not a JSON object");
  auto it = obj.find(key);
  if (it == obj.end()) fail(ErrorCode::kCheckpointCorrupt, "field '" + field_name(where, key) + "' is missing");
  return *it;
}

std::string string_field(const Json& obj, const char* key, const std::string& where) {
  const Json& v = field(obj, key, where);
  if (!v.is_string())
    fail(ErrorCode::kCheckpointCorrupt, "field '" + field_name(where, key) + "' must be a string, not " + v.type_name());
  return v.get<std::string>();
}

const Json& array_field(const Json& obj, const char* key, const std::string& where) {
  const Json& v = field(obj, key, where);
  if (!v.is_array())
    fail(ErrorCode::kCheckpointCorrupt, "field '" + field_name(where, key) + "' must be an array, not " + v.type_name());
  return v;
}

CheckpointGraph graph_from_json(const Json& j, const std::string& where) {
  CheckpointGraph g;
  g.key = string_field(j, "key", where);
  g.backend = string_field(j, "backend", where);
  g.model = string_field(j, "model", where);
  try {
    g.graph_spec = GraphSpec::from_json(field(j, "graph_spec", where).dump());
  } catch (const Error& e) {
    fail(ErrorCode::kCheckpointCorrupt, "field '" + where + ".graph_spec' is invalid: " + e.what());
  }
  try {
    g.backend_config = OnnxRuntimeBackendConfig::from_json(field(j, "backend_config", where).dump());
  } catch (const Error& e) {
    fail(ErrorCode::kCheckpointCorrupt, "field '" + where + ".backend_config' is invalid: " + e.what());
  }
  const Json& opts = array_field(j, "path_options", where);
  for (std::size_t i = 0; i < opts.size(); ++i) {
    if (!opts[i].is_string())
      fail(ErrorCode::kCheckpointCorrupt, "field '" + where + ".path_options[" + std::to_string(i) + "]' must be a string");
    g.path_options.push_back(opts[i].get<std::string>());
  }
  g.structure_json = field(j, "structure", where).dump();
  const Json& arts = array_field(j, "artifacts", where);
  for (std::size_t i = 0; i < arts.size(); ++i) {
    const std::string at = where + ".artifacts[" + std::to_string(i) + "]";
    CheckpointArtifact a;
    a.path = string_field(arts[i], "path", at);
    const Json& size = field(arts[i], "size", at);
    if (!size.is_number_unsigned() && !(size.is_number_integer() && size.get<std::int64_t>() >= 0))
      fail(ErrorCode::kCheckpointCorrupt, "field '" + at + ".size' must be a non-negative integer, not " + size.dump());
    a.size = size.get<std::uint64_t>();
    a.sha256 = string_field(arts[i], "sha256", at);
    g.artifacts.push_back(std::move(a));
  }
  return g;
}

// ---------------------------------------------------------------------------------
// Files (POSIX, for fsync).

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // close() reports write-back errors on some file systems, so a writer checks it.
  void close_checked(const std::string& path) {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(ErrorCode::kIo, "cannot write '" + path + "': close failed: " + errno_text());
  }

 private:
  int fd_;
};

void write_all(int fd, const char* data, std::size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::kIo, "cannot write '" + path + "': " + errno_text());
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

Fd create_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail(ErrorCode::kIo, "cannot create '" + path.string() + "': " + errno_text());
  return Fd(fd);
}

void sync_and_close(Fd& fd, const fs::path& path) {
  if (::fsync(fd.get()) != 0) fail(ErrorCode::kIo, "cannot flush '" + path.string() + "' to disk: " + errno_text());
  fd.close_checked(path.string());
}

// Copies `source` to the new file `dest`, hashing what it writes; flushed to disk.
detail::FileDigest copy_and_hash(const fs::path& source, const fs::path& dest) {
  Fd in(::open(source.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) fail(ErrorCode::kIo, "cannot open '" + source.string() + "' for reading: " + errno_text());
  Fd out = create_file(dest);
  detail::Sha256 sha;
  detail::FileDigest digest;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    ssize_t n = ::read(in.get(), buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::kIo, "cannot read '" + source.string() + "': " + errno_text());
    }
    if (n == 0) break;
    sha.update(buffer.data(), static_cast<std::size_t>(n));
    write_all(out.get(), buffer.data(), static_cast<std::size_t>(n), dest.string());
    digest.size += static_cast<std::uint64_t>(n);
  }
  sync_and_close(out, dest);
  digest.sha256 = sha.final_hex();
  return digest;
}

void write_text_file(const fs::path& path, const std::string& text) {
  Fd out = create_file(path);
  write_all(out.get(), text.data(), text.size(), path.string());
  sync_and_close(out, path);
}

// fsync on a directory makes the entries created in it durable.
void sync_directory(const fs::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0)
    fail(ErrorCode::kIo, "cannot flush directory '" + dir.string() + "' to disk: " + errno_text());
}

std::string read_text_file(const fs::path& path, const char* what) {
  std::error_code ec;
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

std::string random_token() {
  std::random_device rd;
  std::uniform_int_distribution<std::uint64_t> dist;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(dist(rd)));
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
  const fs::path manifest = target / kCheckpointManifestFile;
  if (!fs::is_regular_file(fs::symlink_status(manifest, ec)))
    fail(ErrorCode::kInvalidArgument, refuse + "is a non-empty directory without " +
                                          std::string(kCheckpointManifestFile) + ", so not an aitune checkpoint");
  bool ours = false;
  try {
    auto j = Json::parse(read_text_file(manifest, "manifest"));
    ours = j.is_object() && j.contains("format") && j["format"] == kCheckpointFormatName;
  } catch (const std::exception&) {
  }
  if (!ours)
    fail(ErrorCode::kInvalidArgument, refuse + "holds a manifest.json that is not an aitune checkpoint manifest "
                                               "(no \"format\": \"aitune-checkpoint\")");
  return Target::kCheckpoint;
}

// Swaps the finished temporary directory into place. After this returns, `tmp` no
// longer holds the new checkpoint (it is removed, or holds the old one to be removed).
void commit(const fs::path& tmp, const fs::path& target, Target existing) {
  if (existing == Target::kAbsent) {
    if (::rename(tmp.c_str(), target.c_str()) != 0)
      fail(ErrorCode::kIo, "cannot move '" + tmp.string() + "' to '" + target.string() + "': " + errno_text());
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // the previous checkpoint; a leftover is harmless
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    fail(ErrorCode::kIo, "cannot swap '" + tmp.string() + "' into '" + target.string() + "': " + errno_text());
  // No atomic exchange here: move the old checkpoint aside, the new one in, then drop
  // the old one; put the old one back if the second rename fails.
  fs::path aside = target.parent_path() / ("." + target.filename().string() + ".old-" + random_token());
  if (::rename(target.c_str(), aside.c_str()) != 0)
    fail(ErrorCode::kIo, "cannot move the previous checkpoint '" + target.string() + "' aside: " + errno_text());
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    std::string why = errno_text();
    ::rename(aside.c_str(), target.c_str());
    fail(ErrorCode::kIo, "cannot move '" + tmp.string() + "' to '" + target.string() + "': " + why);
  }
  std::error_code ec;
  fs::remove_all(aside, ec);
}

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
// CheckpointManifest

const CheckpointGraph* CheckpointManifest::find_graph(const std::string& key) const noexcept {
  for (const auto& g : graphs)
    if (g.key == key) return &g;
  return nullptr;
}

std::string CheckpointManifest::to_json(int indent) const {
  Json j;
  j["format"] = kCheckpointFormatName;
  j["format_version"] = format_version;
  j["aitune_version"] = aitune_version;
  j["onnxruntime_version"] = onnxruntime_version;
  j["module_name"] = module_name;
  j["created"] = created;
  j["metadata"] = parse_opaque(metadata_json, "{}", "metadata_json");
  j["graphs"] = Json::array();
  for (const auto& g : graphs) {
    Json jg;
    jg["key"] = g.key;
    jg["backend"] = g.backend;
    jg["model"] = g.model;
    jg["graph_spec"] = Json::parse(g.graph_spec.to_json());
    jg["backend_config"] = Json::parse(g.backend_config.to_json());
    jg["path_options"] = g.path_options;
    jg["structure"] = parse_opaque(g.structure_json, "null", "structure_json of graph '" + g.key + "'");
    jg["artifacts"] = Json::array();
    for (const auto& a : g.artifacts) jg["artifacts"].push_back(Json{{"path", a.path}, {"size", a.size}, {"sha256", a.sha256}});
    j["graphs"].push_back(std::move(jg));
  }
  return j.dump(indent);
}

CheckpointManifest CheckpointManifest::from_json(const std::string& text) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    fail(ErrorCode::kCheckpointCorrupt, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(ErrorCode::kCheckpointCorrupt, std::string("not a JSON object but ") + j.type_name());
  if (!j.contains("format") || j["format"] != kCheckpointFormatName)
    fail(ErrorCode::kCheckpointCorrupt, "not an aitune checkpoint manifest: field 'format' is " +
                                            (j.contains("format") ? j["format"].dump() : std::string("missing")) +
                                            ", expected \"aitune-checkpoint\"");
  const Json& version = field(j, "format_version", "");
  if (!version.is_number_integer())
    fail(ErrorCode::kCheckpointCorrupt, "field 'format_version' must be an integer, not " + version.dump());
  const auto v = version.get<std::int64_t>();
  const std::string supported = "this aitune (" + std::string(aitune::version()) + ") reads format versions 1 to " +
                                std::to_string(kCheckpointFormatVersion);
  if (v > kCheckpointFormatVersion)
    fail(ErrorCode::kCheckpointCorrupt, "format_version " + std::to_string(v) +
                                            " is newer than supported: " + supported + "; upgrade aitune to load it");
  if (v < 1) fail(ErrorCode::kCheckpointCorrupt, "format_version " + std::to_string(v) + " is invalid; " + supported);

  CheckpointManifest m;
  m.format_version = static_cast<int>(v);
  m.aitune_version = string_field(j, "aitune_version", "");
  m.onnxruntime_version = string_field(j, "onnxruntime_version", "");
  m.module_name = string_field(j, "module_name", "");
  m.created = string_field(j, "created", "");
  m.metadata_json = field(j, "metadata", "").dump();
  const Json& graphs = array_field(j, "graphs", "");
  for (std::size_t i = 0; i < graphs.size(); ++i)
    m.graphs.push_back(graph_from_json(graphs[i], "graphs[" + std::to_string(i) + "]"));
  validate(m, ErrorCode::kCheckpointCorrupt, true);
  return m;
}

// ---------------------------------------------------------------------------------
// Checkpoint

Checkpoint::Checkpoint(std::string directory, CheckpointManifest manifest)
    : directory_(std::move(directory)), manifest_(std::move(manifest)) {}

std::string Checkpoint::graph_directory(const std::string& key) { return "graphs/" + key; }

bool Checkpoint::is_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::exists(fs::path(dir) / kCheckpointManifestFile, ec);
}

CheckpointManifest Checkpoint::save(const std::string& dir, const CheckpointManifest& manifest,
                                    const std::map<std::string, std::string>& files,
                                    const CheckpointSaveOptions& options) {
  if (dir.empty()) fail(ErrorCode::kInvalidArgument, "checkpoint path is empty");
  fs::path target = fs::absolute(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "ckpt/"

  // The manifest as it will be written, minus artifacts.
  CheckpointManifest m = manifest;
  m.format_version = kCheckpointFormatVersion;
  m.aitune_version = std::string(version());
  m.created = now_utc();
  m.metadata_json = parse_opaque(m.metadata_json, "{}", "metadata_json").dump();
  for (auto& g : m.graphs) {
    g.structure_json = parse_opaque(g.structure_json, "null", "structure_json of graph '" + g.key + "'").dump();
    g.artifacts.clear();
    g.path_options.clear();
    // A CUDA stream is an address in this process: meaningless in the one that loads.
    g.backend_config.provider_options.erase("user_compute_stream");
    g.backend_config.provider_options.erase("has_user_compute_stream");
  }
  validate(m, ErrorCode::kInvalidArgument, false);
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
    for (const char* opt : kPathOptions) {
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

  const Target existing = inspect_target(target);
  if (existing == Target::kCheckpoint && !options.overwrite)
    fail(ErrorCode::kInvalidArgument, "'" + target.string() + "' already holds a checkpoint and overwrite is off");
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) fail(ErrorCode::kIo, "cannot create the directory '" + target.parent_path().string() + "': " + ec.message());

  fs::path tmp;
  for (int attempt = 0; tmp.empty(); ++attempt) {
    fs::path candidate = target.parent_path() / ("." + target.filename().string() + ".tmp-" +
                                                 std::to_string(::getpid()) + "-" + random_token());
    if (::mkdir(candidate.c_str(), 0755) == 0) {
      tmp = candidate;
    } else if (errno != EEXIST || attempt > 8) {
      fail(ErrorCode::kIo, "cannot create a temporary directory next to '" + target.string() + "': " + errno_text());
    }
  }
  try {
    std::set<fs::path> dirs{tmp};
    std::size_t written = 0;
    for (auto& g : m.graphs) {
      for (auto& a : g.artifacts) {
        const fs::path dest = tmp / a.path;
        fs::create_directories(dest.parent_path());
        for (fs::path d = dest.parent_path(); d != tmp; d = d.parent_path()) dirs.insert(d);
        auto digest = copy_and_hash(plan.at(a.path), dest);
        a.size = digest.size;
        a.sha256 = digest.sha256;
        if (options.on_file_written) options.on_file_written(a.path, ++written);
      }
    }
    validate(m, ErrorCode::kInternal, true);  // what save built must load
    write_text_file(tmp / kCheckpointManifestFile, m.to_json(2) + "\n");
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) sync_directory(*it);
    commit(tmp, target, existing);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  sync_directory(target.parent_path());
  return m;
}

Checkpoint Checkpoint::load(const std::string& dir) {
  std::error_code ec;
  auto st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) fail(ErrorCode::kIo, "checkpoint '" + dir + "' does not exist");
  if (!fs::is_directory(st))
    fail(ErrorCode::kInvalidArgument, "checkpoint '" + dir + "' is not a directory (a checkpoint is a directory "
                                                             "holding manifest.json)");
  const fs::path root = fs::canonical(dir, ec);
  if (ec) fail(ErrorCode::kIo, "cannot resolve checkpoint '" + dir + "': " + ec.message());

  const fs::path manifest_path = root / kCheckpointManifestFile;
  if (!fs::exists(fs::symlink_status(manifest_path, ec)))
    fail(ErrorCode::kCheckpointCorrupt, "checkpoint '" + root.string() + "' has no " +
                                            std::string(kCheckpointManifestFile) +
                                            ": not an aitune checkpoint, or one whose save did not finish");
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

std::string Checkpoint::model_path(const std::string& key) const {
  return (fs::path(directory_) / graph(key).model).string();
}

OnnxRuntimeBackendConfig Checkpoint::backend_config(const std::string& key,
                                                    const CheckpointBackendOverrides& overrides) const {
  const auto& g = graph(key);
  OnnxRuntimeBackendConfig config = g.backend_config;
  for (const auto& opt : g.path_options)
    config.provider_options[opt] = (fs::path(directory_) / config.provider_options.at(opt)).string();
  if (overrides.provider && *overrides.provider != config.provider) {
    config.provider = *overrides.provider;
    config.provider_options.clear();
  }
  if (overrides.device_id) config.device_id = *overrides.device_id;
  if (overrides.provider_options)
    for (const auto& [k, v] : *overrides.provider_options) config.provider_options[k] = v;
  return config;
}

std::unique_ptr<OnnxRuntimeBackend> Checkpoint::create_backend(const std::string& key,
                                                               const CheckpointBackendOverrides& overrides,
                                                               std::shared_ptr<OrtRuntime> runtime) const {
  const auto& g = graph(key);
  auto config = backend_config(key, overrides);
  try {
    return OnnxRuntimeBackend::create(model_path(key), config, g.graph_spec, std::move(runtime));
  } catch (const Error& e) {
    throw Error(e.code(), "checkpoint '" + directory_ + "', graph '" + key + "': " + e.what());
  }
}

}  // namespace aitune
