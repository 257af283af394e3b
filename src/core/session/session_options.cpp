// OnnxSessionConfig's names and JSON, and the ORT session options it makes (the provider's part from the registry).
#include "session/session_options.hpp"

#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "aitune/error.hpp"
#include "base/enum_names.hpp"
#include "ort/ort_runtime_impl.hpp"
#include "providers/provider_registry.hpp"
#include "session/session_limits.hpp"

namespace aitune {

using detail::ort_call;

namespace {

constexpr detail::EnumNames<GraphOptimizationLevel, 4> kLevelNames{{
    {GraphOptimizationLevel::kDisableAll, "disable_all"},
    {GraphOptimizationLevel::kBasic, "basic"},
    {GraphOptimizationLevel::kExtended, "extended"},
    {GraphOptimizationLevel::kAll, "all"},
}};

}  // namespace

std::string_view graph_optimization_level_name(GraphOptimizationLevel level) noexcept {
  return detail::enum_name(kLevelNames, level, "all");
}

GraphOptimizationLevel parse_graph_optimization_level(std::string_view text) {
  return detail::parse_enum(kLevelNames, text, "graph optimization level");
}

Device OnnxSessionConfig::device() const {
  return provider_capabilities(provider).device_memory ? Device::cuda(device_id) : Device::cpu();
}

std::string OnnxSessionConfig::to_json(int indent) const {
  nlohmann::json j{{"provider", execution_provider_name(provider)},
                   {"device_id", device_id},
                   {"graph_optimization_level", graph_optimization_level_name(graph_optimization_level)},
                   {"intra_op_threads", intra_op_threads},
                   {"inter_op_threads", inter_op_threads},
                   {"provider_options", provider_options},
                   {"session_config", session_config}};
  // Only when set: the JSON of every other config (and what digests it) stays as it was.
  if (in_place_outputs) j["in_place_outputs"] = true;
  if (!output_aliases.empty()) j["output_aliases"] = output_aliases;
  return j.dump(indent);
}

OnnxSessionConfig OnnxSessionConfig::from_json(const std::string& text) {
  OnnxSessionConfig c;
  try {
    auto j = nlohmann::json::parse(text);
    c.provider = parse_execution_provider(j.at("provider").get<std::string>());
    c.device_id = j.value("device_id", 0);
    c.graph_optimization_level = parse_graph_optimization_level(j.value("graph_optimization_level", "all"));
    c.intra_op_threads = j.value("intra_op_threads", 0);
    c.inter_op_threads = j.value("inter_op_threads", 0);
    c.provider_options = j.value("provider_options", std::map<std::string, std::string>{});
    c.session_config = j.value("session_config", std::map<std::string, std::string>{});
    c.in_place_outputs = j.value("in_place_outputs", false);
    c.output_aliases = j.value("output_aliases", std::map<std::string, std::string>{});
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, std::string("backend config JSON is malformed: ") + e.what());
  }
  return c;
}

namespace detail {
namespace {

::GraphOptimizationLevel to_ort(GraphOptimizationLevel level) {
  switch (level) {
    case GraphOptimizationLevel::kDisableAll: return ORT_DISABLE_ALL;
    case GraphOptimizationLevel::kBasic: return ORT_ENABLE_BASIC;
    case GraphOptimizationLevel::kExtended: return ORT_ENABLE_EXTENDED;
    case GraphOptimizationLevel::kAll: return ORT_ENABLE_ALL;
  }
  return ORT_ENABLE_ALL;
}

}  // namespace

void check_cuda_graph_config(const OnnxSessionConfig& config) {
  if (!provider_option_on(config, "enable_cuda_graph")) return;
  auto it = config.session_config.find(kDisableCpuEpFallback);
  if (it != config.session_config.end() && it->second != "1")
    throw Error(ErrorCode::kInvalidArgument,
                std::string("enable_cuda_graph=1 needs every node on the CUDA provider, but session config ") +
                    kDisableCpuEpFallback + "='" + it->second +
                    "' would let nodes fall back to the CPU inside a captured graph; leave it unset (aitune sets it "
                    "to 1 for CUDA-graph sessions)");
}

bool provider_option_on(const OnnxSessionConfig& config, const char* key) {
  auto it = config.provider_options.find(key);
  return it != config.provider_options.end() && it->second != "0" && it->second != "false";
}

void check_thread_counts(const OnnxSessionConfig& config) {
  // The same range a checkpoint's manifest is held to: a caller (Python included) that
  // asks for 100,000 threads gets a clear error, not a session that hangs creating them.
  for (auto [name, value] : {std::pair{"intra_op_threads", config.intra_op_threads},
                             std::pair{"inter_op_threads", config.inter_op_threads}})
    if (value < 0 || value > kMaxSessionThreads)
      throw Error(ErrorCode::kInvalidArgument, std::string(name) + " is " + std::to_string(value) +
                                                   "; allowed: 0 (ORT's default) to " + std::to_string(kMaxSessionThreads));
}

SessionSetup make_session_setup(OrtRuntime& runtime, const OnnxSessionConfig& config) {
  check_thread_counts(config);
  SessionSetup setup;
  auto& so = setup.options;
  so.SetGraphOptimizationLevel(to_ort(config.graph_optimization_level));
  if (config.intra_op_threads > 0) so.SetIntraOpNumThreads(config.intra_op_threads);
  if (config.inter_op_threads > 0) so.SetInterOpNumThreads(config.inter_op_threads);
  for (const auto& [k, v] : config.session_config)
    ort_call(ErrorCode::kInvalidArgument, "session config entry '" + k + "'", [&] { so.AddConfigEntry(k.c_str(), v.c_str()); });
  const auto& provider = provider_description(config.provider);
  setup.cuda_graph = provider.capabilities.cuda_graph && provider_option_on(config, "enable_cuda_graph");
  // Safe by construction: a node the CUDA provider cannot place would run on the CPU
  // inside a captured graph (host work and copies a replay does not redo), so a session
  // that will be captured refuses it at creation instead (check_cuda_graph_config).
  if (setup.cuda_graph) so.AddConfigEntry(kDisableCpuEpFallback, "1");
  if (!provider.append)
    throw Error(ErrorCode::kProviderUnavailable,
                "the " + provider.name + " execution provider cannot create sessions in this build");
  provider.append(setup, runtime, config);
  return setup;
}

}  // namespace detail
}  // namespace aitune
