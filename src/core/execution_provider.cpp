// Execution provider names and parsing.
#include "aitune/execution_provider.hpp"

#include <algorithm>
#include <cctype>
#include <string>

#include "aitune/error.hpp"

namespace aitune {

std::string_view execution_provider_name(ExecutionProvider provider) noexcept {
  switch (provider) {
    case ExecutionProvider::kCPU: return "cpu";
    case ExecutionProvider::kCUDA: return "cuda";
    case ExecutionProvider::kTensorRT: return "tensorrt";
  }
  return "cpu";
}

std::string_view execution_provider_ort_name(ExecutionProvider provider) noexcept {
  switch (provider) {
    case ExecutionProvider::kCPU: return "CPUExecutionProvider";
    case ExecutionProvider::kCUDA: return "CUDAExecutionProvider";
    case ExecutionProvider::kTensorRT: return "TensorrtExecutionProvider";
  }
  return "CPUExecutionProvider";
}

ExecutionProvider parse_execution_provider(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (auto provider : {ExecutionProvider::kCPU, ExecutionProvider::kCUDA, ExecutionProvider::kTensorRT}) {
    std::string ort(execution_provider_ort_name(provider));
    std::transform(ort.begin(), ort.end(), ort.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == execution_provider_name(provider) || lower == ort) return provider;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "unknown execution provider '" + std::string(text) + "'; valid values: cpu, cuda, tensorrt");
}

}  // namespace aitune
