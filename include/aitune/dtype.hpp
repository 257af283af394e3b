// DType: the tensor element types aitune handles, mapped to ONNX and DLPack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <dlpack/dlpack.h>

namespace aitune {

/// Element type of a tensor. The set ONNX Runtime and torch share for inference.
enum class DType {
  kBool,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

/// Size of one element in bytes.
std::size_t dtype_size(DType dtype) noexcept;

/// True for float16, bfloat16, float32 and float64.
bool dtype_is_floating(DType dtype) noexcept;

/// Canonical name as torch spells it without the prefix: "bool", "int8", ..., "float16",
/// "bfloat16", "float32", "float64".
std::string_view dtype_name(DType dtype) noexcept;

/// Parses a canonical name (also accepts the aliases "half", "float", "double", "long",
/// "int"). Throws Error(kInvalidArgument) listing the valid names.
DType dtype_from_name(std::string_view name);

/// The ONNX TensorProto.DataType value (FLOAT = 1, ..., BFLOAT16 = 16), which is also
/// ORT's ONNXTensorElementDataType.
int dtype_to_onnx(DType dtype) noexcept;

/// Inverse of dtype_to_onnx; nullopt for ONNX types aitune does not handle (string,
/// complex, unsigned > 8 bits, float8...).
std::optional<DType> dtype_from_onnx(int onnx_type) noexcept;

/// The DLPack descriptor (lanes = 1).
DLDataType dtype_to_dlpack(DType dtype) noexcept;

/// Inverse of dtype_to_dlpack; nullopt for vectorised or unsupported types.
std::optional<DType> dtype_from_dlpack(DLDataType dl) noexcept;

/// numpy's type string for .npy headers ("<f4", "|b1", ...); bfloat16 has none.
std::optional<std::string> dtype_to_numpy(DType dtype);

/// Inverse of dtype_to_numpy (little-endian or byte-order-free strings only).
std::optional<DType> dtype_from_numpy(std::string_view descr) noexcept;

}  // namespace aitune
