// OnnxSession: the life cycle of one model's session, input checks, and the choice of runner per call.
#include "aitune/onnx_session.hpp"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <filesystem>
#include <mutex>
#include <set>
#include <shared_mutex>

#include "aitune/error.hpp"
#include "cuda/cuda_stream.hpp"
#include "aitune/in_place_outputs.hpp"
#include "aitune/dtype.hpp"
#include "aitune/onnx_nodes.hpp"
#include "aitune/onnx_value_info.hpp"
#include "session/accepted_shapes.hpp"
#include "session/cuda_graph_runner.hpp"
#include "session/spec_mismatch.hpp"
#include "base/enum_names.hpp"
#include "session/io_binding_runner.hpp"
#include "ort/ort_api.hpp"
#include "ort/ort_runtime_impl.hpp"
#include "session/deferred_release.hpp"
#include "session/session_context.hpp"
#include "providers/provider_registry.hpp"
#include "session/session_options.hpp"

namespace aitune {
namespace fs = std::filesystem;
using detail::ort_call;
using detail::value_over;

namespace {

constexpr detail::EnumNames<SessionState, 3> kStateNames{{
    {SessionState::kBuilt, "built"},
    {SessionState::kActive, "active"},
    {SessionState::kInactive, "inactive"},
}};

}  // namespace

std::string_view session_state_name(SessionState state) noexcept { return detail::enum_name(kStateNames, state, "built"); }

struct OnnxSession::Impl {
  std::shared_ptr<OrtRuntime> runtime;
  OnnxSessionConfig config;
  GraphSpec spec;
  detail::SessionContext ctx;  // the session and the model's I/O
  bool cuda_graph = false;     // enable_cuda_graph=1: calls go to `graphs`
  // The provider computes in device memory (its registry capability, read once here and
  // not per call: the registry lookup takes a lock).
  bool device_memory = false;
  // Made with each session and released before it: device calls without / with CUDA graphs.
  std::unique_ptr<detail::IoBindingRunner> bindings;
  std::unique_ptr<detail::CudaGraphRunner> graphs;
  SessionState state = SessionState::kBuilt;
  mutable std::shared_mutex state_mutex;  // infer: shared; activate/deactivate: exclusive
  mutable detail::AcceptedShapes accepted;  // shapes found to satisfy spec.conditions

