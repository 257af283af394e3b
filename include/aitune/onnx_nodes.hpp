// The nodes of an ONNX model with the module scope its exporter recorded, and a debug
// copy of a model whose intermediate values are graph outputs (for precision debugging).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace aitune {

/// One node of a model's main graph, in graph (topological) order.
struct OnnxNode {
  std::string name;
  std::string op_type;
  std::vector<std::string> inputs;  ///< value names read ("" for an omitted optional input)
  std::vector<std::string> outputs;
  /// The node's string attributes by name (e.g. ScatterND's "reduction"); others are not read.
  std::map<std::string, std::string> string_attributes;
  /// The module the node was exported from, as torch's dynamo exporter records it in the
  /// node's metadata_props: the innermost module path of `pkg.torch.onnx.name_scopes`
  /// (else of `namespace`), e.g. "model.layers.1.self_attn"; "" when the node has none
  /// (another exporter, or a node a graph transform added).
  std::string scope;
  /// Every enclosing module path, outermost first ("" for the root is left out).
  std::vector<std::string> scopes;
};

/// The main graph's nodes of an ONNX file, read from its protobuf wire format (no
/// protobuf dependency; external data is not read). Error(kIo) when the file cannot be
/// read, Error(kModelInvalid) when it is not a well-formed protobuf along the walked path.
std::vector<OnnxNode> onnx_graph_nodes(const std::string& model_path);

/// The element types (ONNX TensorProto.DataType: FLOAT = 1, FLOAT16 = 10, BFLOAT16 = 16)
/// the main graph declares for its values, by name: graph inputs and outputs, value_info
/// entries and initializers. A value with no declared type is absent.
std::map<std::string, int> onnx_value_element_types(const std::string& model_path);

/// The graph output names of an ONNX file.
std::vector<std::string> onnx_graph_outputs(const std::string& model_path);

/// Writes `target`: `model_path` with `values` (node output names) added as graph
/// outputs after its own, the way Polygraphy marks every tensor an output. The copy is
/// the original bytes followed by a second `graph` field holding only the new outputs,
/// which protobuf parsers merge into the first (so the original graph is never re-encoded).
/// Names already graph outputs are skipped. `target` must sit in the model's directory
/// when the model has external data (its references are relative). Returns the names
/// added, in order. Error(kIo) when `target` cannot be written.
std::vector<std::string> write_model_with_outputs(const std::string& model_path, const std::vector<std::string>& values,
                                                  const std::string& target);

}  // namespace aitune
