// Private: the provider registry, one ProviderDescription per execution provider; the
// engine asks it instead of switching on the provider (candidates, session options,
// availability, doctor, Triton export).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "aitune/correctness.hpp"
#include "aitune/execution_provider.hpp"
#include "aitune/graph_spec.hpp"
#include "aitune/onnx_session.hpp"
#include "aitune/ort_runtime.hpp"

namespace aitune {
namespace detail {
struct SessionSetup;  // session_setup.hpp
}  // namespace detail

/// One candidate variant a provider adds to the plan: the options it sets (those the
/// caller left open), the precision it computes in, and session settings.
struct ProviderVariant {
  std::map<std::string, std::string> options;
  Precision precision = Precision::kStrict;
  std::optional<int> intra_op_threads;
  std::optional<GraphOptimizationLevel> graph_optimization_level;
};

/// What a provider's options become in a Triton config.pbtxt (Triton's ONNX Runtime
/// backend): the gpu_execution_accelerator block and model parameters; what has no
/// place there goes to `notes`.
struct TritonProviderBlock {
  std::string accelerator_name;  ///< "" for no execution_accelerators block
  std::map<std::string, std::string> accelerator;
  std::map<std::string, std::string> parameters;
  std::vector<std::string> notes;
};

/// Everything aitune knows about one execution provider. A hook left empty means the
/// provider has nothing to do there.
struct ProviderDescription {
  std::string name;      ///< "cuda": the handle's name, the JSON and CLI spelling
  std::string ort_name;  ///< "CUDAExecutionProvider"
  ProviderCapabilities capabilities;
  /// The provider options it documents (for listings and errors); informational.
  std::vector<std::string> option_names;

  /// Rejects options the provider does not take, before anything is loaded.
  std::function<void(const OnnxSessionConfig&)> validate_options;
  /// The candidate variants of `base` (the first: `base` made strict where the
  /// provider's default is not).
  std::function<std::vector<ProviderVariant>(const OnnxSessionConfig& base, const GraphSpec& spec)> variants;
  /// The precision options the caller fixed decide (use_tf32=0: strict), if any.
  std::function<std::optional<Precision>(const std::map<std::string, std::string>& options)> fixed_precision;
  /// Options that put a variant's caches under `dir` (TensorRT engines, timing caches).
  std::function<std::map<std::string, std::string>(const GraphSpec& spec, const std::string& dir,
                                                   const std::map<std::string, std::string>& options)>
      cache_options;
  /// Whether it can be used here, and why not (`available` and `reason`).
  std::function<ProviderStatus(OrtRuntime::Impl& runtime)> probe;
  /// Appends the provider to the session options and sets where the session computes
  /// (memory info, stream). Empty: sessions cannot be created (kProviderUnavailable).
  std::function<void(detail::SessionSetup& setup, OrtRuntime& runtime, const OnnxSessionConfig& config)> append;
  /// Extra lines `aitune doctor` prints under the provider's status.
  std::function<std::vector<std::string>(const ProviderStatus& status)> doctor_details;
  /// Its Triton block; `cache_paths` are the repository's copies of cache files by option.
  std::function<TritonProviderBlock(const OnnxSessionConfig& config,
                                    const std::map<std::string, std::string>& cache_paths)>
      triton;
  /// The largest batch an engine built for `config` runs (a TensorRT profile), if bounded.
  std::function<std::optional<int64_t>(const OnnxSessionConfig& config)> max_batch;
};

/// Registers a provider (after the built-ins). Error(kInvalidArgument) when the name or
/// the ORT name is taken. Thread safe; descriptions live for the process.
void register_execution_provider(ProviderDescription description);

/// The description of a registered provider; Error(kInvalidArgument) for an unknown one.
const ProviderDescription& provider_description(ExecutionProvider provider);

namespace detail {
/// True when provider option `key` is set to something other than "0" / "false".
bool option_on(const std::map<std::string, std::string>& options, const std::string& key);
/// Why a per-process or aitune-only option has no place in a Triton model (stream
/// addresses, device_id), shared by the GPU providers' Triton blocks.
std::optional<std::string> triton_process_local_option(const std::string& key, const std::string& value);
}  // namespace detail

}  // namespace aitune
