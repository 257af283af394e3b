// OnnxSession: one ONNX model in one ORT session, run on host or device memory
// (IOBinding on CUDA, a plain Run over the caller's buffers on the CPU), inputs validated
// against the graph spec; CUDA sessions run on a stream of their own and can be ordered
// with a caller's stream, and replay CUDA graphs with enable_cuda_graph=1.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aitune/device.hpp"
#include "aitune/execution_provider.hpp"
#include "aitune/graph_spec.hpp"
#include "aitune/ort_runtime.hpp"
#include "aitune/tensor.hpp"

namespace aitune {

/// ORT's graph optimisation levels (GraphOptimizationLevel).
enum class GraphOptimizationLevel { kDisableAll, kBasic, kExtended, kAll };

std::string_view graph_optimization_level_name(GraphOptimizationLevel level) noexcept;
/// Parses "disable_all" / "basic" / "extended" / "all"; Error(kInvalidArgument) otherwise.
GraphOptimizationLevel parse_graph_optimization_level(std::string_view text);

/// How a session is created. Value type.
struct OnnxSessionConfig {
  ExecutionProvider provider = ExecutionProvider::kCUDA;  ///< the default of the AITune ONNX Runtime backend guide
  int device_id = 0;
  GraphOptimizationLevel graph_optimization_level = GraphOptimizationLevel::kAll;
  int intra_op_threads = 0;  ///< 0 = ORT's default
  int inter_op_threads = 0;  ///< 0 = ORT's default
  /// Provider options as ORT spells them (CUDA: "use_tf32", "cudnn_conv_algo_search",
  /// "enable_cuda_graph", ...; TensorRT: "trt_fp16_enable", ...). Unknown keys are
  /// rejected by ORT at session creation. CUDA sessions get "user_compute_stream" (a
  /// stream aitune creates per session) and "has_user_compute_stream" unless given here.
  std::map<std::string, std::string> provider_options;
  /// Session config entries (AddConfigEntry), e.g. "session.disable_prepacking".
  std::map<std::string, std::string> session_config;
  /// Write each output that updates an input (find_in_place_outputs: a ScatterND of an
  /// input nothing else reads, a decode step's KV cache) into that input's buffer: the
  /// input is updated in place and the output is a view of it, so no copy of it is made
  /// per call. The caller must expect its input to change (the decode contract).
  bool in_place_outputs = false;
  /// Outputs the caller declares written into an input's buffer, output name -> input
  /// name, as found ones are (e.g. a GroupQueryAttention's present into its past, which
  /// ONNX Runtime shares when the two are one buffer). Checked at session creation.
  std::map<std::string, std::string> output_aliases;

  /// The device the session's inputs and outputs live on.
  Device device() const;
  std::string to_json(int indent = 2) const;
  static OnnxSessionConfig from_json(const std::string& text);
  bool operator==(const OnnxSessionConfig&) const = default;
};

/// One graph input or output as the ONNX model declares it.
struct IoInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;                           ///< -1 where the extent is symbolic or unknown
  std::vector<std::string> symbolic_dims;  ///< per axis; "" where not symbolic
  /// False where the model declares no shape at all (an output only: a session refuses an
  /// input whose rank is unknown); `shape` is then empty without meaning a scalar.
  bool rank_known = true;
};

/// Life cycle: `create` builds the session (kBuilt); `activate` marks it the one in use
/// (kActive); `deactivate` releases the session and its device memory (kInactive);
/// `activate` on an inactive session recreates the session. `infer` works in kBuilt and
/// kActive and throws Error(kState) in kInactive.
enum class SessionState { kBuilt, kActive, kInactive };
std::string_view session_state_name(SessionState state) noexcept;

/// An ORT session over one model file. `infer` is safe to call from several threads
/// at once (each call has its own IOBinding or Run; CUDA-graph calls take turns); state
/// changes must not race with `infer`.
///
/// CUDA graphs (provider option enable_cuda_graph=1, CUDA only): each distinct set of
/// input shapes (up to 8; further shapes run without a graph) gets fixed device buffers
/// and its own captured graph, recorded on its first call. Each call copies the inputs
/// into those buffers and the outputs out of them on the session's stream, so outputs
/// handed out are never overwritten by a later replay. Capture is safe by construction:
/// the session is created with session.disable_cpu_ep_fallback=1, so a model with a node
/// the CUDA provider cannot place (or with control flow) is refused at creation with
/// Error(kCudaGraphCapture) naming why; inputs and outputs are bound to device buffers
/// only. A capture or replay that fails throws Error(kCudaGraphCapture) (kOutOfMemory
/// when memory ran out), leaves no capture open on the session's stream, and every later
/// call throws Error(kCudaGraphCapture) until deactivate() and activate() recreate the
/// session. Inputs updated in place (output_aliases()) are not copied: the graph binds the
/// caller's buffer, and its address is part of what selects the captured graph (a loop
/// passing back the same cache replays one graph; unverified on a GPU so far).
class OnnxSession {
 public:
  /// The checks `create` makes of `config` before it reads a model: the device id, the
  /// provider's options, CUDA graph settings and thread counts. Error(kInvalidArgument)
  /// naming what is wrong (a caller that makes many sessions checks once, up front).
  static void check_config(const OnnxSessionConfig& config);

