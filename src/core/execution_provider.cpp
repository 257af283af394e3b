// Execution provider names and parsing.
#include "aitune/execution_provider.hpp"

#include <algorithm>
#include <cctype>
#include <string>

#include "aitune/error.hpp"
#include "enum_names.hpp"

namespace aitune {
namespace {

constexpr detail::EnumNames<ExecutionProvider, 3> kNames{{
    {ExecutionProvider::kCPU, "cpu"},
    {ExecutionProvider::kCUDA, "cuda"},
    {ExecutionProvider::kTensorRT, "tensorrt"},
}};

// ORT's own names (what OrtApi::GetAvailableProviders lists).
constexpr detail::EnumNames<ExecutionProvider, 3> kOrtNames{{
    {ExecutionProvider::kCPU, "CPUExecutionProvider"},
    {ExecutionProvider::kCUDA, "CUDAExecutionProvider"},
    {ExecutionProvider::kTensorRT, "TensorrtExecutionProvider"},
}};

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::string_view execution_provider_name(ExecutionProvider provider) noexcept {
  return detail::enum_name(kNames, provider, "cpu");
}

std::string_view execution_provider_ort_name(ExecutionProvider provider) noexcept {
  return detail::enum_name(kOrtNames, provider, "CPUExecutionProvider");
}

ExecutionProvider parse_execution_provider(std::string_view text) {
  const std::string wanted = lower(text);
  for (const auto& row : kOrtNames)
    if (wanted == lower(row.name)) return row.value;
  if (auto provider = detail::enum_value(kNames, wanted)) return *provider;
  throw Error(ErrorCode::kInvalidArgument, "unknown execution provider '" + std::string(text) +
                                               "'; valid values: " + detail::enum_names_list(kNames));
}

}  // namespace aitune
