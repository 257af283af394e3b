// Private: the checkpoint manifest's validation rules, shared by save (the caller's input)
// and load (the file's contents), and its JSON helpers.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "aitune/checkpoint.hpp"
#include "aitune/error.hpp"
#include "session/session_limits.hpp"

namespace aitune::detail {

using ManifestJson = nlohmann::ordered_json;  // keeps the manifest's fields in a readable order

/// Largest manifest.json read (far above any real manifest).
inline constexpr std::uintmax_t kMaxManifestBytes = 64u << 20;
// kMaxSessionThreads and kMaxDeviceId (session_limits.hpp) bound a saved backend configuration.

/// The provider options that name a directory a save may take into the checkpoint (its
/// `path_options`, made relative to it): TensorRT's engine and timing caches.
inline constexpr const char* kPathOptions[] = {"trt_engine_cache_path", "trt_timing_cache_path"};

/// Why `path` is not an acceptable relative path (see is_safe_relative_path), or "".
std::string unsafe_path_reason(const std::string& path);

/// Checks graph keys, backends, thread counts and device ids, and that there is a
/// graph; with `artifacts`, also every artifact path and digest, the model and the
/// path options. Throws Error(`code`) naming the field.
void validate_manifest(const CheckpointManifest& m, ErrorCode code, bool artifacts);

/// JSON text given by the front end (metadata, structure), parsed with the nesting
/// bound of parse_bounded_json; "" means `empty`. Error(kInvalidArgument) naming `what`.
ManifestJson parse_opaque_json(const std::string& text, const char* empty, const std::string& what);

}  // namespace aitune::detail
