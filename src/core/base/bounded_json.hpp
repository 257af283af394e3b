// Private: JSON parsing with a nesting bound, for text read from files or given by callers.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "aitune/error.hpp"

namespace aitune::detail {

/// Deepest nesting of arrays/objects accepted. A manifest needs about 8 levels (a tune
/// report in `metadata`, a pytree in `structure`); nlohmann's dump and conversions
/// recurse once per level, so 80,000 levels overflowed the stack (issue 17).
inline constexpr std::size_t kMaxJsonDepth = 128;

/// Parses `text` as JSON nested at most kMaxJsonDepth levels deep. Throws Error(`code`)
/// "<what>: ..." when it does not parse or nests deeper; nothing deeper is ever built.
template <typename Json>
Json parse_bounded_json(std::string_view text, ErrorCode code, const std::string& what) {
  struct TooDeep {};
  try {
    // The callback sees each value as it is opened; refusing there stops the parser
    // before the deep value exists (nlohmann's parser itself is iterative).
    return Json::parse(text, [](int depth, typename Json::parse_event_t event, Json&) {
      if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
          static_cast<std::size_t>(depth) >= kMaxJsonDepth)
        throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    throw Error(code, what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const typename Json::exception& e) {
    throw Error(code, what + ": not valid JSON: " + e.what());
  }
}

}  // namespace aitune::detail
