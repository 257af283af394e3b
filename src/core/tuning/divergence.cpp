// Tracing where a candidate's graph first diverges from a reference: a debug copy of the
// model with intermediate values as outputs, run once, compared value by value.
#include "aitune/divergence.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "aitune/error.hpp"
#include "aitune/onnx_nodes.hpp"

namespace aitune {
namespace {

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float value;
  if (exp == 0)
    value = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31)
    value = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    value = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -value : value;
}

// A float32 copy of a contiguous floating-point host tensor (so an fp16 graph's values
// compare with an fp32 reference).
Tensor as_float32(const TensorView& t) {
  Tensor out = Tensor::empty_host(DType::kFloat32, t.shape);
  auto* dst = static_cast<float*>(out.data());
  const auto n = static_cast<std::size_t>(t.numel());
  for (std::size_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case DType::kFloat32: dst[i] = static_cast<const float*>(t.data)[i]; break;
      case DType::kFloat64: dst[i] = static_cast<float>(static_cast<const double*>(t.data)[i]); break;
      case DType::kFloat16: dst[i] = half_to_float(static_cast<const std::uint16_t*>(t.data)[i]); break;
      case DType::kBFloat16: {
        const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(t.data)[i]) << 16;
        std::memcpy(&dst[i], &bits, sizeof(float));
        break;
      }
      default: dst[i] = 0;
    }
  }
  return out;
}

// The debug copy of a model: written next to it (external data references are relative
// to the model's directory) and removed when this goes out of scope.
class DebugModel {
 public:
  DebugModel(const std::string& model_path, const std::vector<std::string>& values) {
    static std::atomic<int> counter{0};
    const std::filesystem::path model(model_path);
    path_ = (model.parent_path() / ("." + model.stem().string() + ".debug-" + std::to_string(::getpid()) + "-" +
                                    std::to_string(counter++) + ".onnx"))
                .string();
    write_model_with_outputs(model_path, values, path_);
  }
  ~DebugModel() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  DebugModel(const DebugModel&) = delete;
  DebugModel& operator=(const DebugModel&) = delete;
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

// Every output of `model_path` with `values` added as outputs, run once, by name (host memory).
std::map<std::string, Tensor> run_with_outputs(const std::string& model_path, const std::vector<std::string>& values,
                                               const OnnxSessionConfig& config,
                                               const std::map<std::string, TensorView>& inputs) {
  const DebugModel debug(model_path, values);
  auto session = OnnxSession::create(debug.path(), config);
  std::map<std::string, TensorView> feed;
  std::vector<Tensor> copies;  // host inputs of a device session, on its device
  copies.reserve(session->inputs().size());
  for (const auto& io : session->inputs()) {
    auto it = inputs.find(io.name);
    if (it == inputs.end())
      throw Error(ErrorCode::kInvalidArgument, "debugging '" + model_path + "': no value given for input '" + io.name + "'");
    if (it->second.device.kind == DeviceKind::kCPU && session->device().kind != DeviceKind::kCPU) {
      // A view the caller keeps alive: the owner only marks the Tensor defined.
      copies.push_back(session->to_device(Tensor::adopt(it->second, std::make_shared<int>(0))));
      feed.emplace(io.name, copies.back().view());
    } else {
      feed.emplace(io.name, it->second);
    }
  }
  auto outputs = session->infer_named(feed);
  std::map<std::string, Tensor> by_name;
  for (std::size_t i = 0; i < outputs.size(); ++i)
    by_name.emplace(session->outputs()[i].name, session->to_host(outputs[i]));
  return by_name;
}

std::map<std::string, const OnnxNode*> producers(const std::vector<OnnxNode>& nodes) {
  std::map<std::string, const OnnxNode*> out;
  for (const auto& n : nodes)
    for (const auto& v : n.outputs) out.emplace(v, &n);
  return out;
}

// The nodes that feed `value` (its producer included) without feeding any of `good`
// (values found within tolerance), in graph order: where a wrong value can have come from.
std::vector<const OnnxNode*> suspects_of(const std::vector<OnnxNode>& nodes,
                                         const std::map<std::string, const OnnxNode*>& by_value,
                                         const std::string& value, const std::vector<std::string>& good) {
  std::set<const OnnxNode*> fine, suspect;
  std::vector<const OnnxNode*> stack;
  auto walk = [&](std::set<const OnnxNode*>& marked, const std::vector<std::string>& from, bool stop_at_fine) {
    auto push = [&](const std::string& v) {
      auto it = by_value.find(v);
      if (it == by_value.end() || (stop_at_fine && fine.count(it->second))) return;
      if (marked.insert(it->second).second) stack.push_back(it->second);
    };
    for (const auto& v : from) push(v);
    while (!stack.empty()) {
      const OnnxNode* n = stack.back();
      stack.pop_back();
      for (const auto& v : n->inputs) push(v);
    }
  };
  walk(fine, good, false);  // everything upstream of a value within tolerance
  walk(suspect, {value}, true);
  std::vector<const OnnxNode*> ordered;
  for (const auto& n : nodes)
    if (suspect.count(&n)) ordered.push_back(&n);
  return ordered;
}

// The deepest module path containing every scoped suspect: the longest common prefix of
// their scope chains, named by the deepest scope in it that `names` knows (scope -> the
// user's module path; "" is the root module). "" when no scope is known.
std::string location_of(const std::vector<const OnnxNode*>& suspects, const std::map<std::string, std::string>& names) {
  std::optional<std::vector<std::string>> common;
  for (const OnnxNode* n : suspects) {
    if (n->scopes.empty()) continue;  // a node a transform added (a Cast of the fp16 converter)
    if (!common) {
      common = n->scopes;
      continue;
    }
    std::size_t k = 0;
    while (k < common->size() && k < n->scopes.size() && (*common)[k] == n->scopes[k]) ++k;
    common->resize(k);
  }
  if (!common) return "";
  for (auto it = common->rbegin(); it != common->rend(); ++it)
    if (auto name = names.find(*it); name != names.end()) return name->second;
  auto root = names.find("");
  return root == names.end() ? "" : root->second;
}

// Compares `actual` with `expected` in float32; nullopt when either is not floating point.
std::optional<OutputCheck> compare_value(const std::string& value, const Tensor& actual, const TensorView& expected,
                                         const Tolerance& tolerance) {
  if (!dtype_is_floating(actual.dtype()) || !dtype_is_floating(expected.dtype)) return std::nullopt;
  const Tensor a = as_float32(actual.view()), e = as_float32(expected);
  return compare_output(value, a.view(), e.view(), tolerance);
}

}  // namespace

