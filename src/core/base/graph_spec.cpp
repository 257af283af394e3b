// GraphSpec derivation from recorded calls, validation helpers and JSON round trip.
#include "aitune/graph_spec.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "aitune/error.hpp"
#include "base/bounded_json.hpp"

namespace aitune {

std::vector<int> TensorSpec::dynamic_axes() const {
  std::vector<int> axes;
  for (std::size_t i = 0; i < rank(); ++i)
    if (is_dynamic(i)) axes.push_back(static_cast<int>(i));
  return axes;
}

bool TensorSpec::accepts(const Shape& shape) const {
  if (shape.size() != rank()) return false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < min_shape[i]) return false;
    if (max_shape[i] != kUnbounded && shape[i] > max_shape[i]) return false;
    if (step_of(i) > 1 && (shape[i] - min_shape[i]) % step_of(i) != 0) return false;
  }
  return true;
}

std::string TensorSpec::to_string() const {
  std::string out = std::string(dtype_name(dtype)) + "[";
  for (std::size_t i = 0; i < rank(); ++i) {
    if (i) out += ", ";
    if (batch_axis && *batch_axis == static_cast<int>(i)) out += "b:";
    if (min_shape[i] == max_shape[i]) {
      out += std::to_string(min_shape[i]);
    } else {
      out += std::to_string(min_shape[i]) + ".." + (max_shape[i] == kUnbounded ? "" : std::to_string(max_shape[i]));
      if (step_of(i) > 1) out += " step " + std::to_string(step_of(i));
    }
  }
  return out + "]";
}

std::optional<std::size_t> GraphSpec::find_input(const std::string& name) const {
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].name == name) return i;
  return std::nullopt;
}

const ShapeCondition* GraphSpec::violated_condition(ShapeRefs shapes) const {
  for (const auto& c : conditions)
    if (!c.holds(*this, shapes)) return &c;
  return nullptr;
}

void GraphSpec::check_conditions(ShapeRefs shapes) const {
  const ShapeCondition* violated = violated_condition(shapes);
  if (violated == nullptr) return;
  std::string given;
  for (const auto& name : violated->inputs())
    if (auto i = find_input(name); i && *i < shapes.size())
      given += (given.empty() ? "" : ", ") + name + " " + shape_to_string(*shapes[*i]);
  // An export's condition can run to kilobytes (SEW's was an OR of three ANDs, 4158
  // characters): the message shows its start; inspect and the report list it whole.
  constexpr std::size_t kShownCharacters = 240;
  const std::string whole = violated->to_string();
  const std::string shown = whole.size() <= kShownCharacters
                                ? "`" + whole + "`"
                                : "`" + whole.substr(0, kShownCharacters) + " ...` (" + std::to_string(whole.size()) +
                                      " characters; `aitune inspect` of a checkpoint and the tune report list it whole)";
  throw Error(ErrorCode::kShapeMismatch,
              "input shapes " + given + " violate " + shown +
                  ", a condition the graph was exported under: the model's code decides on these sizes and the "
                  "graph holds only the branch its export took, so it would compute another model here; record "
                  "samples of these sizes in ait.tune to have graphs for them");
}

const ShapeCondition* GraphSpec::violated_condition(const std::vector<Shape>& shapes) const {
  return violated_condition(ShapeRefs(shape_refs(shapes)));
}

void GraphSpec::check_conditions(const std::vector<Shape>& shapes) const {
  check_conditions(ShapeRefs(shape_refs(shapes)));
}

// ---- recording ----

