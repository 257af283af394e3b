// The CPU execution provider: ORT's built-in one, so the whole pipeline runs without a GPU.
#include "aitune/error.hpp"
#include "providers/provider_registry.hpp"
#include "providers/session_setup.hpp"

namespace aitune::providers {

ProviderDescription cpu() {
  ProviderDescription d;
  d.name = "cpu";
  d.ort_name = "CPUExecutionProvider";
  d.capabilities = {.device_memory = false, .cuda_graph = false, .fp16_model = false, .contrib_operators = true};
  d.validate_options = [](const OnnxSessionConfig& config) {
    if (!config.provider_options.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  "the CPU execution provider takes no provider options (got '" + config.provider_options.begin()->first +
                      "'); its settings are the session's: intra_op_threads, inter_op_threads and "
                      "graph_optimization_level (OnnxSessionConfig; `aitune run` and `tune` take them as "
                      "--provider-option KEY=VALUE too)");
  };
  // Intra-op threads {ORT default, 1} x graph optimisation {all, extended}.
  d.variants = [](const OnnxSessionConfig&, const GraphSpec&) {
    return std::vector<ProviderVariant>{
        {{}, Precision::kStrict, std::nullopt, std::nullopt},
        {{}, Precision::kStrict, 1, std::nullopt},
        {{}, Precision::kStrict, std::nullopt, GraphOptimizationLevel::kExtended},
    };
  };
  d.probe = [](OrtRuntime::Impl&) {
    ProviderStatus s;
    s.available = true;
    return s;
  };
  d.append = [validate = d.validate_options](detail::SessionSetup& setup, OrtRuntime&, const OnnxSessionConfig& config) {
    validate(config);
    setup.owned_memory_info.emplace(Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault));
    setup.memory_info = *setup.owned_memory_info;
  };
  d.triton = [](const OnnxSessionConfig& config, const std::map<std::string, std::string>&) {
    TritonProviderBlock block;
    for (const auto& [key, value] : config.provider_options)
      block.notes.push_back("provider option " + key + "=" + value +
                            ": Triton's ONNX Runtime backend passes no options to the CPU provider");
    return block;
  };
  return d;
}

}  // namespace aitune::providers
