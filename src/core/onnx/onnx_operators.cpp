// Collects the operator types of an ONNX model by walking its protobuf wire format.
#include "aitune/onnx_operators.hpp"

#include <cstdint>

#include "onnx/onnx_wire_reader.hpp"

namespace aitune {
namespace {

// ONNX messages the walk descends into (field numbers of onnx.proto3): ModelProto.graph = 7,
// .functions = 25; GraphProto.node = 1; FunctionProto.node = 7; NodeProto.op_type = 4,
// .attribute = 5; AttributeProto.g = 6, .graphs = 11.
enum class Message { kModel, kGraph, kFunction, kNode, kAttribute };

bool child_of(Message m, std::uint64_t field, Message& child) {
  switch (m) {
    case Message::kModel:
      if (field == 7) return child = Message::kGraph, true;
      if (field == 25) return child = Message::kFunction, true;
      return false;
    case Message::kGraph:
      if (field == 1) return child = Message::kNode, true;
      return false;
    case Message::kFunction:
      if (field == 7) return child = Message::kNode, true;
      return false;
    case Message::kNode:
      if (field == 5) return child = Message::kAttribute, true;
      return false;
    case Message::kAttribute:
      if (field == 6 || field == 11) return child = Message::kGraph, true;
      return false;
  }
  return false;
}

class OperatorWalker : detail::ProtobufReader {
 public:
  using ProtobufReader::ProtobufReader;

  std::set<std::string> run() {
    walk(0, bytes_.size(), Message::kModel, 0);
    return std::move(ops_);
  }

 private:
  void walk(std::size_t begin, std::size_t end, Message type, std::size_t depth) {
    if (depth > kOnnxMaxMessageDepth)
      malformed(begin, "messages nested deeper than " + std::to_string(kOnnxMaxMessageDepth));
    for (std::size_t i = begin; i < end;) {
      const std::uint64_t tag = varint(i, end);
      const auto wire_type = static_cast<std::uint32_t>(tag & 7);
      const std::uint64_t field = tag >> 3;
      if (field == 0) malformed(i, "invalid field number 0");
      if (wire_type == 3 || wire_type == 4) malformed(i, "unsupported wire type " + std::to_string(wire_type));
      Message child{};
      if (wire_type == 2 && ((type == Message::kNode && field == 4) || child_of(type, field, child))) {
        const std::size_t n = length(i, end);
        if (type == Message::kNode && field == 4)
          ops_.emplace(bytes_.substr(i, n));
        else
          walk(i, i + n, child, depth + 1);
        i += n;
      } else {
        skip(i, end, wire_type, static_cast<std::uint32_t>(field), depth);
      }
    }
  }

  std::set<std::string> ops_;
};

}  // namespace

std::set<std::string> onnx_operator_types(const std::string& model_path) {
  const detail::MappedModel model(model_path);
  return OperatorWalker(model.bytes(), model_path).run();
}

}  // namespace aitune
