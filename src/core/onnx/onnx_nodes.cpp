// Reads an ONNX model's nodes (with their exporter's module scopes) from the protobuf wire
// format, and writes debug copies with intermediate values as graph outputs.
#include "aitune/onnx_nodes.hpp"

#include <fstream>
#include <set>

#include "aitune/error.hpp"
#include "onnx/onnx_wire_reader.hpp"

namespace aitune {
namespace {

// Field numbers of onnx.proto3: ModelProto.graph = 7; GraphProto.node = 1, .output = 12;
// NodeProto.input = 1, .output = 2, .name = 3, .op_type = 4, .attribute = 5, .metadata_props = 9;
// AttributeProto.name = 1, .s = 4; StringStringEntryProto.key = 1, .value = 2; ValueInfoProto.name = 1.
// GraphProto.initializer = 5, .input = 11, .value_info = 13; TensorProto.data_type = 2, .name = 8;
// ValueInfoProto.type = 2; TypeProto.tensor_type = 1; TypeProto.Tensor.elem_type = 1.
constexpr std::uint64_t kModelGraph = 7, kGraphNode = 1, kGraphOutput = 12;
constexpr std::uint64_t kGraphInitializer = 5, kGraphInput = 11, kGraphValueInfo = 13;
constexpr std::uint64_t kNodeInput = 1, kNodeOutput = 2, kNodeName = 3, kNodeOpType = 4, kNodeAttribute = 5,
                        kNodeMetadata = 9;
constexpr std::uint64_t kAttributeName = 1, kAttributeString = 4;

// The module paths of torch's `pkg.torch.onnx.name_scopes` (a Python list literal,
// "['', 'inner', 'inner.layers.0', 'layer_norm']"): every quoted item but the last, which
// names the FX node itself; the root's "" is left out.
std::vector<std::string> scopes_of_name_scopes(const std::string& text) {
  std::vector<std::string> items;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char quote = text[i];
    if (quote != '\'' && quote != '"') continue;
    const auto end = text.find(quote, i + 1);
    if (end == std::string::npos) break;
    items.push_back(text.substr(i + 1, end - i - 1));
    i = end;
  }
  if (!items.empty()) items.pop_back();
  std::erase(items, std::string());
  return items;
}

// The module paths of the exporter's `namespace` entry (": __main__.M/inner: __main__.D/
// inner.layers.0: __main__.L/layer_norm: aten.layer_norm.default"): the part before ": "
// of every '/'-separated item but the last.
std::vector<std::string> scopes_of_namespace(const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  for (;;) {
    const auto slash = text.find('/', start);
    if (slash == std::string::npos) break;  // the last item is the node itself
    const std::string item = text.substr(start, slash - start);
    const std::string path = item.substr(0, item.find(": "));
    if (!path.empty()) items.push_back(path);
    start = slash + 1;
  }
  return items;
}

class NodeWalker : detail::ProtobufReader {
 public:
  using ProtobufReader::ProtobufReader;

  void run() {
    for (std::size_t i = 0, end = bytes_.size(); i < end;) {
      const auto [field, wire] = tag(i, end);
      if (field == kModelGraph && wire == 2) {
        const std::size_t n = length(i, end);
        graph(i, i + n);
        i += n;
      } else {
        skip(i, end, wire, static_cast<std::uint32_t>(field), 0);
      }
    }
  }

  std::vector<OnnxNode> nodes;
  std::vector<std::string> outputs;
  std::map<std::string, int> element_types;

 private:
  std::pair<std::uint64_t, std::uint32_t> tag(std::size_t& i, std::size_t end) const {
    const std::uint64_t t = varint(i, end);
    if ((t >> 3) == 0) malformed(i, "invalid field number 0");
    return {t >> 3, static_cast<std::uint32_t>(t & 7)};
  }

  std::string string_at(std::size_t& i, std::size_t end) const {
    const std::size_t n = length(i, end);
    std::string s(bytes_.substr(i, n));
    i += n;
    return s;
  }

