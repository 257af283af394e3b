// OnnxRuntimeBackend: session creation per provider, input validation, IOBinding runs,
// ordering with a caller's CUDA stream, CUDA-graph replays.
#include "aitune/onnx_runtime_backend.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <mutex>
#include <shared_mutex>

#include "aitune/cuda_timer.hpp"
#include "aitune/error.hpp"
#include "cuda_runtime.hpp"
#include "ort_api.hpp"
#include "ort_runtime_impl.hpp"

namespace aitune {
namespace fs = std::filesystem;
using detail::ort_call;

// ---- names and config ----

std::string_view graph_optimization_level_name(GraphOptimizationLevel level) noexcept {
  switch (level) {
    case GraphOptimizationLevel::kDisableAll: return "disable_all";
    case GraphOptimizationLevel::kBasic: return "basic";
    case GraphOptimizationLevel::kExtended: return "extended";
    case GraphOptimizationLevel::kAll: return "all";
  }
  return "all";
}

GraphOptimizationLevel parse_graph_optimization_level(std::string_view text) {
  for (auto level : {GraphOptimizationLevel::kDisableAll, GraphOptimizationLevel::kBasic,
                     GraphOptimizationLevel::kExtended, GraphOptimizationLevel::kAll})
    if (graph_optimization_level_name(level) == text) return level;
  throw Error(ErrorCode::kInvalidArgument, "unknown graph optimization level '" + std::string(text) +
                                               "'; valid values: disable_all, basic, extended, all");
}

std::string_view backend_state_name(BackendState state) noexcept {
  switch (state) {
    case BackendState::kBuilt: return "built";
    case BackendState::kActive: return "active";
    case BackendState::kInactive: return "inactive";
  }
  return "built";
}

Device OnnxRuntimeBackendConfig::device() const {
  return provider == ExecutionProvider::kCPU ? Device::cpu() : Device::cuda(device_id);
}

std::string OnnxRuntimeBackendConfig::to_json(int indent) const {
  nlohmann::json j{{"provider", execution_provider_name(provider)},
                   {"device_id", device_id},
                   {"graph_optimization_level", graph_optimization_level_name(graph_optimization_level)},
                   {"intra_op_threads", intra_op_threads},
                   {"inter_op_threads", inter_op_threads},
                   {"provider_options", provider_options},
                   {"session_config", session_config}};
  return j.dump(indent);
}

OnnxRuntimeBackendConfig OnnxRuntimeBackendConfig::from_json(const std::string& text) {
  OnnxRuntimeBackendConfig c;
  try {
    auto j = nlohmann::json::parse(text);
    c.provider = parse_execution_provider(j.at("provider").get<std::string>());
    c.device_id = j.value("device_id", 0);
    c.graph_optimization_level = parse_graph_optimization_level(j.value("graph_optimization_level", "all"));
    c.intra_op_threads = j.value("intra_op_threads", 0);
    c.inter_op_threads = j.value("inter_op_threads", 0);
    c.provider_options = j.value("provider_options", std::map<std::string, std::string>{});
    c.session_config = j.value("session_config", std::map<std::string, std::string>{});
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, std::string("backend config JSON is malformed: ") + e.what());
  }
  return c;
}

// ---- implementation ----