  void create_session();
  void release_session();
  void check_inputs(const std::vector<TensorView>& inputs) const;
  void check_in_place_inputs(const std::vector<TensorView>& inputs) const;
  void check_batch_agrees(const std::vector<TensorView>& inputs) const;
  const std::string& model_path() const { return ctx.model_path; }
};

namespace {

// ONNX's TensorProto.DataType names (onnx.proto), for the element types aitune has no dtype
// for: "string (8)" says what "8" did not.
std::string onnx_type_name(int type) {
  static const char* const names[] = {"undefined", "float", "uint8", "int8", "uint16", "int16", "int32",
                                      "int64", "string", "bool", "float16", "double", "uint32", "uint64",
                                      "complex64", "complex128", "bfloat16", "float8e4m3fn", "float8e4m3fnuz",
                                      "float8e5m2", "float8e5m2fnuz", "uint4", "int4", "float4e2m1",
                                      "float8e8m0", "uint2", "int2"};
  const std::string number = std::to_string(type);
  if (type < 0 || type >= static_cast<int>(sizeof names / sizeof names[0])) return number;
  return std::string(names[type]) + " (" + number + ")";
}

std::vector<IoInfo> read_io(const Ort::Session& session, bool inputs, const std::string& model_path,
                            const std::set<std::string>& without_rank) {
  std::vector<IoInfo> out;
  Ort::AllocatorWithDefaultOptions alloc;
  std::size_t n = inputs ? session.GetInputCount() : session.GetOutputCount();
  for (std::size_t i = 0; i < n; ++i) {
    IoInfo io;
    io.name = (inputs ? session.GetInputNameAllocated(i, alloc) : session.GetOutputNameAllocated(i, alloc)).get();
    auto type_info = inputs ? session.GetInputTypeInfo(i) : session.GetOutputTypeInfo(i);
    if (type_info.GetONNXType() != ONNX_TYPE_TENSOR)
      throw Error(ErrorCode::kModelInvalid, "model '" + model_path + "': " + (inputs ? "input '" : "output '") +
                                                io.name + "' is not a tensor; aitune handles tensor graphs only");
    auto tensor_info = type_info.GetTensorTypeAndShapeInfo();
    auto dtype = dtype_from_onnx(static_cast<int>(tensor_info.GetElementType()));
    // A valid graph aitune cannot run (uint16, string), not an invalid one: kUnsupportedDType.
    if (!dtype)
      throw Error(ErrorCode::kUnsupportedDType, "model '" + model_path + "': " + (inputs ? "input '" : "output '") +
                                                io.name + "' has ONNX element type " +
                                                onnx_type_name(static_cast<int>(tensor_info.GetElementType())) +
                                                ", which aitune does not handle");
    io.dtype = *dtype;
    io.shape = tensor_info.GetShape();
    std::vector<const char*> symbolic(io.shape.size(), nullptr);
    tensor_info.GetSymbolicDimensions(symbolic.data(), symbolic.size());
    for (auto* s : symbolic) io.symbolic_dims.emplace_back(s ? s : "");
    // ORT reads a value declared without a shape as rank 0: a scalar spec refused the
    // user's real tensor ("expected rank 0") and random inputs were made as scalars.
    io.rank_known = !without_rank.count(io.name);
    if (inputs && !io.rank_known)
      throw Error(ErrorCode::kModelInvalid,
                  "model '" + model_path + "': input '" + io.name + "' declares no shape, so its rank is unknown; aitune "
                  "checks every call against each input's rank: declare it (onnx.tools.update_model_dims."
                  "update_inputs_outputs_dims(model, {'" + io.name + "': ['batch', ...]}, {}), or export with input shapes)");
    out.push_back(std::move(io));
  }
  return out;
}

// "a, b, c" from the names of a list of IoInfo or TensorSpec, for error messages.
template <typename List>
std::string join_names(const List& list) {
  std::string out;
  for (const auto& item : list) out += (out.empty() ? "" : ", ") + item.name;
  return out;
}

// The spec implied by the model alone: declared extents fixed, the others unbounded.
std::vector<TensorSpec> specs_from_io(const std::vector<IoInfo>& ios) {
  std::vector<TensorSpec> specs;
  for (const auto& io : ios) {
    TensorSpec s{io.name, io.dtype, io.shape, io.shape, std::nullopt};
    for (std::size_t i = 0; i < io.shape.size(); ++i)
      if (io.shape[i] < 0) {
        s.min_shape[i] = 1;
        s.max_shape[i] = kUnbounded;
      }
    specs.push_back(std::move(s));
  }
  return specs;
}

// An output extent that no input's shape decides (Range's length, NonZero's count, a Loop's
// trip count: the model declares it with a symbol no input has, or none) is made by the
// recorded samples' values: it stays free in a session's spec, and so in the checkpoints
// and Triton configs written from it, instead of fixed at the one value the samples happened
// to give (`dims: [5]` in a config whose model returns 3 for n = 3; a probe).
void free_value_decided_extents(GraphSpec& spec, const std::vector<IoInfo>& inputs,
                                const std::vector<IoInfo>& outputs) {
  std::set<std::string> input_symbols;
  for (const auto& io : inputs)
    for (const auto& symbol : io.symbolic_dims)
      if (!symbol.empty()) input_symbols.insert(symbol);
  for (std::size_t j = 0; j < spec.outputs.size() && j < outputs.size(); ++j) {
    const IoInfo& declared = outputs[j];
    TensorSpec& s = spec.outputs[j];
    if (!declared.rank_known || declared.shape.size() != s.rank()) continue;  // nothing declared to go by
    for (std::size_t axis = 0; axis < s.rank(); ++axis) {
      const std::string symbol = axis < declared.symbolic_dims.size() ? declared.symbolic_dims[axis] : "";
      if (declared.shape[axis] >= 0 || input_symbols.count(symbol) || s.batch_axis == static_cast<int>(axis)) continue;
      s.min_shape[axis] = 0;
      s.max_shape[axis] = kUnbounded;
    }
  }
}

// Puts a caller's spec in model order, after checking it describes this model.
std::vector<TensorSpec> align_spec(const std::vector<TensorSpec>& given, const std::vector<IoInfo>& ios,
                                   const char* what, const std::string& model_path) {
  const std::string expected = join_names(ios);
  if (given.size() != ios.size())
    throw SpecMismatchError("graph spec has " + std::to_string(given.size()) + " " + what +
                                                 "s but model '" + model_path + "' has " +
                                                 std::to_string(ios.size()) + " (" + expected + ")");
  std::vector<TensorSpec> aligned;
  for (const auto& io : ios) {
    auto it = std::find_if(given.begin(), given.end(), [&](const TensorSpec& s) { return s.name == io.name; });
    if (it == given.end())
      throw SpecMismatchError(std::string("graph spec has no ") + what + " named '" + io.name +
                                                   "' (model '" + model_path + "' has " + expected + ")");
    if (it->dtype != io.dtype)
      throw SpecMismatchError(std::string("graph spec ") + what + " '" + io.name + "' is " +
                                                 std::string(dtype_name(it->dtype)) + " but the model declares " +
                                                 std::string(dtype_name(io.dtype)));
    if (it->rank() != io.shape.size())
      throw SpecMismatchError(std::string("graph spec ") + what + " '" + io.name + "' has rank " +
                                                 std::to_string(it->rank()) + " but the model declares " +
                                                 shape_to_string(io.shape));
    aligned.push_back(*it);
  }
  return aligned;
}

// The session's allocator of `memory` (a reference to it that outlives the session), or
// null where the session has none (a CPU session, a provider without pinned memory).
std::shared_ptr<Ort::Allocator> session_allocator(const Ort::Session& session, const OrtMemoryInfo* memory) {
  if (memory == nullptr) return nullptr;
  try {
    return std::make_shared<Ort::Allocator>(session, memory);
  } catch (const Ort::Exception&) {
    return nullptr;  // "no requested allocator available": nothing to hold
  }
}

}  // namespace

namespace {

// ORT's refusal of a node it has no kernel for ("Could not find an implementation for
// Gemm(13) node with name 'node_linear'", ORT_NOT_IMPLEMENTED) says neither the dtype nor
// what to do. Where the node takes a float that is not float32 (the model runs in bfloat16,
// float16 or float64: the CPU provider has no double Erf, so a float64 GELU fails) this is
// the message of Error(kUnsupportedDType): the provider, the operator, the dtype (read from
// the model's declared value types) and the user's ways out; nullopt otherwise (ORT's own
// message stands).
std::optional<std::string> missing_kernel_for_dtype(const Ort::Exception& e, const std::string& model_path,
                                                    ExecutionProvider provider) {
  const std::string text = e.what();
  // The text after `opening` (searched from `from`) up to the next `close`, or nullopt.
  auto between = [&](const std::string& opening, char close, std::size_t from) -> std::optional<std::string> {
    const auto at = text.find(opening, from);
    if (at == std::string::npos) return std::nullopt;
    const auto begin = at + opening.size();
    return text.substr(begin, text.find(close, begin) - begin);
  };
  std::optional<std::string> found_op, found_opset, found_node;
  const std::string lead = "Could not find an implementation for ";
  if (const auto at = text.find(lead); e.GetOrtErrorCode() == ORT_NOT_IMPLEMENTED && at != std::string::npos) {
    found_op = between(lead, '(', at);
    found_opset = between(*found_op + "(", ')', at);
    found_node = between("node with name '", '\'', at);
    if (!found_opset || !found_node) return std::nullopt;
  } else if (const auto typed = text.find("Type Error: Type "); typed != std::string::npos) {
    // The other form, at load: the operator's schema takes no such type ("Type Error: Type
    // 'tensor(bfloat16)' of input parameter (x) of operator (Conv) in node (node_conv2d) is
    // invalid": ONNX's Conv has no bfloat16).
    found_op = between("of operator (", ')', typed);
    found_node = between("in node (", ')', typed);
    if (!found_op || !found_node) return std::nullopt;
  } else {
    return std::nullopt;
  }
  const std::string op = *found_op, opset = found_opset.value_or(""), node_name = *found_node;
  std::optional<DType> odd_float;
  // Whether a graph input or initializer (a value no node produces) is of that dtype: if
  // none is, the model's weights and inputs are of another dtype and its own code casts to
  // it (Falcon's ALiBi, computed in bfloat16 in a float32 model), so module.float() does
  // not help.
  bool dtype_given = false;
  try {
    const auto types = onnx_value_element_types(model_path);
    const auto nodes = onnx_graph_nodes(model_path);
    // The node ORT names; an unnamed one (the tracer leaves some unnamed: "node with name ''")
    // is each unnamed node of that operator.
    for (const auto& node : nodes) {
      if (node.name != node_name || (node_name.empty() && node.op_type != op)) continue;
      for (const auto& input : node.inputs) {
        const auto type = types.find(input);
        if (type == types.end()) continue;
        const auto dtype = dtype_from_onnx(type->second);
        if (dtype == DType::kBFloat16 || dtype == DType::kFloat16 || dtype == DType::kFloat64) odd_float = dtype;
      }
      if (odd_float || !node_name.empty()) break;
    }
    std::set<std::string> produced;
    for (const auto& node : nodes) produced.insert(node.outputs.begin(), node.outputs.end());
    if (!odd_float && node_name.empty()) {
      // Not in the file: a node ORT made expanding a function (Gelu into Erf). The model's
      // own floats say the dtype when they are all of one that is not float32.
      std::set<DType> given;
      for (const auto& [name, type] : types) {
        const auto dtype = dtype_from_onnx(type);
        if (!produced.count(name) && dtype && dtype_is_floating(*dtype)) given.insert(*dtype);
      }
      if (given.size() == 1 && *given.begin() != DType::kFloat32) odd_float = *given.begin();
    }
    if (odd_float)
      for (const auto& [name, type] : types)
        if (!produced.count(name) && dtype_from_onnx(type) == *odd_float) dtype_given = true;
  } catch (const Error&) {
    return std::nullopt;  // the model cannot be read here: ORT's message stands
  }
  if (!odd_float) return std::nullopt;
  const std::string dtype(dtype_name(*odd_float));
  const std::string prefix = "ONNX Runtime's " + std::string(execution_provider_ort_name(provider)) + " has no " +
                             dtype + " kernel for " + op + " (" + (opset.empty() ? "" : "opset " + opset + ", ") +
                             (node_name.empty() ? std::string("an unnamed node") : "node '" + node_name + "'") + ")";
  if (!dtype_given) {
    return prefix + ": the model's code casts to " + dtype + " before this node (none of its weights or inputs is " +
           dtype + ", so module.float() does not change it), and this provider runs " + dtype +
           " for few operators; tune with the torch.compile backend (TorchCompileBackend), or on the CUDA provider" +
           " (ONNX Runtime: " + text + ")";
  }
  const std::string ways =
      *odd_float == DType::kBFloat16
          ? "tune the module in float32 (module.float()), in float16 on the CUDA provider, or with the "
            "torch.compile backend (TorchCompileBackend), which runs bfloat16 on the CPU"
      : *odd_float == DType::kFloat64
          ? "tune the module in float32 (module.float()) or with the torch.compile backend (TorchCompileBackend), "
            "which runs float64"
          : "tune the module in float32 (module.float()), on the CUDA provider, or with the torch.compile backend "
            "(TorchCompileBackend)";
  return prefix + ": the model computes in " + dtype + ", which this provider runs for few operators; " + ways +
         " (ONNX Runtime: " + text + ")";
}

// ORT's refusal of a model newer than it reads ("Unsupported model IR version: 14, max
// supported IR version: 13", after its source path and function signature): the versions,
// and the user's ways out; nullopt for any other error.
std::optional<std::string> newer_ir_version(const Ort::Exception& e, const std::string& ort_version) {
  const std::string text = e.what();
  const std::string lead = "Unsupported model IR version: ", most = "max supported IR version: ";
  const auto at = text.find(lead), max_at = text.find(most);
  if (at == std::string::npos || max_at == std::string::npos) return std::nullopt;
  auto number = [&](std::size_t from) {
    std::size_t end = from;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    return text.substr(from, end - from);
  };
  const std::string version = number(at + lead.size()), max = number(max_at + most.size());
  if (version.empty() || max.empty()) return std::nullopt;
  return "the model's ONNX IR version is " + version + ", and ONNX Runtime " + ort_version + " reads IR version " +
         max + " at most; save it for an older IR (model.ir_version = " + max +
         " before onnx.save, where its opsets allow) or use a newer ONNX Runtime";
}

}  // namespace

void OnnxSession::Impl::create_session() {
  release_session();
  detail::session_releases().retry();  // sessions whose stream could not drain when released
  auto setup = detail::make_session_setup(*runtime, config);
  auto& rt = detail::runtime_impl(*runtime);
  // A graph session is created with CPU fallback disabled, so ORT refuses a model with a
  // node off the CUDA provider (or with control flow) here, before any capture; ORT says
  // so with ORT_FAIL, which ort_call turns into the fallback code.
  const ErrorCode failure = setup.cuda_graph ? ErrorCode::kCudaGraphCapture : ErrorCode::kModelInvalid;
  const std::string context =
      setup.cuda_graph ? "model '" + model_path() +
                             "' cannot run as a CUDA graph (enable_cuda_graph=1: every node must run on the CUDA "
                             "provider, CPU fallback is disabled)"
                       : "cannot load model '" + model_path() + "'";
  // The stream is released after the session (the deleter owns it): tensors handed out
  // keep the session, and so its stream, alive.
  ctx.session = ort_call(failure, context, [&] {
    std::unique_ptr<Ort::Session> session;
    try {
      session = std::make_unique<Ort::Session>(*rt.env, model_path().c_str(), setup.options);
    } catch (const Ort::Exception& e) {
      if (auto why = missing_kernel_for_dtype(e, model_path(), config.provider))
        throw Error(ErrorCode::kUnsupportedDType, context + ": " + *why);
      if (auto why = newer_ir_version(e, runtime->version()))
        throw Error(ErrorCode::kModelInvalid, context + ": " + *why);
      throw;
    }
    detail::count_session_created();
    return std::shared_ptr<Ort::Session>(session.release(), [owned = setup.owned_stream, stream = setup.stream,
                                                             pinned = setup.pinned_memory_info](Ort::Session* s) {
      // Destroyed once its stream has drained (host functions the CUDA provider queued
      // there return pinned buffers to the session's arena; see deferred_release.hpp).
      detail::session_releases().release(stream, [s, owned, stream, pinned]() mutable {
        // The session's pinned allocator is held past the session: host functions its
        // destruction queues hold that arena too, and must not be its last owner.
        std::shared_ptr<Ort::Allocator> pinned_arena = session_allocator(*s, pinned);
        delete s;
        detail::count_session_released();
        // Then the allocator and the stream, once the stream has drained again (now, or
        // parked until it can be waited for).
        detail::session_releases().release(stream, [pinned_arena, owned]() mutable {
          pinned_arena.reset();
          owned.reset();
        });
      });
    });
  });
  ctx.owned_memory_info = std::move(setup.owned_memory_info);
  ctx.memory_info = ctx.owned_memory_info ? static_cast<const OrtMemoryInfo*>(*ctx.owned_memory_info) : setup.memory_info;
  ctx.stream = setup.stream;
  ctx.stream_syncs_with_legacy = setup.stream_syncs_with_legacy;
  ctx.device = config.device();
  ctx.run_default = detail::quiet_run_options();
  ctx.run_async = detail::quiet_run_options();
  ctx.run_async.AddConfigEntry("disable_synchronize_execution_providers", "1");
  cuda_graph = setup.cuda_graph;
  if (device_memory) {
    if (cuda_graph) graphs = std::make_unique<detail::CudaGraphRunner>(ctx);
    else bindings = std::make_unique<detail::IoBindingRunner>(ctx);
  }
}

void OnnxSession::Impl::release_session() {
  // Runners first: their bindings refer to the session.
  bindings.reset();
  graphs.reset();
  ctx.session.reset();
  ctx.memory_info = nullptr;
  ctx.owned_memory_info.reset();
  ctx.stream = 0;
  ctx.stream_syncs_with_legacy = false;
}

OnnxSession::OnnxSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OnnxSession::~OnnxSession() = default;

void OnnxSession::check_config(const OnnxSessionConfig& config) {
  if (config.device_id < 0)
    throw Error(ErrorCode::kInvalidArgument, "device_id must be >= 0, got " + std::to_string(config.device_id));
  const auto& provider = provider_description(config.provider);  // unknown providers: kInvalidArgument
  if (!provider.capabilities.cuda_graph && config.provider_options.count("enable_cuda_graph"))
    throw Error(ErrorCode::kInvalidArgument, std::string("provider option enable_cuda_graph is for the CUDA "
                                                         "execution provider, not ") +
                                                 std::string(execution_provider_name(config.provider)));
  if (provider.validate_options) provider.validate_options(config);
  detail::check_cuda_graph_config(config);
  detail::check_thread_counts(config);
}

std::unique_ptr<OnnxSession> OnnxSession::create(const std::string& model_path,
                                                               const OnnxSessionConfig& config,
                                                               const std::optional<GraphSpec>& spec,
                                                               std::shared_ptr<OrtRuntime> runtime) {
  std::error_code ec;
  if (fs::is_directory(model_path, ec))
    throw Error(ErrorCode::kModelInvalid, "model path '" + model_path + "' is a directory, not an .onnx file");
  if (!fs::exists(model_path, ec))
    throw Error(ErrorCode::kModelInvalid, "model file not found: '" + model_path + "'");
  if (!fs::is_regular_file(model_path, ec))  // /dev/null, a FIFO: no model to read, and it exists
    throw Error(ErrorCode::kModelInvalid,
                "model path '" + model_path + "' is not a regular file (a device, FIFO or socket): not an .onnx file");
  // ORT calls an empty file an invalid argument; it is a model that is not one.
  if (fs::file_size(model_path, ec) == 0 && !ec)
    throw Error(ErrorCode::kModelInvalid, "model file '" + model_path + "' is empty (0 bytes): not an ONNX model");
  check_config(config);  // before the runtime loads
  const auto& provider = provider_description(config.provider);
  // The runtime before the session's state: Impl holds ONNX Runtime objects whose
  // destructors call its API, so an Impl destroyed by a runtime that failed to load called
  // an API never set up (a segfault where the error belonged).
  if (!runtime) runtime = OrtRuntime::load();
  auto impl = std::make_unique<Impl>();
  impl->runtime = std::move(runtime);
  impl->ctx.model_path = model_path;
  impl->config = config;
  impl->device_memory = provider.capabilities.device_memory;
  impl->create_session();
  auto& ctx = impl->ctx;
  const auto without_rank = onnx_values_without_rank(model_path);
  ctx.inputs = ort_call(ErrorCode::kModelInvalid, "model '" + model_path + "'",
                        [&] { return read_io(*ctx.session, true, model_path, without_rank); });
  ctx.outputs = ort_call(ErrorCode::kModelInvalid, "model '" + model_path + "'",
                         [&] { return read_io(*ctx.session, false, model_path, without_rank); });
  if (spec) {
    impl->spec.inputs = align_spec(spec->inputs, ctx.inputs, "input", model_path);
    impl->spec.outputs = align_spec(spec->outputs, ctx.outputs, "output", model_path);
    free_value_decided_extents(impl->spec, ctx.inputs, ctx.outputs);
    impl->spec.batch_sizes = spec->batch_sizes;
    for (const auto& condition : spec->conditions)
      for (const auto& name : condition.inputs())
        if (!impl->spec.find_input(name))
          throw Error(ErrorCode::kInvalidArgument, "graph spec condition `" + condition.to_string() + "` reads input '" +
                                                       name + "', which model '" + model_path + "' does not take");
    impl->spec.conditions = spec->conditions;
  } else {
    impl->spec.inputs = specs_from_io(ctx.inputs);
    impl->spec.outputs = specs_from_io(ctx.outputs);
  }
  auto aliases = config.output_aliases;
  if (config.in_place_outputs)  // a declared alias of the same output wins over a found one
    for (auto& [output, input] : find_in_place_outputs(onnx_graph_nodes(model_path), ctx.inputs, ctx.outputs))
      aliases.emplace(output, input);
  ctx.output_aliases = output_alias_indices(aliases, ctx.inputs, ctx.outputs, model_path);
  ctx.has_aliases = !aliases.empty();
  ctx.updated_in_place.assign(ctx.inputs.size(), false);
  for (const int input : ctx.output_aliases)
    if (input >= 0) ctx.updated_in_place[static_cast<std::size_t>(input)] = true;
  for (const auto& io : ctx.inputs) ctx.input_names.push_back(io.name.c_str());
  for (const auto& io : ctx.outputs) ctx.output_names.push_back(io.name.c_str());
  return std::unique_ptr<OnnxSession>(new OnnxSession(std::move(impl)));
}

const std::vector<IoInfo>& OnnxSession::inputs() const noexcept { return impl_->ctx.inputs; }
const std::vector<IoInfo>& OnnxSession::outputs() const noexcept { return impl_->ctx.outputs; }
const GraphSpec& OnnxSession::graph_spec() const noexcept { return impl_->spec; }
void OnnxSession::set_batch_rows(BatchRows rows, std::string reason) {
  impl_->spec.batch_rows = rows;
  impl_->spec.batch_rows_reason = std::move(reason);
}
const OnnxSessionConfig& OnnxSession::config() const noexcept { return impl_->config; }
const std::string& OnnxSession::model_path() const noexcept { return impl_->ctx.model_path; }
const std::vector<int>& OnnxSession::output_aliases() const noexcept { return impl_->ctx.output_aliases; }
Device OnnxSession::device() const noexcept { return impl_->ctx.device; }

SessionState OnnxSession::state() const noexcept {
  std::shared_lock lock(impl_->state_mutex);
  return impl_->state;
}

int OnnxSession::opset() const {
  std::shared_lock lock(impl_->state_mutex);
  if (!impl_->ctx.session) throw Error(ErrorCode::kState, "session is inactive; call activate() first");
  return ort_call(ErrorCode::kModelInvalid, "opset of '" + impl_->model_path() + "'",
                  [&] { return impl_->ctx.session->GetOpset(""); });
}

void OnnxSession::activate() {
  std::unique_lock lock(impl_->state_mutex);
  if (!impl_->ctx.session) impl_->create_session();
  impl_->state = SessionState::kActive;
}

void OnnxSession::deactivate() {
  std::unique_lock lock(impl_->state_mutex);
  impl_->release_session();
  impl_->state = SessionState::kInactive;
}

void OnnxSession::Impl::check_inputs(const std::vector<TensorView>& views) const {
  if (views.size() != spec.inputs.size())
    throw Error(ErrorCode::kInvalidArgument, "model '" + model_path() + "' takes " + std::to_string(spec.inputs.size()) +
                                                 " input(s) (" + join_names(spec.inputs) + "), got " +
                                                 std::to_string(views.size()));
  const Device device = ctx.device;  // config.device(), kept at creation (no registry lookup per call)
  for (std::size_t i = 0; i < views.size(); ++i) {
    const auto& v = views[i];
    const auto& s = spec.inputs[i];
    // Built only when a check fails: this runs on every call.
    auto who = [&] { return "input '" + s.name + "'"; };
    if (v.dtype != s.dtype)
      throw Error(ErrorCode::kDTypeMismatch, who() + ": expected dtype " + std::string(dtype_name(s.dtype)) + ", got " +
                                                 std::string(dtype_name(v.dtype)));
    if (v.shape.size() != s.rank())
      throw Error(ErrorCode::kShapeMismatch, who() + ": expected rank " + std::to_string(s.rank()) + " (" +
                                                 s.to_string() + "), got rank " + std::to_string(v.shape.size()) +
                                                 " " + shape_to_string(v.shape));
    if (v.numel() == 0) {
      // A graph whose declared extent is 0 takes nothing else: say so, not "expected" it.
      const bool only_empty = std::any_of(s.max_shape.begin(), s.max_shape.end(), [](int64_t d) { return d == 0; });
      throw Error(ErrorCode::kShapeMismatch,
                  who() + ": empty tensor " + shape_to_string(v.shape) + "; aitune runs no tensor of 0 elements" +
                      (only_empty ? " and the model declares " + s.to_string() + ", an extent fixed at 0, so it takes no other"
                                  : " (the graph takes " + s.to_string() + ")"));
    }
    if (!s.accepts(v.shape))
      throw Error(ErrorCode::kShapeMismatch, who() + ": shape " + shape_to_string(v.shape) +
                                                 " is outside the graph spec " + s.to_string());
    if (!v.is_contiguous())
      throw Error(ErrorCode::kInvalidArgument, who() + ": tensor is not contiguous (shape " + shape_to_string(v.shape) +
                                                   ", strides " + shape_to_string(v.strides) +
                                                   "); make it contiguous first");
    if (!(v.device == device))
      throw Error(ErrorCode::kInvalidArgument, who() + ": tensor is on " + v.device.to_string() + " but the " +
                                                   std::string(execution_provider_name(config.provider)) +
                                                   " session runs on " + device.to_string());
    if (v.data == nullptr) throw Error(ErrorCode::kInvalidArgument, who() + ": null data pointer");
  }
  check_batch_agrees(views);
  if (!spec.conditions.empty()) {
    std::vector<const Shape*> shapes;  // by reference: this runs per call
    shapes.reserve(views.size());
    for (const auto& v : views) shapes.push_back(&v.shape);
    if (!accepted.contains(ShapeRefs(shapes))) {
      spec.check_conditions(ShapeRefs(shapes));
      accepted.add(ShapeRefs(shapes));
    }
  }
  if (ctx.has_aliases) check_in_place_inputs(views);
}

void OnnxSession::Impl::check_batch_agrees(const std::vector<TensorView>& views) const {
  // Every batch axis had the call's batch size in every recorded call, and the export made
  // them one dimension (dynamo's shared Dim, the trace's one example): inputs whose batch
  // extents disagree (3 prompts with 1 image) are outside what the graph computes, which
  // ONNX Runtime may answer with another model's numbers (broadcasting a batch of 1) or an
  // error from deep inside a node.
  std::optional<std::size_t> first;
  for (std::size_t i = 0; i < views.size(); ++i) {
    const auto& axis = spec.inputs[i].batch_axis;
    if (!axis) continue;
    if (!first) {
      first = i;
      continue;
    }
    const auto& f = spec.inputs[*first];
    const int64_t a = views[*first].shape[static_cast<std::size_t>(*f.batch_axis)];
    const int64_t b = views[i].shape[static_cast<std::size_t>(*axis)];
    if (a != b)
      throw Error(ErrorCode::kShapeMismatch,
                  "inputs '" + f.name + "' " + shape_to_string(views[*first].shape) + " and '" + spec.inputs[i].name +
                      "' " + shape_to_string(views[i].shape) + " disagree on the batch: " + std::to_string(a) +
                      " and " + std::to_string(b) + "; the graph was recorded and exported with one batch size for "
                      "both (axis " + std::to_string(*f.batch_axis) + " and axis " + std::to_string(*axis) + ")");
  }
}

void OnnxSession::Impl::check_in_place_inputs(const std::vector<TensorView>& views) const {
  // An input updated in place that shares memory with another input (one cache passed as
  // both keys and values) would be read after another output was written over it.
  auto overlap = [](const TensorView& a, const TensorView& b) {
    const auto* a0 = static_cast<const std::byte*>(a.data);
    const auto* b0 = static_cast<const std::byte*>(b.data);
    return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
  };
  for (std::size_t o = 0; o < ctx.output_aliases.size(); ++o) {
    const int k = ctx.output_aliases[o];
    if (k < 0) continue;
    for (std::size_t m = 0; m < views.size(); ++m)
      if (m != static_cast<std::size_t>(k) && overlap(views[static_cast<std::size_t>(k)], views[m]))
        throw Error(ErrorCode::kInvalidArgument, "input '" + ctx.inputs[static_cast<std::size_t>(k)].name +
                                                     "' is updated in place (output '" + ctx.outputs[o].name +
                                                     "' is written into it) and shares memory with input '" +
                                                     ctx.inputs[m].name + "'; pass separate tensors");
  }
}

std::vector<Tensor> OnnxSession::infer(const std::vector<TensorView>& views) const {
  return run(views, std::nullopt);
}

std::vector<Tensor> OnnxSession::infer_on_stream(const std::vector<TensorView>& views,
                                                        std::uintptr_t stream) const {
  return run(views, stream);
}

std::uintptr_t OnnxSession::cuda_stream() const noexcept {
  std::shared_lock lock(impl_->state_mutex);
  return impl_->ctx.stream;
}

std::vector<Tensor> OnnxSession::run(const std::vector<TensorView>& views,
                                            std::optional<std::uintptr_t> caller) const {
  std::shared_lock lock(impl_->state_mutex);
  auto& ctx = impl_->ctx;
  if (!ctx.session) throw Error(ErrorCode::kState, "session for '" + ctx.model_path + "' is inactive; call activate()");
  impl_->check_inputs(views);
  auto where = [&] { return "running '" + ctx.model_path + "'"; };
  if (!impl_->device_memory) {
    // Host memory needs no binding plans: a plain Run over the caller's buffers is
    // cheaper per call than an IoBinding (measured: ~5 us of 20 on a small MLP).
    return ort_call(ErrorCode::kInternal, where, [&] {
      std::vector<Ort::Value> values;
      values.reserve(views.size());
      for (const auto& v : views) values.push_back(value_over(v, ctx.memory_info));
      // Outputs written into an input (output_aliases) are given over that input's
      // buffer; ORT allocates the others (empty values).
      auto outputs = ctx.aliased_outputs(views);
      ctx.session->Run(ctx.run_default, ctx.input_names.data(), values.data(), values.size(),
                       ctx.output_names.data(), outputs.data(), outputs.size());
      return ctx.adopt_outputs(std::move(outputs));
    });
  }
  return ort_call(ErrorCode::kInternal, where, [&] {
    return impl_->cuda_graph ? impl_->graphs->run(views, caller) : impl_->bindings->run(views, caller);
  });
}

std::vector<Tensor> OnnxSession::infer_named(const std::map<std::string, TensorView>& named) const {
  std::vector<TensorView> ordered;
  for (const auto& [name, view] : named)
    if (std::none_of(impl_->ctx.inputs.begin(), impl_->ctx.inputs.end(), [&](const IoInfo& io) { return io.name == name; }))
      throw Error(ErrorCode::kInvalidArgument, "unknown input '" + name + "'; model '" + impl_->model_path() +
                                                   "' takes: " + join_names(impl_->ctx.inputs));
  for (const auto& io : impl_->ctx.inputs) {
    auto it = named.find(io.name);
    if (it == named.end())
      throw Error(ErrorCode::kInvalidArgument, "missing input '" + io.name + "'; model '" + impl_->model_path() +
                                                   "' takes: " + join_names(impl_->ctx.inputs));
    ordered.push_back(it->second);
  }
  return infer(ordered);
}


namespace {

// Owner of a tensor made with the session's allocator: members are destroyed in reverse
// order, so the value is released before the allocator and the session it came from.
struct AllocatedTensor {
  std::shared_ptr<Ort::Session> session;
  std::unique_ptr<Ort::Allocator> allocator;
  Ort::Value value{nullptr};
};

// Copies `from` into `to` (same dtype and shape) through ORT's data transfer, without a
// stream: done when it returns.
void copy_tensor(Ort::Env& env, const TensorView& from, const OrtMemoryInfo* from_mem, const TensorView& to,
                 const OrtMemoryInfo* to_mem) {
  std::vector<Ort::Value> src, dst;
  src.push_back(value_over(from, from_mem));
  dst.push_back(value_over(to, to_mem));
  Ort::Status st = env.CopyTensors(src, dst, nullptr);
  if (!st.IsOK()) throw Ort::Exception(st.GetErrorMessage(), st.GetErrorCode());
}

}  // namespace

Tensor OnnxSession::to_device(const Tensor& host) const {
  if (host.device().kind != DeviceKind::kCPU)
    throw Error(ErrorCode::kInvalidArgument, "to_device: tensor is on " + host.device().to_string() + ", not the host");
  if (!impl_->device_memory) return host;
  std::shared_lock lock(impl_->state_mutex);
  if (!impl_->ctx.session) throw Error(ErrorCode::kState, "session is inactive; call activate()");
  // ORT's data transfer comes with the CUDA plugin EP; register it for TensorRT sessions too.
  const auto& devices = detail::runtime_impl(*impl_->runtime).cuda_ep_devices();
  auto& env = *detail::runtime_impl(*impl_->runtime).env;
  return ort_call(ErrorCode::kInternal, "copying a tensor to " + device().to_string(), [&] {
    auto mem = devices.at(impl_->config.device_id).GetMemoryInfo(OrtDeviceMemoryType_DEFAULT);
    auto cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
    Tensor device_tensor;
    if (impl_->cuda_graph) {
      // Not from the arena (see stream_buffer_tensor); the allocation is ordered on the
      // session's stream, which the runner syncs under its lock (no wait inside a capture).
      device_tensor = impl_->graphs->ready_buffer(host.dtype(), host.shape());
    } else {
      auto owner = std::make_shared<AllocatedTensor>();
      owner->session = impl_->ctx.session;
      owner->allocator = std::make_unique<Ort::Allocator>(*impl_->ctx.session, mem);
      owner->value = Ort::Value::CreateTensor(*owner->allocator, host.shape().data(), host.shape().size(),
                                              static_cast<ONNXTensorElementDataType>(dtype_to_onnx(host.dtype())));
      TensorView view{owner->value.GetTensorMutableRawData(), host.dtype(), host.shape(), {}, device()};
      device_tensor = Tensor::adopt(std::move(view), owner);
    }
    copy_tensor(env, host.view(), cpu, device_tensor.view(), mem);
    return device_tensor;
  });
}

Tensor OnnxSession::to_host(const Tensor& tensor) const {
  if (tensor.device().kind == DeviceKind::kCPU) return tensor;
  const auto& devices = detail::runtime_impl(*impl_->runtime).cuda_ep_devices();
  auto& env = *detail::runtime_impl(*impl_->runtime).env;
  Tensor host = Tensor::empty_host(tensor.dtype(), tensor.shape());
  ort_call(ErrorCode::kInternal, "copying a tensor from " + tensor.device().to_string(), [&] {
    auto mem = devices.at(tensor.device().index).GetMemoryInfo(OrtDeviceMemoryType_DEFAULT);
    auto cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
    copy_tensor(env, tensor.view(), mem, host.view(), cpu);
  });
  return host;
}

}  // namespace aitune
