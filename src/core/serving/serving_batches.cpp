// Requests to a served graph checked one by one against its spec and grouped into model calls.
#include "aitune/serving_batches.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include "aitune/error.hpp"

namespace aitune {
namespace {

std::string input_names(const GraphSpec& spec) {
  std::string out;
  for (const auto& t : spec.inputs) out += (out.empty() ? "" : ", ") + t.name;
  return out;
}

// Largest summed batch one call may carry: the smallest upper bound of the inputs' batch axes.
std::optional<int64_t> batch_limit(const GraphSpec& spec) {
  std::optional<int64_t> limit;
  for (const auto& t : spec.inputs)
    if (t.batch_axis) {
      int64_t max = t.max_shape[static_cast<std::size_t>(*t.batch_axis)];
      if (max != kUnbounded) limit = limit ? std::min(*limit, max) : max;
    }
  return limit;
}

}  // namespace

std::vector<std::size_t> check_request(const GraphSpec& spec, const std::vector<RequestTensor>& request) {
  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < request.size(); ++i) {
    const auto& name = request[i].name;
    if (!spec.find_input(name))
      throw Error(ErrorCode::kInvalidArgument,
                  "unknown input '" + name + "'; the graph takes: " + input_names(spec));
    if (!by_name.emplace(name, i).second)
      throw Error(ErrorCode::kInvalidArgument, "input '" + name + "' given twice");
  }
  std::vector<std::size_t> order;
  std::optional<int64_t> batch;
  std::string batch_from;
  for (const auto& t : spec.inputs) {
    auto it = by_name.find(t.name);
    if (it == by_name.end())
      throw Error(ErrorCode::kInvalidArgument, "missing input '" + t.name + "'; the graph takes: " + input_names(spec));
    const auto& r = request[it->second];
    if (r.dtype != t.dtype)
      throw Error(ErrorCode::kDTypeMismatch, "input '" + t.name + "' is " + std::string(dtype_name(r.dtype)) +
                                                 "; the graph takes " + t.to_string());
    if (!t.accepts(r.shape))
      throw Error(ErrorCode::kShapeMismatch, "input '" + t.name + "' has shape " + shape_to_string(r.shape) +
                                                 "; the graph takes " + t.to_string());
    if (t.batch_axis) {
      int64_t b = r.shape[static_cast<std::size_t>(*t.batch_axis)];
      if (batch && *batch != b)
        throw Error(ErrorCode::kShapeMismatch, "inputs '" + batch_from + "' and '" + t.name +
                                                   "' disagree on the batch size (" + std::to_string(*batch) +
                                                   " vs " + std::to_string(b) + ")");
      batch = b;
      batch_from = t.name;
    }
    order.push_back(it->second);
  }
  if (!spec.conditions.empty()) {
    std::vector<const Shape*> shapes;
    for (auto i : order) shapes.push_back(&request[i].shape);
    spec.check_conditions(ShapeRefs(shapes));
  }
  return order;
}

int64_t request_batch_size(const GraphSpec& spec, const std::vector<Shape>& shapes) {
  if (shapes.size() != spec.inputs.size())
    throw Error(ErrorCode::kInvalidArgument, "request_batch_size: " + std::to_string(shapes.size()) +
                                                 " shapes for " + std::to_string(spec.inputs.size()) + " inputs");
  for (std::size_t i = 0; i < spec.inputs.size(); ++i)
    if (const auto& axis = spec.inputs[i].batch_axis) {
      if (static_cast<std::size_t>(*axis) >= shapes[i].size())
        throw Error(ErrorCode::kShapeMismatch, "input '" + spec.inputs[i].name + "' has no axis " +
                                                   std::to_string(*axis) + " (its batch axis)");
      return shapes[i][static_cast<std::size_t>(*axis)];
    }
  return 0;
}

std::string requests_apart_reason(const GraphSpec& spec) {
  switch (spec.batch_rows) {
    case BatchRows::kIndependent: return "";
    case BatchRows::kCoupled:
      return "the model's batch rows depend on each other (" + spec.batch_rows_reason +
             "), so requests joined into one batch would get part of each other's answers";
    case BatchRows::kUnchecked: break;
  }
  return "the tuner did not check that the model computes each row of a batch apart (" +
         (spec.batch_rows_reason.empty() ? std::string("a checkpoint written before the check")
                                         : spec.batch_rows_reason) +
         "); tune it with a batch of 1 and one of 2 or more samples (the check runs a row of the largest batch "
         "alone) to join requests";
}

std::vector<std::vector<std::size_t>> group_requests(const GraphSpec& spec,
                                                     const std::vector<std::vector<Shape>>& requests,
                                                     const std::vector<std::string>& unbatched_values) {
  if (unbatched_values.size() != requests.size())
    throw Error(ErrorCode::kInvalidArgument, "group_requests: " + std::to_string(unbatched_values.size()) +
                                                 " values of unbatched inputs for " + std::to_string(requests.size()) +
                                                 " requests (one per request)");
  std::vector<std::vector<std::size_t>> calls;
  const bool batched = std::any_of(spec.inputs.begin(), spec.inputs.end(),
                                   [](const TensorSpec& t) { return t.batch_axis.has_value(); });
  // Requests share a call only where the tuner saw each row of a batch computed as it is
  // alone (GraphSpec::batch_rows): a model that mixes rows (a batch mean, scores of every
  // row against every other, logits flattened over the batch) would hand each request a
  // part of the others' answers. Unchecked (a checkpoint written before the check): apart.
  if (!batched || !requests_apart_reason(spec).empty()) {
    for (std::size_t i = 0; i < requests.size(); ++i) calls.push_back({i});
    return calls;
  }
  const auto limit = batch_limit(spec);
  // Key: every extent except the batch axis' ones, so that shapes differing only there
  // concatenate, and the values of the inputs without a batch axis, which a call has one of.
  std::map<std::pair<std::vector<int64_t>, std::string>, std::size_t> open;  // key -> index of its latest call
  std::vector<int64_t> call_batch;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const auto& shapes = requests[r];
    const int64_t batch = request_batch_size(spec, shapes);
    std::vector<int64_t> key;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      key.push_back(-2);  // separates inputs
      for (std::size_t a = 0; a < shapes[i].size(); ++a)
        key.push_back(spec.inputs[i].batch_axis && static_cast<std::size_t>(*spec.inputs[i].batch_axis) == a
                          ? -1
                          : shapes[i][a]);
    }
    auto full_key = std::make_pair(std::move(key), unbatched_values[r]);
    auto it = open.find(full_key);
    // A graph exported under conditions on its shapes (ShapeCondition) takes the
    // concatenated call only where it satisfies them: a batch of 3 from 1 + 2 is refused by
    // a graph whose code branched on `batch == 3`, so the request starts a call of its own.
    auto joined_holds = [&](std::size_t call) {
      if (spec.conditions.empty()) return true;
      std::vector<Shape> joined = shapes;
      for (std::size_t i = 0; i < joined.size(); ++i)
        if (const auto& axis = spec.inputs[i].batch_axis) joined[i][static_cast<std::size_t>(*axis)] = call_batch[call] + batch;
      return spec.violated_condition(joined) == nullptr;
    };
    if (it != open.end() && (!limit || call_batch[it->second] + batch <= *limit) && joined_holds(it->second)) {
      calls[it->second].push_back(r);
      call_batch[it->second] += batch;
      continue;
    }
    calls.push_back({r});
    call_batch.push_back(batch);
    open[std::move(full_key)] = calls.size() - 1;
  }
  return calls;
}

}  // namespace aitune
