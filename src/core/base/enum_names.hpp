// Private: enum <-> name tables, one per enum, and the lookups every *_name / parse_* function is written with.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "aitune/error.hpp"

namespace aitune::detail {

/// One row of a name table: a value and its stable spelling (JSON, logs, CLI, Python).
template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

/// The table of an enum: one row per value, so that names and parsing cannot disagree.
template <typename E, std::size_t N>
using EnumNames = std::array<EnumName<E>, N>;

/// The name of `value`; `fallback` for a value without a row (a cast integer).
template <typename E, std::size_t N>
constexpr std::string_view enum_name(const EnumNames<E, N>& table, E value, std::string_view fallback = "?") noexcept {
  for (const auto& row : table)
    if (row.value == value) return row.name;
  return fallback;
}

/// The value named `name` exactly; nullopt when no row has that name.
template <typename E, std::size_t N>
constexpr std::optional<E> enum_value(const EnumNames<E, N>& table, std::string_view name) noexcept {
  for (const auto& row : table)
    if (row.name == name) return row.value;
  return std::nullopt;
}

/// "a, b, c": the valid names, for error messages.
template <typename E, std::size_t N>
std::string enum_names_list(const EnumNames<E, N>& table) {
  std::string out;
  for (const auto& row : table) out += (out.empty() ? "" : ", ") + std::string(row.name);
  return out;
}

/// The value named `text`, else Error(kInvalidArgument) "unknown <what> '<text>'; valid
/// values: <names>".
template <typename E, std::size_t N>
E parse_enum(const EnumNames<E, N>& table, std::string_view text, std::string_view what) {
  if (auto value = enum_value(table, text)) return *value;
  throw Error(ErrorCode::kInvalidArgument, "unknown " + std::string(what) + " '" + std::string(text) +
                                               "'; valid values: " + enum_names_list(table));
}

}  // namespace aitune::detail