void GraphSpecBuilder::merge(std::vector<Accumulator>& acc, const std::vector<TensorRecord>& records,
                             int64_t batch_size, bool first, const char* what) {
  if (first) {
    for (const auto& r : records) {
      Accumulator a{r, r.shape, r.shape, std::vector<bool>(r.shape.size(), batch_size > 0)};
      for (std::size_t i = 0; i < r.shape.size(); ++i)
        a.tracks_batch[i] = batch_size > 0 && r.shape[i] == batch_size;
      acc.push_back(std::move(a));
    }
    return;
  }
  if (records.size() != acc.size())
    throw Error(ErrorCode::kInvalidArgument, std::string("recorded call has ") + std::to_string(records.size()) +
                                                 " " + what + "s, earlier calls had " + std::to_string(acc.size()));
  for (std::size_t k = 0; k < records.size(); ++k) {
    const auto& r = records[k];
    auto& a = acc[k];
    if (r.name != a.first.name)
      throw Error(ErrorCode::kInvalidArgument, std::string(what) + " " + std::to_string(k) + " is named '" + r.name +
                                                   "', earlier calls named it '" + a.first.name + "'");
    if (r.dtype != a.first.dtype)
      throw Error(ErrorCode::kDTypeMismatch, std::string(what) + " '" + r.name + "': dtype " +
                                                 std::string(dtype_name(r.dtype)) + ", earlier calls had " +
                                                 std::string(dtype_name(a.first.dtype)));
    if (r.shape.size() != a.min_shape.size())
      throw Error(ErrorCode::kShapeMismatch, std::string(what) + " '" + r.name + "': rank " +
                                                 std::to_string(r.shape.size()) + " " + shape_to_string(r.shape) +
                                                 ", earlier calls had rank " + std::to_string(a.min_shape.size()));
    for (std::size_t i = 0; i < r.shape.size(); ++i) {
      a.min_shape[i] = std::min(a.min_shape[i], r.shape[i]);
      a.max_shape[i] = std::max(a.max_shape[i], r.shape[i]);
      a.tracks_batch[i] = a.tracks_batch[i] && batch_size > 0 && r.shape[i] == batch_size;
    }
  }
}

void GraphSpecBuilder::record(const std::vector<TensorRecord>& inputs, const std::vector<TensorRecord>& outputs,
                              int64_t batch_size) {
  for (const auto* list : {&inputs, &outputs})
    for (const auto& r : *list)
      for (auto d : r.shape)
        if (d < 0)
          throw Error(ErrorCode::kShapeMismatch,
                      "tensor '" + r.name + "' has a negative extent: " + shape_to_string(r.shape));
  // Validate both lists before changing anything, so a rejected call leaves no trace.
  auto inputs_copy = inputs_;
  auto outputs_copy = outputs_;
  bool first = num_samples_ == 0;
  merge(inputs_copy, inputs, batch_size, first, "input");
  merge(outputs_copy, outputs, batch_size, first, "output");
  inputs_ = std::move(inputs_copy);
  outputs_ = std::move(outputs_copy);
  auto shapes = [](const std::vector<TensorRecord>& records) {
    std::vector<Shape> out;
    for (const auto& r : records) out.push_back(r.shape);
    return out;
  };
  input_shapes_.push_back(shapes(inputs));
  output_shapes_.push_back(shapes(outputs));
  if (batch_size > 0 && std::find(batch_sizes_.begin(), batch_sizes_.end(), batch_size) == batch_sizes_.end()) {
    batch_sizes_.push_back(batch_size);
    std::sort(batch_sizes_.begin(), batch_sizes_.end());
  }
  ++num_samples_;
}

namespace {

std::string range_text(int64_t min, int64_t max) {
  return std::to_string(min) + ".." + (max == kUnbounded ? std::string() : std::to_string(max));
}

}  // namespace

