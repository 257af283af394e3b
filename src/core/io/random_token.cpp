// Random hex tokens for temporary and per-process directory names (one definition for both).
#include "io/random_token.hpp"

#include <cstdint>
#include <cstdio>
#include <random>

namespace aitune::detail {

std::string random_token() {
  std::random_device rd;
  std::uniform_int_distribution<std::uint64_t> dist;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(dist(rd)));
  return buf;
}

}  // namespace aitune::detail
