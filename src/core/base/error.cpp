// Names of error codes.
#include "aitune/error.hpp"

#include "base/enum_names.hpp"

namespace aitune {
namespace {

constexpr detail::EnumNames<ErrorCode, 13> kNames{{
    {ErrorCode::kInvalidArgument, "invalid_argument"},
    {ErrorCode::kShapeMismatch, "shape_mismatch"},
    {ErrorCode::kDTypeMismatch, "dtype_mismatch"},
    {ErrorCode::kProviderUnavailable, "provider_unavailable"},
    {ErrorCode::kModelInvalid, "model_invalid"},
    {ErrorCode::kCheckpointCorrupt, "checkpoint_corrupt"},
    {ErrorCode::kState, "state"},
    {ErrorCode::kIo, "io"},
    {ErrorCode::kInternal, "internal"},
    {ErrorCode::kOutOfMemory, "out_of_memory"},
    {ErrorCode::kCudaGraphCapture, "cuda_graph_capture"},
    {ErrorCode::kBackendUnavailable, "backend_unavailable"},
    {ErrorCode::kUnsupportedDType, "unsupported_dtype"},
}};

}  // namespace

std::string_view error_code_name(ErrorCode code) noexcept { return detail::enum_name(kNames, code, "internal"); }
std::optional<ErrorCode> error_code_from_name(std::string_view name) noexcept { return detail::enum_value(kNames, name); }

}  // namespace aitune
