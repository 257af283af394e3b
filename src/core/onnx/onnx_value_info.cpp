// Reads the declared types of an ONNX model's graph inputs and outputs from its protobuf
// wire format (ModelProto.graph = 7; GraphProto.input = 11, .output = 12; ValueInfoProto
// .name = 1, .type = 2; TypeProto.tensor_type = 1; TypeProto.Tensor.shape = 2).
#include "aitune/onnx_value_info.hpp"

#include <cstdint>
#include <optional>
#include <string_view>

#include "onnx/onnx_wire_reader.hpp"

namespace aitune {
namespace {

class ValueInfoWalker : detail::ProtobufReader {
 public:
  using ProtobufReader::ProtobufReader;

  std::set<std::string> run() {
    for_each_field(0, bytes_.size(), [&](std::uint64_t field, std::size_t begin, std::size_t end) {
      if (field == 7) graph(begin, end);
    });
    return std::move(without_rank_);
  }

 private:
  // Calls `visit(field, begin, end)` for each length-delimited field of the message in
  // [begin, end) and skips the others.
  template <typename Visit>
  void for_each_field(std::size_t begin, std::size_t end, Visit&& visit) const {
    for (std::size_t i = begin; i < end;) {
      const std::uint64_t tag = varint(i, end);
      const auto wire_type = static_cast<std::uint32_t>(tag & 7);
      const std::uint64_t field = tag >> 3;
      if (field == 0) malformed(i, "invalid field number 0");
      if (wire_type == 2) {
        const std::size_t n = length(i, end);
        visit(field, i, i + n);
        i += n;
      } else {
        skip(i, end, wire_type, static_cast<std::uint32_t>(field), 1);
      }
    }
  }

  void graph(std::size_t begin, std::size_t end) {
    for_each_field(begin, end, [&](std::uint64_t field, std::size_t b, std::size_t e) {
      if (field == 11 || field == 12) value_info(b, e);
    });
  }

  void value_info(std::size_t begin, std::size_t end) {
    std::string_view name;
    bool tensor = false, shape = false;
    for_each_field(begin, end, [&](std::uint64_t field, std::size_t b, std::size_t e) {
      if (field == 1) name = bytes_.substr(b, e - b);
      if (field != 2) return;
      for_each_field(b, e, [&](std::uint64_t type_field, std::size_t tb, std::size_t te) {
        if (type_field != 1) return;  // a sequence, map or optional: not a tensor
        tensor = true;
        for_each_field(tb, te, [&](std::uint64_t tensor_field, std::size_t, std::size_t) {
          if (tensor_field == 2) shape = true;
        });
      });
    });
    if (tensor && !shape) without_rank_.emplace(name);
  }

  std::set<std::string> without_rank_;
};

}  // namespace

std::set<std::string> onnx_values_without_rank_in(std::string_view model_bytes, const std::string& what) {
  return ValueInfoWalker(model_bytes, what).run();
}

std::set<std::string> onnx_values_without_rank(const std::string& model_path) {
  const detail::MappedModel model(model_path);
  return onnx_values_without_rank_in(model.bytes(), model_path);
}

}  // namespace aitune
