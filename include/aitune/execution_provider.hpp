// ExecutionProvider: which ONNX Runtime execution provider a session runs on.
#pragma once

#include <string_view>

namespace aitune {

/// The execution providers aitune drives. The spec lists CUDA and TensorRT; CPU is
/// ours, so that the whole pipeline runs where there is no GPU. The default is CUDA.
enum class ExecutionProvider { kCPU, kCUDA, kTensorRT };

/// "cpu", "cuda", "tensorrt" (the spellings of the Python enum's values).
std::string_view execution_provider_name(ExecutionProvider provider) noexcept;

/// ORT's own name: "CPUExecutionProvider", "CUDAExecutionProvider", ...
std::string_view execution_provider_ort_name(ExecutionProvider provider) noexcept;

/// Parses "cpu" / "cuda" / "tensorrt" (case-insensitive; ORT's names accepted too).
/// Throws Error(kInvalidArgument) listing the valid values.
ExecutionProvider parse_execution_provider(std::string_view text);

}  // namespace aitune
