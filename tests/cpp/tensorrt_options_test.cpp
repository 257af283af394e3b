// TensorRT option composition: caches under the backend's directory, profiles from the
// graph spec, the caller's options winning.
#include <gtest/gtest.h>

#include "aitune/tensorrt_options.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {

GraphSpec image_and_mask_spec() {
  GraphSpecBuilder b;
  for (int64_t batch : {1, 8})
    b.record({{"image", DType::kFloat32, {batch, 3, 224, 224}}, {"mask", DType::kBool, {batch, 16}}},
             {{"logits", DType::kFloat32, {batch, 10}}}, batch);
  return b.build();
}

TEST(TensorRtOptions, CachesAndProfilesFromTheSpec) {
  auto o = tensorrt_provider_options(image_and_mask_spec(), "/cache/m/g/backend");
  EXPECT_EQ(o.at("trt_engine_cache_enable"), "1");
  EXPECT_EQ(o.at("trt_engine_cache_path"), "/cache/m/g/backend/trt_engines");
  EXPECT_EQ(o.at("trt_timing_cache_enable"), "1");
  EXPECT_EQ(o.at("trt_timing_cache_path"), "/cache/m/g/backend/trt_timing");
  EXPECT_EQ(o.at("trt_profile_min_shapes"), "image:1x3x224x224,mask:1x16");
  EXPECT_EQ(o.at("trt_profile_opt_shapes"), "image:8x3x224x224,mask:8x16");
  EXPECT_EQ(o.at("trt_profile_max_shapes"), "image:8x3x224x224,mask:8x16");
}

TEST(TensorRtOptions, CallerOptionsWin) {
  auto o = tensorrt_provider_options(image_and_mask_spec(), "/c",
                                     {{"trt_engine_cache_path", "/mine"}, {"trt_fp16_enable", "1"}});
  EXPECT_EQ(o.at("trt_engine_cache_path"), "/mine");
  EXPECT_EQ(o.at("trt_fp16_enable"), "1");
  EXPECT_EQ(o.at("trt_timing_cache_path"), "/c/trt_timing");
}

TEST(TensorRtOptions, NoProfilesForStaticOrUnboundedShapes) {
  GraphSpecBuilder b;
  b.record({{"x", DType::kFloat32, {4, 8}}}, {{"y", DType::kFloat32, {4, 8}}}, 4);
  auto fixed = tensorrt_provider_options(b.build(), "/c");
  EXPECT_FALSE(fixed.count("trt_profile_min_shapes"));  // one shape: TensorRT needs no profile
  auto open = image_and_mask_spec();
  open.inputs[0].max_shape[0] = kUnbounded;
  auto unbounded = tensorrt_provider_options(open, "/c");
  EXPECT_FALSE(unbounded.count("trt_profile_max_shapes"));
  EXPECT_TRUE(unbounded.count("trt_engine_cache_path"));
  EXPECT_FALSE(tensorrt_provider_options(open, "").count("trt_engine_cache_path"));
}

}  // namespace
}  // namespace aitune
