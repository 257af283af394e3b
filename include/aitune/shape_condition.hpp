// ShapeCondition: a condition on the extents of a graph's inputs that its exported model
// holds only under (a guard torch.export found while capturing it).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "aitune/tensor.hpp"

namespace aitune {

struct GraphSpec;

/// Input shapes by reference, in a spec's input order (a session's per-call check copies none).
using ShapeRefs = std::span<const Shape* const>;

/// Pointers to `shapes`, for a ShapeRefs over them (valid while `shapes` lives).
inline std::vector<const Shape*> shape_refs(const std::vector<Shape>& shapes) {
  std::vector<const Shape*> refs;
  refs.reserve(shapes.size());
  for (const auto& shape : shapes) refs.push_back(&shape);
  return refs;
}

/// One condition an exported graph was captured under, over its inputs' extents: the
/// model's code decided on a shape (`if x.shape[0] == 3:`, `if seq % 3 == 0:`) and the
/// export recorded only the branch its example took, so the graph computes the module only
/// where the condition holds (`x.shape[0] != 3`). A graph spec carries them and a session
/// refuses a call that violates one (kShapeMismatch) rather than computing another model.
///
/// Written as a JSON expression tree: an integer, `true`/`false`, `["dim", input, axis]`
/// (the extent of an input's axis), or `[op, operand...]` with op one of add, mul, pow,
/// floordiv, ceildiv, mod (Python's floor semantics), min, max, abs, eq, ne, lt, le, gt,
/// ge, and, or, not. Value type; thread-compatible.
class ShapeCondition {
 public:
  /// Throws Error(kInvalidArgument) naming what is malformed (an unknown op, a wrong
  /// number of operands, a negative axis, nesting deeper than the JSON bound).
  static ShapeCondition from_json(const std::string& text);
  std::string to_json() const;

  /// Whether the condition holds for these input shapes, in the spec's input order. An
  /// expression that cannot be evaluated (an input or axis the shapes lack, a division by
  /// zero, an overflow) does not hold: the graph was not captured there either.
  bool holds(const GraphSpec& spec, ShapeRefs shapes) const;
  bool holds(const GraphSpec& spec, const std::vector<Shape>& shapes) const;
  /// The inputs the condition reads, each once, in order of first use.
  std::vector<std::string> inputs() const;
  /// What makes the condition unusable with `spec`, or "": an input the spec lacks, an axis
  /// past its input's rank, a division or modulo by the constant 0 (each would refuse every
  /// call as violating it; a checkpoint holding one is damaged).
  std::string problem_with(const GraphSpec& spec) const;
  /// Whether the condition holds at every shape `spec` accepts, read on the axes it reads
  /// (each over its range and step, independently): then it says nothing the spec's ranges
  /// do not (`1 < 3 * h * w` over h, w in 32..48). False where it reads a batch axis (the
  /// batch range may widen after tuning), an unbounded axis, or more than `max_points`
  /// combinations of extents.
  bool holds_throughout(const GraphSpec& spec, std::size_t max_points = 1 << 14) const;
  /// Python-like text: "x.shape[0] != 3", "x.shape[1] % 3 != 0".
  std::string to_string() const;

  bool operator==(const ShapeCondition& o) const { return nodes_ == o.nodes_; }

 private:
  enum class Op : uint8_t {
    kConst, kDim, kAdd, kMul, kPow, kFloorDiv, kCeilDiv, kMod, kMin, kMax, kAbs,
    kEq, kNe, kLt, kLe, kGt, kGe, kAnd, kOr, kNot
  };
  struct Node {
    Op op = Op::kConst;
    int64_t value = 0;            // kConst: the value; kDim: the axis
    std::string input;            // kDim: the input's name
    std::vector<int> operands;    // indices into nodes_
    bool operator==(const Node&) const = default;
  };
  friend struct ShapeConditionCodec;  // the JSON reading and writing (shape_condition.cpp)
  std::optional<int64_t> evaluate(int node, const GraphSpec& spec, ShapeRefs shapes) const;
  std::string text(int node) const;

  std::vector<Node> nodes_;  // the root is the last
};

}  // namespace aitune