GraphSpec GraphSpecBuilder::build() const {
  if (num_samples_ == 0) throw Error(ErrorCode::kState, "no calls were recorded; nothing to build a graph spec from");
  // A batch axis can only be told apart from a fixed extent once the batch size varied.
  bool batch_varied = batch_sizes_.size() >= 2;
  auto convert = [&](const std::vector<Accumulator>& acc) {
    std::vector<TensorSpec> specs;
    for (const auto& a : acc) {
      TensorSpec s{a.first.name, a.first.dtype, a.min_shape, a.max_shape, std::nullopt};
      if (batch_varied)
        for (std::size_t i = 0; i < a.tracks_batch.size(); ++i)
          if (a.tracks_batch[i]) {
            s.batch_axis = static_cast<int>(i);
            break;
          }
      specs.push_back(std::move(s));
    }
    return specs;
  };
  GraphSpec spec{convert(inputs_), convert(outputs_), batch_sizes_};
  // Every input's batch axis is one axis of the graph: two different ranges declared for it
  // (input_ids 1..4, attention_mask 1..8) cannot both hold, and taking their union would
  // silently drop the narrower one.
  const DeclaredRange* batch_range = nullptr;
  for (const auto& range : declared_) {
    const auto index = spec.find_input(range.input);
    if (!index || spec.inputs[*index].batch_axis != range.axis) continue;
    if (batch_range && (batch_range->min != range.min || batch_range->max != range.max || batch_range->step != range.step))
      throw Error(ErrorCode::kInvalidArgument,
                  "dynamic_shapes: the batch axis is declared " + range_text(batch_range->min, batch_range->max) +
                      " on input '" + batch_range->input + "' and " + range_text(range.min, range.max) + " on input '" +
                      range.input + "'" + (range.step != batch_range->step ? " (different steps)" : "") +
                      ": every input's batch axis is one axis of the graph; declare one range (the same on each input, "
                      "or on one of them)");
    batch_range = &range;
  }
  for (const auto& range : declared_) apply(range, spec);
  return spec;
}

namespace {

// Widens `axis` of `s` to hold [min, max] in steps of `step` as well as what it held
// (every recorded extent is min plus a multiple of step: checked by apply).
void widen(TensorSpec& s, std::size_t axis, int64_t min, int64_t max, int64_t step) {
  s.min_shape[axis] = std::min(s.min_shape[axis], min);
  if (s.max_shape[axis] != kUnbounded) s.max_shape[axis] = max == kUnbounded ? kUnbounded : std::max(s.max_shape[axis], max);
  if (step > 1) {
    s.step.resize(s.rank(), 1);
    s.step[axis] = step;
  }
}

}  // namespace

void GraphSpecBuilder::declare_range(const std::string& input, int axis, int64_t min, int64_t max, int64_t step) {
  const std::string where = "dynamic_shapes: input '" + input + "' axis " + std::to_string(axis);
  if (axis < 0) throw Error(ErrorCode::kInvalidArgument, where + ": the axis must be >= 0");
  if (step < 1) throw Error(ErrorCode::kInvalidArgument, where + ": step " + std::to_string(step) + " is below 1");
  if (min < 0) throw Error(ErrorCode::kInvalidArgument, where + ": min " + std::to_string(min) + " is negative");
  if (max != kUnbounded && max < min)
    throw Error(ErrorCode::kInvalidArgument, where + ": max " + std::to_string(max) + " is below min " +
                                                 std::to_string(min) + " (max -1 or None: no upper bound)");
  declared_.push_back({input, axis, min, max, step});
}

