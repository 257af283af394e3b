// A graph spec that does not describe its model (an input or output of another name, dtype
// or rank). OnnxSession::create refuses it as an invalid argument: a caller gave the spec.
// Checkpoint::create_session catches this type and calls it what it is there, a damaged
// checkpoint, since the spec came from the checkpoint's own manifest.
#pragma once

#include <string>

#include "aitune/error.hpp"

namespace aitune {

class SpecMismatchError : public Error {
 public:
  explicit SpecMismatchError(const std::string& message) : Error(ErrorCode::kInvalidArgument, message) {}
};

}  // namespace aitune
