// Finds the files an ONNX model references (external data, EPContext engine files) by walking its protobuf wire format.
#include "aitune/onnx_external_data.hpp"

#include <cstdint>
#include <set>
#include <vector>

#include "aitune/error.hpp"
#include "onnx/onnx_wire_reader.hpp"

namespace aitune {
namespace {

// Which ONNX messages the walk descends into. Field numbers are those of onnx.proto3
// (onnx 1.x); only fields that can (transitively) hold a TensorProto are followed.
enum class Message { kModel, kGraph, kNode, kAttribute, kTensor, kSparseTensor, kFunction, kTrainingInfo, kEntry };

// The message type of field `field` of a message of type `m` when that field is an
// embedded message the walk follows; false otherwise.
bool child_of(Message m, std::uint32_t field, Message& child) {
  switch (m) {
    case Message::kModel:  // graph = 7, training_info = 20, functions = 25
      if (field == 7) return child = Message::kGraph, true;
      if (field == 20) return child = Message::kTrainingInfo, true;
      if (field == 25) return child = Message::kFunction, true;
      return false;
    case Message::kTrainingInfo:  // initialization = 1, algorithm = 2
      if (field == 1 || field == 2) return child = Message::kGraph, true;
      return false;
    case Message::kGraph:  // node = 1, initializer = 5, sparse_initializer = 15
      if (field == 1) return child = Message::kNode, true;
      if (field == 5) return child = Message::kTensor, true;
      if (field == 15) return child = Message::kSparseTensor, true;
      return false;
    case Message::kFunction:  // node = 7, attribute_proto = 11
      if (field == 7) return child = Message::kNode, true;
      if (field == 11) return child = Message::kAttribute, true;
      return false;
    case Message::kNode:  // attribute = 5
      if (field == 5) return child = Message::kAttribute, true;
      return false;
    case Message::kAttribute:  // t = 5, g = 6, tensors = 10, graphs = 11, sparse_tensor = 22, sparse_tensors = 23
      if (field == 5 || field == 10) return child = Message::kTensor, true;
      if (field == 6 || field == 11) return child = Message::kGraph, true;
      if (field == 22 || field == 23) return child = Message::kSparseTensor, true;
      return false;
    case Message::kSparseTensor:  // values = 1, indices = 2
      if (field == 1 || field == 2) return child = Message::kTensor, true;
      return false;
    case Message::kTensor:  // external_data = 13 (StringStringEntryProto)
      if (field == 13) return child = Message::kEntry, true;
      return false;
    case Message::kEntry: return false;
  }
  return false;
}

class Walker : detail::ProtobufReader {
 public:
  using ProtobufReader::ProtobufReader;

  std::set<std::string> run() {
    walk(0, bytes_.size(), Message::kModel, 0);
    return std::move(locations_);
  }

 private:
  // What an EPContext node says about its engine: attributes embed_mode (int, default 1)
  // and ep_cache_context (the engine's bytes, or with embed_mode=0 a file's path).
  struct NodeFacts {
    std::string_view op_type;
    std::int64_t embed_mode = 1;
    std::string_view cache_context;
    bool has_cache_context = false;
  };

  void add_location(std::size_t at, std::string_view location, const char* what) {
    if (location.size() > kOnnxMaxLocationBytes)
      malformed(at, std::string("an ") + what + " of " + std::to_string(location.size()) + " bytes (limit " +
                        std::to_string(kOnnxMaxLocationBytes) + ")");
    locations_.emplace(location);
  }

  void walk(std::size_t begin, std::size_t end, Message type, std::size_t depth) {
    if (depth > kOnnxMaxMessageDepth)
      malformed(begin, "messages nested deeper than " + std::to_string(kOnnxMaxMessageDepth));
    std::string_view key, value;  // of a StringStringEntryProto or an AttributeProto (name, s); the last wins, as in protobuf
    bool has_value = false;
    std::int64_t int_value = 0;  // an AttributeProto's i
    bool has_int = false;
    if (type == Message::kNode) nodes_.emplace_back();
    for (std::size_t i = begin; i < end;) {
      const std::uint64_t tag = varint(i, end);
      const auto wire_type = static_cast<std::uint32_t>(tag & 7);
      const std::uint64_t field = tag >> 3;
      if (field == 0 || field > 0x1fffffff) malformed(i, "invalid field number " + std::to_string(field));
      if (wire_type == 4) malformed(i, "end of a group that was not started");
      Message child{};
      // StringStringEntryProto: key = 1, value = 2. AttributeProto: name = 1, s = 4, i = 3.
      // NodeProto: op_type = 4.
      const bool entry_string = type == Message::kEntry && (field == 1 || field == 2);
      const bool attribute_string = type == Message::kAttribute && (field == 1 || field == 4);
      if (wire_type == 2 && (entry_string || attribute_string || (type == Message::kNode && field == 4))) {
        const std::size_t n = length(i, end);
        const std::string_view text = bytes_.substr(i, n);
        if (type == Message::kNode) nodes_.back().op_type = text;
        else if (field == 1) key = text;
        else value = text, has_value = true;
        i += n;
      } else if (wire_type == 0 && type == Message::kAttribute && field == 3) {
        int_value = static_cast<std::int64_t>(varint(i, end));
        has_int = true;
      } else if (wire_type == 2 && child_of(type, static_cast<std::uint32_t>(field), child)) {
        const std::size_t n = length(i, end);
        walk(i, i + n, child, depth + 1);
        i += n;
      } else {
        skip(i, end, wire_type, static_cast<std::uint32_t>(field), depth);
      }
    }
    if (type == Message::kEntry && key == "location") {
      if (!has_value) malformed(begin, "an external_data \"location\" entry without a value");
      add_location(begin, value, "external data location");
    }
    // A node's attributes (not a function's attribute defaults, which have no node).
    if (type == Message::kAttribute && !nodes_.empty()) {
      NodeFacts& node = nodes_.back();
      if (key == "embed_mode" && has_int) node.embed_mode = int_value;
      if (key == "ep_cache_context" && has_value) node.cache_context = value, node.has_cache_context = true;
    }
    if (type == Message::kNode) {
      const NodeFacts node = nodes_.back();
      nodes_.pop_back();
      // An EPContext node with embed_mode=0 loads its engine from a file beside the model
      // (ORT resolves ep_cache_context against the model's directory): a file the model
      // pulls in, like external data.
      if (node.op_type == "EPContext" && node.embed_mode == 0) {
        if (!node.has_cache_context || node.cache_context.empty())
          malformed(begin, "an EPContext node with embed_mode=0 and no ep_cache_context file");
        add_location(begin, node.cache_context, "EPContext engine file path");
      }
    }
  }

  std::set<std::string> locations_;
  std::vector<NodeFacts> nodes_;  // the nodes being walked, innermost last
};

}  // namespace

std::vector<std::string> onnx_external_data_locations_in(std::string_view model_bytes, const std::string& what) {
  auto files = Walker(model_bytes, what).run();
  return {files.begin(), files.end()};
}

std::vector<std::string> onnx_external_data_locations(const std::string& model_path) {
  const detail::MappedModel model(model_path);
  return onnx_external_data_locations_in(model.bytes(), model_path);
}

bool is_safe_relative_path(const std::string& path) noexcept {
  if (path.empty() || path.front() == '/') return false;
  if (path.find('\\') != std::string::npos || path.find('\0') != std::string::npos) return false;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string_view part(path.data() + start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace aitune
