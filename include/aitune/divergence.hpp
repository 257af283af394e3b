// Where a candidate first diverges: intermediate values of its ONNX graph compared, in
// execution order, with a reference (eager PyTorch's module outputs, or the fp32 CPU run
// of the same graph), named by the module scope the exporter recorded.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "aitune/correctness.hpp"
#include "aitune/onnx_session.hpp"
#include "aitune/tensor.hpp"

namespace aitune {

/// A reference value for one intermediate of the graph: what `module` (the user's module
/// path) produced in eager PyTorch, to compare with the ONNX value `value`.
struct ModuleOutput {
  std::string module;
  std::string value;
  TensorView expected;  ///< host memory, contiguous
  /// The module's scope as the exporter records it in node metadata ("inner.model.layers.1";
  /// "" for the root module): how a scope is named as the user's module path.
  std::string scope = {};
  /// The module's input (the value its first node reads from outside it), not its output:
  /// a wrong input clears the module itself, an input within tolerance clears its producers.
  bool input = false;
};

/// A node between the last values within tolerance and the first beyond it.
struct SuspectNode {
  std::string name;
  std::string op_type;
  std::string scope;  ///< its innermost module scope as exported ("" when it has none)
};

/// The first intermediate value beyond tolerance.
struct DivergencePoint {
  std::string module;   ///< the module path (the node's scope when compared node by node); "" when unknown
  bool input = false;   ///< the value is `module`'s input, not its output
  std::string node;     ///< the ONNX node producing `value` ("" when not found in the graph)
  std::string op_type;
  std::string value;    ///< the ONNX value name
  OutputCheck check;    ///< the comparison that failed
  /// Where it first diverges: the deepest module containing every scoped node that feeds
  /// `value` without feeding any value found within tolerance (`suspects`), named as the
  /// user's module path; a fault in a module's own code between its children (a wrong
  /// Softmax in self_attn) is named as that module, not as the child whose output first
  /// shows it. Equal to `module` when nothing narrower is known.
  std::string location;
  std::vector<SuspectNode> suspects;  ///< in graph order
};

/// The result of tracing one candidate's divergence.
struct DivergenceReport {
  std::string reference;  ///< what the values were compared with, in words
  std::size_t compared = 0;  ///< values compared before the first divergence (or in all)
  std::size_t skipped = 0;   ///< values not compared: not floating point, or absent from the candidate's graph
  std::optional<DivergencePoint> first;  ///< nullopt: every compared value is within tolerance

  /// One sentence: "first diverges in model.layers.1.self_attn (3 nodes after the last
  /// values within tolerance: MatMul, LogSoftmax, MatMul; first module output beyond
  /// tolerance: model.layers.1.self_attn.o_proj, node node_add_3 (Add), value add_3):
  /// 12 of 40 elements beyond ..." or why nothing was found.
  std::string describe() const;
  std::string to_json(int indent = 2) const;
};

/// Runs `model_path` under `config` with every `expected[i].value` made a graph output (a
/// debug copy written next to the model and removed afterwards) on `inputs` (by input
/// name) and compares each value, in the order given (the order the modules finished in
/// eager PyTorch), with its expected tensor under the tolerance `precision` gives float32
/// outputs (`default_tolerance`); the first beyond it is the divergence point. Values of
/// either side are compared in float32 (an fp16 graph's intermediates are fp16).
DivergenceReport trace_divergence(const std::string& model_path, const OnnxSessionConfig& config,
                                  const std::map<std::string, TensorView>& inputs,
                                  const std::vector<ModuleOutput>& expected, Precision precision);

/// Precision debugging of an ONNX model alone (`aitune debug-precision`): every node
/// output of `candidate_model` (the model itself, or a transformed copy of it such as its
/// fp16 conversion, whose value names it keeps) under `candidate` is compared, in graph
/// order, with the same value of `model_path` run in fp32 on the CPU (graph optimisations
/// off). `tolerance` overrides the one `precision` gives float32 values. The first node
/// beyond tolerance is named with its module scope from the exporter's metadata.
DivergenceReport debug_precision(const std::string& model_path, const std::string& candidate_model,
                                 const OnnxSessionConfig& candidate, const std::map<std::string, TensorView>& inputs,
                                 Precision precision, const std::optional<Tolerance>& tolerance = std::nullopt);

}  // namespace aitune
