// ShapeCondition: reading, writing and evaluating a condition on input extents.
#include "aitune/shape_condition.hpp"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <string_view>

#include "aitune/error.hpp"
#include "aitune/graph_spec.hpp"
#include "base/bounded_json.hpp"

namespace aitune {
namespace {

using nlohmann::json;

struct OpName {
  std::string_view name;
  std::string_view symbol;  // the infix operator of to_string; empty: written as a call
  int min_operands, max_operands;
};

// Indexed by ShapeCondition::Op (kConst and kDim are written apart).
constexpr std::array<OpName, 20> kOps{{
    {"const", "", 0, 0},  {"dim", "", 0, 0},      {"add", "+", 2, 64},   {"mul", "*", 2, 64},
    {"pow", "**", 2, 2},  {"floordiv", "//", 2, 2}, {"ceildiv", "", 2, 2}, {"mod", "%", 2, 2},
    {"min", "", 1, 64},   {"max", "", 1, 64},      {"abs", "", 1, 1},     {"eq", "==", 2, 2},
    {"ne", "!=", 2, 2},   {"lt", "<", 2, 2},       {"le", "<=", 2, 2},    {"gt", ">", 2, 2},
    {"ge", ">=", 2, 2},   {"and", "and", 1, 64},   {"or", "or", 1, 64},   {"not", "", 1, 1},
}};

[[noreturn]] void malformed(const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, "shape condition JSON: " + why);
}

// Python's floor division and modulo (the export's sympy FloorDiv and Mod on sizes).
std::optional<int64_t> floor_div(int64_t a, int64_t b) {
  if (b == 0 || (a == INT64_MIN && b == -1)) return std::nullopt;
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

std::optional<int64_t> floor_mod(int64_t a, int64_t b) {
  auto q = floor_div(a, b);
  if (!q) return std::nullopt;
  return a - *q * b;
}

}  // namespace

struct ShapeConditionCodec {
  using Op = ShapeCondition::Op;

  static int parse(ShapeCondition& c, const json& j) {
    ShapeCondition::Node node;
    if (j.is_boolean()) {
      node.value = j.get<bool>() ? 1 : 0;
    } else if (j.is_number_integer()) {
      node.value = j.get<int64_t>();
    } else if (j.is_array() && !j.empty() && j[0].is_string()) {
      const auto name = j[0].get<std::string>();
      const auto* found = std::find_if(kOps.begin(), kOps.end(), [&](const OpName& o) { return o.name == name; });
      if (found == kOps.end() || found == kOps.begin()) malformed("unknown operation '" + name + "'");
      node.op = static_cast<Op>(found - kOps.begin());
      const int operands = static_cast<int>(j.size()) - 1;
      if (node.op == Op::kDim) {
        if (operands != 2 || !j[1].is_string() || !j[2].is_number_integer() || j[2].get<int64_t>() < 0)
          malformed("'dim' takes an input's name and an axis >= 0, got " + j.dump());
        node.input = j[1].get<std::string>();
        node.value = j[2].get<int64_t>();
      } else {
        if (operands < found->min_operands || operands > found->max_operands)
          malformed("'" + name + "' takes " + std::to_string(found->min_operands) + ".." +
                    std::to_string(found->max_operands) + " operands, got " + std::to_string(operands));
        for (std::size_t i = 1; i < j.size(); ++i) node.operands.push_back(parse(c, j[i]));
      }
    } else {
      malformed("expected an integer, a boolean or [operation, operand...], got " + j.dump().substr(0, 80));
    }
    c.nodes_.push_back(std::move(node));
    return static_cast<int>(c.nodes_.size()) - 1;
  }

