// Version strings compiled into the engine.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_c_api.h>

#include "aitune/version.hpp"

namespace aitune {

std::string_view version() noexcept { return AITUNE_VERSION; }
int ort_api_version() noexcept { return ORT_API_VERSION; }

}  // namespace aitune
