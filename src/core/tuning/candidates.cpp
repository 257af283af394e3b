// The candidate plan: provider variants, the fp16 and fused models, precision limits.
#include "aitune/candidates.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "providers/provider_registry.hpp"

namespace aitune {

std::string candidate_name(const OnnxSessionConfig& config) {
  std::string name(execution_provider_name(config.provider));
  std::vector<std::string> parts;
  for (const auto& [k, v] : config.provider_options)
    if (k != "user_compute_stream" && k != "has_user_compute_stream") parts.push_back(k + "=" + v);
  if (config.intra_op_threads) parts.push_back("intra_op_threads=" + std::to_string(config.intra_op_threads));
  if (config.inter_op_threads) parts.push_back("inter_op_threads=" + std::to_string(config.inter_op_threads));
  if (config.graph_optimization_level != GraphOptimizationLevel::kAll)
    parts.push_back("graph_optimization_level=" +
                    std::string(graph_optimization_level_name(config.graph_optimization_level)));
  if (parts.empty()) return name;
  name += "[";
  for (std::size_t i = 0; i < parts.size(); ++i) name += (i ? "," : "") + parts[i];
  return name + "]";
}

std::vector<OnnxCandidate> provider_variants(const OnnxSessionConfig& base, const GraphSpec& spec) {
  std::vector<OnnxCandidate> out;
  // A variant sets options the caller left open; what the caller fixed stays fixed. The
  // variants themselves are the provider's (its registry entry).
  const auto& provider = provider_description(base.provider);
  if (!provider.variants) return {{candidate_name(base), base, Precision::kStrict}};
  for (auto& variant : provider.variants(base, spec)) {
    OnnxSessionConfig c = base;
    for (auto& [k, v] : variant.options) c.provider_options.emplace(k, v);
    if (variant.intra_op_threads && base.intra_op_threads == 0) c.intra_op_threads = *variant.intra_op_threads;
    if (variant.graph_optimization_level && base.graph_optimization_level == GraphOptimizationLevel::kAll)
      c.graph_optimization_level = *variant.graph_optimization_level;
    if (std::any_of(out.begin(), out.end(), [&](const OnnxCandidate& e) { return e.config == c; }))
      continue;  // the caller's fixed options made it a duplicate
    // What the caller fixed (use_tf32, trt_fp16_enable) decides the precision, not the variant.
    Precision precision = variant.precision;
    if (provider.fixed_precision)
      if (auto fixed = provider.fixed_precision(c.provider_options)) precision = *fixed;
    out.push_back({candidate_name(c), c, precision});
  }
  return out;
}

namespace model_transform {

std::vector<std::string> steps(std::string_view name) {
  std::vector<std::string> out;
  while (!name.empty()) {
    auto cut = name.find(kSeparator);
    out.emplace_back(name.substr(0, cut));
    name = cut == std::string_view::npos ? std::string_view() : name.substr(cut + 1);
  }
  return out;
}

bool is_fusion(std::string_view step) noexcept { return step == kOrtFusions || step == kOrtTransformersOptimizer; }

}  // namespace model_transform

bool PlannedCandidate::only_where_fusion_applies() const {
  auto all = model_transform::steps(model_transform);
  return std::any_of(all.begin(), all.end(), [](const std::string& s) { return model_transform::is_fusion(s); });
}

namespace {

PlannedCandidate planned(std::string name, OnnxSessionConfig config, Precision precision, std::string model = {}) {
  return {std::move(name), std::move(config), precision, std::move(model)};
}

// The fp16-model candidates: the last variant (a CUDA graph where shapes are static, else
// TF32) on the fp16 model, judged by the fp16 tolerance; with convolutions also with
// prefer_nhwc=1 (cuDNN's fp16 tensor-core convolutions want NHWC: ResNet-50 b16 fp16
// 2074 -> 1635 us on the H200, issue 16), and NHWC with fuse_conv_bias=1 (cuDNN frontend
// fuses the bias add into the convolution instead of a separate kernel per convolution:
// 1629 -> 1278 us, ahead of torch.compile fp16). fuse_conv_bias=1 returned wrong results
// in fp32/TF32 NCHW and failed cuDNN's heuristics in fp16 NCHW on the same model, so it
// is planned in fp16 NHWC only; the plain NHWC candidate stays as the fallback.
std::vector<PlannedCandidate> fp16_models(const CandidateRequest& r, const std::vector<PlannedCandidate>& variants) {
  if (!r.tune_provider_options || !provider_capabilities(r.base.provider).fp16_model ||
      r.model_precision != Precision::kStrict || !precision_allowed(Precision::kFP16, r.precision_limit) ||
      variants.empty())
    return {};
  const auto& base = variants.back();
  const std::string fp16(model_transform::kFp16);
  std::vector<PlannedCandidate> out{planned(base.name + " fp16 model", base.config, Precision::kFP16, fp16)};
  // Mixed precision on the same configuration: sensitive nodes kept in fp32 by rule, and
  // (tried only when the all-fp16 model fails its check) the smallest set a search finds.
  out.push_back(planned(base.name + " fp16 mixed model", base.config, Precision::kFP16,
                        std::string(model_transform::kFp16Mixed)));
  out.push_back(planned(base.name + " fp16 searched model", base.config, Precision::kFP16,
                        std::string(model_transform::kFp16Search)));
  if (r.has_convolutions && !base.config.provider_options.contains("prefer_nhwc")) {
    OnnxSessionConfig nhwc = base.config;
    nhwc.provider_options["prefer_nhwc"] = "1";
    out.push_back(planned(candidate_name(nhwc) + " fp16 model", nhwc, Precision::kFP16, fp16));
    if (!nhwc.provider_options.contains("fuse_conv_bias")) {
      nhwc.provider_options["fuse_conv_bias"] = "1";
      out.push_back(planned(candidate_name(nhwc) + " fp16 model", nhwc, Precision::kFP16, fp16));
    }
  }
  return out;
}

// The fused-model candidates: per precision the variant most likely to win (CUDA: the
// last of its precision, a CUDA graph where shapes are static; otherwise the first, ORT's
// defaults), and the first fp16 candidate's configuration on the fused model in fp16 (on
// CUDA also with cuDNN's flash attention), so a fusion adds at most four candidates.
std::vector<PlannedCandidate> fused_models(const CandidateRequest& r, const std::vector<PlannedCandidate>& variants,
                                           const std::vector<PlannedCandidate>& fp16) {
  // A provider without contrib operators (TensorRT) cannot run what a fusion makes.
  if (!r.transformer_fusions || !r.tune_provider_options || !provider_capabilities(r.base.provider).contrib_operators)
    return {};
  const std::string fusion(r.use_dynamo ? model_transform::kOrtFusions : model_transform::kOrtTransformersOptimizer);
  std::vector<std::pair<Precision, const PlannedCandidate*>> best;  // in order of first appearance
  for (const auto& v : variants) {
    auto it = std::find_if(best.begin(), best.end(), [&](const auto& b) { return b.first == v.precision; });
    if (it == best.end())
      best.emplace_back(v.precision, &v);
    else if (provider_capabilities(v.config.provider).cuda_graph)  // its last: a CUDA graph where shapes are static
      it->second = &v;
  }
  std::vector<PlannedCandidate> out;
  for (const auto& [precision, v] : best) out.push_back(planned(v->name + " + " + fusion, v->config, precision, fusion));
  if (!fp16.empty()) {
    const auto& half = fp16.front();
    std::string variant = half.name.substr(0, half.name.size() - std::string_view(" fp16 model").size());
    out.push_back(planned(variant + " + " + fusion + " fp16", half.config, half.precision,
                          fusion + model_transform::kSeparator + std::string(model_transform::kFp16)));
    // The fused attention operators on cuDNN's flash attention (sdpa_kernel bit 8), which
    // the CUDA EP does not pick by default (its default: flash, then memory-efficient).
    if (r.base.provider == ExecutionProvider::kCUDA && !half.config.provider_options.contains("sdpa_kernel")) {
      OnnxSessionConfig cudnn_attention = half.config;
      cudnn_attention.provider_options["sdpa_kernel"] = "8";
      out.push_back(planned(candidate_name(cudnn_attention) + " + " + fusion + " fp16", cudnn_attention,
                            half.precision,
                            fusion + model_transform::kSeparator + std::string(model_transform::kFp16)));
    }
  }
  return out;
}

}  // namespace

std::vector<PlannedCandidate> plan_candidates(const CandidateRequest& r) {
  auto expanded = provider_variants(r.base, r.spec);
  // One candidate: strict fp32 as eager matmuls run by default (the CUDA EP's TF32 default
  // differs by ~1e-3 on conv/attention models).
  if (!r.tune_provider_options) expanded.resize(1);
  std::vector<PlannedCandidate> variants;
  for (std::size_t i = 0; i < expanded.size(); ++i) {
    auto& v = expanded[i];
    if (const auto& provider = provider_description(r.base.provider); provider.cache_options && !r.tensorrt_cache_root.empty())
      v.config.provider_options = provider.cache_options(
          r.spec, r.tensorrt_cache_root + "/trt/variant_" + std::to_string(i), v.config.provider_options);
    // An fp16 / bf16 model computes in its dtype whatever the provider options say.
    Precision precision = r.model_precision == Precision::kStrict ? v.precision : r.model_precision;
    if (precision_allowed(precision, r.precision_limit))
      variants.push_back(planned(v.name, std::move(v.config), precision));
  }
  auto fp16 = fp16_models(r, variants);
  auto fused = fused_models(r, variants, fp16);
  std::vector<PlannedCandidate> plan = std::move(variants);
  for (auto* more : {&fp16, &fused}) plan.insert(plan.end(), more->begin(), more->end());
  return plan;
}

}  // namespace aitune
