// aitune::Error: the one exception type of the engine, carrying an ErrorCode.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace aitune {

/// What went wrong, coarse enough for the edges (Python exceptions, CLI exit codes)
/// to translate without parsing messages.
enum class ErrorCode {
  kInvalidArgument,      ///< a caller passed a value that is not allowed
  kShapeMismatch,        ///< a tensor's rank or shape is outside what the graph accepts
  kDTypeMismatch,        ///< a tensor's element type differs from the graph's
  kProviderUnavailable,  ///< an execution provider (or ORT itself) cannot be loaded
  kModelInvalid,         ///< a model file is missing, unreadable or rejected by ORT
  kCheckpointCorrupt,    ///< a checkpoint fails its integrity checks
  kState,                ///< the object is in a state where the call is not allowed
  kIo,                   ///< a file could not be read or written
  kInternal,             ///< an unexpected failure inside ORT or aitune
  kOutOfMemory,          ///< host or device memory ran out (ORT's allocator, CUDA, std::bad_alloc)
  kCudaGraphCapture,     ///< a model cannot be captured as a CUDA graph, or a capture/replay failed
  kBackendUnavailable,   ///< a saved graph's backend cannot run in this engine (torch.compile needs Python)
  kUnsupportedDType,     ///< the execution provider has no kernel for an operator at the model's dtype (bf16 on CPU)
};

/// Stable lower-case name of a code ("invalid_argument", ...), used in JSON and logs.
std::string_view error_code_name(ErrorCode code) noexcept;
/// The code `error_code_name` names, or nullopt for another name.
std::optional<ErrorCode> error_code_from_name(std::string_view name) noexcept;

/// The exception thrown by every aitune API. `what()` is a complete, human-readable
/// sentence naming the object at fault (input name, path, provider) with expected vs
/// actual values where they apply.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace aitune
