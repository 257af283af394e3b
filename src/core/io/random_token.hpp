// Private: random hex tokens that make temporary and per-process names unique.
#pragma once

#include <string>

namespace aitune::detail {

/// 16 random hex digits (std::random_device), for temporary names.
std::string random_token();

}  // namespace aitune::detail
