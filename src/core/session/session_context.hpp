// Private: what the runners of one ORT session share (the session, its device memory and stream, the model's I/O).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aitune/onnx_session.hpp"
#include "aitune/tensor.hpp"
#include "ort/ort_api.hpp"

namespace aitune::detail {

/// One live session and the facts every way of running it needs. Owned by the backend;
/// the runners keep a reference. `session` and the memory/stream fields are replaced
/// when the session is recreated (activate after deactivate); the I/O lists are not.
/// RunOptions whose run logs at FATAL only. A run that fails is an Error carrying ORT's
/// message, so ORT's own ERROR line on stderr (`[E:onnxruntime:, sequential_executor.cc ...
/// Non-zero status code returned while running ...`) only repeated it, in red, where a
/// caller may handle the failure: every candidate that fails while tuning printed one,
/// `disable_external_logging=True` or not, in a tune that then chose another candidate.
Ort::RunOptions quiet_run_options();

struct SessionContext {
  // Shared with every tensor ORT allocated for this session: device memory is returned
  // to the session's allocator, so the session must outlive those tensors.
  std::shared_ptr<Ort::Session> session;
  std::optional<Ort::MemoryInfo> owned_memory_info;
  const OrtMemoryInfo* memory_info = nullptr;  // where inputs live and outputs are allocated
  std::uintptr_t stream = 0;                    // see SessionSetup::stream
  bool stream_syncs_with_legacy = false;        // see SessionSetup::stream_syncs_with_legacy
  // Both log a failed run at FATAL only (quiet_run_options): the failure comes back to the
  // caller as an Error carrying ORT's message.
  Ort::RunOptions run_async{nullptr};           // disable_synchronize_execution_providers=1
  Ort::RunOptions run_default{nullptr};         // ORT's defaults: Run waits for the device
  Device device;
  std::string model_path;
  std::vector<IoInfo> inputs, outputs;               // model order
  std::vector<const char*> input_names, output_names;  // c_str()s of the above, for Run
  // Per output, the input whose buffer it is written into (-1: none; OnnxSession::output_aliases).
  std::vector<int> output_aliases;
  std::vector<bool> updated_in_place;  // per input: an output is written into it
  bool has_aliases = false;

  /// Whether a call from `caller` needs events to order the session's stream with it.
  bool needs_events(std::optional<std::uintptr_t> caller) const;
  /// Per output, ORT's value over the buffer of the input `views[output_aliases[i]]` it is
  /// written into, or an empty value where ORT allocates the output.
  std::vector<Ort::Value> aliased_outputs(const std::vector<TensorView>& views) const;
  /// A tensor over the caller's input an aliased output was written into: the caller
  /// owns that memory, so the tensor keeps nothing alive (valid while the input is).
  Tensor caller_buffer(const TensorView& input) const;
  /// Tensors owning ORT's output values (each keeps the session alive).
  std::vector<Tensor> adopt_outputs(std::vector<Ort::Value> values) const;
};

/// An ORT tensor over memory someone else owns (no copy).
Ort::Value value_over(const TensorView& v, const OrtMemoryInfo* mem);

}  // namespace aitune::detail