  /// Loads `model_path` (external data files next to it) into a session for
  /// `config.provider`. `spec` bounds what inputs `infer` accepts; without it the
  /// model's declared shapes do (symbolic dims unbounded). Throws
  /// Error(kModelInvalid) for a missing or corrupt model, Error(kProviderUnavailable)
  /// with the reason when the provider cannot be used, Error(kInvalidArgument) for a
  /// spec that does not match the model's inputs, Error(kCudaGraphCapture) for a model
  /// that cannot be captured with enable_cuda_graph=1, Error(kInvalidArgument) when
  /// enable_cuda_graph=1 comes with session.disable_cpu_ep_fallback other than "1".
  static std::unique_ptr<OnnxSession> create(const std::string& model_path,
                                                    const OnnxSessionConfig& config,
                                                    const std::optional<GraphSpec>& spec = std::nullopt,
                                                    std::shared_ptr<OrtRuntime> runtime = nullptr);

  ~OnnxSession();
  OnnxSession(const OnnxSession&) = delete;
  OnnxSession& operator=(const OnnxSession&) = delete;

  const std::vector<IoInfo>& inputs() const noexcept;
  const std::vector<IoInfo>& outputs() const noexcept;
  /// The spec `infer` validates against (given, or derived from the model).
  const GraphSpec& graph_spec() const noexcept;
  /// Records what the tuner found of the batch rows (GraphSpec::batch_rows) in the spec a
  /// checkpoint saves; the checks `infer` makes do not read it.
  void set_batch_rows(BatchRows rows, std::string reason);
  const OnnxSessionConfig& config() const noexcept;
  const std::string& model_path() const noexcept;
  Device device() const noexcept;
  SessionState state() const noexcept;
  /// Per output, the index of the input whose buffer it is written into (-1: none): the
  /// declared OnnxSessionConfig::output_aliases and, with in_place_outputs, those found
  /// in the graph. Such an output is a view of that input, valid while the input is.
  const std::vector<int>& output_aliases() const noexcept;
  /// Default-domain ONNX opset of the model.
  int opset() const;

  void activate();
  void deactivate();

  /// Runs the model. `inputs` are in the order of `inputs()`. Each is checked before
  /// anything runs: dtype, rank, extents within the spec, non-empty, contiguous, on the
  /// session's device; a violation throws Error(kDTypeMismatch / kShapeMismatch /
  /// kInvalidArgument) naming the input with expected vs actual. Inputs are bound
  /// without copies and must stay alive until `infer` returns. Outputs are allocated by
  /// ORT on the session's device and returned in the order of `outputs()`; each owns
  /// its ORT value. With CUDA graphs (enable_cuda_graph=1) inputs are copied into the
  /// graph's fixed buffers, and the outputs are one of two fixed output buffers of that
  /// shape, handed over without a copy and written again only once every output of that
  /// call is released; while both are held, outputs are copies. The inputs must be ready
  /// when `infer` is called (no pending device work on them); on return the outputs are
  /// ready to read (the host waits for the session's stream). An output written into an
  /// input's buffer (output_aliases()) is a view of that input, updated in place; such an
  /// input must not share memory with any other input (Error(kInvalidArgument)).
  std::vector<Tensor> infer(const std::vector<TensorView>& inputs) const;

  /// As `infer`, ordered with the caller's CUDA stream `stream` (a cudaStream_t as an
  /// integer; 0 is the legacy default stream) without host waits: the run starts after
  /// the work queued on `stream` so far (e.g. what produces the inputs), and work queued
  /// on `stream` afterwards sees the outputs. CUDA events order the two, except for the
  /// legacy stream, which CUDA itself orders with the session's own stream (a blocking
  /// one). So while a CUDA-graph session captures (the first calls of an input shape),
  /// other threads must not use the legacy stream. Returns without waiting for the
  /// device. Inputs and outputs follow the stream rules of CUDA caching allocators: used
  /// on `stream` only, they need nothing more. TensorRT sessions (ORT's own stream) wait
  /// on the host for `stream` first. On the CPU it is `infer`.
  std::vector<Tensor> infer_on_stream(const std::vector<TensorView>& inputs, std::uintptr_t stream) const;

  /// The CUDA stream the session runs on (cudaStream_t as an integer), for device timing;
  /// 0 for CPU and TensorRT sessions.
  std::uintptr_t cuda_stream() const noexcept;

  /// As `infer`, inputs by name. Missing and unknown names throw Error(kInvalidArgument)
  /// listing the expected names.
  std::vector<Tensor> infer_named(const std::map<std::string, TensorView>& inputs) const;

  /// Copies a host tensor to this session's device through ORT's data transfer (for
  /// callers without a CUDA runtime of their own, e.g. the CLI). Returns `host` itself
  /// when the session runs on the CPU.
  Tensor to_device(const Tensor& host) const;
  /// Copies a tensor on this session's device to host memory.
  Tensor to_host(const Tensor& tensor) const;

  struct Impl;

 private:
  explicit OnnxSession(std::unique_ptr<Impl> impl);
  std::vector<Tensor> run(const std::vector<TensorView>& inputs, std::optional<std::uintptr_t> caller) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace aitune
