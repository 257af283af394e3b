// The checkpoint manifest: its JSON format (to_json / from_json) and the rules every
// manifest obeys, apart from the files a checkpoint holds (checkpoint.cpp).
#include <algorithm>
#include <cctype>
#include <set>

#include "aitune/checkpoint.hpp"
#include "aitune/error.hpp"
#include "aitune/onnx_external_data.hpp"
#include "aitune/version.hpp"
#include "base/bounded_json.hpp"
#include "checkpoint/checkpoint_manifest_rules.hpp"

namespace aitune {
namespace detail {
namespace {

using Json = ManifestJson;

[[noreturn]] void fail(ErrorCode code, const std::string& message) { throw Error(code, message); }

}  // namespace

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

namespace {

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

// Whether an ONNX Runtime option (a session config entry or a provider option) makes the
// session read or write a file it names: session.optimized_model_filepath, ep.context_*,
// profile prefixes, TensorRT's dumps and caches. A checkpoint is data: loading one writes
// nothing outside it (an edited manifest made a load overwrite any file the user could
// write), so only the path options it names as its own (`path_options`, relative to it)
// may name files.
bool names_a_file(std::string key) {
  std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
  // ("file" alone would take trt_profile_max_shapes for one)
  for (const char* part : {"path", "file_name", "filename", "file_prefix", "_dir", "dump", "ep.context"})
    if (key.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

void validate_manifest(const CheckpointManifest& m, ErrorCode code, bool artifacts) {
  // No graph is allowed: a front end may keep only its own decisions in the metadata
  // (aitune.torch's torch.compile graphs); aitune.torch's load refuses a checkpoint
  // that restores nothing.
  std::set<std::string> keys, paths;
  for (std::size_t i = 0; i < m.graphs.size(); ++i) {
    const auto& g = m.graphs[i];
    const std::string where = graph_where(g, i);
    check_key(g.key, code, "graphs[" + std::to_string(i) + "]");
    if (!keys.insert(g.key).second) fail(code, where + ": graph key '" + g.key + "' appears twice");
    const CheckpointSection* section = find_checkpoint_section(g.backend);
    if (!section) {
      std::string known;
      for (const auto& s : checkpoint_sections()) known += (known.empty() ? "" : ", ") + std::string(s.name);
      fail(code, where + ": unknown backend '" + g.backend + "'; this aitune knows: " + known);
    }
    if (g.section_version < 1 || g.section_version > section->version)
      fail(code, where + ": section_version " + std::to_string(g.section_version) + " of backend '" + g.backend +
                     "' is not one this aitune reads (1 to " + std::to_string(section->version) +
                     (g.section_version > section->version ? "); upgrade aitune to load it" : ")"));
    const auto& c = g.backend_config;
    for (auto [name, value] : {std::pair{"intra_op_threads", c.intra_op_threads}, std::pair{"inter_op_threads", c.inter_op_threads}})
      if (value < 0 || value > kMaxSessionThreads)
        fail(code, where + ": backend_config." + name + " is " + std::to_string(value) + "; allowed: 0 (ORT's default) to " +
                       std::to_string(kMaxSessionThreads));
    auto refuse_file = [&](const std::string& option) {
      fail(code, where + ": " + option +
                     " makes ONNX Runtime read or write a file it names; a checkpoint may not hold one (loading "
                     "writes nothing outside the checkpoint): set it on the session you create instead");
    };
    for (const auto& [key, value] : c.session_config)
      if (names_a_file(key)) refuse_file("backend_config.session_config entry '" + key + "'='" + value + "'");
    // TensorRT's cache directories are path options, which the save makes relative to the
    // checkpoint where it takes them in (`path_options`, checked below) and keeps as given
    // where it does not (the user's own cache)
    for (const auto& [key, value] : c.provider_options)
      if (names_a_file(key) &&
          std::none_of(std::begin(kPathOptions), std::end(kPathOptions), [&](const char* p) { return key == p; }))
        refuse_file("provider option " + key + "='" + value + "'");
    if (c.device_id < 0 || c.device_id > kMaxDeviceId)
      fail(code, where + ": backend_config.device_id is " + std::to_string(c.device_id) + "; allowed: 0 to " +
                     std::to_string(kMaxDeviceId));
    if (!artifacts) continue;
    bool has_model = !section->runs_in_engine && g.model.empty();  // a front end's graph has no model
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


Json parse_opaque_json(const std::string& text, const char* empty, const std::string& what) {
  return parse_bounded_json<Json>(text.empty() ? std::string_view(empty) : std::string_view(text),
                                  ErrorCode::kInvalidArgument, what + " is not acceptable JSON");
}

namespace {

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
  // Format 1 has neither field: its graphs are ONNX Runtime graphs, section version 1.
  if (j.contains("section_version")) {
    const Json& v = j.at("section_version");
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > (1 << 20))
      fail(ErrorCode::kCheckpointCorrupt, "field '" + where + ".section_version' must be a small integer, not " + v.dump());
    g.section_version = static_cast<int>(v.get<std::int64_t>());
  }
  if (j.contains("section")) g.section_json = j.at("section").dump();
  g.model = string_field(j, "model", where);
  try {
    g.graph_spec = GraphSpec::from_json(field(j, "graph_spec", where).dump());
  } catch (const Error& e) {
    fail(ErrorCode::kCheckpointCorrupt, "field '" + where + ".graph_spec' is invalid: " + e.what());
  }
  const Json& config = field(j, "backend_config", where);
  // from_json converts numbers leniently (1.5 -> 1, 2^32 + 1 -> 1): check them here.
  for (const char* key : {"device_id", "intra_op_threads", "inter_op_threads"}) {
    if (!config.is_object() || !config.contains(key)) continue;
    const Json& v = config.at(key);
    constexpr std::int64_t kLimit = 1 << 20;  // far beyond any range; validate_manifest states the real one
    if (!v.is_number_integer() || (v.is_number_unsigned() ? v.get<std::uint64_t>() > std::uint64_t{kLimit}
                                                           : v.get<std::int64_t>() < -kLimit || v.get<std::int64_t>() > kLimit))
      fail(ErrorCode::kCheckpointCorrupt, "field '" + where + ".backend_config." + key + "' must be a small integer, not " +
                                              v.dump());
  }
  try {
    g.backend_config = OnnxSessionConfig::from_json(config.dump());
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


}  // namespace
}  // namespace detail

using detail::fail;
using detail::parse_opaque_json;
using detail::validate_manifest;
using Json = detail::ManifestJson;
using detail::kMaxManifestBytes;
using detail::parse_bounded_json;
using detail::field;
using detail::string_field;
using detail::array_field;
using detail::graph_from_json;

const std::vector<CheckpointSection>& checkpoint_sections() {
  static const std::vector<CheckpointSection> sections = {
      {kOnnxRuntimeBackendName, 1, true, "this engine (OnnxSession)"},
      {kTorchCompileBackendName, 1, false, "the Python front end (ait.load compiles it again)"},
      {kEagerBackendName, 1, false, "the Python front end (ait.load runs the module itself)"},
  };
  return sections;
}

const CheckpointSection* find_checkpoint_section(std::string_view name) noexcept {
  for (const auto& s : checkpoint_sections())
    if (s.name == name) return &s;
  return nullptr;
}

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
  j["metadata"] = parse_opaque_json(metadata_json, "{}", "metadata_json");
  j["graphs"] = Json::array();
  for (const auto& g : graphs) {
    Json jg;
    jg["key"] = g.key;
    jg["backend"] = g.backend;
    jg["section_version"] = g.section_version;
    jg["section"] = parse_opaque_json(g.section_json, "null", "section_json of graph '" + g.key + "'");
    jg["model"] = g.model;
    jg["graph_spec"] = Json::parse(g.graph_spec.to_json());
    jg["backend_config"] = Json::parse(g.backend_config.to_json());
    jg["path_options"] = g.path_options;
    jg["structure"] = parse_opaque_json(g.structure_json, "null", "structure_json of graph '" + g.key + "'");
    jg["artifacts"] = Json::array();
    for (const auto& a : g.artifacts) jg["artifacts"].push_back(Json{{"path", a.path}, {"size", a.size}, {"sha256", a.sha256}});
    j["graphs"].push_back(std::move(jg));
  }
  return j.dump(indent);
}

CheckpointManifest CheckpointManifest::from_json(const std::string& text) {
  if (text.size() > kMaxManifestBytes)
    fail(ErrorCode::kCheckpointCorrupt, std::to_string(text.size()) + " bytes, larger than any manifest (limit " +
                                            std::to_string(kMaxManifestBytes) + ")");
  const Json j = parse_bounded_json<Json>(text, ErrorCode::kCheckpointCorrupt, "manifest");
  if (!j.is_object()) fail(ErrorCode::kCheckpointCorrupt, std::string("not a JSON object but ") + j.type_name());
  if (!j.contains("format") || j.at("format") != kCheckpointFormatName)
    fail(ErrorCode::kCheckpointCorrupt, "not an aitune checkpoint manifest: field 'format' is " +
                                            (j.contains("format") ? j.at("format").dump() : std::string("missing")) +
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
  validate_manifest(m, ErrorCode::kCheckpointCorrupt, true);
  return m;
}


}  // namespace aitune
