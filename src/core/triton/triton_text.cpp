// Triton's protobuf text format pieces: dtype names, string literals, tensor entries.
#include "triton/triton_text.hpp"

#include <cstdio>
#include <sstream>

namespace aitune::detail {

// Triton's DataType enum spelling for each dtype aitune handles.
std::string_view triton_dtype(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "TYPE_BOOL";
    case DType::kInt8: return "TYPE_INT8";
    case DType::kInt16: return "TYPE_INT16";
    case DType::kInt32: return "TYPE_INT32";
    case DType::kInt64: return "TYPE_INT64";
    case DType::kUInt8: return "TYPE_UINT8";
    case DType::kFloat16: return "TYPE_FP16";
    case DType::kBFloat16: return "TYPE_BF16";
    case DType::kFloat32: return "TYPE_FP32";
    case DType::kFloat64: return "TYPE_FP64";
  }
  return "TYPE_INVALID";
}

// A protobuf text-format string literal: C escapes, non-printable bytes as octal.
std::string quote(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\%03o", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? std::string(sep) : "") + items[i];
  return out;
}

// dims of one tensor: -1 for dynamic axes; the batch axis dropped when batching.
std::vector<int64_t> triton_dims(const TensorSpec& t, bool batching) {
  std::vector<int64_t> dims;
  for (std::size_t axis = batching ? 1 : 0; axis < t.rank(); ++axis)
    dims.push_back(t.is_dynamic(axis) ? -1 : t.min_shape[axis]);
  return dims;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

namespace {

// One input/output entry; a scalar (or a batched rank-1 tensor) gets dims [1] and an
// empty reshape, as Triton's own auto-complete writes it: batched or not, the model's
// tensor has no dimension there (without batching a rank-0 output was written as [1],
// which Triton refuses as a rank mismatch).
std::string tensor_entry(const TensorSpec& t, bool batching) {
  auto dims = triton_dims(t, batching);
  std::ostringstream out;
  out << "  {\n    name: " << quote(t.name) << "\n    data_type: " << triton_dtype(t.dtype) << "\n";
  if (dims.empty()) {
    out << "    dims: [1]\n    reshape { shape: [] }\n";
  } else {
    out << "    dims: " << dims_text(dims) << "\n";
  }
  out << "  }";
  return out.str();
}

}  // namespace

std::string tensor_list(const char* field, const std::vector<TensorSpec>& tensors, bool batching) {
  std::vector<std::string> entries;
  for (const auto& t : tensors) entries.push_back(tensor_entry(t, batching));
  return std::string(field) + " [\n" + join(entries, ",\n") + "\n]\n";
}

}  // namespace aitune::detail
