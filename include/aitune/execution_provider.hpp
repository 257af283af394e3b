// ExecutionProvider: which ONNX Runtime execution provider a session runs on (a handle
// into the provider registry, provider_registry.hpp, which describes each one).
#pragma once

#include <compare>
#include <string_view>
#include <vector>

namespace aitune {

/// A registered execution provider, by its name. The built-in ones are CPU, CUDA and
/// TensorRT (the spec lists CUDA and TensorRT; CPU is ours, so that the whole pipeline
/// runs where there is no GPU); a new one is one ProviderDescription registered with
/// register_execution_provider (provider_registry.hpp), not a new enum value. What a
/// provider does (its options, candidate variants, capabilities, availability, Triton
/// block) is asked of the registry, never switched on here.
class ExecutionProvider {
 public:
  /// The CPU provider (the zero value, as the enum's first member was).
  constexpr ExecutionProvider() noexcept = default;
  /// `name` must outlive every copy (a literal, or the registry's own string); from
  /// text use parse_execution_provider, which checks it is registered.
  constexpr explicit ExecutionProvider(std::string_view name) noexcept : name_(name) {}

  /// "cpu", "cuda", "tensorrt", ...
  constexpr std::string_view name() const noexcept { return name_; }

  friend constexpr bool operator==(ExecutionProvider a, ExecutionProvider b) noexcept { return a.name_ == b.name_; }
  friend constexpr std::strong_ordering operator<=>(ExecutionProvider a, ExecutionProvider b) noexcept {
    return a.name_ <=> b.name_;
  }

  static const ExecutionProvider kCPU;
  static const ExecutionProvider kCUDA;
  static const ExecutionProvider kTensorRT;

 private:
  std::string_view name_ = "cpu";
};

inline constexpr ExecutionProvider ExecutionProvider::kCPU{"cpu"};
inline constexpr ExecutionProvider ExecutionProvider::kCUDA{"cuda"};
inline constexpr ExecutionProvider ExecutionProvider::kTensorRT{"tensorrt"};

/// "cpu", "cuda", "tensorrt" (the spellings of the Python enum's values).
std::string_view execution_provider_name(ExecutionProvider provider) noexcept;

/// ORT's own name: "CPUExecutionProvider", "CUDAExecutionProvider", ... (the registry's).
std::string_view execution_provider_ort_name(ExecutionProvider provider) noexcept;

/// Parses a registered provider's name (case-insensitive; ORT's names accepted too).
/// Throws Error(kInvalidArgument) listing the registered names.
ExecutionProvider parse_execution_provider(std::string_view text);

/// Every registered provider, in registration order (the built-ins first).
std::vector<ExecutionProvider> registered_execution_providers();

/// What a provider can do, from its registry entry; the rest of the engine asks these
/// instead of comparing providers.
struct ProviderCapabilities {
  /// Sessions compute in CUDA device memory (inputs are bound there; IoBinding runners).
  bool device_memory = false;
  /// enable_cuda_graph=1 is taken (CUDA-graph runner, CUDA-graph candidates).
  bool cuda_graph = false;
  /// The plan may run it on the fp16-converted model (the provider has no fp16 mode of
  /// its own that would make that model redundant).
  bool fp16_model = false;
  /// Runs ONNX Runtime's contrib operators (what the transformer fusions make).
  bool contrib_operators = false;
};
const ProviderCapabilities& provider_capabilities(ExecutionProvider provider);

}  // namespace aitune