  static json dump(const ShapeCondition& c, int index) {
    const auto& node = c.nodes_[static_cast<std::size_t>(index)];
    if (node.op == Op::kConst) return node.value;
    if (node.op == Op::kDim) return json::array({"dim", node.input, node.value});
    json j = json::array({std::string(kOps[static_cast<std::size_t>(node.op)].name)});
    for (int operand : node.operands) j.push_back(dump(c, operand));
    return j;
  }
};

ShapeCondition ShapeCondition::from_json(const std::string& text) {
  const json j = detail::parse_bounded_json<json>(text, ErrorCode::kInvalidArgument, "shape condition JSON");
  ShapeCondition c;
  ShapeConditionCodec::parse(c, j);
  return c;
}

std::string ShapeCondition::to_json() const {
  if (nodes_.empty()) return "true";
  return ShapeConditionCodec::dump(*this, static_cast<int>(nodes_.size()) - 1).dump();
}

std::optional<int64_t> ShapeCondition::evaluate(int index, const GraphSpec& spec, ShapeRefs shapes) const {
  const auto& node = nodes_[static_cast<std::size_t>(index)];
  if (node.op == Op::kConst) return node.value;
  if (node.op == Op::kDim) {
    auto input = spec.find_input(node.input);
    if (!input || *input >= shapes.size()) return std::nullopt;
    const Shape& shape = *shapes[*input];
    if (static_cast<std::size_t>(node.value) >= shape.size()) return std::nullopt;
    return shape[static_cast<std::size_t>(node.value)];
  }
  // Operands are folded as they are evaluated (this runs per call of a session): no list.
  auto operand = [&](std::size_t i) { return evaluate(node.operands[i], spec, shapes); };
  if (node.op == Op::kAnd || node.op == Op::kOr) {  // left to right, deciding early, as Python does
    for (std::size_t i = 0; i < node.operands.size(); ++i) {
      auto value = operand(i);
      if (!value) return std::nullopt;
      if ((*value != 0) == (node.op == Op::kOr)) return node.op == Op::kOr ? 1 : 0;
    }
    return node.op == Op::kAnd ? 1 : 0;
  }
  auto first = operand(0);
  if (!first) return std::nullopt;
  int64_t r = *first;
  if (node.operands.size() == 1) {  // abs, not, and a min or max of one
    if (node.op == Op::kAbs) return r == INT64_MIN ? std::nullopt : std::optional<int64_t>(r < 0 ? -r : r);
    if (node.op == Op::kNot) return r == 0;
    return r;
  }
  if (node.op == Op::kAdd || node.op == Op::kMul || node.op == Op::kMin || node.op == Op::kMax) {
    for (std::size_t i = 1; i < node.operands.size(); ++i) {
      auto x = operand(i);
      if (!x) return std::nullopt;
      if (node.op == Op::kAdd ? __builtin_add_overflow(r, *x, &r)
          : node.op == Op::kMul ? __builtin_mul_overflow(r, *x, &r)
                                : false)
        return std::nullopt;
      if (node.op == Op::kMin) r = std::min(r, *x);
      if (node.op == Op::kMax) r = std::max(r, *x);
    }
    return r;
  }
  auto second = operand(1);
  if (!second) return std::nullopt;
  const int64_t a = r, b = *second;
  switch (node.op) {
    case Op::kPow: {
      if (b < 0) return std::nullopt;  // a fraction: not an extent
      r = 1;
      for (int64_t k = 0; k < b; ++k) {
        if (__builtin_mul_overflow(r, a, &r)) return std::nullopt;
        if (r == 0 || r == 1) break;  // 0 and 1 stay themselves (for r == 1, only when a == 1)
      }
      if (a == -1) r = b % 2 ? -1 : 1;
      return r;
    }
    case Op::kFloorDiv: return floor_div(a, b);
    case Op::kCeilDiv: {
      if (a == INT64_MIN) return std::nullopt;
      auto q = floor_div(-a, b);
      if (!q || *q == INT64_MIN) return std::nullopt;
      return -*q;
    }
    case Op::kMod: return floor_mod(a, b);
    case Op::kEq: return a == b;
    case Op::kNe: return a != b;
    case Op::kLt: return a < b;
    case Op::kLe: return a <= b;
    case Op::kGt: return a > b;
    case Op::kGe: return a >= b;
    default: return std::nullopt;
  }
}

bool ShapeCondition::holds(const GraphSpec& spec, ShapeRefs shapes) const {
  if (nodes_.empty()) return true;
  auto value = evaluate(static_cast<int>(nodes_.size()) - 1, spec, shapes);
  return value && *value != 0;
}

bool ShapeCondition::holds(const GraphSpec& spec, const std::vector<Shape>& shapes) const {
  return holds(spec, ShapeRefs(shape_refs(shapes)));
}

std::string ShapeCondition::problem_with(const GraphSpec& spec) const {
  for (const auto& node : nodes_) {
    if (node.op == Op::kDim) {
      const auto input = spec.find_input(node.input);
      if (!input) return "it reads input '" + node.input + "', which the graph does not have";
      const auto rank = spec.inputs[*input].rank();
      if (static_cast<std::size_t>(node.value) >= rank)
        return "it reads axis " + std::to_string(node.value) + " of input '" + node.input + "', which has rank " +
               std::to_string(rank);
    }
    if ((node.op == Op::kFloorDiv || node.op == Op::kCeilDiv || node.op == Op::kMod) && node.operands.size() == 2) {
      const auto& divisor = nodes_[static_cast<std::size_t>(node.operands[1])];
      if (divisor.op == Op::kConst && divisor.value == 0) return "it divides by the constant 0";
    }
  }
  return "";
}

bool ShapeCondition::holds_throughout(const GraphSpec& spec, std::size_t max_points) const {
  struct Axis {
    std::size_t input;
    std::size_t axis;
    int64_t min, max, step;
  };
  std::vector<Axis> axes;
  std::size_t points = 1;
  for (const auto& node : nodes_) {
    if (node.op != Op::kDim) continue;
    const auto found = spec.find_input(node.input);
    if (!found) return false;
    const std::size_t input = *found;
    const auto* t = &spec.inputs[input];
    if (node.value < 0 || static_cast<std::size_t>(node.value) >= t->rank()) return false;
    const auto axis = static_cast<std::size_t>(node.value);
    if (std::any_of(axes.begin(), axes.end(), [&](const Axis& a) { return a.input == input && a.axis == axis; }))
      continue;
    if ((t->batch_axis && static_cast<std::size_t>(*t->batch_axis) == axis) || t->max_shape[axis] == kUnbounded)
      return false;
    Axis a{input, axis, t->min_shape[axis], t->max_shape[axis], std::max<int64_t>(t->step_of(axis), 1)};
    points *= static_cast<std::size_t>((a.max - a.min) / a.step + 1);
    if (points > max_points) return false;
    axes.push_back(a);
  }
  std::vector<Shape> shapes;
  for (const auto& t : spec.inputs) shapes.push_back(t.min_shape);
  // every combination, odometer-wise over the axes read
  while (true) {
    if (!holds(spec, shapes)) return false;
    std::size_t k = 0;
    for (; k < axes.size(); ++k) {
      auto& extent = shapes[axes[k].input][axes[k].axis];
      if (extent + axes[k].step <= axes[k].max) {
        extent += axes[k].step;
        break;
      }
      extent = axes[k].min;
    }
    if (k == axes.size()) return true;
  }
}

std::vector<std::string> ShapeCondition::inputs() const {
  std::vector<std::string> names;
  for (const auto& node : nodes_)
    if (node.op == Op::kDim && std::find(names.begin(), names.end(), node.input) == names.end())
      names.push_back(node.input);
  return names;
}

std::string ShapeCondition::text(int index) const {
  const auto& node = nodes_[static_cast<std::size_t>(index)];
  if (node.op == Op::kConst) return std::to_string(node.value);
  if (node.op == Op::kDim) return node.input + ".shape[" + std::to_string(node.value) + "]";
  const auto& op = kOps[static_cast<std::size_t>(node.op)];
  auto operand = [&](int i) {  // compound operands in parentheses: no precedence to get wrong
    const auto& o = nodes_[static_cast<std::size_t>(i)];
    const bool simple = o.op == Op::kConst || o.op == Op::kDim || kOps[static_cast<std::size_t>(o.op)].symbol.empty();
    if (simple) return text(i);
    std::string wrapped(1, '(');  // appended, not "(" + ...: GCC 12's -Wrestrict misfires on that
    wrapped += text(i);
    return wrapped += ')';
  };
  std::string out;
  if (node.op == Op::kNot) return out.append("not ").append(operand(node.operands[0]));
  if (op.symbol.empty()) {  // min, max, abs, ceildiv: a call
    out = std::string(op.name) + "(";
    for (std::size_t i = 0; i < node.operands.size(); ++i) out.append(i ? ", " : "").append(text(node.operands[i]));
    return out + ")";
  }
  // `and` / `or` of the same operand more than once reads as that operand once (the
  // export repeats a guard per use: `(x.shape[0] != 1) or (x.shape[0] != 1) or ...`).
  const bool idempotent = op.name == std::string_view("and") || op.name == std::string_view("or");
  std::vector<std::string> seen;
  for (std::size_t i = 0; i < node.operands.size(); ++i) {
    std::string term = operand(node.operands[i]);
    if (idempotent && std::find(seen.begin(), seen.end(), term) != seen.end()) continue;
    seen.push_back(term);
  }
  if (seen.size() == 1 && node.operands.size() > 1) return text(node.operands[0]);
  for (std::size_t i = 0; i < seen.size(); ++i) {
    if (i) out.append(" ").append(op.symbol).append(" ");
    out += seen[i];
  }
  return out;
}

std::string ShapeCondition::to_string() const {
  return nodes_.empty() ? "True" : text(static_cast<int>(nodes_.size()) - 1);
}

}  // namespace aitune
