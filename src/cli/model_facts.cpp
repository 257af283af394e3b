// Reads the operators and the precision of an ONNX model for `aitune tune`'s candidate plan.
#include "model_facts.hpp"

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string_view>

#include "aitune/error.hpp"

namespace aitune::cli {
namespace {

// ONNX messages the walk descends into (field numbers of onnx.proto3): ModelProto.graph = 7,
// .functions = 25; GraphProto.node = 1; FunctionProto.node = 7; NodeProto.op_type = 4,
// .attribute = 5; AttributeProto.g = 6, .graphs = 11.
enum class Message { kModel, kGraph, kFunction, kNode, kAttribute };
constexpr std::size_t kMaxDepth = 100;  // as protobuf's default recursion limit

class OperatorWalker {
 public:
  OperatorWalker(std::string_view bytes, const std::string& what) : bytes_(bytes), what_(what) {}

  std::set<std::string> run() {
    walk(0, bytes_.size(), Message::kModel, 0);
    return std::move(ops_);
  }

 private:
  [[noreturn]] void malformed(std::size_t at, const std::string& why) const {
    throw Error(ErrorCode::kModelInvalid,
                "ONNX model '" + what_ + "' is not a well-formed protobuf: " + why + " at byte " + std::to_string(at));
  }

  std::uint64_t varint(std::size_t& i, std::size_t end) const {
    std::uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i >= end) malformed(i, "truncated varint");
      auto b = static_cast<unsigned char>(bytes_[i++]);
      value |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return value;
    }
    malformed(i, "varint longer than 10 bytes");
  }

  void advance(std::size_t& i, std::size_t end, std::uint64_t n) const {
    if (n > end - i) malformed(i, "field runs past the end of its message");
    i += static_cast<std::size_t>(n);
  }

  static bool child_of(Message m, std::uint64_t field, Message& child) {
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

  void walk(std::size_t begin, std::size_t end, Message type, std::size_t depth) {
    if (depth > kMaxDepth) malformed(begin, "messages nested deeper than " + std::to_string(kMaxDepth));
    for (std::size_t i = begin; i < end;) {
      const std::uint64_t tag = varint(i, end);
      const auto wire_type = tag & 7;
      const std::uint64_t field = tag >> 3;
      if (field == 0) malformed(i, "invalid field number 0");
      Message child{};
      switch (wire_type) {
        case 0: varint(i, end); break;
        case 1: advance(i, end, 8); break;
        case 5: advance(i, end, 4); break;
        case 2: {
          const std::uint64_t n = varint(i, end);
          const std::size_t start = i;
          advance(i, end, n);
          if (type == Message::kNode && field == 4)
            ops_.emplace(bytes_.substr(start, i - start));
          else if (child_of(type, field, child))
            walk(start, i, child, depth + 1);
          break;
        }
        default: malformed(i, "unsupported wire type " + std::to_string(wire_type));
      }
    }
  }

  std::string_view bytes_;
  const std::string& what_;
  std::set<std::string> ops_;
};

}  // namespace

std::set<std::string> onnx_operator_types(const std::string& model_path) {
  std::ifstream in(model_path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kIo, "cannot open ONNX model '" + model_path + "'");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(ErrorCode::kIo, "cannot read ONNX model '" + model_path + "'");
  return OperatorWalker(bytes, model_path).run();
}

bool has_convolutions(const std::set<std::string>& operators) {
  for (const char* op : {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv"})
    if (operators.contains(op)) return true;
  return false;
}

Precision model_precision(const std::vector<IoInfo>& inputs, const std::vector<IoInfo>& outputs) {
  std::set<DType> floating;
  for (const auto* ios : {&inputs, &outputs})
    for (const auto& io : *ios)
      if (io.dtype == DType::kFloat16 || io.dtype == DType::kBFloat16 || io.dtype == DType::kFloat32 ||
          io.dtype == DType::kFloat64)
        floating.insert(io.dtype);
  if (floating == std::set<DType>{DType::kFloat16}) return Precision::kFP16;
  if (floating == std::set<DType>{DType::kBFloat16}) return Precision::kBF16;
  return Precision::kStrict;
}

}  // namespace aitune::cli
