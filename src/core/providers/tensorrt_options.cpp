// TensorRT provider options: engine and timing caches, optimisation profiles.
#include "aitune/tensorrt_options.hpp"

#include <algorithm>

namespace aitune {

std::string tensorrt_profile_shapes(const GraphSpec& spec, bool max) {
  std::string out;
  for (const auto& t : spec.inputs) {
    out += (out.empty() ? "" : ",") + t.name + ":";
    const auto& shape = max ? t.max_shape : t.min_shape;
    for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? "x" : "") + std::to_string(shape[i]);
  }
  return out;
}

std::map<std::string, std::string> tensorrt_provider_options(const GraphSpec& spec, const std::string& cache_dir,
                                                             const std::map<std::string, std::string>& user) {
  std::map<std::string, std::string> options;
  if (!cache_dir.empty()) {
    options["trt_engine_cache_enable"] = "1";
    options["trt_engine_cache_path"] = cache_dir + "/trt_engines";
    options["trt_timing_cache_enable"] = "1";
    options["trt_timing_cache_path"] = cache_dir + "/trt_timing";
  }
  bool bounded = std::all_of(spec.inputs.begin(), spec.inputs.end(), [](const TensorSpec& t) {
    return std::none_of(t.max_shape.begin(), t.max_shape.end(), [](int64_t d) { return d == kUnbounded; });
  });
  bool dynamic = std::any_of(spec.inputs.begin(), spec.inputs.end(),
                             [](const TensorSpec& t) { return t.min_shape != t.max_shape; });
  if (bounded && dynamic && !spec.inputs.empty()) {
    options["trt_profile_min_shapes"] = tensorrt_profile_shapes(spec, false);
    options["trt_profile_opt_shapes"] = tensorrt_profile_shapes(spec, true);
    options["trt_profile_max_shapes"] = tensorrt_profile_shapes(spec, true);
  }
  for (const auto& [k, v] : user) options[k] = v;
  return options;
}

}  // namespace aitune
