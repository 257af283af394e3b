// find_in_place_outputs: a graph's outputs that are a ScatterND of an input nothing else reads, or a
// GroupQueryAttention's present key / value over a past input nothing else reads.
#include "aitune/in_place_outputs.hpp"

#include <algorithm>
#include <set>

#include "aitune/error.hpp"

namespace aitune {
namespace {

const IoInfo* find_io(const std::vector<IoInfo>& list, const std::string& name) {
  auto it = std::find_if(list.begin(), list.end(), [&](const IoInfo& io) { return io.name == name; });
  return it == list.end() ? nullptr : &*it;
}

// Ops that read only a tensor's shape: they may read an input that is updated in place.
bool reads_only_shape(const OnnxNode& node) { return node.op_type == "Shape" || node.op_type == "Size"; }

}  // namespace

std::map<std::string, std::string> find_in_place_outputs(const std::vector<OnnxNode>& nodes,
                                                         const std::vector<IoInfo>& inputs,
                                                         const std::vector<IoInfo>& outputs) {
  std::map<std::string, const OnnxNode*> producer;
  std::map<std::string, std::vector<const OnnxNode*>> readers;
  for (const auto& node : nodes) {
    for (const auto& out : node.outputs) producer[out] = &node;
    for (const auto& in : node.inputs)
      if (!in.empty()) readers[in].push_back(&node);
  }
  std::map<std::string, std::string> aliases;
  std::set<std::string> taken;
  for (const auto& out : outputs) {
    auto made = producer.find(out.name);
    if (made == producer.end()) continue;
    const OnnxNode& writer = *made->second;
    std::string data;  // the input the output is that input updated
    if (writer.op_type == "ScatterND" && writer.inputs.size() == 3) {
      auto reduction = writer.string_attributes.find("reduction");
      if (reduction != writer.string_attributes.end() && reduction->second != "none") continue;
      data = writer.inputs[0];
    } else if (writer.op_type == "GroupQueryAttention") {
      // present_key / present_value (outputs 1, 2) over past_key / past_value (inputs 3, 4):
      // bound to one buffer, GQA writes only this step's slots (ORT's past/present sharing)
      const auto slot = std::find(writer.outputs.begin(), writer.outputs.end(), out.name) - writer.outputs.begin();
      if ((slot != 1 && slot != 2) || writer.inputs.size() <= static_cast<std::size_t>(slot + 2)) continue;
      data = writer.inputs[static_cast<std::size_t>(slot + 2)];
    } else {
      continue;
    }
    const IoInfo* in = find_io(inputs, data);
    if (data.empty() || in == nullptr || in->dtype != out.dtype || in->shape.size() != out.shape.size()) continue;
    if (find_io(outputs, data) != nullptr || taken.count(data)) continue;
    const auto uses = std::count(writer.inputs.begin(), writer.inputs.end(), data);
    if (uses != 1) continue;  // read by the writer twice: as what it writes and as something else
    const auto& data_readers = readers[data];
    const bool only_writer = std::all_of(data_readers.begin(), data_readers.end(), [&](const OnnxNode* reader) {
      return reader == &writer || reads_only_shape(*reader);
    });
    if (!only_writer) continue;
    aliases[out.name] = data;
    taken.insert(data);
  }
  return aliases;
}

std::vector<int> output_alias_indices(const std::map<std::string, std::string>& aliases,
                                      const std::vector<IoInfo>& inputs, const std::vector<IoInfo>& outputs,
                                      const std::string& model_path) {
  std::vector<int> indices(outputs.size(), -1);
  std::set<std::string> taken;
  for (const auto& [output, input] : aliases) {
    auto who = [&] { return "model '" + model_path + "': output alias '" + output + "' -> '" + input + "'"; };
    auto out = std::find_if(outputs.begin(), outputs.end(), [&](const IoInfo& io) { return io.name == output; });
    auto in = std::find_if(inputs.begin(), inputs.end(), [&](const IoInfo& io) { return io.name == input; });
    if (out == outputs.end()) throw Error(ErrorCode::kInvalidArgument, who() + ": the model has no output '" + output + "'");
    if (in == inputs.end()) throw Error(ErrorCode::kInvalidArgument, who() + ": the model has no input '" + input + "'");
    if (in->dtype != out->dtype || in->shape.size() != out->shape.size())
      throw Error(ErrorCode::kInvalidArgument, who() + ": the input is " + std::string(dtype_name(in->dtype)) + " " +
                                                   shape_to_string(in->shape) + ", the output " +
                                                   std::string(dtype_name(out->dtype)) + " " +
                                                   shape_to_string(out->shape));
    for (std::size_t d = 0; d < in->shape.size(); ++d)
      if (in->shape[d] >= 0 && out->shape[d] >= 0 && in->shape[d] != out->shape[d])
        throw Error(ErrorCode::kInvalidArgument, who() + ": the input is " + shape_to_string(in->shape) +
                                                     ", the output " + shape_to_string(out->shape));
    if (!taken.insert(input).second)
      throw Error(ErrorCode::kInvalidArgument, who() + ": another output is written into '" + input + "' already");
    indices[out - outputs.begin()] = static_cast<int>(in - inputs.begin());
  }
  return indices;
}

}  // namespace aitune