void GraphSpecBuilder::apply(const DeclaredRange& range, GraphSpec& spec) const {
  const std::string where = "dynamic_shapes: input '" + range.input + "' axis " + std::to_string(range.axis);
  auto index = spec.find_input(range.input);
  if (!index) {
    std::string names;
    for (const auto& s : spec.inputs) names += (names.empty() ? "" : ", ") + s.name;
    throw Error(ErrorCode::kInvalidArgument, where + ": the graph has no such input (its inputs: " + names + ")");
  }
  auto& declared = spec.inputs[*index];
  const auto axis = static_cast<std::size_t>(range.axis);
  if (axis >= declared.rank())
    throw Error(ErrorCode::kInvalidArgument, where + ": the input has rank " + std::to_string(declared.rank()));
  const auto& recorded = inputs_[*index];
  const std::string declared_text =
      range_text(range.min, range.max) + (range.step > 1 ? " step " + std::to_string(range.step) : "");
  if (recorded.min_shape[axis] < range.min || (range.max != kUnbounded && recorded.max_shape[axis] > range.max))
    throw Error(ErrorCode::kInvalidArgument,
                where + " is declared " + declared_text + " but was recorded at " +
                    range_text(recorded.min_shape[axis], recorded.max_shape[axis]) +
                    ": the declared range must hold every recorded extent");
  for (const auto& shapes : input_shapes_)
    if ((shapes[*index][axis] - range.min) % range.step != 0)
      throw Error(ErrorCode::kInvalidArgument, where + " is declared " + declared_text + " but was recorded at " +
                                                   std::to_string(shapes[*index][axis]) +
                                                   ", which is not among those extents");
  if (declared.batch_axis && *declared.batch_axis == range.axis) {  // one batch range for every batch axis
    for (auto* list : {&spec.inputs, &spec.outputs})
      for (auto& s : *list)
        if (s.batch_axis) widen(s, static_cast<std::size_t>(*s.batch_axis), range.min, range.max, range.step);
    return;
  }
  widen(declared, axis, range.min, range.max, range.step);
  // Output axes that followed this extent in every call (the sequence axis of a hidden state).
  for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
    auto& out = spec.outputs[o];
    for (std::size_t j = 0; j < out.rank(); ++j) {
      if (out.batch_axis && static_cast<std::size_t>(*out.batch_axis) == j) continue;
      bool follows = !input_shapes_.empty();
      for (std::size_t c = 0; c < input_shapes_.size() && follows; ++c)
        follows = output_shapes_[c][o][j] == input_shapes_[c][*index][axis];
      if (follows) widen(out, j, range.min, range.max, range.step);
    }
  }
}

// ---- JSON ----

namespace {

using nlohmann::json;

json tensor_to_json(const TensorSpec& s) {
  json j{{"name", s.name}, {"dtype", dtype_name(s.dtype)}, {"min_shape", s.min_shape}, {"max_shape", s.max_shape}};
  j["batch_axis"] = s.batch_axis ? json(*s.batch_axis) : json(nullptr);
  if (std::any_of(s.step.begin(), s.step.end(), [](int64_t v) { return v > 1; })) j["step"] = s.step;
  return j;
}

template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key))
    throw Error(ErrorCode::kInvalidArgument, "graph spec JSON: " + where + " has no field '" + key + "'");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, "graph spec JSON: " + where + "." + key + " is malformed: " + e.what());
  }
}

TensorSpec tensor_from_json(const json& j, const std::string& where) {
  TensorSpec s;
  s.name = field<std::string>(j, "name", where);
  s.dtype = dtype_from_name(field<std::string>(j, "dtype", where));
  s.min_shape = field<Shape>(j, "min_shape", where);
  s.max_shape = field<Shape>(j, "max_shape", where);
  if (s.min_shape.size() != s.max_shape.size())
    throw Error(ErrorCode::kInvalidArgument, "graph spec JSON: " + where + " min_shape and max_shape differ in rank");
  for (std::size_t i = 0; i < s.rank(); ++i) {
    bool bad_max = s.max_shape[i] != kUnbounded && s.max_shape[i] < s.min_shape[i];
    if (s.min_shape[i] < 0 || bad_max)
      throw Error(ErrorCode::kInvalidArgument, "graph spec JSON: " + where + " axis " + std::to_string(i) +
                                                   " has min_shape " + std::to_string(s.min_shape[i]) +
                                                   " and max_shape " + std::to_string(s.max_shape[i]) +
                                                   " (need 0 <= min <= max, max = -1 for unbounded)");
  }
  if (j.contains("step")) {  // absent: every extent (specs written before steps existed)
    s.step = field<Shape>(j, "step", where);
    if (s.step.size() != s.rank() || std::any_of(s.step.begin(), s.step.end(), [](int64_t v) { return v < 1; }))
      throw Error(ErrorCode::kInvalidArgument,
                  "graph spec JSON: " + where + ".step must hold one step >= 1 per axis, got " + shape_to_string(s.step));
  }
  if (j.contains("batch_axis") && !j.at("batch_axis").is_null()) {
    s.batch_axis = field<int>(j, "batch_axis", where);
    if (*s.batch_axis < 0 || static_cast<std::size_t>(*s.batch_axis) >= s.rank())
      throw Error(ErrorCode::kInvalidArgument, "graph spec JSON: " + where + ".batch_axis " +
                                                   std::to_string(*s.batch_axis) + " is outside rank " +
                                                   std::to_string(s.rank()));
  }
  return s;
}

}  // namespace

