// TensorRT provider options composed from a graph spec and a cache directory, so that
// engines are built once per shape range and survive restarts.
#pragma once

#include <map>
#include <string>

#include "aitune/graph_spec.hpp"

namespace aitune {

/// The options aitune sets for the TensorRT execution provider, with `user` (the
/// caller's own options, as ORT spells them) winning over each:
///   trt_engine_cache_enable=1, trt_engine_cache_path=<cache_dir>/trt_engines,
///   trt_timing_cache_enable=1, trt_timing_cache_path=<cache_dir>/trt_timing,
///   trt_profile_min_shapes / _opt_ / _max_ = "name:1x3x224x224,..." from the graph spec's
///   min shape, max shape (opt: the largest, which throughput is tuned for) and max shape.
/// Profiles are set only when every input axis has a finite upper bound (an unbounded
/// axis has no maximum to build for); static inputs are listed too (TensorRT wants all).
/// `cache_dir` empty: no cache options. Pure function; throws nothing.
std::map<std::string, std::string> tensorrt_provider_options(const GraphSpec& spec, const std::string& cache_dir,
                                                             const std::map<std::string, std::string>& user = {});

/// "x:1x3x224x224,mask:1x128": one shape per input, as trt_profile_*_shapes take them.
std::string tensorrt_profile_shapes(const GraphSpec& spec, bool max);

}  // namespace aitune