  void graph(std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end;) {
      const auto [field, wire] = tag(i, end);
      if (wire == 2 && field == kGraphNode) {
        const std::size_t n = length(i, end);
        node(i, i + n);
        i += n;
      } else if (wire == 2 && field == kGraphOutput) {
        const std::size_t n = length(i, end);
        outputs.push_back(first_string(i, i + n, 1));
        value_info(i, i + n);
        i += n;
      } else if (wire == 2 && (field == kGraphInput || field == kGraphValueInfo)) {
        const std::size_t n = length(i, end);
        value_info(i, i + n);
        i += n;
      } else if (wire == 2 && field == kGraphInitializer) {
        const std::size_t n = length(i, end);
        initializer(i, i + n);
        i += n;
      } else {
        skip(i, end, wire, static_cast<std::uint32_t>(field), 1);
      }
    }
  }

  // The varint of field `wanted` in the message [begin, end) (0 when absent).
  std::uint64_t first_varint(std::size_t begin, std::size_t end, std::uint64_t wanted, std::size_t depth) const {
    std::uint64_t value = 0;
    for (std::size_t i = begin; i < end;) {
      const auto [field, wire] = tag(i, end);
      if (wire == 0 && field == wanted)
        value = varint(i, end);
      else
        skip(i, end, wire, static_cast<std::uint32_t>(field), depth);
    }
    return value;
  }

  // The [begin, end) of the embedded message of field `wanted` in [begin, end) ({0, 0} when absent).
  std::pair<std::size_t, std::size_t> first_message(std::size_t begin, std::size_t end, std::uint64_t wanted,
                                                    std::size_t depth) const {
    std::pair<std::size_t, std::size_t> found{0, 0};
    for (std::size_t i = begin; i < end;) {
      const auto [field, wire] = tag(i, end);
      if (wire == 2 && field == wanted) {
        const std::size_t n = length(i, end);
        found = {i, i + n};
        i += n;
      } else {
        skip(i, end, wire, static_cast<std::uint32_t>(field), depth);
      }
    }
    return found;
  }

  // A ValueInfoProto's name and tensor element type into `element_types` (none for a
  // value without a tensor type).
  void value_info(std::size_t begin, std::size_t end) {
    const std::string name = first_string(begin, end, 1);
    const auto type = first_message(begin, end, 2, 2);
    if (name.empty() || type.first == type.second) return;
    const auto tensor = first_message(type.first, type.second, 1, 3);
    if (tensor.first == tensor.second) return;
    if (const auto elem = first_varint(tensor.first, tensor.second, 1, 4); elem != 0)
      element_types[name] = static_cast<int>(elem);
  }

  // An initializer's (TensorProto) name and data type into `element_types`.
  void initializer(std::size_t begin, std::size_t end) {
    const std::string name = first_string(begin, end, 8);
    if (const auto elem = first_varint(begin, end, 2, 2); !name.empty() && elem != 0)
      element_types[name] = static_cast<int>(elem);
  }

  // The string of field `wanted` in the message [begin, end) ("" when absent).
  std::string first_string(std::size_t begin, std::size_t end, std::uint64_t wanted) const {
    std::string value;
    for (std::size_t i = begin; i < end;) {
      const auto [field, wire] = tag(i, end);
      if (wire == 2 && field == wanted)
        value = string_at(i, end);
      else
        skip(i, end, wire, static_cast<std::uint32_t>(field), 2);
    }
    return value;
  }

  // A string attribute (AttributeProto.s) into `n.string_attributes`; others are skipped.
  void attribute(std::size_t begin, std::size_t end, OnnxNode& n) const {
    std::string name, value;
    bool has_string = false;
    for (std::size_t i = begin; i < end;) {
      const auto [field, wire] = tag(i, end);
      if (wire == 2 && field == kAttributeName) {
        name = string_at(i, end);
      } else if (wire == 2 && field == kAttributeString) {
        value = string_at(i, end);
        has_string = true;
      } else {
        skip(i, end, wire, static_cast<std::uint32_t>(field), 3);
      }
    }
    if (has_string && !name.empty()) n.string_attributes[name] = value;
  }

