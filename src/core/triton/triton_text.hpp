// Private: Triton's protobuf text format pieces shared by config.pbtxt and the ensemble config (dtype names, quoting, tensor entries).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "aitune/dtype.hpp"
#include "aitune/graph_spec.hpp"

namespace aitune::detail {

/// Triton's DataType enum spelling of `dtype` ("TYPE_FP32", ...).
std::string_view triton_dtype(DType dtype);

/// A protobuf text-format string literal: C escapes, non-printable bytes as octal.
std::string quote(std::string_view text);

/// `items` joined by `sep`.
std::string join(const std::vector<std::string>& items, std::string_view sep);

/// The dims of one tensor as Triton reads them: -1 for dynamic axes; the batch axis
/// (axis 0) dropped when batching.
std::vector<int64_t> triton_dims(const TensorSpec& t, bool batching);

/// "[a, b, c]".
std::string dims_text(const std::vector<int64_t>& dims);

/// An "input [...]" / "output [...]" list (`field`) of `tensors`; a scalar (or a batched
/// rank-1 tensor) gets dims [1] and an empty reshape, as Triton's own auto-complete
/// writes it.
std::string tensor_list(const char* field, const std::vector<TensorSpec>& tensors, bool batching);

}  // namespace aitune::detail
