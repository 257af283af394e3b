// Reading elements of host tensors as numbers, whatever their dtype: what the
// correctness checks (correctness.cpp) and the magnitude groups (magnitude_groups.cpp)
// compare and measure.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "aitune/tensor.hpp"

namespace aitune::detail {

inline double half_to_double(uint16_t h) {
  uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  double value;
  if (exp == 0) {
    value = std::ldexp(static_cast<double>(mant), -24);  // subnormal
  } else if (exp == 31) {
    value = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    value = std::ldexp(static_cast<double>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -value : value;
}

inline double bfloat16_to_double(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Element i of a contiguous host tensor as a double.
inline double element(const TensorView& t, std::size_t i) {
  switch (t.dtype) {
    case DType::kFloat32: return static_cast<const float*>(t.data)[i];
    case DType::kFloat64: return static_cast<const double*>(t.data)[i];
    case DType::kFloat16: return half_to_double(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kBFloat16: return bfloat16_to_double(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(t.data)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(t.data)[i];
    case DType::kInt16: return static_cast<const int16_t*>(t.data)[i];
    case DType::kInt8: return static_cast<const int8_t*>(t.data)[i];
    case DType::kUInt8:
    case DType::kBool: return static_cast<const uint8_t*>(t.data)[i];
  }
  return 0;
}

// Element i of a contiguous integer or bool host tensor, exactly (a double holds integers
// exactly only up to 2^53: token ids or hashes beyond it would compare equal when distinct).
inline int64_t integer_element(const TensorView& t, std::size_t i) {
  switch (t.dtype) {
    case DType::kInt64: return static_cast<const int64_t*>(t.data)[i];
    case DType::kInt32: return static_cast<const int32_t*>(t.data)[i];
    case DType::kInt16: return static_cast<const int16_t*>(t.data)[i];
    case DType::kInt8: return static_cast<const int8_t*>(t.data)[i];
    case DType::kUInt8:
    case DType::kBool: return static_cast<const uint8_t*>(t.data)[i];
    default: return 0;
  }
}

}  // namespace aitune::detail
