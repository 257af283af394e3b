// DType tables: names, sizes, ONNX / DLPack / numpy codes.
#include "aitune/dtype.hpp"

#include <array>

#include "aitune/error.hpp"

namespace aitune {
namespace {

// DLPack 0.8 added kDLBool = 6 (torch exports bool that way); Debian ships 0.6's header.
constexpr uint8_t kDLPackBool = 6;

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t size;
  int onnx;            // TensorProto.DataType
  DLDataType dlpack;   // code, bits, lanes
  std::string_view numpy;  // "" where numpy has no type
};

// One row per dtype: every mapping reads this table, so they cannot disagree.
constexpr std::array<DTypeInfo, 10> kTable{{
    {DType::kBool, "bool", 1, 9, {kDLPackBool, 8, 1}, "|b1"},
    {DType::kInt8, "int8", 1, 3, {kDLInt, 8, 1}, "|i1"},
    {DType::kInt16, "int16", 2, 5, {kDLInt, 16, 1}, "<i2"},
    {DType::kInt32, "int32", 4, 6, {kDLInt, 32, 1}, "<i4"},
    {DType::kInt64, "int64", 8, 7, {kDLInt, 64, 1}, "<i8"},
    {DType::kUInt8, "uint8", 1, 2, {kDLUInt, 8, 1}, "|u1"},
    {DType::kFloat16, "float16", 2, 10, {kDLFloat, 16, 1}, "<f2"},
    {DType::kBFloat16, "bfloat16", 2, 16, {kDLBfloat, 16, 1}, ""},
    {DType::kFloat32, "float32", 4, 1, {kDLFloat, 32, 1}, "<f4"},
    {DType::kFloat64, "float64", 8, 11, {kDLFloat, 64, 1}, "<f8"},
}};

const DTypeInfo& info(DType dtype) noexcept { return kTable[static_cast<std::size_t>(dtype)]; }

}  // namespace

std::size_t dtype_size(DType dtype) noexcept { return info(dtype).size; }

bool dtype_is_floating(DType dtype) noexcept {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
         dtype == DType::kFloat64;
}
std::string_view dtype_name(DType dtype) noexcept { return info(dtype).name; }
int dtype_to_onnx(DType dtype) noexcept { return info(dtype).onnx; }
DLDataType dtype_to_dlpack(DType dtype) noexcept { return info(dtype).dlpack; }

DType dtype_from_name(std::string_view name) {
  for (const auto& row : kTable)
    if (row.name == name) return row.dtype;
  struct Alias { std::string_view name; DType dtype; };
  constexpr Alias kAliases[] = {{"half", DType::kFloat16}, {"float", DType::kFloat32},
                                {"double", DType::kFloat64}, {"long", DType::kInt64},
                                {"int", DType::kInt32}, {"short", DType::kInt16}};
  for (const auto& alias : kAliases)
    if (alias.name == name) return alias.dtype;
  std::string valid;
  for (const auto& row : kTable) valid += (valid.empty() ? "" : ", ") + std::string(row.name);
  throw Error(ErrorCode::kInvalidArgument,
              "unknown dtype '" + std::string(name) + "'; valid dtypes: " + valid);
}

std::optional<DType> dtype_from_onnx(int onnx_type) noexcept {
  for (const auto& row : kTable)
    if (row.onnx == onnx_type) return row.dtype;
  return std::nullopt;
}

std::optional<DType> dtype_from_dlpack(DLDataType dl) noexcept {
  if (dl.lanes != 1) return std::nullopt;
  for (const auto& row : kTable)
    if (row.dlpack.code == dl.code && row.dlpack.bits == dl.bits) return row.dtype;
  return std::nullopt;
}

std::optional<std::string> dtype_to_numpy(DType dtype) {
  if (info(dtype).numpy.empty()) return std::nullopt;
  return std::string(info(dtype).numpy);
}

std::optional<DType> dtype_from_numpy(std::string_view descr) noexcept {
  if (descr.size() == 3 && (descr[0] == '<' || descr[0] == '|' || descr[0] == '=')) {
    for (const auto& row : kTable) {
      if (row.numpy.empty()) continue;
      if (row.numpy.substr(1) == descr.substr(1)) return row.dtype;
    }
  }
  return std::nullopt;
}

}  // namespace aitune