std::string DivergenceReport::describe() const {
  if (!first)
    return "no intermediate value beyond tolerance (" + std::to_string(compared) + " compared with " + reference +
           ", " + std::to_string(skipped) + " skipped): the divergence is in the graph outputs alone";
  const auto& p = *first;
  std::string node = p.node.empty() ? "" : "node " + p.node + " (" + p.op_type + "), ";
  const std::string after = "compared with " + reference + ", after " + std::to_string(compared - 1) +
                            " values within tolerance): " + p.check.failure;
  if (!p.location.empty() && p.location != p.module) {
    // The wrong value first shows at a module output deeper in (or after) the place its
    // suspect nodes share: name that place, then what showed it.
    std::string ops;
    const std::size_t shown = std::min<std::size_t>(p.suspects.size(), 8);
    for (std::size_t i = 0; i < shown; ++i) ops += (i ? ", " : "") + p.suspects[i].op_type;
    if (p.suspects.size() > shown) ops += ", ...";
    return "first diverges in " + p.location + " (" + std::to_string(p.suspects.size()) +
           " nodes after the last values within tolerance: " + ops + "; first beyond tolerance: " +
           (p.module.empty() ? std::string("an unscoped value") : (p.input ? "the input of " : "the output of ") + p.module) +
           ", " + node + "value " + p.value + "; " + after;
  }
  std::string where = p.module.empty() ? "an unscoped node" : p.input ? "the input of " + p.module : p.module;
  return "first diverges in " + where + " (" + node + "value " + p.value + "; " + after;
}

std::string DivergenceReport::to_json(int indent) const {
  nlohmann::json j = {{"reference", reference}, {"compared", compared}, {"skipped", skipped}};
  if (first) {
    const auto& c = first->check;
    nlohmann::json suspects = nlohmann::json::array();
    for (std::size_t i = 0; i < first->suspects.size() && i < 50; ++i)  // the first 50: a report, not a dump
      suspects.push_back({{"name", first->suspects[i].name},
                          {"op_type", first->suspects[i].op_type},
                          {"scope", first->suspects[i].scope}});
    j["first"] = {{"module", first->module},
                  {"input", first->input},
                  {"location", first->location.empty() ? first->module : first->location},
                  {"suspect_count", first->suspects.size()},
                  {"suspects", suspects},
                  {"node", first->node},
                  {"op_type", first->op_type},
                  {"value", first->value},
                  {"failure", c.failure},
                  {"max_abs_error", c.max_abs_error},
                  {"max_rel_error", c.max_rel_error},
                  {"mismatched", c.mismatched},
                  {"atol", c.atol_applied},
                  {"rtol", c.tolerance.rtol}};
  } else {
    j["first"] = nullptr;
  }
  j["summary"] = describe();
  return j.dump(indent);
}

