// Test helper: writes ONNX protobuf messages byte by byte (wire format), so tests and the
// fuzzer can build models whose external-data entries come in any field order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace aitune::test::onnx_wire {

inline std::string varint(std::uint64_t v) {
  std::string out;
  do {
    unsigned char b = v & 0x7f;
    v >>= 7;
    if (v) b |= 0x80;
    out += static_cast<char>(b);
  } while (v);
  return out;
}

/// A length-delimited field (wire type 2): strings and embedded messages.
inline std::string bytes_field(std::uint32_t field, const std::string& payload) {
  return varint((std::uint64_t{field} << 3) | 2) + varint(payload.size()) + payload;
}

/// A varint field (wire type 0).
inline std::string varint_field(std::uint32_t field, std::uint64_t value) {
  return varint(std::uint64_t{field} << 3) + varint(value);
}

/// StringStringEntryProto {key = 1, value = 2}; `value_first` writes field 2 before 1
/// (valid protobuf, which a byte-pattern scan missed: issue 17).
inline std::string entry(const std::string& key, const std::string& value, bool value_first = false) {
  return value_first ? bytes_field(2, value) + bytes_field(1, key) : bytes_field(1, key) + bytes_field(2, value);
}

/// TensorProto with its data in `location`: dims = 1, data_type = 2, name = 8,
/// external_data = 13, data_location = 14 (EXTERNAL = 1).
inline std::string external_tensor(const std::string& name, const std::string& location, bool value_first = false) {
  return varint_field(1, 4) + varint_field(2, 1) + bytes_field(8, name) +
         bytes_field(13, entry("offset", "0", value_first)) + bytes_field(13, entry("location", location, value_first)) +
         bytes_field(13, entry("length", "16", value_first)) + varint_field(14, 1);
}

/// GraphProto {node = 1, name = 2, initializer = 5, sparse_initializer = 15}.
inline std::string graph(const std::vector<std::string>& initializers, const std::vector<std::string>& nodes = {},
                         const std::vector<std::string>& sparse = {}) {
  std::string g = bytes_field(2, "g");
  for (const auto& n : nodes) g += bytes_field(1, n);
  for (const auto& t : initializers) g += bytes_field(5, t);
  for (const auto& s : sparse) g += bytes_field(15, s);
  return g;
}

/// NodeProto {op_type = 4, attribute = 5} with one attribute holding `payload` in field
/// `attribute_field` of AttributeProto (t = 5, g = 6, tensors = 10, graphs = 11,
/// sparse_tensor = 22) named "a" (name = 1).
inline std::string node_with_attribute(std::uint32_t attribute_field, const std::string& payload,
                                       const std::string& op = "If") {
  return bytes_field(4, op) + bytes_field(5, bytes_field(1, "a") + bytes_field(attribute_field, payload));
}

/// An EPContext NodeProto (op_type = 4, domain = 7, attribute = 5) as ORT's TensorRT EP
/// dumps it: embed_mode (AttributeProto i = 3) and ep_cache_context (s = 4); with
/// embed_mode=0 the context names an engine file beside the model. `attributes_first`
/// writes the attributes before op_type (valid protobuf, field order is free).
inline std::string ep_context_node(std::int64_t embed_mode, const std::string& cache_context,
                                   bool attributes_first = false) {
  const std::string attributes =
      bytes_field(5, bytes_field(1, "embed_mode") + varint_field(3, static_cast<std::uint64_t>(embed_mode))) +
      bytes_field(5, bytes_field(1, "ep_cache_context") + bytes_field(4, cache_context)) +
      bytes_field(5, bytes_field(1, "main_context") + varint_field(3, 1));
  const std::string head = bytes_field(4, "EPContext") + bytes_field(7, "com.microsoft");
  return attributes_first ? attributes + head : head + attributes;
}

/// SparseTensorProto {values = 1, indices = 2}.
inline std::string sparse_tensor(const std::string& values, const std::string& indices) {
  return bytes_field(1, values) + bytes_field(2, indices);
}

/// ModelProto {ir_version = 1, graph = 7, functions = 25 (FunctionProto {node = 7})}.
inline std::string model(const std::string& graph_bytes, const std::vector<std::string>& function_nodes = {}) {
  std::string m = varint_field(1, 9) + bytes_field(7, graph_bytes);
  if (!function_nodes.empty()) {
    std::string f = bytes_field(1, "f");
    for (const auto& n : function_nodes) f += bytes_field(7, n);
    m += bytes_field(25, f);
  }
  return m;
}

}  // namespace aitune::test::onnx_wire

namespace aitune::test::onnx_wire {

/// Rewrites every external_data "location" entry of a serialized model so that its
/// value comes before its key. The entry keeps its length, so every enclosing length
/// stays right: the result is the same model, written in another valid field order.
/// Returns how many entries were rewritten.
inline std::size_t put_location_values_first(std::string& model_bytes) {
  const std::string key = bytes_field(1, "location");
  std::size_t rewritten = 0;
  for (auto pos = model_bytes.find(key + '\x12'); pos != std::string::npos; pos = model_bytes.find(key + '\x12', pos + 1)) {
    std::size_t i = pos + key.size() + 1;
    std::uint64_t len = 0;
    int shift = 0;
    while (i < model_bytes.size()) {
      auto b = static_cast<unsigned char>(model_bytes[i++]);
      len |= std::uint64_t{b & 0x7fu} << shift;
      shift += 7;
      if (!(b & 0x80)) break;
    }
    const std::string value_field = model_bytes.substr(pos + key.size(), i - pos - key.size() + len);
    model_bytes.replace(pos, key.size() + value_field.size(), value_field + key);
    ++rewritten;
    pos += key.size() + value_field.size() - 1;
  }
  return rewritten;
}

/// A whole model: y = Identity(x), x and y float32 [2]; `output` names y. Opset 13.
/// `elem_type` is the ONNX element type of x and the output (1 FLOAT, 4 UINT16, 8 STRING ...).
inline std::string identity_model(const std::string& output, std::uint64_t elem_type = 1) {
  auto value_info = [elem_type](const std::string& name) {
    const std::string dim = bytes_field(1, varint_field(1, 2));        // TensorShapeProto.dim {dim_value: 2}
    const std::string tensor_type = varint_field(1, elem_type) + bytes_field(2, dim);  // elem_type, shape
    return bytes_field(1, name) + bytes_field(2, bytes_field(1, tensor_type));  // name, type {tensor_type}
  };
  const std::string node = bytes_field(1, "x") + bytes_field(2, output) + bytes_field(4, "Identity");
  const std::string g = bytes_field(1, node) + bytes_field(2, "g") + bytes_field(11, value_info("x")) +
                        bytes_field(12, value_info(output));
  const std::string opset = bytes_field(1, "") + varint_field(2, 13);
  return varint_field(1, 8) + bytes_field(7, g) + bytes_field(8, opset);
}

}  // namespace aitune::test::onnx_wire