std::string GraphSpec::to_json(int indent) const {
  json j;
  j["inputs"] = json::array();
  j["outputs"] = json::array();
  for (const auto& s : inputs) j["inputs"].push_back(tensor_to_json(s));
  for (const auto& s : outputs) j["outputs"].push_back(tensor_to_json(s));
  j["batch_sizes"] = batch_sizes;
  if (!conditions.empty()) {  // absent: none (and specs written before conditions existed)
    j["conditions"] = json::array();
    for (const auto& c : conditions) j["conditions"].push_back(json::parse(c.to_json()));
  }
  // absent: unchecked with nothing said (and specs written before the check)
  if (batch_rows != BatchRows::kUnchecked || !batch_rows_reason.empty()) {
    j["batch_rows"] = std::string(batch_rows_name(batch_rows));
    j["batch_rows_reason"] = batch_rows_reason;
  }
  return j.dump(indent);
}

GraphSpec GraphSpec::from_json(const std::string& text) {
  // Bounded nesting: copying a deep value below would recurse once per level.
  const json j = detail::parse_bounded_json<json>(text, ErrorCode::kInvalidArgument, "graph spec JSON");
  GraphSpec spec;
  for (const char* key : {"inputs", "outputs"}) {
    auto list = field<std::vector<json>>(j, key, "graph spec");
    auto& target = std::string(key) == "inputs" ? spec.inputs : spec.outputs;
    for (std::size_t i = 0; i < list.size(); ++i)
      target.push_back(tensor_from_json(list[i], std::string(key) + "[" + std::to_string(i) + "]"));
  }
  if (j.contains("batch_sizes")) spec.batch_sizes = field<std::vector<int64_t>>(j, "batch_sizes", "graph spec");
  if (j.contains("conditions")) {
    auto list = field<std::vector<json>>(j, "conditions", "graph spec");
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto condition = ShapeCondition::from_json(list[i].dump());
      if (const auto problem = condition.problem_with(spec); !problem.empty())
        throw Error(ErrorCode::kInvalidArgument, "graph spec JSON: conditions[" + std::to_string(i) + "] (" +
                                                     condition.to_string() + "): " + problem);
      spec.conditions.push_back(std::move(condition));
    }
  }
  if (j.contains("batch_rows")) {
    try {
      spec.batch_rows = parse_batch_rows(field<std::string>(j, "batch_rows", "graph spec"));
    } catch (const Error& e) {
      throw Error(e.code(), std::string("graph spec JSON: ") + e.what());
    }
    if (j.contains("batch_rows_reason"))
      spec.batch_rows_reason = field<std::string>(j, "batch_rows_reason", "graph spec");
  }
  return spec;
}

BatchRows parse_batch_rows(std::string_view name) {
  for (BatchRows rows : {BatchRows::kUnchecked, BatchRows::kIndependent, BatchRows::kCoupled})
    if (name == batch_rows_name(rows)) return rows;
  throw Error(ErrorCode::kInvalidArgument,
              "batch_rows '" + std::string(name) + "' is not one of unchecked, independent, coupled");
}

std::string_view batch_rows_name(BatchRows rows) noexcept {
  switch (rows) {
    case BatchRows::kIndependent: return "independent";
    case BatchRows::kCoupled: return "coupled";
    case BatchRows::kUnchecked: break;
  }
  return "unchecked";
}

}  // namespace aitune