DivergenceReport trace_divergence(const std::string& model_path, const OnnxSessionConfig& config,
                                  const std::map<std::string, TensorView>& inputs,
                                  const std::vector<ModuleOutput>& expected, Precision precision) {
  for (const auto& m : expected)
    if (m.expected.device.kind != DeviceKind::kCPU || !m.expected.is_contiguous())
      throw Error(ErrorCode::kInvalidArgument,
                  "the expected output of module '" + m.module + "' must be a contiguous host tensor");
  const auto nodes = onnx_graph_nodes(model_path);
  const auto by_value = producers(nodes);
  std::vector<std::string> values;
  for (const auto& m : expected) values.push_back(m.value);
  const auto actual = run_with_outputs(model_path, values, config, inputs);
  const Tolerance tolerance = default_tolerance(DType::kFloat32, precision);

  std::map<std::string, std::string> module_of_scope;  // exported scope -> the user's module path
  for (const auto& m : expected)
    if (!m.input) module_of_scope.emplace(m.scope, m.module);
  std::vector<std::string> within;  // values found within tolerance so far

  DivergenceReport report;
  report.reference = "eager PyTorch's module inputs and outputs";
  for (const auto& m : expected) {
    auto it = actual.find(m.value);
    std::optional<OutputCheck> check;
    // A value of another shape is not that module's output (the scope's last node
    // computed something else, e.g. a tuple's part): not compared.
    if (it != actual.end() && it->second.shape() == m.expected.shape)
      check = compare_value(m.value, it->second, m.expected, tolerance);
    if (!check) {
      ++report.skipped;
      continue;
    }
    ++report.compared;
    if (check->passed) {
      within.push_back(m.value);
      continue;
    }
    DivergencePoint p{m.module, m.input, "", "", m.value, *check};
    if (auto node = by_value.find(m.value); node != by_value.end()) {
      p.node = node->second->name;
      p.op_type = node->second->op_type;
    }
    const auto suspects = suspects_of(nodes, by_value, m.value, within);
    for (const OnnxNode* n : suspects) p.suspects.push_back({n->name, n->op_type, n->scope});
    p.location = location_of(suspects, module_of_scope);
    if (p.location.empty()) p.location = p.module;
    report.first = std::move(p);
    break;
  }
  return report;
}

DivergenceReport debug_precision(const std::string& model_path, const std::string& candidate_model,
                                 const OnnxSessionConfig& candidate, const std::map<std::string, TensorView>& inputs,
                                 Precision precision, const std::optional<Tolerance>& tolerance) {
  const auto nodes = onnx_graph_nodes(model_path);
  std::vector<std::string> values;
  for (const auto& n : nodes)
    for (const auto& v : n.outputs)
      if (!v.empty()) values.push_back(v);

  OnnxSessionConfig reference;
  reference.provider = ExecutionProvider::kCPU;
  // No fusions on the reference: every node computes as the graph says, in fp32.
  reference.graph_optimization_level = GraphOptimizationLevel::kDisableAll;
  const auto expected = run_with_outputs(model_path, values, reference, inputs);
  const auto candidate_nodes = candidate_model.empty() ? nodes : onnx_graph_nodes(candidate_model);
  // Only the values the candidate computes become its outputs: one it lacks (a transformed
  // copy that fused it away or named it otherwise) is not compared, where asking for it
  // made ORT refuse the whole debug copy ("Graph output ... does not exist").
  std::set<std::string> computed;
  for (const auto& n : candidate_nodes)
    for (const auto& v : n.outputs) computed.insert(v);
  std::vector<std::string> candidate_values;
  for (const auto& v : values)
    if (computed.count(v)) candidate_values.push_back(v);
  const auto actual =
      run_with_outputs(candidate_model.empty() ? model_path : candidate_model, candidate_values, candidate, inputs);
  const Tolerance applied = tolerance.value_or(default_tolerance(DType::kFloat32, precision));
  const auto candidate_producers = producers(candidate_nodes);

  DivergenceReport report;
  report.reference = "the fp32 CPU run of the same graph";
  for (const auto& n : nodes) {
    for (const auto& v : n.outputs) {
      auto a = actual.find(v);
      auto e = expected.find(v);
      std::optional<OutputCheck> check;
      if (a != actual.end() && e != expected.end()) check = compare_value(v, a->second, e->second.view(), applied);
      if (!check) {
        ++report.skipped;
        continue;
      }
      ++report.compared;
      if (check->passed) continue;
      // Named as the candidate's graph has it (a transformed copy may compute the value
      // with another op), with the reference's scope where the copy lost it.
      DivergencePoint p{n.scope, false, n.name, n.op_type, v, *check};
      if (auto c = candidate_producers.find(v); c != candidate_producers.end()) {
        p.node = c->second->name;
        p.op_type = c->second->op_type;
        if (!c->second->scope.empty()) p.module = c->second->scope;
      }
      p.location = p.module;  // node by node: the node itself is where it diverges
      p.suspects.push_back({p.node, p.op_type, p.module});
      report.first = std::move(p);
      return report;
    }
  }
  return report;
}

}  // namespace aitune
