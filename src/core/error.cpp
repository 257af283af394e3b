// Names of error codes.
#include "aitune/error.hpp"

namespace aitune {

std::string_view error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kShapeMismatch: return "shape_mismatch";
    case ErrorCode::kDTypeMismatch: return "dtype_mismatch";
    case ErrorCode::kProviderUnavailable: return "provider_unavailable";
    case ErrorCode::kModelInvalid: return "model_invalid";
    case ErrorCode::kCheckpointCorrupt: return "checkpoint_corrupt";
    case ErrorCode::kState: return "state";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kInternal: return "internal";
  }
  return "internal";
}

}  // namespace aitune