  void node(std::size_t begin, std::size_t end) {
    OnnxNode n;
    std::string name_scopes, name_space;
    for (std::size_t i = begin; i < end;) {
      const auto [field, wire] = tag(i, end);
      if (wire != 2) {
        skip(i, end, wire, static_cast<std::uint32_t>(field), 2);
      } else if (field == kNodeInput) {
        n.inputs.push_back(string_at(i, end));
      } else if (field == kNodeOutput) {
        n.outputs.push_back(string_at(i, end));
      } else if (field == kNodeName) {
        n.name = string_at(i, end);
      } else if (field == kNodeOpType) {
        n.op_type = string_at(i, end);
      } else if (field == kNodeAttribute) {
        const std::size_t len = length(i, end);
        attribute(i, i + len, n);
        i += len;
      } else if (field == kNodeMetadata) {
        const std::size_t len = length(i, end);
        const std::string key = first_string(i, i + len, 1);
        if (key == "pkg.torch.onnx.name_scopes") name_scopes = first_string(i, i + len, 2);
        if (key == "namespace") name_space = first_string(i, i + len, 2);
        i += len;
      } else {
        skip(i, end, wire, static_cast<std::uint32_t>(field), 2);
      }
    }
    n.scopes = !name_scopes.empty() ? scopes_of_name_scopes(name_scopes) : scopes_of_namespace(name_space);
    if (!n.scopes.empty()) n.scope = n.scopes.back();
    nodes.push_back(std::move(n));
  }
};

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// A length-delimited field: tag, length, payload.
std::string field_bytes(std::uint64_t field, const std::string& payload) {
  std::string out;
  put_varint(out, (field << 3) | 2);
  put_varint(out, payload.size());
  return out + payload;
}

}  // namespace

std::vector<OnnxNode> onnx_graph_nodes(const std::string& model_path) {
  const detail::MappedModel model(model_path);
  NodeWalker walker(model.bytes(), model_path);
  walker.run();
  return std::move(walker.nodes);
}

std::map<std::string, int> onnx_value_element_types(const std::string& model_path) {
  const detail::MappedModel model(model_path);
  NodeWalker walker(model.bytes(), model_path);
  walker.run();
  return std::move(walker.element_types);
}

std::vector<std::string> onnx_graph_outputs(const std::string& model_path) {
  const detail::MappedModel model(model_path);
  NodeWalker walker(model.bytes(), model_path);
  walker.run();
  return std::move(walker.outputs);
}

std::vector<std::string> write_model_with_outputs(const std::string& model_path, const std::vector<std::string>& values,
                                                  const std::string& target) {
  const detail::MappedModel model(model_path);
  NodeWalker walker(model.bytes(), model_path);
  walker.run();
  std::set<std::string> taken(walker.outputs.begin(), walker.outputs.end());
  std::vector<std::string> added;
  std::string graph;
  for (const auto& v : values) {
    if (v.empty() || !taken.insert(v).second) continue;
    graph += field_bytes(kGraphOutput, field_bytes(1, v));  // ValueInfoProto{name}; ORT infers the type
    added.push_back(v);
  }
  std::ofstream out(target, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorCode::kIo, "cannot write the debug model '" + target + "'");
  out.write(model.bytes().data(), static_cast<std::streamsize>(model.bytes().size()));
  const std::string extra = field_bytes(kModelGraph, graph);
  out.write(extra.data(), static_cast<std::streamsize>(extra.size()));
  out.close();
  if (!out) throw Error(ErrorCode::kIo, "cannot write the debug model '" + target + "'");
  return added;
}

}  // namespace aitune
