// The candidate plan: which session configurations tuning tries for one graph, and on
// which model each runs (the export, or one a named transform makes of it). Decided once
// here for both drivers, `aitune tune` (C++) and `ait.tune` (the torch front end).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "aitune/correctness.hpp"
#include "aitune/graph_spec.hpp"
#include "aitune/onnx_session.hpp"

namespace aitune {

/// A full session configuration to try, with the precision it computes in (which sets
/// its default tolerance).
struct OnnxCandidate {
  std::string name;
  OnnxSessionConfig config;
  Precision precision = Precision::kStrict;
  /// The graph (fusion) transform the model went through and the fused operators it made
  /// (copied into the CandidateResult; see CandidateResult::transform).
  std::string transform;
  std::map<std::string, int64_t> fused_operators;
  /// Mixed precision: the nodes its model keeps in fp32 (copied into the CandidateResult).
  std::vector<std::string> fp32_nodes = {};
  /// How its model was made, where the transform's name does not say it all (copied into
  /// the CandidateResult; see CandidateResult::transform_note).
  std::string transform_note = {};
};

/// "cuda[use_tf32=0,enable_cuda_graph=1]": the provider and every option set, the
/// stream options aitune sets itself left out.
std::string candidate_name(const OnnxSessionConfig& config);

/// The variants a session configuration expands into (the first is `base` itself, made
/// strict where the provider's default is not). `base.provider_options` and session
/// settings the caller fixed are kept in every variant.
///   CPU: intra-op threads {ORT default, 1} x graph optimisation {all, extended};
///   CUDA: use_tf32 0 (strict) with cudnn_conv_algo_search EXHAUSTIVE / HEURISTIC,
///         prefer_nhwc=1, and use_tf32=1 (TF32 tolerance); with CUDA graphs (strict and
///         TF32) where every input shape of `spec` is static;
///   TensorRT: fp32 and fp16 (FP16 tolerance), builder optimisation level 3 and 5.
std::vector<OnnxCandidate> provider_variants(const OnnxSessionConfig& base, const GraphSpec& spec);

/// The names of the model transforms a planned candidate may run on. A name is one step
/// or steps joined by '+', applied in order to the export ("ort_fusions+fp16": the fused
/// model, converted to fp16). Every transform is the front end's: it needs Python
/// packages (onnxconverter-common, onnxscript, onnxruntime.transformers), so `aitune
/// tune` lists the candidates on them but cannot evaluate them.
namespace model_transform {
inline constexpr std::string_view kExported = "";  ///< the exported model as it is
inline constexpr std::string_view kFp16 = "fp16";  ///< float tensors converted to fp16, I/O kept
/// fp16 with numerically sensitive nodes kept in fp32 (softmax, reductions, norms, exp/pow,
/// a vocabulary-sized final MatMul): what autocast keeps in fp32.
inline constexpr std::string_view kFp16Mixed = "fp16_mixed";
/// fp16 with the smallest set of nodes kept in fp32 that passes the check, found by a
/// measured search (fp32_node_search.hpp); tried only where the all-fp16 model failed it.
inline constexpr std::string_view kFp16Search = "fp16_search";
/// ONNX Runtime's transformer fusions on a dynamo export (onnxscript's optimize_for_ort).
inline constexpr std::string_view kOrtFusions = "ort_fusions";
/// The same on a trace export (onnxruntime.transformers.optimizer).
inline constexpr std::string_view kOrtTransformersOptimizer = "ort_transformers_optimizer";
inline constexpr char kSeparator = '+';

/// The steps of a transform name ("" has none).
std::vector<std::string> steps(std::string_view name);
/// True for a fusion step: it makes no model (and so no candidate) where nothing fuses.
bool is_fusion(std::string_view step) noexcept;
}  // namespace model_transform

/// What the plan is made from: the session configuration the user asked for and what the
/// front end knows of the model.
struct CandidateRequest {
  /// Provider, device and the provider options the user fixed (kept in every candidate).
  OnnxSessionConfig base;
  /// The recorded graph's spec: static shapes enable CUDA-graph variants, and TensorRT
  /// profiles come from it.
  GraphSpec spec;
  /// The loosest precision a candidate may compute in (nullopt: any).
  PrecisionLimit precision_limit;
  /// What the model computes in by its own dtypes: an fp16 / bf16 module exports an fp16 /
  /// bf16 model, which computes in that precision whatever the provider options.
  Precision model_precision = Precision::kStrict;
  /// The model has convolutions: the fp16 model is also tried with prefer_nhwc=1
  /// (cuDNN's fp16 tensor-core convolutions want NHWC).
  bool has_convolutions = false;
  /// Expand into the provider variants (and the fp16 and fused models); false: one
  /// strict candidate.
  bool tune_provider_options = true;
  /// Also try ONNX Runtime's transformer fusions (not for TensorRT, which takes no
  /// contrib operators).
  bool transformer_fusions = true;
  /// The model is a dynamo export (picks the fusion pass: ort_fusions, else
  /// ort_transformers_optimizer).
  bool use_dynamo = true;
  /// TensorRT: each variant's engine and timing caches go to <root>/trt/variant_<i>, so an
  /// fp16 engine is never found by the fp32 variant; "" sets no cache options.
  std::string tensorrt_cache_root;
};

/// One candidate of the plan.
struct PlannedCandidate {
  std::string name;
  OnnxSessionConfig config;
  Precision precision = Precision::kStrict;
  /// The model it runs on: model_transform::kExported, or a transform name.
  std::string model_transform;
  /// Its model is made by the front end (every transform is); the CLI skips it.
  bool needs_front_end() const noexcept { return !model_transform.empty(); }
  /// It exists only where its fusion applies (the front end drops it when the fusion
  /// finds nothing to fuse).
  bool only_where_fusion_applies() const;
};

/// The candidates tuning evaluates, in order:
///  1. the provider variants (only the first without tune_provider_options), TensorRT
///     cache directories per variant, relabelled with model_precision when that is not
///     strict, those outside precision_limit dropped;
///  2. CUDA with tune_provider_options, a strict model, FP16 allowed: the last variant on
///     the fp16 model ("<variant> fp16 model"), and with convolutions the same with
///     prefer_nhwc=1;
///  3. with transformer_fusions and tune_provider_options, not TensorRT: per precision
///     the variant most likely to win (CUDA: the last of that precision, a CUDA graph
///     where shapes are static; otherwise the first, ORT's defaults) on the fused model
///     ("<variant> + <fusion>"), and the first fp16 candidate's configuration on the
///     fused model in fp16 ("<variant> + <fusion> fp16").
/// Empty when no candidate computes within precision_limit (the caller says so).
std::vector<PlannedCandidate> plan_candidates(const CandidateRequest& request);

}  // namespace aitune
