// The candidate plan: provider variants, the fp16 and fused models, precision limits,
// TensorRT cache directories, exactly as both drivers (CLI and front end) evaluate them.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "aitune/candidates.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {

GraphSpec spec(bool static_shapes) {
  GraphSpecBuilder b;
  for (int64_t batch : static_shapes ? std::vector<int64_t>{4} : std::vector<int64_t>{1, 4})
    b.record({{"x", DType::kFloat32, {batch, 16}}}, {{"y", DType::kFloat32, {batch, 8}}}, batch);
  return b.build();
}

CandidateRequest request(ExecutionProvider provider, bool static_shapes = false) {
  CandidateRequest r;
  r.base.provider = provider;
  r.spec = spec(static_shapes);
  return r;
}

std::vector<std::string> names(const std::vector<PlannedCandidate>& plan) {
  std::vector<std::string> out;
  for (const auto& c : plan) out.push_back(c.name);
  return out;
}

TEST(ModelTransform, StepsAndFusions) {
  EXPECT_TRUE(model_transform::steps("").empty());
  EXPECT_EQ(model_transform::steps("ort_fusions+fp16"), (std::vector<std::string>{"ort_fusions", "fp16"}));
  EXPECT_TRUE(model_transform::is_fusion("ort_transformers_optimizer"));
  EXPECT_FALSE(model_transform::is_fusion("fp16"));
}

TEST(PlanCandidates, CpuVariantsThenTheFusedDefault) {
  auto plan = plan_candidates(request(ExecutionProvider::kCPU));
  EXPECT_EQ(names(plan), (std::vector<std::string>{"cpu", "cpu[intra_op_threads=1]",
                                                   "cpu[graph_optimization_level=extended]", "cpu + ort_fusions"}));
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(plan[i].model_transform, "");
    EXPECT_FALSE(plan[i].needs_front_end());
    EXPECT_EQ(plan[i].precision, Precision::kStrict);
  }
  EXPECT_EQ(plan[3].model_transform, "ort_fusions");
  EXPECT_TRUE(plan[3].needs_front_end());
  EXPECT_TRUE(plan[3].only_where_fusion_applies());
  EXPECT_EQ(plan[3].config, plan[0].config);  // ORT's defaults

  auto trace = request(ExecutionProvider::kCPU);
  trace.use_dynamo = false;
  EXPECT_EQ(plan_candidates(trace).back().name, "cpu + ort_transformers_optimizer");
  auto plain = request(ExecutionProvider::kCPU);
  plain.transformer_fusions = false;
  EXPECT_EQ(plan_candidates(plain).size(), 3u);
  auto one = request(ExecutionProvider::kCPU);
  one.tune_provider_options = false;
  EXPECT_EQ(names(plan_candidates(one)), (std::vector<std::string>{"cpu"}));
}

