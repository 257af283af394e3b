// Private: the ORT session options an OnnxSessionConfig makes (the provider's part from the registry).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>

#include "aitune/onnx_session.hpp"
#include "aitune/ort_runtime.hpp"
#include "ort/ort_api.hpp"
#include "providers/session_setup.hpp"

namespace aitune::detail {

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
