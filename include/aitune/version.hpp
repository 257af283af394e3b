// Version of aitune and of the ONNX Runtime API it was built against.
#pragma once

#include <string_view>

namespace aitune {

/// aitune's version ("0.1.0").
std::string_view version() noexcept;
/// ORT_API_VERSION of the headers aitune was compiled with (29 for ORT 1.29).
int ort_api_version() noexcept;

}  // namespace aitune
