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

/// The code of an ORT failure: kOutOfMemory for a failed allocation, else
/// error_code_from_ort. ORT reports allocation failures (its arena's "Failed to allocate
/// memory", CUDA's "out of memory", a std::bad_alloc it caught) as ORT_FAIL or
/// ORT_RUNTIME_EXCEPTION with no code of their own, so this is the one place ORT's text is
/// read; everything downstream decides by the code.
inline ErrorCode ort_failure_code(const Ort::Exception& e, ErrorCode fallback) {
  std::string text(e.what());
  for (auto& c : text) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  for (const char* sign : {"out of memory", "failed to allocate", "bad_alloc"})
    if (text.find(sign) != std::string::npos) return ErrorCode::kOutOfMemory;
  return error_code_from_ort(e.GetOrtErrorCode(), fallback);
}

/// ORT's message without the source location and C++ signature it puts before the reason
/// ("/onnxruntime_src/.../model_load_utils.h:46 void onnxruntime::model_load_utils::
/// ValidateOpsetForDomain(const std::unordered_map<...>&, ...) Opset 99 is under
/// development..."): the reason is for the user, the signature was noise in every CLI error.
inline std::string readable_ort_message(const std::string& text) {
  const auto at = text.find("/onnxruntime_src/");
  if (at == std::string::npos) return text;
  auto i = text.find(' ', at);  // past "file:line"
  if (i == std::string::npos) return text;
  const auto open = text.find('(', i);
  if (open == std::string::npos || text.find('\n', i) < open) return text;
  int depth = 0;
  for (auto j = open; j < text.size(); ++j) {
    if (text[j] == '(') ++depth;
    if (text[j] == ')' && --depth == 0) {
      auto rest = j + 1;
      while (rest < text.size() && text[rest] == ' ') ++rest;
      return text.substr(0, at) + text.substr(rest);
    }
  }
  return text;
}

/// Runs `fn`; an Ort::Exception becomes Error(ort_failure_code, context + ": " + ORT's message).
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
    throw Error(ort_failure_code(e, fallback), where + ": " + readable_ort_message(e.what()));
  }
}

}  // namespace aitune::detail