TEST(PlanCandidates, CudaStaticShapesWithConvolutions) {
  auto r = request(ExecutionProvider::kCUDA, true);
  r.has_convolutions = true;
  auto plan = plan_candidates(r);
  EXPECT_EQ(names(plan), (std::vector<std::string>{
                             "cuda[use_tf32=0]",
                             "cuda[cudnn_conv_algo_search=HEURISTIC,use_tf32=0]",
                             "cuda[prefer_nhwc=1,use_tf32=0]",
                             "cuda[use_tf32=1]",
                             "cuda[enable_cuda_graph=1,use_tf32=0]",
                             "cuda[enable_cuda_graph=1,use_tf32=1]",
                             "cuda[enable_cuda_graph=1,use_tf32=1] fp16 model",
                             "cuda[enable_cuda_graph=1,use_tf32=1] fp16 mixed model",
                             "cuda[enable_cuda_graph=1,use_tf32=1] fp16 searched model",
                             "cuda[enable_cuda_graph=1,prefer_nhwc=1,use_tf32=1] fp16 model",
                             "cuda[enable_cuda_graph=1,fuse_conv_bias=1,prefer_nhwc=1,use_tf32=1] fp16 model",
                             "cuda[enable_cuda_graph=1,use_tf32=0] + ort_fusions",
                             "cuda[enable_cuda_graph=1,use_tf32=1] + ort_fusions",
                             "cuda[enable_cuda_graph=1,use_tf32=1] + ort_fusions fp16",
                             "cuda[enable_cuda_graph=1,sdpa_kernel=8,use_tf32=1] + ort_fusions fp16",
                         }));
  EXPECT_EQ(plan[6].model_transform, "fp16");
  EXPECT_EQ(plan[7].model_transform, "fp16_mixed");
  EXPECT_EQ(plan[8].model_transform, "fp16_search");
  EXPECT_EQ(plan[8].config, plan[6].config);  // the search is tried where this fp16 model fails
  EXPECT_EQ(plan[8].precision, Precision::kFP16);
  EXPECT_EQ(plan[6].precision, Precision::kFP16);
  EXPECT_EQ(plan[9].config.provider_options.at("prefer_nhwc"), "1");
  EXPECT_FALSE(plan[9].config.provider_options.contains("fuse_conv_bias"));
  EXPECT_EQ(plan[10].config.provider_options.at("prefer_nhwc"), "1");
  EXPECT_EQ(plan[10].config.provider_options.at("fuse_conv_bias"), "1");
  EXPECT_EQ(plan[10].precision, Precision::kFP16);
  EXPECT_EQ(plan[12].precision, Precision::kTF32);
  EXPECT_EQ(plan[13].model_transform, "ort_fusions+fp16");
  EXPECT_EQ(plan[13].precision, Precision::kFP16);
  EXPECT_EQ(plan[13].config, plan[6].config);
  EXPECT_EQ(plan[14].model_transform, "ort_fusions+fp16");  // cuDNN flash attention, on the fused model only
  EXPECT_EQ(plan[14].config.provider_options.at("sdpa_kernel"), "8");
  EXPECT_TRUE(plan[14].only_where_fusion_applies());
}

TEST(PlanCandidates, PrecisionLimitsAndTheModelsOwnPrecision) {
  auto strict = request(ExecutionProvider::kCUDA);
  strict.precision_limit = Precision::kStrict;
  strict.transformer_fusions = false;
  auto plan = plan_candidates(strict);
  ASSERT_EQ(plan.size(), 3u);
  for (const auto& c : plan) EXPECT_EQ(c.precision, Precision::kStrict) << c.name;

  auto tf32 = strict;
  tf32.precision_limit = Precision::kTF32;
  EXPECT_EQ(plan_candidates(tf32).size(), 4u);  // TF32 added, no fp16 model

  auto half = request(ExecutionProvider::kCUDA);
  half.model_precision = Precision::kFP16;
  plan = plan_candidates(half);
  ASSERT_FALSE(plan.empty());
  for (const auto& c : plan) {
    EXPECT_EQ(c.precision, Precision::kFP16) << c.name;  // an fp16 model computes in fp16
    EXPECT_NE(c.model_transform, "fp16") << c.name;      // nothing to convert
  }
  half.precision_limit = Precision::kStrict;
  EXPECT_TRUE(plan_candidates(half).empty());  // the caller says none fits
}

TEST(PlanCandidates, TensorRtVariantsGetCacheDirectoriesAndNoFusion) {
  auto r = request(ExecutionProvider::kTensorRT);
  r.tensorrt_cache_root = "/cache/g";
  auto plan = plan_candidates(r);
  ASSERT_EQ(plan.size(), 3u);
  for (std::size_t i = 0; i < plan.size(); ++i) {
    EXPECT_EQ(plan[i].config.provider_options.at("trt_engine_cache_path"),
              "/cache/g/trt/variant_" + std::to_string(i) + "/trt_engines");
    EXPECT_EQ(plan[i].name.rfind("tensorrt[", 0), 0u) << plan[i].name;  // named before the cache options
    EXPECT_EQ(plan[i].name.find("cache"), std::string::npos) << plan[i].name;
  }
  r.tensorrt_cache_root.clear();
  EXPECT_FALSE(plan_candidates(r)[0].config.provider_options.contains("trt_engine_cache_path"));
}

}  // namespace
}  // namespace aitune
