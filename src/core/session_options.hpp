// Private: the ORT session options an OnnxSessionConfig makes, per provider (CPU, CUDA plugin EP, TensorRT).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>

#include "aitune/onnx_session.hpp"
#include "aitune/ort_runtime.hpp"
#include "cuda_stream.hpp"
#include "ort_api.hpp"

namespace aitune::detail {

/// Everything session creation needs besides the model, and what the runners need to
/// know about where the session computes.
struct SessionSetup {
  Ort::SessionOptions options;
  /// Where inputs must live and outputs are allocated: the session's device. Points into
  /// `owned_memory_info` or into the runtime's CUDA EP device (which outlives sessions).
  std::optional<Ort::MemoryInfo> owned_memory_info;
  const OrtMemoryInfo* memory_info = nullptr;
  /// The CUDA stream the session runs on (user_compute_stream): `owned_stream`'s, or the
  /// caller's. 0 where unknown (CPU, TensorRT).
  std::uintptr_t stream = 0;
  /// The stream aitune created for the session; the session's deleter takes it over so
  /// that it is destroyed after the session.
  std::shared_ptr<CudaStream> owned_stream;
  /// True when `stream` is aitune's own blocking stream (StreamSync::kWithLegacyStream):
  /// CUDA itself orders it with a caller on the legacy default stream, so no events.
  bool stream_syncs_with_legacy = false;
  /// enable_cuda_graph is on (CUDA only).
  bool cuda_graph = false;
  /// Strings the V1 TensorRT struct points into; alive until the session is created.
  std::list<std::string> keep_alive;
};

/// Builds the session options for `config` (threads, optimisation level, session config
/// entries, the provider and its options). Throws Error(kInvalidArgument) for options
/// the provider does not take or thread counts out of range, Error(kProviderUnavailable)
/// when the provider cannot be used here.
SessionSetup make_session_setup(OrtRuntime& runtime, const OnnxSessionConfig& config);

/// Error(kInvalidArgument) naming the field when intra_op_threads or inter_op_threads is
/// outside 0..kMaxSessionThreads (session_limits.hpp). make_session_setup calls it first.
void check_thread_counts(const OnnxSessionConfig& config);

/// The session config key (kOrtSessionOptionsDisableCPUEPFallback) that makes session
/// creation fail when a node would fall back to the CPU provider.
inline constexpr const char* kDisableCpuEpFallback = "session.disable_cpu_ep_fallback";

/// For enable_cuda_graph=1: Error(kInvalidArgument) when the session config would let
/// nodes fall back to the CPU (kDisableCpuEpFallback set to anything but "1"). Checked
/// before any session is created; make_session_setup sets the key itself.
void check_cuda_graph_config(const OnnxSessionConfig& config);

/// True when provider option `key` is set to something other than "0" / "false".
bool provider_option_on(const OnnxSessionConfig& config, const char* key);

}  // namespace aitune::detail
