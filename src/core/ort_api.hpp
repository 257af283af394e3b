// Private: the ORT C++ API, configured for run-time loading, and the one helper that
// turns an ORT failure into an aitune::Error with context.
#pragma once

// The API table is set by OrtRuntime after dlopen; nothing links against libonnxruntime.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <string>
#include <type_traits>
#include <utility>

#include "aitune/error.hpp"

namespace aitune::detail {

/// Maps an ORT error code to ours, `fallback` where ORT's code says nothing useful.
ErrorCode error_code_from_ort(OrtErrorCode code, ErrorCode fallback) noexcept;

/// Runs `fn`; an Ort::Exception becomes Error(code, context + ": " + ORT's message).
/// `context` is a string, or a callable returning one, so that hot paths build the
/// message only when something failed.
template <typename Context, typename Fn>
decltype(auto) ort_call(ErrorCode fallback, Context&& context, Fn&& fn) {
  try {
    return std::forward<Fn>(fn)();
  } catch (const Ort::Exception& e) {
    std::string where;
    if constexpr (std::is_invocable_v<Context>) {
      where = context();
    } else {
      where = context;
    }
    throw Error(error_code_from_ort(e.GetOrtErrorCode(), fallback), where + ": " + e.what());
  }
}

}  // namespace aitune::detail
