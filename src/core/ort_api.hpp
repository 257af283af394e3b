// Private: the ORT C++ API, configured for run-time loading, and the one helper that
// turns an ORT failure into an aitune::Error with context.
#pragma once

// The API table is set by OrtRuntime after dlopen; nothing links against libonnxruntime.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <string>
#include <utility>

#include "aitune/error.hpp"

namespace aitune::detail {

/// Maps an ORT error code to ours, `fallback` where ORT's code says nothing useful.
ErrorCode error_code_from_ort(OrtErrorCode code, ErrorCode fallback) noexcept;

/// Runs `fn`; an Ort::Exception becomes Error(code, context + ": " + ORT's message).
template <typename Fn>
decltype(auto) ort_call(ErrorCode fallback, const std::string& context, Fn&& fn) {
  try {
    return std::forward<Fn>(fn)();
  } catch (const Ort::Exception& e) {
    throw Error(error_code_from_ort(e.GetOrtErrorCode(), fallback), context + ": " + e.what());
  }
}

}  // namespace aitune::detail