// A CUDA event for ordering one stream after another (timing disabled: cheaper).
class StreamEvent {
 public:
  StreamEvent() : rt_(detail::require_cuda_runtime("ordering with the caller's CUDA stream")) {
    detail::cuda_check(rt_.event_create_with_flags(&event_, detail::kCudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  ~StreamEvent() { rt_.event_destroy(event_); }
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  /// Work queued on `waiter` from now on runs after all work queued on `producer` so far;
  /// the host does not wait.
  void order(std::uintptr_t producer, std::uintptr_t waiter) {
    detail::cuda_check(rt_.event_record(event_, reinterpret_cast<detail::cudaStream_t>(producer)), "cudaEventRecord");
    detail::cuda_check(rt_.stream_wait_event(reinterpret_cast<detail::cudaStream_t>(waiter), event_, 0),
                       "cudaStreamWaitEvent");
  }

 private:
  const detail::CudaRuntime& rt_;
  detail::cudaEvent_t event_ = nullptr;
};

struct OnnxRuntimeBackend::Impl {
  std::shared_ptr<OrtRuntime> runtime;
  std::string model_path;
  OnnxRuntimeBackendConfig config;
  std::vector<IoInfo> inputs, outputs;
  GraphSpec spec;
  std::vector<std::string> input_names_storage;  // c_str()s bound by name
  std::vector<const char*> input_name_ptrs, output_name_ptrs;  // for Session::Run
  // Shared with every tensor ORT allocated for this session: device memory is returned
  // to the session's allocator, so the session must outlive those tensors.
  std::shared_ptr<Ort::Session> session;
  // Where inputs must live and outputs are allocated: the session's device.
  std::optional<Ort::MemoryInfo> owned_memory_info;
  const OrtMemoryInfo* memory_info = nullptr;
  // The CUDA stream the session runs on (user_compute_stream): aitune's own, created
  // with the session and destroyed after it, or the caller's. 0 where unknown (TensorRT).
  std::uintptr_t stream = 0;
  // True when `stream` is aitune's own blocking stream (StreamSync::kWithLegacyStream):
  // CUDA itself orders it with a caller on the legacy default stream, so no events.
  bool stream_syncs_with_legacy = false;
  Ort::RunOptions run_async{nullptr};  // disable_synchronize_execution_providers=1
  const Ort::RunOptions run_default{nullptr};  // ORT's defaults: Run waits for the device
  BackendState state = BackendState::kBuilt;
  // IoBindings reused across calls: ORT plans device copies per binding, and a fresh
  // binding per call costs that planning every time. One per concurrent caller.
  std::mutex pool_mutex;
  struct PooledBinding {
    explicit PooledBinding(Ort::Session& session) : binding(session) {}
    Ort::IoBinding binding;
    // What each input was last bound to: a call with the same pointer, dtype and shape
    // skips re-binding it (the common case of a caller reusing its input buffers).
    std::vector<TensorView> last_inputs;
    std::vector<Ort::Value> input_values;
    std::unique_ptr<StreamEvent> before, after;  // ordering with the caller's stream
  };
  std::vector<std::unique_ptr<PooledBinding>> binding_pool;
  // CUDA graphs (provider option enable_cuda_graph=1): a captured graph replays fixed
  // device addresses, so each input shape gets a slot of lanes, each lane a graph of its
  // own (ORT graph id `id`) with fixed input buffers that calls copy into, all on the
  // session's stream, so no host wait orders them.
  bool cuda_graph = false;
  struct GraphLane {
    explicit GraphLane(Ort::Session& session) : binding(session) {}
    Ort::IoBinding binding;
    std::vector<Tensor> inputs;
    std::vector<Ort::Value> bound;  // ORT's views of `inputs` and `outputs`
    Ort::RunOptions run;
    // Lent lanes: outputs in buffers of their own (not the arena, see StreamBuffer) that
    // calls hand to the caller without a copy. The lane is free again once every tensor
    // of its last call is gone (`lease` expired); until then its graph does not replay.
    std::vector<Tensor> outputs;
    std::weak_ptr<void> lease;
  };
  struct GraphSlot {
    // Outputs bound once to ORT's allocation and copied out on every call: the first call
    // of a shape (which tells the output shapes) and calls made while every lent lane is held.
    std::unique_ptr<GraphLane> copy_lane;
    // Made on demand, up to kLentLanes: a caller that keeps the last output while making
    // the next call (`y = m(x)` in a loop) alternates between two.
    std::vector<std::unique_ptr<GraphLane>> lent_lanes;
    std::vector<Shape> output_shapes;  // known after the first call
    int first_graph_id = 0;
    StreamEvent before, after;
  };
  static constexpr std::size_t kLentLanes = 2;
  std::mutex graph_mutex;  // one graph call at a time: a lane's buffers are shared
  std::map<std::vector<Shape>, std::unique_ptr<GraphSlot>> graph_slots;
  // Shapes past this many run without a graph (gpu_graph_id -1): each captured graph
  // keeps its activations reserved.
  static constexpr std::size_t kMaxGraphShapes = 8;
  mutable std::shared_mutex state_mutex;  // infer: shared; activate/deactivate: exclusive


  void create_session();
  void check_inputs(const std::vector<TensorView>& inputs) const;
  std::vector<Tensor> adopt_outputs(std::vector<Ort::Value> values) const;
  std::vector<Tensor> run_device(const std::vector<TensorView>& views, std::optional<std::uintptr_t> caller);
  std::vector<Tensor> run_graph(const std::vector<TensorView>& views, std::optional<std::uintptr_t> caller);
  // A lane of `slot` for graph id `id`: input buffers shaped like `views`; outputs bound to
  // buffers of `output_shapes` (a lent lane) or, where that is empty, to ORT's allocation.
  std::unique_ptr<GraphLane> make_lane(const std::vector<TensorView>& views, int id,
                                       const std::vector<Shape>& output_shapes) const;
  // CUDA graphs: copies of `values` in stream-ordered memory (see StreamBuffer), on the
  // session's stream.
  std::vector<Tensor> copy_out(const std::vector<Ort::Value>& values) const;
  // Whether a call from `caller` needs events to order the session's stream with it.
  bool needs_events(std::optional<std::uintptr_t> caller) const;
};

namespace {

// Owner of a tensor ORT allocated: members are destroyed in reverse order, so the value
// is released before the allocator and the session it came from.
struct OrtTensorOwner {
  std::shared_ptr<Ort::Session> session;
  std::unique_ptr<Ort::Allocator> allocator;  // set where the value came from an explicit allocator
  Ort::Value value{nullptr};
};

// Device memory of a CUDA-graph session's outputs and to_device copies. Not from the
// session's arena: a captured graph keeps using the activations it was captured with,
// which the arena counts as free after the run, so arena memory handed out after capture
// is overwritten by later replays (seen on the H200: kept outputs changed). CUDA's
// stream-ordered allocator is separate; memory is freed on the session's stream, which
// waits for the caller's stream before each run reuses it.
struct StreamBuffer {
  void* data = nullptr;
  std::uintptr_t stream = 0;
  std::shared_ptr<Ort::Session> session;  // keeps the stream (owned by its deleter) alive
  ~StreamBuffer() {
    if (data) detail::cuda_runtime().free_async(data, reinterpret_cast<detail::cudaStream_t>(stream));
  }
};

Tensor stream_buffer_tensor(DType dtype, const Shape& shape, Device device, std::uintptr_t stream,
                            std::shared_ptr<Ort::Session> session) {
  const auto& rt = detail::require_cuda_runtime("CUDA-graph outputs");
  static const bool pool_kept = [&] {
    // Keep freed memory in the pool across synchronisations instead of returning it to
    // the driver each time (the default threshold, 0): reallocation would cost every call.
    void* pool = nullptr;
    if (rt.device_get_default_mem_pool(&pool, device.index) != 0) return false;
    std::uint64_t threshold = std::uint64_t{1} << 30;
    return rt.mem_pool_set_attribute(pool, detail::kCudaMemPoolAttrReleaseThreshold, &threshold) == 0;
  }();
  static_cast<void>(pool_kept);
  auto owner = std::make_shared<StreamBuffer>();
  owner->stream = stream;
  owner->session = std::move(session);
  TensorView view{nullptr, dtype, shape, {}, device};
  detail::cuda_check(rt.malloc_async(&owner->data, std::max<std::size_t>(view.nbytes(), 1),
                                     reinterpret_cast<detail::cudaStream_t>(stream)),
                     "cudaMallocAsync");
  view.data = owner->data;
  return Tensor::adopt(std::move(view), std::move(owner));
}

// An ORT tensor over memory someone else owns (no copy).
Ort::Value value_over(const TensorView& v, const OrtMemoryInfo* mem) {
  return Ort::Value::CreateTensor(Ort::ConstMemoryInfo(mem), v.data, v.nbytes(), v.shape.data(), v.shape.size(),
                                  static_cast<ONNXTensorElementDataType>(dtype_to_onnx(v.dtype)));
}

::GraphOptimizationLevel to_ort(GraphOptimizationLevel level) {
  switch (level) {
    case GraphOptimizationLevel::kDisableAll: return ORT_DISABLE_ALL;
    case GraphOptimizationLevel::kBasic: return ORT_ENABLE_BASIC;
    case GraphOptimizationLevel::kExtended: return ORT_ENABLE_EXTENDED;
    case GraphOptimizationLevel::kAll: return ORT_ENABLE_ALL;
  }
  return ORT_ENABLE_ALL;
}

// The V1 TensorRT options struct holds only these; unknown keys are an error here
// rather than silently ignored.
void apply_tensorrt_option(OrtTensorRTProviderOptions& o, const std::string& key, const std::string& value,
                           std::vector<std::string>& keep_alive) {
  auto as_int = [&] {
    try {
      return std::stoi(value);
    } catch (...) {
      throw Error(ErrorCode::kInvalidArgument, "TensorRT option " + key + "='" + value + "' is not an integer");
    }
  };
  if (key == "trt_fp16_enable") o.trt_fp16_enable = as_int();
  else if (key == "trt_int8_enable") o.trt_int8_enable = as_int();
  else if (key == "trt_max_workspace_size") o.trt_max_workspace_size = static_cast<size_t>(std::stoull(value));
  else if (key == "trt_max_partition_iterations") o.trt_max_partition_iterations = as_int();
  else if (key == "trt_min_subgraph_size") o.trt_min_subgraph_size = as_int();
  else if (key == "trt_engine_cache_enable") o.trt_engine_cache_enable = as_int();
  else if (key == "trt_engine_cache_path") o.trt_engine_cache_path = keep_alive.emplace_back(value).c_str();
  else if (key == "trt_dump_subgraphs") o.trt_dump_subgraphs = as_int();
  else if (key == "trt_force_sequential_engine_build") o.trt_force_sequential_engine_build = as_int();
  else
    throw Error(ErrorCode::kInvalidArgument,
                "unsupported TensorRT option '" + key +
                    "' (this ONNX Runtime build cannot create TensorRT V2 options, so only the V1 "
                    "struct's fields are available); supported: trt_fp16_enable, trt_int8_enable, trt_max_workspace_size, "
                    "trt_max_partition_iterations, trt_min_subgraph_size, trt_engine_cache_enable, "
                    "trt_engine_cache_path, trt_dump_subgraphs, trt_force_sequential_engine_build");
}

std::vector<IoInfo> read_io(const Ort::Session& session, bool inputs, const std::string& model_path) {
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
    if (!dtype)
      throw Error(ErrorCode::kModelInvalid, "model '" + model_path + "': " + (inputs ? "input '" : "output '") +
                                                io.name + "' has ONNX element type " +
                                                std::to_string(tensor_info.GetElementType()) +
                                                ", which aitune does not handle");
    io.dtype = *dtype;
    io.shape = tensor_info.GetShape();
    std::vector<const char*> symbolic(io.shape.size(), nullptr);
    tensor_info.GetSymbolicDimensions(symbolic.data(), symbolic.size());
    for (auto* s : symbolic) io.symbolic_dims.emplace_back(s ? s : "");
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

// Puts a caller's spec in model order, after checking it describes this model.
std::vector<TensorSpec> align_spec(const std::vector<TensorSpec>& given, const std::vector<IoInfo>& ios,
                                   const char* what, const std::string& model_path) {
  const std::string expected = join_names(ios);
  if (given.size() != ios.size())
    throw Error(ErrorCode::kInvalidArgument, "graph spec has " + std::to_string(given.size()) + " " + what +
                                                 "s but model '" + model_path + "' has " +
                                                 std::to_string(ios.size()) + " (" + expected + ")");
  std::vector<TensorSpec> aligned;
  for (const auto& io : ios) {
    auto it = std::find_if(given.begin(), given.end(), [&](const TensorSpec& s) { return s.name == io.name; });
    if (it == given.end())
      throw Error(ErrorCode::kInvalidArgument, std::string("graph spec has no ") + what + " named '" + io.name +
                                                   "' (model '" + model_path + "' has " + expected + ")");
    if (it->dtype != io.dtype)
      throw Error(ErrorCode::kInvalidArgument, std::string("graph spec ") + what + " '" + io.name + "' is " +
                                                 std::string(dtype_name(it->dtype)) + " but the model declares " +
                                                 std::string(dtype_name(io.dtype)));
    if (it->rank() != io.shape.size())
      throw Error(ErrorCode::kInvalidArgument, std::string("graph spec ") + what + " '" + io.name + "' has rank " +
                                                 std::to_string(it->rank()) + " but the model declares " +
                                                 shape_to_string(io.shape));
    aligned.push_back(*it);
  }
  return aligned;
}

}  // namespace

void OnnxRuntimeBackend::Impl::create_session() {
  auto& rt = runtime->impl();
  Ort::SessionOptions so;
  so.SetGraphOptimizationLevel(to_ort(config.graph_optimization_level));
  if (config.intra_op_threads > 0) so.SetIntraOpNumThreads(config.intra_op_threads);
  if (config.inter_op_threads > 0) so.SetInterOpNumThreads(config.inter_op_threads);
  for (const auto& [k, v] : config.session_config)
    ort_call(ErrorCode::kInvalidArgument, "session config entry '" + k + "'", [&] { so.AddConfigEntry(k.c_str(), v.c_str()); });

  std::vector<std::string> keep_alive;
  keep_alive.reserve(config.provider_options.size());
  binding_pool.clear();
  graph_slots.clear();
  owned_memory_info.reset();
  memory_info = nullptr;
  stream = 0;
  stream_syncs_with_legacy = false;
  std::shared_ptr<CudaStream> owned_stream;  // handed to the session's deleter below
  auto option_on = [&](const char* key) {
    auto it = config.provider_options.find(key);
    return it != config.provider_options.end() && it->second != "0" && it->second != "false";
  };
  cuda_graph = config.provider == ExecutionProvider::kCUDA && option_on("enable_cuda_graph");
  switch (config.provider) {
    case ExecutionProvider::kCPU:
      if (!config.provider_options.empty())
        throw Error(ErrorCode::kInvalidArgument, "the CPU execution provider takes no provider options (got '" +
                                                     config.provider_options.begin()->first +
                                                     "'); use intra_op_threads / graph_optimization_level");
      owned_memory_info.emplace(Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault));
      memory_info = *owned_memory_info;
      break;
    case ExecutionProvider::kCUDA: {
      // Plugin-EP route: the only one in this ORT build that takes every CUDA option as a string.
      const auto& devices = rt.cuda_ep_devices();
      if (config.device_id < 0 || static_cast<std::size_t>(config.device_id) >= devices.size())
        throw Error(ErrorCode::kInvalidArgument, "device_id " + std::to_string(config.device_id) + " but " +
                                                     std::to_string(devices.size()) + " CUDA device(s) are present");
      const auto& device = devices[config.device_id];
      std::unordered_map<std::string, std::string> options(config.provider_options.begin(),
                                                           config.provider_options.end());
      // The session runs on a stream aitune knows, so calls can be ordered with the
      // caller's stream by events. Verified on an H200: this plugin route honours
      // user_compute_stream only together with has_user_compute_stream=1 (without it,
      // cuBLAS crashed in the first run).
      if (auto it = options.find("user_compute_stream"); it != options.end()) {
        try {
          stream = static_cast<std::uintptr_t>(std::stoull(it->second));
        } catch (const std::exception&) {
          throw Error(ErrorCode::kInvalidArgument,
                      "provider option user_compute_stream='" + it->second + "' is not a stream address");
        }
      } else {
        // Blocking: torch's default stream is the legacy stream, and calls from there are
        // then ordered by CUDA with no events (two record/wait pairs less per call).
        owned_stream = CudaStream::create(config.device_id, StreamSync::kWithLegacyStream);
        stream = owned_stream->handle();
        stream_syncs_with_legacy = true;
        options["user_compute_stream"] = std::to_string(stream);
      }
      options["has_user_compute_stream"] = "1";
      ort_call(ErrorCode::kInvalidArgument, "CUDA provider options",
               [&] { so.AppendExecutionProvider_V2(*rt.env, {device}, options); });
      memory_info = device.GetMemoryInfo(OrtDeviceMemoryType_DEFAULT);
      break;
    }
    case ExecutionProvider::kTensorRT: {
      auto status = runtime->provider_status(ExecutionProvider::kTensorRT);
      if (!status.available) throw Error(ErrorCode::kProviderUnavailable, status.reason);
      // The V2 options object takes every TensorRT option as a string (profiles, timing
      // cache, builder level); where this ORT build cannot create it, the V1 struct
      // takes the subset it has fields for and names any other option as unsupported.
      bool v2 = false;
      try {
        Ort::TensorRTProviderOptions options;
        std::unordered_map<std::string, std::string> all(config.provider_options.begin(),
                                                         config.provider_options.end());
        all["device_id"] = std::to_string(config.device_id);
        options.Update(all);
        so.AppendExecutionProvider_TensorRT_V2(*options);
        v2 = true;
      } catch (const Ort::Exception& e) {
        if (std::string(e.what()).find("not enabled in this build") == std::string::npos &&
            std::string(e.what()).find("not supported") == std::string::npos)
          throw Error(ErrorCode::kInvalidArgument, std::string("TensorRT provider options: ") + e.what());
      }
      if (!v2) {
        OrtTensorRTProviderOptions trt{};
        trt.device_id = config.device_id;
        trt.trt_max_partition_iterations = 1000;
        trt.trt_min_subgraph_size = 1;
        trt.trt_max_workspace_size = size_t{1} << 30;
        for (const auto& [k, v] : config.provider_options) apply_tensorrt_option(trt, k, v, keep_alive);
        ort_call(ErrorCode::kProviderUnavailable, "TensorRT execution provider",
                 [&] { so.AppendExecutionProvider_TensorRT(trt); });
      }
      OrtCUDAProviderOptions cuda{};  // fallback for nodes TensorRT does not take, as the reference does
      cuda.device_id = config.device_id;
      ort_call(ErrorCode::kProviderUnavailable, "CUDA fallback of the TensorRT execution provider",
               [&] { so.AppendExecutionProvider_CUDA(cuda); });
      owned_memory_info.emplace("Cuda", OrtDeviceAllocator, config.device_id, OrtMemTypeDefault);
      memory_info = *owned_memory_info;
      break;
    }
  }
  // The stream is released after the session (the deleter owns it): tensors handed out
  // keep the session, and so its stream, alive.
  session = ort_call(ErrorCode::kModelInvalid, "cannot load model '" + model_path + "'", [&] {
    return std::shared_ptr<Ort::Session>(new Ort::Session(*rt.env, model_path.c_str(), so),
                                         [owned_stream](Ort::Session* s) { delete s; });
  });
  run_async = Ort::RunOptions();
  run_async.AddConfigEntry("disable_synchronize_execution_providers", "1");
}

OnnxRuntimeBackend::OnnxRuntimeBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OnnxRuntimeBackend::~OnnxRuntimeBackend() = default;

std::unique_ptr<OnnxRuntimeBackend> OnnxRuntimeBackend::create(const std::string& model_path,
                                                               const OnnxRuntimeBackendConfig& config,
                                                               const std::optional<GraphSpec>& spec,
                                                               std::shared_ptr<OrtRuntime> runtime) {
  std::error_code ec;
  if (!fs::is_regular_file(model_path, ec))
    throw Error(ErrorCode::kModelInvalid, "model file not found: '" + model_path + "'");
  if (config.device_id < 0)
    throw Error(ErrorCode::kInvalidArgument, "device_id must be >= 0, got " + std::to_string(config.device_id));
  if (config.provider != ExecutionProvider::kCUDA && config.provider_options.count("enable_cuda_graph"))
    throw Error(ErrorCode::kInvalidArgument, std::string("provider option enable_cuda_graph is for the CUDA "
                                                         "execution provider, not ") +
                                                 std::string(execution_provider_name(config.provider)));
  auto impl = std::make_unique<Impl>();
  impl->runtime = runtime ? std::move(runtime) : OrtRuntime::load();
  impl->model_path = model_path;
  impl->config = config;
  impl->create_session();
  impl->inputs = ort_call(ErrorCode::kModelInvalid, "model '" + model_path + "'",
                          [&] { return read_io(*impl->session, true, model_path); });
  impl->outputs = ort_call(ErrorCode::kModelInvalid, "model '" + model_path + "'",
                           [&] { return read_io(*impl->session, false, model_path); });
  if (spec) {
    impl->spec.inputs = align_spec(spec->inputs, impl->inputs, "input", model_path);
    impl->spec.outputs = align_spec(spec->outputs, impl->outputs, "output", model_path);
    impl->spec.batch_sizes = spec->batch_sizes;
  } else {
    impl->spec.inputs = specs_from_io(impl->inputs);
    impl->spec.outputs = specs_from_io(impl->outputs);
  }
  for (const auto& io : impl->inputs) impl->input_names_storage.push_back(io.name);
  for (const auto& name : impl->input_names_storage) impl->input_name_ptrs.push_back(name.c_str());
  for (const auto& io : impl->outputs) impl->output_name_ptrs.push_back(io.name.c_str());
  return std::unique_ptr<OnnxRuntimeBackend>(new OnnxRuntimeBackend(std::move(impl)));
}

const std::vector<IoInfo>& OnnxRuntimeBackend::inputs() const noexcept { return impl_->inputs; }
const std::vector<IoInfo>& OnnxRuntimeBackend::outputs() const noexcept { return impl_->outputs; }
const GraphSpec& OnnxRuntimeBackend::graph_spec() const noexcept { return impl_->spec; }
const OnnxRuntimeBackendConfig& OnnxRuntimeBackend::config() const noexcept { return impl_->config; }
const std::string& OnnxRuntimeBackend::model_path() const noexcept { return impl_->model_path; }
Device OnnxRuntimeBackend::device() const noexcept { return impl_->config.device(); }

BackendState OnnxRuntimeBackend::state() const noexcept {
  std::shared_lock lock(impl_->state_mutex);
  return impl_->state;
}

int OnnxRuntimeBackend::opset() const {
  std::shared_lock lock(impl_->state_mutex);
  if (!impl_->session) throw Error(ErrorCode::kState, "backend is inactive; call activate() first");
  return ort_call(ErrorCode::kModelInvalid, "opset of '" + impl_->model_path + "'",
                  [&] { return impl_->session->GetOpset(""); });
}

void OnnxRuntimeBackend::activate() {
  std::unique_lock lock(impl_->state_mutex);
  if (!impl_->session) impl_->create_session();
  impl_->state = BackendState::kActive;
}

void OnnxRuntimeBackend::deactivate() {
  std::unique_lock lock(impl_->state_mutex);
  impl_->binding_pool.clear();
  impl_->graph_slots.clear();
  impl_->session.reset();
  impl_->state = BackendState::kInactive;
}

void OnnxRuntimeBackend::Impl::check_inputs(const std::vector<TensorView>& views) const {
  if (views.size() != spec.inputs.size())
    throw Error(ErrorCode::kInvalidArgument, "model '" + model_path + "' takes " + std::to_string(spec.inputs.size()) +
                                                 " input(s) (" + join_names(spec.inputs) + "), got " +
                                                 std::to_string(views.size()));
  const Device device = config.device();
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
    if (v.numel() == 0)
      throw Error(ErrorCode::kShapeMismatch, who() + ": empty tensor " + shape_to_string(v.shape) + " (expected " +
                                                 s.to_string() + ")");
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
}

std::vector<Tensor> OnnxRuntimeBackend::infer(const std::vector<TensorView>& views) const {
  return run(views, std::nullopt);
}

std::vector<Tensor> OnnxRuntimeBackend::infer_on_stream(const std::vector<TensorView>& views,
                                                        std::uintptr_t stream) const {
  return run(views, stream);
}

std::uintptr_t OnnxRuntimeBackend::cuda_stream() const noexcept {
  std::shared_lock lock(impl_->state_mutex);
  return impl_->stream;
}

std::vector<Tensor> OnnxRuntimeBackend::run(const std::vector<TensorView>& views,
                                            std::optional<std::uintptr_t> caller) const {
  std::shared_lock lock(impl_->state_mutex);
  if (!impl_->session) throw Error(ErrorCode::kState, "backend for '" + impl_->model_path + "' is inactive; call activate()");
  impl_->check_inputs(views);
  if (impl_->config.provider == ExecutionProvider::kCPU) {
    // Host memory needs no binding plans: a plain Run over the caller's buffers is
    // cheaper per call than an IoBinding (measured: ~5 us of 20 on a small MLP).
    return ort_call(ErrorCode::kInternal, [&] { return "running '" + impl_->model_path + "'"; }, [&] {
      std::vector<Ort::Value> values;
      values.reserve(views.size());
      for (const auto& v : views) values.push_back(value_over(v, impl_->memory_info));
      auto outputs = impl_->session->Run(Ort::RunOptions{nullptr}, impl_->input_name_ptrs.data(), values.data(),
                                         values.size(), impl_->output_name_ptrs.data(),
                                         impl_->output_name_ptrs.size());
      return impl_->adopt_outputs(std::move(outputs));
    });
  }
  return ort_call(ErrorCode::kInternal, [&] { return "running '" + impl_->model_path + "'"; }, [&] {
    return impl_->cuda_graph ? impl_->run_graph(views, caller) : impl_->run_device(views, caller);
  });
}

std::vector<Tensor> OnnxRuntimeBackend::Impl::run_device(const std::vector<TensorView>& views,
                                                         std::optional<std::uintptr_t> caller) {
  std::unique_ptr<PooledBinding> pooled;
  {
    std::lock_guard pool_lock(pool_mutex);
    if (!binding_pool.empty()) {
      pooled = std::move(binding_pool.back());
      binding_pool.pop_back();
    }
  }
  if (!pooled) {
    pooled = std::make_unique<PooledBinding>(*session);
    pooled->last_inputs.resize(views.size());
    pooled->input_values.resize(views.size());
  }
  Ort::IoBinding& binding = pooled->binding;
  Ort::ConstMemoryInfo mem(memory_info);
  for (std::size_t i = 0; i < views.size(); ++i) {
    const auto& v = views[i];
    auto& last = pooled->last_inputs[i];
    if (last.data == v.data && last.dtype == v.dtype && last.shape == v.shape) continue;
    pooled->input_values[i] = value_over(v, memory_info);
    binding.BindInput(input_names_storage[i].c_str(), pooled->input_values[i]);
    last = TensorView{v.data, v.dtype, v.shape, {}, v.device};
  }
  // Outputs are bound afresh each call, so ORT allocates new ones: tensors returned by
  // earlier calls stay the caller's.
  for (const auto& o : outputs) binding.BindOutput(o.name.c_str(), mem);
  const bool ordered = needs_events(caller);
  if (ordered) {
    if (!pooled->before) pooled->before = std::make_unique<StreamEvent>(), pooled->after = std::make_unique<StreamEvent>();
    pooled->before->order(*caller, stream);  // inputs the caller is still producing
  } else if (caller && stream == 0) {
    // A session on a stream of ORT's own (TensorRT): the host waits for the caller's work.
    const auto& rt = detail::require_cuda_runtime("ordering with the caller's CUDA stream");
    detail::cuda_check(rt.stream_synchronize(reinterpret_cast<detail::cudaStream_t>(*caller)), "cudaStreamSynchronize");
  }
  // Ordered calls return without waiting for the device: the caller's stream waits instead.
  session->Run(caller && stream != 0 ? run_async : run_default, binding);
  if (ordered) pooled->after->order(stream, *caller);
  auto values = binding.GetOutputValues();
  binding.ClearBoundOutputs();  // the outputs now belong to the caller alone
  {
    std::lock_guard pool_lock(pool_mutex);
    binding_pool.push_back(std::move(pooled));
  }
  return adopt_outputs(std::move(values));
}

bool OnnxRuntimeBackend::Impl::needs_events(std::optional<std::uintptr_t> caller) const {
  if (!caller || stream == 0 || *caller == stream) return false;
  // 0 and cudaStreamLegacy (1) name the legacy default stream.
  return !(stream_syncs_with_legacy && *caller <= 1);
}

std::vector<Tensor> OnnxRuntimeBackend::Impl::copy_out(const std::vector<Ort::Value>& values) const {
  const auto& rt = detail::cuda_runtime();
  auto on_stream = reinterpret_cast<detail::cudaStream_t>(stream);
  std::vector<Tensor> copies;
  copies.reserve(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    copies.push_back(stream_buffer_tensor(outputs[i].dtype, values[i].GetTensorTypeAndShapeInfo().GetShape(),
                                          config.device(), stream, session));
    detail::cuda_check(rt.memcpy_async(copies.back().data(), values[i].GetTensorRawData(), copies.back().nbytes(),
                                       detail::kCudaMemcpyDeviceToDevice, on_stream),
                       "copying a CUDA graph's output");
  }
  return copies;
}

std::unique_ptr<OnnxRuntimeBackend::Impl::GraphLane> OnnxRuntimeBackend::Impl::make_lane(
    const std::vector<TensorView>& views, int id, const std::vector<Shape>& output_shapes) const {
  auto lane = std::make_unique<GraphLane>(*session);
  for (std::size_t i = 0; i < views.size(); ++i) {
    lane->inputs.push_back(stream_buffer_tensor(views[i].dtype, views[i].shape, config.device(), stream, session));
    lane->bound.push_back(value_over(lane->inputs.back().view(), memory_info));
    lane->binding.BindInput(input_names_storage[i].c_str(), lane->bound.back());
  }
  // Bound once and never cleared: the captured graph writes there on every replay.
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (output_shapes.empty()) {
      lane->binding.BindOutput(outputs[i].name.c_str(), Ort::ConstMemoryInfo(memory_info));
      continue;
    }
    lane->outputs.push_back(stream_buffer_tensor(outputs[i].dtype, output_shapes[i], config.device(), stream, session));
    lane->bound.push_back(value_over(lane->outputs.back().view(), memory_info));
    lane->binding.BindOutput(outputs[i].name.c_str(), lane->bound.back());
  }
  lane->run = Ort::RunOptions();
  lane->run.AddConfigEntry("gpu_graph_id", std::to_string(id).c_str());
  lane->run.AddConfigEntry("disable_synchronize_execution_providers", "1");
  return lane;
}

std::vector<Tensor> OnnxRuntimeBackend::Impl::run_graph(const std::vector<TensorView>& views,
                                                        std::optional<std::uintptr_t> caller) {
  const auto& rt = detail::require_cuda_runtime("CUDA graphs");
  auto on_stream = reinterpret_cast<detail::cudaStream_t>(stream);
  const bool ordered = needs_events(caller);
  // Without a caller's stream the outputs are ready on return; with one, the caller orders.
  auto finish = [&](std::vector<Tensor> results, StreamEvent* after) {
    if (ordered) after->order(stream, *caller);
    if (!caller) detail::cuda_check(rt.stream_synchronize(on_stream), "cudaStreamSynchronize");
    return results;
  };
  std::vector<Shape> key;
  key.reserve(views.size());
  for (const auto& v : views) key.push_back(v.shape);
  std::lock_guard lock(graph_mutex);
  auto it = graph_slots.find(key);
  if (it == graph_slots.end()) {
    if (graph_slots.size() >= kMaxGraphShapes) {
      // Past the limit a new shape runs as a plain call. gpu_graph_id -1 tells ORT not to
      // capture it.
      Ort::IoBinding binding(*session);
      std::vector<Ort::Value> values;
      for (std::size_t i = 0; i < views.size(); ++i) {
        values.push_back(value_over(views[i], memory_info));
        binding.BindInput(input_names_storage[i].c_str(), values.back());
      }
      for (const auto& o : outputs) binding.BindOutput(o.name.c_str(), Ort::ConstMemoryInfo(memory_info));
      Ort::RunOptions run;
      run.AddConfigEntry("gpu_graph_id", "-1");
      StreamEvent before, after;
      if (ordered) before.order(*caller, stream);
      session->Run(run, binding);  // synchronises the session's stream
      // ORT allocated these in the arena, where captured graphs' activations may live.
      return finish(copy_out(binding.GetOutputValues()), &after);
    }
    auto slot = std::make_unique<GraphSlot>();
    // ORT graph ids start at 1 (0 is its default id, -1 means "do not capture").
    slot->first_graph_id = static_cast<int>(graph_slots.size() * (1 + kLentLanes)) + 1;
    slot->copy_lane = make_lane(views, slot->first_graph_id, {});
    it = graph_slots.emplace(key, std::move(slot)).first;
  }
  GraphSlot& slot = *it->second;
  GraphLane* lane = slot.copy_lane.get();
  if (!slot.output_shapes.empty()) {
    for (auto& lent : slot.lent_lanes)
      if (lent->lease.expired()) {
        lane = lent.get();
        break;
      }
    if (lane == slot.copy_lane.get() && slot.lent_lanes.size() < kLentLanes) {
      const int id = slot.first_graph_id + 1 + static_cast<int>(slot.lent_lanes.size());
      slot.lent_lanes.push_back(make_lane(views, id, slot.output_shapes));
      lane = slot.lent_lanes.back().get();
    }
  }
  if (ordered) slot.before.order(*caller, stream);
  for (std::size_t i = 0; i < views.size(); ++i)
    detail::cuda_check(rt.memcpy_async(lane->inputs[i].data(), views[i].data, views[i].nbytes(),
                                       detail::kCudaMemcpyDeviceToDevice, on_stream),
                       "copying an input into the CUDA graph's buffer");
  session->Run(lane->run, lane->binding);  // a lane's first call runs, then ORT captures
  if (lane == slot.copy_lane.get()) {
    // The copy lane's outputs are overwritten by its next replay: the caller gets copies.
    auto values = lane->binding.GetOutputValues();
    if (slot.output_shapes.empty())
      for (const auto& v : values) slot.output_shapes.push_back(v.GetTensorTypeAndShapeInfo().GetShape());
    return finish(copy_out(values), &slot.after);
  }
  // Every tensor handed out shares one lease, which also keeps the buffers alive should
  // the slot go first (deactivate).
  auto lease = std::make_shared<std::vector<Tensor>>(lane->outputs);
  lane->lease = lease;
  std::vector<Tensor> lent;
  lent.reserve(lane->outputs.size());
  for (const auto& o : lane->outputs) lent.push_back(Tensor::adopt(o.view(), lease));
  return finish(std::move(lent), &slot.after);
}

std::vector<Tensor> OnnxRuntimeBackend::Impl::adopt_outputs(std::vector<Ort::Value> values) const {
  std::vector<Tensor> result;
  result.reserve(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto owner = std::make_shared<OrtTensorOwner>();
    owner->session = session;
    owner->value = std::move(values[i]);
    auto info = owner->value.GetTensorTypeAndShapeInfo();
    TensorView view;
    view.dtype = outputs[i].dtype;
    view.shape = info.GetShape();
    view.device = config.device();
    view.data = owner->value.GetTensorMutableRawData();
    result.push_back(Tensor::adopt(std::move(view), std::move(owner)));
  }
  return result;
}

std::vector<Tensor> OnnxRuntimeBackend::infer_named(const std::map<std::string, TensorView>& named) const {
  std::vector<TensorView> ordered;
  for (const auto& [name, view] : named)
    if (std::none_of(impl_->inputs.begin(), impl_->inputs.end(), [&](const IoInfo& io) { return io.name == name; }))
      throw Error(ErrorCode::kInvalidArgument, "unknown input '" + name + "'; model '" + impl_->model_path +
                                                   "' takes: " + join_names(impl_->inputs));
  for (const auto& io : impl_->inputs) {
    auto it = named.find(io.name);
    if (it == named.end())
      throw Error(ErrorCode::kInvalidArgument, "missing input '" + io.name + "'; model '" + impl_->model_path +
                                                   "' takes: " + join_names(impl_->inputs));
    ordered.push_back(it->second);
  }
  return infer(ordered);
}


namespace {

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

Tensor OnnxRuntimeBackend::to_device(const Tensor& host) const {
  if (host.device().kind != DeviceKind::kCPU)
    throw Error(ErrorCode::kInvalidArgument, "to_device: tensor is on " + host.device().to_string() + ", not the host");
  if (impl_->config.provider == ExecutionProvider::kCPU) return host;
  std::shared_lock lock(impl_->state_mutex);
  if (!impl_->session) throw Error(ErrorCode::kState, "backend is inactive; call activate()");
  // ORT's data transfer comes with the CUDA plugin EP; register it for TensorRT sessions too.
  const auto& devices = impl_->runtime->impl().cuda_ep_devices();
  auto& env = *impl_->runtime->impl().env;
  return ort_call(ErrorCode::kInternal, "copying a tensor to " + device().to_string(), [&] {
    auto mem = devices.at(impl_->config.device_id).GetMemoryInfo(OrtDeviceMemoryType_DEFAULT);
    auto cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
    Tensor device_tensor;
    if (impl_->cuda_graph) {  // not from the arena: see StreamBuffer
      device_tensor = stream_buffer_tensor(host.dtype(), host.shape(), device(), impl_->stream, impl_->session);
      detail::cuda_check(detail::cuda_runtime().stream_synchronize(reinterpret_cast<detail::cudaStream_t>(impl_->stream)),
                         "cudaStreamSynchronize");  // the allocation is ordered on that stream
    } else {
      auto owner = std::make_shared<OrtTensorOwner>();
      owner->session = impl_->session;
      owner->allocator = std::make_unique<Ort::Allocator>(*impl_->session, mem);
      owner->value = Ort::Value::CreateTensor(*owner->allocator, host.shape().data(), host.shape().size(),
                                              static_cast<ONNXTensorElementDataType>(dtype_to_onnx(host.dtype())));
      TensorView view{owner->value.GetTensorMutableRawData(), host.dtype(), host.shape(), {}, device()};
      device_tensor = Tensor::adopt(std::move(view), owner);
    }
    copy_tensor(env, host.view(), cpu, device_tensor.view(), mem);
    return device_tensor;
  });
}

Tensor OnnxRuntimeBackend::to_host(const Tensor& tensor) const {
  if (tensor.device().kind == DeviceKind::kCPU) return tensor;
  const auto& devices = impl_->runtime->impl().cuda_ep_devices();
  auto& env = *impl_->runtime->impl().env;
  Tensor host = Tensor::empty_host(tensor.dtype(), tensor.shape());
  ort_call(ErrorCode::kInternal, "copying a tensor from " + tensor.device().to_string(), [&] {
    auto mem = devices.at(tensor.device().index).GetMemoryInfo(OrtDeviceMemoryType_DEFAULT);
    auto cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
    copy_tensor(env, tensor.view(), mem, host.view(), cpu);
  });
  return host;
}

}  // namespace aitune
