// Tests for OnnxSession on the CPU provider (model metadata, numerics, dtypes,
// input validation, life cycle, concurrency) and, where a GPU is usable, on CUDA.
#include <array>
#include <limits>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "test_support.hpp"

namespace aitune {
namespace {

using test::contains_word;
using test::ErrorExpectation;
using test::expect_allclose_f32;
using test::expect_error;
using test::fixture;
using test::make_host;
using test::values_of;

constexpr double kTol = 1e-5;

std::unique_ptr<OnnxSession> cpu_backend(const std::string& model,
                                                const std::optional<GraphSpec>& spec = std::nullopt) {
  return OnnxSession::create(fixture(model), test::cpu_config(), spec);
}

// ---------------------------------------------------------------------------------
// multi_dtype.onnx inputs with known outputs

struct MultiDtypeCase {
  Tensor ids, mask;
  std::vector<int64_t> ids_plus_one;
  std::vector<float> mask_as_float;
};

MultiDtypeCase multi_dtype_case(int64_t batch, int64_t salt = 0) {
  MultiDtypeCase c;
  std::vector<int64_t> ids;
  std::vector<uint8_t> mask;
  const std::vector<int64_t> specials = {0,  -1, 1LL << 40, std::numeric_limits<int64_t>::max() - 1, -(1LL << 50),
                                         42, 7,  std::numeric_limits<int64_t>::min()};
  for (int64_t i = 0; i < batch * 8; ++i) {
    ids.push_back(specials[static_cast<std::size_t>(i % 8)] + (i / 8 == 0 ? 0 : (i / 8) * 1000 + salt) *
                                                                  (specials[static_cast<std::size_t>(i % 8)] < 0 ? 1 : -1));
    mask.push_back(static_cast<uint8_t>((i * 3 + salt) % 5 < 2));
  }
  for (int64_t v : ids) c.ids_plus_one.push_back(v + 1);
  for (uint8_t m : mask) c.mask_as_float.push_back(m ? 1.0f : 0.0f);
  c.ids = make_host(DType::kInt64, {batch, 8}, ids);
  c.mask = make_host(DType::kBool, {batch, 8}, mask);
  return c;
}

void expect_multi_dtype_outputs(const std::vector<Tensor>& out, const MultiDtypeCase& c,
                                std::source_location loc = std::source_location::current()) {
  SCOPED_TRACE(testing::Message() << "called from " << loc.file_name() << ":" << loc.line());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].dtype(), DType::kInt64);
  EXPECT_EQ(out[0].shape(), c.ids.shape());
  EXPECT_EQ(values_of<int64_t>(out[0]), c.ids_plus_one);
  EXPECT_EQ(out[1].dtype(), DType::kFloat32);
  EXPECT_EQ(out[1].shape(), c.mask.shape());
  EXPECT_EQ(values_of<float>(out[1]), c.mask_as_float);
}

// A successful call, to show that the backend still works after an error.
void expect_multi_dtype_still_works(const OnnxSession& b,
                                    std::source_location loc = std::source_location::current()) {
  const auto c = multi_dtype_case(3, 5);
  std::vector<Tensor> out;
  try {
    out = b.infer({c.ids.view(), c.mask.view()});
  } catch (const std::exception& e) {
    ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line())) << "infer after an error failed: " << e.what();
    return;
  }
  expect_multi_dtype_outputs(out, c, loc);
}

void expect_mlp_still_works(const OnnxSession& b, std::source_location loc = std::source_location::current()) {
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const Tensor y = test::load_fixture_npy("mlp_y.npy");
  std::vector<Tensor> out;
  try {
    out = b.infer({x.view()});
  } catch (const std::exception& e) {
    ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line())) << "infer after an error failed: " << e.what();
    return;
  }
  if (out.size() != 1) {
    ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line())) << "expected 1 output, got " << out.size();
    return;
  }
  expect_allclose_f32(out[0], y, kTol, loc);
}

// A non-contiguous view: `rows` x `cols` elements of `storage` (cols x rows, compact),
// transposed.
TensorView transposed_view(const Tensor& storage, int64_t rows, int64_t cols) {
  TensorView v = storage.view();
  v.shape = {rows, cols};
  v.strides = {1, rows};
  return v;
}

// ---------------------------------------------------------------------------------
// Names and small enums

TEST(OnnxSessionEnums, GraphOptimizationLevel) {
  const std::vector<std::pair<GraphOptimizationLevel, const char*>> levels = {
      {GraphOptimizationLevel::kDisableAll, "disable_all"},
      {GraphOptimizationLevel::kBasic, "basic"},
      {GraphOptimizationLevel::kExtended, "extended"},
      {GraphOptimizationLevel::kAll, "all"}};
  for (const auto& [level, name] : levels) {
    EXPECT_EQ(graph_optimization_level_name(level), name);
    EXPECT_EQ(parse_graph_optimization_level(name), level);
  }
  expect_error([] { parse_graph_optimization_level("max"); }, ErrorCode::kInvalidArgument,
               {"max", "disable_all", "basic", "extended", "all"});
}

TEST(OnnxSessionEnums, SessionStateNames) {
  EXPECT_EQ(session_state_name(SessionState::kBuilt), "built");
  EXPECT_EQ(session_state_name(SessionState::kActive), "active");
  EXPECT_EQ(session_state_name(SessionState::kInactive), "inactive");
}

// ---------------------------------------------------------------------------------
// Config

TEST(OnnxSessionConfig, DefaultsFollowTheSpec) {
  OnnxSessionConfig c;
  EXPECT_EQ(c.provider, ExecutionProvider::kCUDA);
  EXPECT_EQ(c.device_id, 0);
  EXPECT_EQ(c.graph_optimization_level, GraphOptimizationLevel::kAll);
  EXPECT_EQ(c.device(), Device::cuda(0));
  c.provider = ExecutionProvider::kCPU;
  c.device_id = 0;
  EXPECT_EQ(c.device(), Device::cpu());
  c.provider = ExecutionProvider::kTensorRT;
  c.device_id = 1;
  EXPECT_EQ(c.device(), Device::cuda(1));
}

TEST(OnnxSessionConfig, JsonRoundTrip) {
  OnnxSessionConfig c;
  c.provider = ExecutionProvider::kTensorRT;
  c.device_id = 1;
  c.graph_optimization_level = GraphOptimizationLevel::kBasic;
  c.intra_op_threads = 3;
  c.inter_op_threads = 2;
  c.provider_options = {{"trt_fp16_enable", "1"}, {"trt_max_workspace_size", "1073741824"}};
  c.session_config = {{"session.disable_prepacking", "1"}};
  const std::string text = c.to_json();
  SCOPED_TRACE(text);
  EXPECT_TRUE(nlohmann::json::parse(text).is_object());
  EXPECT_EQ(OnnxSessionConfig::from_json(text), c);
  EXPECT_EQ(OnnxSessionConfig::from_json(OnnxSessionConfig{}.to_json()), OnnxSessionConfig{});
}

TEST(OnnxSessionConfig, UnknownProviderStringThrowsInvalidArgument) {
  expect_error([] { parse_execution_provider("rocm"); }, ErrorCode::kInvalidArgument, {"rocm", "cpu", "cuda"});
  // The same through a config file: find the field holding the provider and spoil it.
  auto doc = nlohmann::json::parse(test::cpu_config().to_json());
  std::string key;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.value().is_string() && it.value().get<std::string>() == "cpu") key = it.key();
  }
  ASSERT_FALSE(key.empty()) << "no field with the provider \"cpu\" in " << doc.dump();
  doc[key] = "rocm";
  expect_error([&] { OnnxSessionConfig::from_json(doc.dump()); }, ErrorCode::kInvalidArgument, {"rocm"});
  expect_error([] { OnnxSessionConfig::from_json("{not json"); }, ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------
// Model metadata

void expect_io(const IoInfo& io, const std::string& name, DType dtype, const Shape& shape,
               const std::vector<std::string>& symbolic) {
  SCOPED_TRACE(name);
  EXPECT_EQ(io.name, name);
  EXPECT_EQ(io.dtype, dtype);
  EXPECT_EQ(io.shape, shape);
  EXPECT_EQ(io.symbolic_dims, symbolic);
}

TEST(OnnxSession, AddModelIo) {
  auto b = cpu_backend("add.onnx");
  ASSERT_EQ(b->inputs().size(), 2u);
  ASSERT_EQ(b->outputs().size(), 1u);
  expect_io(b->inputs()[0], "x", DType::kFloat32, {-1, 4}, {"batch", ""});
  expect_io(b->inputs()[1], "y", DType::kFloat32, {-1, 4}, {"batch", ""});
  expect_io(b->outputs()[0], "z", DType::kFloat32, {-1, 4}, {"batch", ""});
}

TEST(OnnxSession, MlpModelIoAndAccessors) {
  const std::string path = fixture("mlp.onnx");
  auto b = OnnxSession::create(path, test::cpu_config());
  ASSERT_EQ(b->inputs().size(), 1u);
  ASSERT_EQ(b->outputs().size(), 1u);
  expect_io(b->inputs()[0], "x", DType::kFloat32, {-1, 64}, {"batch", ""});
  expect_io(b->outputs()[0], "y", DType::kFloat32, {-1, 16}, {"batch", ""});
  EXPECT_EQ(b->model_path(), path);
  EXPECT_EQ(b->config(), test::cpu_config());
  EXPECT_EQ(b->device(), Device::cpu());
  EXPECT_EQ(b->state(), SessionState::kBuilt);
  EXPECT_EQ(b->opset(), 17);
}

TEST(OnnxSession, MultiDtypeAndFp16ModelIo) {
  auto m = cpu_backend("multi_dtype.onnx");
  ASSERT_EQ(m->inputs().size(), 2u);
  ASSERT_EQ(m->outputs().size(), 2u);
  expect_io(m->inputs()[0], "ids", DType::kInt64, {-1, 8}, {"B", ""});
  expect_io(m->inputs()[1], "mask", DType::kBool, {-1, 8}, {"B", ""});
  expect_io(m->outputs()[0], "ids_out", DType::kInt64, {-1, 8}, {"B", ""});
  expect_io(m->outputs()[1], "mask_f", DType::kFloat32, {-1, 8}, {"B", ""});
  EXPECT_EQ(m->opset(), 17);

  auto h = cpu_backend("fp16.onnx");
  ASSERT_EQ(h->inputs().size(), 1u);
  expect_io(h->inputs()[0], "h", DType::kFloat16, {2, 3}, {"", ""});
  expect_io(h->outputs()[0], "o", DType::kFloat16, {2, 3}, {"", ""});
  EXPECT_EQ(h->opset(), 17);
}

TEST(OnnxSession, GraphSpecDerivedFromTheModel) {
  auto b = cpu_backend("mlp.onnx");
  const GraphSpec& spec = b->graph_spec();
  ASSERT_EQ(spec.inputs.size(), 1u);
  ASSERT_EQ(spec.outputs.size(), 1u);
  const TensorSpec& x = spec.inputs[0];
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.dtype, DType::kFloat32);
  ASSERT_EQ(x.rank(), 2u);
  EXPECT_EQ(x.max_shape[0], kUnbounded) << "symbolic dims are unbounded";
  EXPECT_EQ(x.min_shape[1], 64);
  EXPECT_EQ(x.max_shape[1], 64);
  EXPECT_TRUE(x.accepts({3, 64}));
  EXPECT_TRUE(x.accepts({100000, 64}));
  EXPECT_FALSE(x.accepts({3, 63}));
  EXPECT_EQ(spec.outputs[0].name, "y");
  EXPECT_EQ(spec.find_input("x"), 0u);

  auto h = cpu_backend("fp16.onnx");
  EXPECT_EQ(h->graph_spec().inputs[0].min_shape, (Shape{2, 3}));
  EXPECT_EQ(h->graph_spec().inputs[0].max_shape, (Shape{2, 3}));
  EXPECT_TRUE(h->graph_spec().inputs[0].dynamic_axes().empty());
}

// ---------------------------------------------------------------------------------
// Numerics

TEST(OnnxSession, MlpMatchesNumpyReference) {
  auto b = cpu_backend("mlp.onnx");
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const Tensor y = test::load_fixture_npy("mlp_y.npy");
  ASSERT_EQ(y.shape(), (Shape{3, 16}));
  const auto out = b->infer({x.view()});
  ASSERT_EQ(out.size(), 1u);
  const Tensor& o = out[0];
  EXPECT_TRUE(o.defined());
  EXPECT_EQ(o.dtype(), DType::kFloat32);
  EXPECT_EQ(o.shape(), (Shape{3, 16}));
  EXPECT_EQ(o.device(), Device::cpu());
  EXPECT_TRUE(o.view().is_contiguous());
  expect_allclose_f32(o, y, kTol);
}

TEST(OnnxSession, MlpBatchOfOneRowMatchesThatRow) {
  // Row 1 of the reference on its own: a different batch size through the same session.
  auto b = cpu_backend("mlp.onnx");
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const Tensor y = test::load_fixture_npy("mlp_y.npy");
  TensorView row = x.view();
  row.data = static_cast<float*>(x.data()) + 64;
  row.shape = {1, 64};
  const auto out = b->infer({row});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].shape(), (Shape{1, 16}));
  const auto got = values_of<float>(out[0]);
  const auto want = values_of<float>(y);
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(got[i], want[16 + i], kTol) << i;
}

TEST(OnnxSession, InferNamed) {
  auto b = cpu_backend("mlp.onnx");
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const auto out = b->infer_named({{"x", x.view()}});
  ASSERT_EQ(out.size(), 1u);
  expect_allclose_f32(out[0], test::load_fixture_npy("mlp_y.npy"), kTol);

  // Order of the map does not matter: inputs bind by name.
  auto add = cpu_backend("add.onnx");
  const Tensor a = test::make_pattern_f32({2, 4}, 1);
  const Tensor c = make_host<float>(DType::kFloat32, {2, 4}, {100, 200, 300, 400, 500, 600, 700, 800});
  const auto z = add->infer_named({{"y", c.view()}, {"x", a.view()}});
  ASSERT_EQ(z.size(), 1u);
  const auto av = values_of<float>(a), cv = values_of<float>(c), zv = values_of<float>(z[0]);
  ASSERT_EQ(zv.size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(zv[i], av[i] + cv[i]) << i;
}

TEST(OnnxSession, AddIsExact) {
  auto b = cpu_backend("add.onnx");
  const Tensor x = test::make_pattern_f32({5, 4}, 11);
  const Tensor y = test::make_pattern_f32({5, 4}, 12);
  const auto out = b->infer({x.view(), y.view()});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (Shape{5, 4}));
  const auto xv = values_of<float>(x), yv = values_of<float>(y), zv = values_of<float>(out[0]);
  ASSERT_EQ(zv.size(), 20u);
  for (std::size_t i = 0; i < zv.size(); ++i) EXPECT_EQ(zv[i], xv[i] + yv[i]) << i;
}

TEST(OnnxSession, ExternalDataModelGivesTheSameOutput) {
  auto b = cpu_backend("mlp_ext.onnx");
  EXPECT_EQ(b->inputs()[0].name, "x");
  EXPECT_EQ(b->opset(), 17);
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const auto out = b->infer({x.view()});
  ASSERT_EQ(out.size(), 1u);
  expect_allclose_f32(out[0], test::load_fixture_npy("mlp_y.npy"), kTol);
  const auto inline_out = cpu_backend("mlp.onnx")->infer({x.view()});
  expect_allclose_f32(out[0], inline_out[0], 0.0);
}

TEST(OnnxSession, MultiDtypeOutputs) {
  auto b = cpu_backend("multi_dtype.onnx");
  for (int64_t batch : {1, 2, 7}) {
    SCOPED_TRACE(batch);
    const auto c = multi_dtype_case(batch, batch);
    expect_multi_dtype_outputs(b->infer({c.ids.view(), c.mask.view()}), c);
    expect_multi_dtype_outputs(b->infer_named({{"mask", c.mask.view()}, {"ids", c.ids.view()}}), c);
  }
}

TEST(OnnxSession, Float16Relu) {
  auto b = cpu_backend("fp16.onnx");
  // -1.5, 0, 2, 0.5, -3, 65504 (largest half)
  const Tensor h = make_host<uint16_t>(DType::kFloat16, {2, 3}, {0xBE00, 0x0000, 0x4000, 0x3800, 0xC200, 0x7BFF});
  const auto out = b->infer({h.view()});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dtype(), DType::kFloat16);
  EXPECT_EQ(out[0].shape(), (Shape{2, 3}));
  const auto bits = values_of<uint16_t>(out[0]);
  ASSERT_EQ(bits.size(), 6u);
  const std::vector<float> want = {0.0f, 0.0f, 2.0f, 0.5f, 0.0f, 65504.0f};
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(test::half_to_float(bits[i]), want[i]) << i;
}

TEST(OnnxSession, SessionOptionsDoNotChangeResults) {
  OnnxSessionConfig config = test::cpu_config();
  config.graph_optimization_level = GraphOptimizationLevel::kDisableAll;
  config.intra_op_threads = 1;
  config.inter_op_threads = 1;
  config.session_config = {{"session.disable_prepacking", "1"}};
  auto b = OnnxSession::create(fixture("mlp.onnx"), config);
  EXPECT_EQ(b->config(), config);
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const auto out = b->infer({x.view()});
  ASSERT_EQ(out.size(), 1u);
  expect_allclose_f32(out[0], test::load_fixture_npy("mlp_y.npy"), kTol);
}

TEST(OnnxSession, OutputsOutliveTheBackend) {
  std::vector<Tensor> out;
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  {
    auto b = cpu_backend("mlp.onnx");
    out = b->infer({x.view()});
  }
  ASSERT_EQ(out.size(), 1u);
  expect_allclose_f32(out[0], test::load_fixture_npy("mlp_y.npy"), kTol);
  // And a DLPack export of an output outlives the Tensor too.
  const std::vector<float> before = values_of<float>(out[0]);
  DLManagedTensor* m = out[0].to_dlpack();
  out.clear();  // the export is now the only holder of the ORT value
  const float* p = reinterpret_cast<const float*>(static_cast<const char*>(m->dl_tensor.data) + m->dl_tensor.byte_offset);
  EXPECT_EQ(std::vector<float>(p, p + before.size()), before);
  m->deleter(m);
}

TEST(OnnxSession, LiveSessionsCountsSessionsUntilTheirLastOutputIsGone) {
  const std::size_t before = OrtRuntime::live_sessions();
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  std::vector<Tensor> out;
  {
    auto b = cpu_backend("mlp.onnx");
    EXPECT_EQ(OrtRuntime::live_sessions(), before + 1);
    b->deactivate();  // releases the session...
    EXPECT_EQ(OrtRuntime::live_sessions(), before);
    b->activate();  // ...and recreates it
    EXPECT_EQ(OrtRuntime::live_sessions(), before + 1);
    out = b->infer({x.view()});
  }
  EXPECT_EQ(OrtRuntime::live_sessions(), before + 1) << "an output keeps its session";
  out.clear();
  EXPECT_EQ(OrtRuntime::live_sessions(), before);
}

TEST(OnnxSession, ToDeviceAndToHostOnCpu) {
  auto b = cpu_backend("mlp.onnx");
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const Tensor d = b->to_device(x);
  EXPECT_EQ(d.data(), x.data()) << "on the CPU, to_device returns the host tensor itself";
  EXPECT_EQ(d.device(), Device::cpu());
  const Tensor h = b->to_host(d);
  EXPECT_EQ(h.device(), Device::cpu());
  expect_allclose_f32(h, x, 0.0);
}

// ---------------------------------------------------------------------------------
// Input validation: each error has its code, names the input with expected vs actual,
// and leaves the backend working.

TEST(OnnxSessionErrors, MissingInputName) {
  auto b = cpu_backend("multi_dtype.onnx");
  const auto c = multi_dtype_case(2);
  expect_error([&] { b->infer_named({{"ids", c.ids.view()}}); }, ErrorCode::kInvalidArgument, {"mask", "ids"});
  expect_multi_dtype_still_works(*b);
}

TEST(OnnxSessionErrors, UnknownInputName) {
  auto b = cpu_backend("multi_dtype.onnx");
  const auto c = multi_dtype_case(2);
  expect_error([&] { b->infer_named({{"ids", c.ids.view()}, {"mask", c.mask.view()}, {"bogus_input", c.ids.view()}}); },
               ErrorCode::kInvalidArgument, {"bogus_input", "ids", "mask"});
  expect_multi_dtype_still_works(*b);
  expect_error([&] { b->infer_named({{"ids", c.ids.view()}, {"Mask", c.mask.view()}}); }, ErrorCode::kInvalidArgument,
               {"Mask", "mask"});
  expect_multi_dtype_still_works(*b);
}

TEST(OnnxSessionErrors, WrongDtype) {
  auto b = cpu_backend("multi_dtype.onnx");
  const auto c = multi_dtype_case(2);
  const Tensor ids32 = Tensor::empty_host(DType::kInt32, {2, 8});
  expect_error([&] { b->infer({ids32.view(), c.mask.view()}); }, ErrorCode::kDTypeMismatch, {"ids", "int64", "int32"});
  expect_multi_dtype_still_works(*b);
  const Tensor mask_u8 = Tensor::empty_host(DType::kUInt8, {2, 8});
  expect_error([&] { b->infer({c.ids.view(), mask_u8.view()}); }, ErrorCode::kDTypeMismatch, {"mask", "bool", "uint8"});
  expect_multi_dtype_still_works(*b);
  // Through infer_named as well.
  expect_error([&] { b->infer_named({{"ids", ids32.view()}, {"mask", c.mask.view()}}); }, ErrorCode::kDTypeMismatch,
               {"ids", "int64", "int32"});
  expect_multi_dtype_still_works(*b);
}

TEST(OnnxSessionErrors, WrongRank) {
  auto b = cpu_backend("multi_dtype.onnx");
  const auto c = multi_dtype_case(3);
  TensorView ids3 = c.ids.view();
  ids3.shape = {1, 3, 8};  // same bytes, rank 3
  const std::string msg =
      expect_error([&] { b->infer({ids3, c.mask.view()}); }, ErrorCode::kShapeMismatch, {"ids", "3"});
  const std::string expected_spec = b->graph_spec().inputs[0].to_string();
  EXPECT_TRUE(contains_word(msg, "2") || msg.find(expected_spec) != std::string::npos)
      << "message should give the expected rank (2) or spec (" << expected_spec << "): " << msg;
  expect_multi_dtype_still_works(*b);

  TensorView ids1 = c.ids.view();
  ids1.shape = {24};
  expect_error([&] { b->infer({ids1, c.mask.view()}); }, ErrorCode::kShapeMismatch, {"ids", "24"});
  expect_multi_dtype_still_works(*b);
}

TEST(OnnxSessionErrors, StaticExtentMismatch) {
  auto b = cpu_backend("multi_dtype.onnx");
  const auto c = multi_dtype_case(2);
  const Tensor ids = Tensor::empty_host(DType::kInt64, {2, 9});
  expect_error([&] { b->infer({ids.view(), c.mask.view()}); }, ErrorCode::kShapeMismatch, {"ids", "9", "8"});
  expect_multi_dtype_still_works(*b);

  auto h = cpu_backend("fp16.onnx");
  const Tensor wide = Tensor::empty_host(DType::kFloat16, {3, 3});
  expect_error([&] { h->infer({wide.view()}); }, ErrorCode::kShapeMismatch, {"h", "3", "2"});
  const auto ok = h->infer({Tensor::empty_host(DType::kFloat16, {2, 3}).view()});
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].shape(), (Shape{2, 3}));
}

GraphSpec mlp_spec_up_to_batch_4() {
  GraphSpecBuilder builder;
  builder.record({{"x", DType::kFloat32, {1, 64}}}, {{"y", DType::kFloat32, {1, 16}}}, 1);
  builder.record({{"x", DType::kFloat32, {4, 64}}}, {{"y", DType::kFloat32, {4, 16}}}, 4);
  return builder.build();
}

TEST(OnnxSessionErrors, ShapeOutsideTheSpec) {
  const GraphSpec spec = mlp_spec_up_to_batch_4();
  ASSERT_EQ(spec.inputs[0].max_shape, (Shape{4, 64}));
  auto b = cpu_backend("mlp.onnx", spec);
  EXPECT_EQ(b->graph_spec(), spec) << "the given spec is the one used";
  const Tensor x8 = test::make_pattern_f32({8, 64}, 3);
  expect_error([&] { b->infer({x8.view()}); }, ErrorCode::kShapeMismatch, {"x", "8", "4"});
  expect_mlp_still_works(*b);  // batch 3 lies inside [1, 4]
  const Tensor x4 = test::make_pattern_f32({4, 64}, 4);
  const auto out4 = b->infer({x4.view()});
  ASSERT_EQ(out4.size(), 1u);
  EXPECT_EQ(out4[0].shape(), (Shape{4, 16}));
  // The same model without a spec takes batch 8.
  const auto out8 = cpu_backend("mlp.onnx")->infer({x8.view()});
  EXPECT_EQ(out8[0].shape(), (Shape{8, 16}));
}

TEST(OnnxSessionErrors, InputsDisagreeingOnTheBatchAreRefused) {
  // Both inputs' axis 0 followed the batch in every recorded call: one batch to the graph.
  // ONNX Runtime's Add would broadcast a batch of 1 against 3 and answer another model.
  auto b0 = cpu_backend("add.onnx");
  GraphSpec spec = b0->graph_spec();
  for (auto* tensors : {&spec.inputs, &spec.outputs})
    for (auto& t : *tensors) {
      t.min_shape = {1, 4};
      t.max_shape = {8, 4};
      t.batch_axis = 0;
    }
  auto b = cpu_backend("add.onnx", spec);
  const Tensor x3 = test::make_pattern_f32({3, 4}, 1);
  const Tensor y1 = test::make_pattern_f32({1, 4}, 2);
  const Tensor y3 = test::make_pattern_f32({3, 4}, 3);
  expect_error([&] { b->infer({x3.view(), y1.view()}); }, ErrorCode::kShapeMismatch,
               {"'x'", "'y'", "disagree on the batch", "3 and 1"});
  EXPECT_EQ(b->infer({x3.view(), y3.view()})[0].shape(), (Shape{3, 4}));
  // Without batch axes (a spec derived from the model) nothing ties them.
  EXPECT_EQ(b0->infer({x3.view(), y1.view()})[0].shape(), (Shape{3, 4}));
}

TEST(OnnxSessionErrors, SpecNotMatchingTheModelThrowsInvalidArgument) {
  // The header: "Error(kInvalidArgument) for a spec that does not match the model's inputs".
  GraphSpec wrong_name = mlp_spec_up_to_batch_4();
  wrong_name.inputs[0].name = "pixels";
  const std::string msg =
      expect_error([&] { cpu_backend("mlp.onnx", wrong_name); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains_word(msg, "x") || contains_word(msg, "pixels")) << "should name the input: " << msg;
  GraphSpec wrong_dtype = mlp_spec_up_to_batch_4();
  wrong_dtype.inputs[0].dtype = DType::kFloat16;
  expect_error([&] { cpu_backend("mlp.onnx", wrong_dtype); }, ErrorCode::kInvalidArgument,
               {"x", "float16", "float32"});
  GraphSpec wrong_rank = mlp_spec_up_to_batch_4();
  wrong_rank.inputs[0].min_shape = {1, 8, 8};
  wrong_rank.inputs[0].max_shape = {4, 8, 8};
  expect_error([&] { cpu_backend("mlp.onnx", wrong_rank); }, ErrorCode::kInvalidArgument, {"x"});
  GraphSpec two_inputs = mlp_spec_up_to_batch_4();
  two_inputs.inputs.push_back(two_inputs.inputs[0]);
  two_inputs.inputs[1].name = "extra_input";
  expect_error([&] { cpu_backend("mlp.onnx", two_inputs); }, ErrorCode::kInvalidArgument);
}

TEST(OnnxSessionErrors, CpuProviderRejectsProviderOptions) {
  OnnxSessionConfig config = test::cpu_config();
  config.provider_options = {{"use_tf32", "0"}};
  expect_error([&] { OnnxSession::create(fixture("mlp.onnx"), config); }, ErrorCode::kInvalidArgument,
               {"use_tf32"});
}

TEST(OnnxSessionErrors, ThreadCountsOutsideTheManifestRangeAreRefused) {
  // Same range a checkpoint manifest is held to (0 = ORT's default .. 1024).
  for (auto [intra, inter, field] : {std::tuple{-5, 0, "intra_op_threads"}, std::tuple{100000, 0, "intra_op_threads"},
                                     std::tuple{0, 1025, "inter_op_threads"}, std::tuple{0, -1, "inter_op_threads"}}) {
    OnnxSessionConfig config = test::cpu_config();
    config.intra_op_threads = intra;
    config.inter_op_threads = inter;
    expect_error([&] { OnnxSession::create(fixture("mlp.onnx"), config); }, ErrorCode::kInvalidArgument,
                 {field, "1024"});
  }
  OnnxSessionConfig edge = test::cpu_config();
  edge.intra_op_threads = 1;
  edge.inter_op_threads = 1024;  // the bound itself is allowed (inter-op threads are made only for parallel mode)
  auto backend = OnnxSession::create(fixture("mlp.onnx"), edge);
  EXPECT_EQ(backend->config().inter_op_threads, 1024);
}

TEST(OnnxSessionErrors, NonContiguousInput) {
  auto b = cpu_backend("multi_dtype.onnx");
  const auto c = multi_dtype_case(2);
  const TensorView ids_t = transposed_view(c.ids, 2, 8);  // [2, 8] view of [8, 2] storage
  ASSERT_FALSE(ids_t.is_contiguous());
  const std::string msg = expect_error([&] { b->infer({ids_t, c.mask.view()}); },
                                       ErrorExpectation{{ErrorCode::kInvalidArgument}, {"ids"}, {"contiguous"}});
  EXPECT_FALSE(msg.empty());
  expect_multi_dtype_still_works(*b);
}

TEST(OnnxSessionErrors, EmptyInput) {
  auto b = cpu_backend("multi_dtype.onnx");
  const Tensor ids0 = Tensor::empty_host(DType::kInt64, {0, 8});
  const Tensor mask0 = Tensor::empty_host(DType::kBool, {0, 8});
  // The header lists "non-empty" among the shape checks without fixing the code: an
  // empty batch is a shape outside the graph's range or an invalid argument.
  expect_error([&] { b->infer({ids0.view(), mask0.view()}); },
               ErrorExpectation{{ErrorCode::kShapeMismatch, ErrorCode::kInvalidArgument}, {"ids"}});
  expect_multi_dtype_still_works(*b);
}

TEST(OnnxSessionErrors, WrongNumberOfInputs) {
  auto b = cpu_backend("multi_dtype.onnx");
  const auto c = multi_dtype_case(2);
  const std::string msg = expect_error([&] { b->infer({c.ids.view()}); }, ErrorCode::kInvalidArgument, {"1"});
  EXPECT_TRUE(contains_word(msg, "2") || (contains_word(msg, "ids") && contains_word(msg, "mask")))
      << "message should give the expected count or names: " << msg;
  expect_multi_dtype_still_works(*b);
  expect_error([&] { b->infer({c.ids.view(), c.mask.view(), c.ids.view()}); }, ErrorCode::kInvalidArgument, {"3"});
  expect_multi_dtype_still_works(*b);
  expect_error([&] { b->infer({}); }, ErrorCode::kInvalidArgument, {"0"});
  expect_multi_dtype_still_works(*b);
}

TEST(OnnxSessionErrors, InputOnTheWrongDevice) {
  auto b = cpu_backend("multi_dtype.onnx");
  const auto c = multi_dtype_case(2);
  TensorView on_gpu = c.ids.view();  // claims CUDA; must be rejected before anything reads it
  on_gpu.device = Device::cuda(0);
  expect_error([&] { b->infer({on_gpu, c.mask.view()}); },
               ErrorExpectation{{ErrorCode::kInvalidArgument}, {"ids"}, {"cuda"}});
  expect_multi_dtype_still_works(*b);
}

TEST(OnnxSessionErrors, MissingModelFile) {
  const std::string path = (test::models_dir() / "no_such_model.onnx").string();
  const std::string msg =
      expect_error([&] { OnnxSession::create(path, test::cpu_config()); }, ErrorCode::kModelInvalid);
  EXPECT_NE(msg.find(path), std::string::npos) << "message must name the file: " << msg;
}

TEST(OnnxSessionErrors, CorruptModelFile) {
  const std::string path = fixture("corrupt.onnx");
  const std::string msg =
      expect_error([&] { OnnxSession::create(path, test::cpu_config()); }, ErrorCode::kModelInvalid);
  EXPECT_NE(msg.find(path), std::string::npos) << "message must name the file: " << msg;
  // A directory is not a model either.
  expect_error([&] { OnnxSession::create(test::models_dir().string(), test::cpu_config()); },
               ErrorCode::kModelInvalid);
}

TEST(OnnxSessionErrors, EmptyModelFileIsAnInvalidModel) {
  // ORT answers an empty file with ORT_INVALID_ARGUMENT ("No graph was found"), which read
  // as a usage error (CLI exit 2) while a truncated file was kModelInvalid (exit 4).
  test::ScopedTempDir dir;
  test::write_file_bytes(dir.file("empty.onnx"), "");
  const std::string msg = expect_error([&] { OnnxSession::create(dir.file("empty.onnx"), test::cpu_config()); },
                                       ErrorCode::kModelInvalid);
  EXPECT_NE(msg.find(dir.file("empty.onnx")), std::string::npos) << msg;
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  // A directory is named as one, not as a file that was not found.
  const std::string dmsg = expect_error([&] { OnnxSession::create(dir.path().string(), test::cpu_config()); },
                                        ErrorCode::kModelInvalid);
  EXPECT_NE(dmsg.find("is a directory"), std::string::npos) << dmsg;
}

TEST(OnnxSessionErrors, ExternalDataMissing) {
  test::ScopedTempDir dir;
  std::filesystem::copy_file(fixture("mlp_ext.onnx"), dir.file("mlp_ext.onnx"));  // without its .data
  expect_error([&] { OnnxSession::create(dir.file("mlp_ext.onnx"), test::cpu_config()); },
               ErrorCode::kModelInvalid);
}

void expect_gpu_provider_unavailable(ExecutionProvider provider, const char* library_stem) {
  const ProviderStatus st = test::runtime()->provider_status(provider);
  if (st.available) GTEST_SKIP() << execution_provider_name(provider) << " is available here";
  OnnxSessionConfig config;
  config.provider = provider;
  // The message carries the reason: which provider library failed to load.
  expect_error([&] { OnnxSession::create(fixture("mlp.onnx"), config); },
               ErrorExpectation{{ErrorCode::kProviderUnavailable}, {}, {library_stem}});
}

TEST(OnnxSessionErrors, CudaProviderUnavailable) {
  expect_gpu_provider_unavailable(ExecutionProvider::kCUDA, "onnxruntime_providers_cuda");
}

TEST(OnnxSessionErrors, TensorRtProviderUnavailable) {
  expect_gpu_provider_unavailable(ExecutionProvider::kTensorRT, "onnxruntime_providers_tensorrt");
}

// ---------------------------------------------------------------------------------
// Life cycle

TEST(OnnxSession, StateMachine) {
  auto b = cpu_backend("mlp.onnx");
  EXPECT_EQ(b->state(), SessionState::kBuilt);
  expect_mlp_still_works(*b);
  b->activate();
  EXPECT_EQ(b->state(), SessionState::kActive);
  expect_mlp_still_works(*b);
  b->deactivate();
  EXPECT_EQ(b->state(), SessionState::kInactive);
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  expect_error([&] { b->infer({x.view()}); }, ErrorCode::kState);
  expect_error([&] { b->infer_named({{"x", x.view()}}); }, ErrorCode::kState);
  // Metadata stays readable while inactive.
  EXPECT_EQ(b->inputs().size(), 1u);
  EXPECT_EQ(b->graph_spec().inputs.size(), 1u);
  b->activate();
  EXPECT_EQ(b->state(), SessionState::kActive);
  expect_mlp_still_works(*b);
  b->deactivate();
  b->activate();
  EXPECT_EQ(b->state(), SessionState::kActive);
  expect_mlp_still_works(*b);
}

// ---------------------------------------------------------------------------------
// Concurrency

TEST(OnnxSession, ConcurrentInferGivesPerThreadResults) {
  constexpr int kThreads = 8;
  constexpr int kCalls = 50;
  auto b = cpu_backend("mlp.onnx");
  // Two inputs per thread with per-thread batch sizes; references computed serially.
  std::vector<std::array<Tensor, 2>> inputs(kThreads), expected(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    for (int k = 0; k < 2; ++k) {
      inputs[t][k] = test::make_pattern_f32({1 + (t + k) % 5, 64}, static_cast<uint32_t>(100 + 2 * t + k));
      auto out = b->infer({inputs[t][k].view()});
      ASSERT_EQ(out.size(), 1u);
      expected[t][k] = out[0];
    }
  }
  std::string first_failure;
  const int failures = test::run_concurrently(kThreads, kCalls, [&](int t, int call) -> std::string {
    const int k = call % 2;
    const auto out = b->infer({inputs[t][k].view()});
    if (out.size() != 1 || out[0].shape() != expected[t][k].shape()) return "wrong output shape";
    const auto got = values_of<float>(out[0]);
    const auto want = values_of<float>(expected[t][k]);
    for (std::size_t i = 0; i < got.size(); ++i)
      if (std::fabs(got[i] - want[i]) > kTol)
        return "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
               std::to_string(want[i]);
    return "";
  }, first_failure);
  EXPECT_EQ(failures, 0) << first_failure;
}

TEST(OnnxSession, ConcurrentInferOnExactModel) {
  constexpr int kThreads = 8;
  constexpr int kCalls = 50;
  auto b = cpu_backend("add.onnx");
  std::string first_failure;
  const int failures = test::run_concurrently(kThreads, kCalls, [&](int t, int call) -> std::string {
    const int64_t n = 1 + (t + call) % 6;
    std::vector<float> xs, ys;
    for (int64_t i = 0; i < n * 4; ++i) {
      xs.push_back(static_cast<float>(t * 1000 + call));
      ys.push_back(static_cast<float>(i));
    }
    const Tensor x = make_host(DType::kFloat32, {n, 4}, xs);
    const Tensor y = make_host(DType::kFloat32, {n, 4}, ys);
    const auto out = b->infer({x.view(), y.view()});
    if (out.at(0).shape() != Shape{n, 4}) return "wrong output shape " + shape_to_string(out[0].shape());
    const auto z = values_of<float>(out[0]);
    for (std::size_t i = 0; i < z.size(); ++i)
      if (z[i] != xs[i] + ys[i]) return "element " + std::to_string(i) + " is " + std::to_string(z[i]);
    return "";
  }, first_failure);
  EXPECT_EQ(failures, 0) << first_failure;
}

// ---------------------------------------------------------------------------------
// GPU: run where the CUDA provider is usable, skip elsewhere.

OnnxSessionConfig strict_cuda_config() {
  OnnxSessionConfig config = test::cuda_config();
  config.provider_options = {{"use_tf32", "0"}};  // strict fp32, comparable to the CPU within 1e-5
  return config;
}

TEST(OnnxSessionCuda, MlpMatchesCpu) {
  AITUNE_REQUIRE_CUDA();
  auto gpu = OnnxSession::create(fixture("mlp.onnx"), strict_cuda_config());
  EXPECT_EQ(gpu->device(), Device::cuda(0));
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const Tensor xd = gpu->to_device(x);
  EXPECT_EQ(xd.device(), Device::cuda(0));
  EXPECT_EQ(xd.shape(), x.shape());
  const auto out = gpu->infer({xd.view()});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].device().kind, DeviceKind::kCUDA);
  EXPECT_EQ(out[0].shape(), (Shape{3, 16}));
  const Tensor host = gpu->to_host(out[0]);
  EXPECT_EQ(host.device(), Device::cpu());
  const auto cpu_out = cpu_backend("mlp.onnx")->infer({x.view()});
  expect_allclose_f32(host, cpu_out[0], kTol);
  expect_allclose_f32(host, test::load_fixture_npy("mlp_y.npy"), kTol);
}

TEST(OnnxSessionErrors, CudaGraphOptionIsForTheCudaProviderOnly) {
  OnnxSessionConfig config = test::cpu_config();
  config.provider_options["enable_cuda_graph"] = "1";
  expect_error([&] { OnnxSession::create(fixture("mlp.onnx"), config); }, ErrorCode::kInvalidArgument,
               {"enable_cuda_graph", "CUDA", "cpu"});
}

TEST(OnnxSessionCpu, InferOnStreamIsInferAndThereIsNoStream) {
  auto b = cpu_backend("mlp.onnx");
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  EXPECT_EQ(b->cuda_stream(), 0u);
  expect_allclose_f32(b->infer_on_stream({x.view()}, 0).at(0), b->infer({x.view()}).at(0), 0.0);
}

// Inputs that differ call to call: a CUDA graph replaying stale buffers would return the
// previous call's outputs for them.
std::vector<Tensor> changing_inputs(int64_t rows, int count) {
  std::vector<Tensor> xs;
  for (int k = 0; k < count; ++k) xs.push_back(test::make_pattern_f32({rows, 64}, static_cast<uint32_t>(900 + 17 * k + rows)));
  return xs;
}

TEST(OnnxSessionCuda, CudaGraphReplaysFollowChangingInputs) {
  AITUNE_REQUIRE_CUDA();
  OnnxSessionConfig config = strict_cuda_config();
  config.provider_options["enable_cuda_graph"] = "1";
  auto graph = OnnxSession::create(fixture("mlp.onnx"), config);
  auto plain = OnnxSession::create(fixture("mlp.onnx"), strict_cuda_config());
  EXPECT_NE(graph->cuda_stream(), 0u);
  std::vector<Tensor> inputs, kept, expected;
  // Two shapes in turn: two captured graphs, each replayed with new inputs.
  for (int round = 0; round < 3; ++round)
    for (int64_t rows : {3, 5}) {
      for (const Tensor& x : changing_inputs(rows, 2)) {
        inputs.push_back(graph->to_device(x));
        const Tensor want = plain->to_host(plain->infer({plain->to_device(x).view()}).at(0));
        const Tensor got = graph->infer({inputs.back().view()}).at(0);
        expect_allclose_f32(graph->to_host(got), want, 1e-6);
        kept.push_back(got);
        expected.push_back(want);
      }
    }
  // Outputs handed out and inputs copied in earlier are not overwritten by later replays.
  for (std::size_t i = 0; i < kept.size(); ++i) {
    expect_allclose_f32(graph->to_host(kept[i]), expected[i], 1e-6);
    expect_allclose_f32(graph->to_host(graph->infer({inputs[i].view()}).at(0)), expected[i], 1e-6);
  }
}

// A caller that drops each output before its next-but-one call (`y = infer(x)` in a loop)
// gets the graph's own output buffers, two in turn, with no copy; outputs it keeps are
// never written again, even past deactivate().
TEST(OnnxSessionCuda, CudaGraphLendsOutputBuffersInTurnAndKeepsHeldOnes) {
  AITUNE_REQUIRE_CUDA();
  OnnxSessionConfig config = strict_cuda_config();
  config.provider_options["enable_cuda_graph"] = "1";
  auto graph = OnnxSession::create(fixture("mlp.onnx"), config);
  auto cpu = cpu_backend("mlp.onnx");
  const auto xs = changing_inputs(4, 8);
  std::vector<const void*> buffers;
  Tensor y;
  for (const Tensor& x : xs) {
    y = graph->infer_on_stream({graph->to_device(x).view()}, 0).at(0);
    buffers.push_back(y.data());
    expect_allclose_f32(graph->to_host(y), cpu->infer({x.view()}).at(0), kTol);
  }
  // The first call of a shape is copied out (it tells the output shapes); then two lanes.
  const std::set<const void*> lent(buffers.begin() + 1, buffers.end());
  EXPECT_EQ(lent.size(), 2u);
  for (std::size_t i = 2; i < buffers.size(); ++i) EXPECT_NE(buffers[i], buffers[i - 1]) << "call " << i;
  // Held outputs: both lanes are taken, so later calls fall back to copies.
  const Tensor held_a = y;
  const Tensor held_b = graph->infer_on_stream({graph->to_device(xs[0]).view()}, 0).at(0);
  for (int k = 0; k < 3; ++k) {
    const Tensor extra = graph->infer_on_stream({graph->to_device(xs[k + 1]).view()}, 0).at(0);
    EXPECT_NE(extra.data(), held_a.data());
    EXPECT_NE(extra.data(), held_b.data());
    expect_allclose_f32(graph->to_host(extra), cpu->infer({xs[k + 1].view()}).at(0), kTol);
  }
  y = Tensor();
  graph->deactivate();
  expect_allclose_f32(graph->to_host(held_a), cpu->infer({xs.back().view()}).at(0), kTol);
  expect_allclose_f32(graph->to_host(held_b), cpu->infer({xs[0].view()}).at(0), kTol);
  graph->activate();
  expect_allclose_f32(graph->to_host(graph->infer({graph->to_device(xs[2]).view()}).at(0)),
                      cpu->infer({xs[2].view()}).at(0), kTol);
}

TEST(OnnxSessionCuda, InferOnStreamOrdersWithTheLegacyStream) {
  AITUNE_REQUIRE_CUDA();
  for (bool with_graph : {false, true}) {
    OnnxSessionConfig config = strict_cuda_config();
    if (with_graph) config.provider_options["enable_cuda_graph"] = "1";
    auto gpu = OnnxSession::create(fixture("mlp.onnx"), config);
    auto cpu = cpu_backend("mlp.onnx");
    for (const Tensor& x : changing_inputs(4, 4)) {
      // to_device / to_host copy on the legacy default stream (0), the caller's stream here.
      const Tensor out = gpu->infer_on_stream({gpu->to_device(x).view()}, 0).at(0);
      expect_allclose_f32(gpu->to_host(out), cpu->infer({x.view()}).at(0), kTol);
    }
  }
}

TEST(OnnxSessionCuda, DefaultOptionsAndDeviceRoundTrip) {
  AITUNE_REQUIRE_CUDA();
  auto gpu = OnnxSession::create(fixture("mlp.onnx"), test::cuda_config());
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const Tensor back = gpu->to_host(gpu->to_device(x));
  expect_allclose_f32(back, x, 0.0);
  const auto out = gpu->infer({gpu->to_device(x).view()});
  // The CUDA EP's defaults allow TF32; the design notes measured 2e-8 on an MLP.
  expect_allclose_f32(gpu->to_host(out.at(0)), test::load_fixture_npy("mlp_y.npy"), 1e-3);
}

TEST(OnnxSessionCuda, MultiDtype) {
  AITUNE_REQUIRE_CUDA();
  auto gpu = OnnxSession::create(fixture("multi_dtype.onnx"), test::cuda_config());
  const auto c = multi_dtype_case(4, 9);
  const Tensor ids = gpu->to_device(c.ids);
  const Tensor mask = gpu->to_device(c.mask);
  const auto out = gpu->infer({ids.view(), mask.view()});
  ASSERT_EQ(out.size(), 2u);
  for (const auto& o : out) EXPECT_EQ(o.device().kind, DeviceKind::kCUDA);
  expect_multi_dtype_outputs({gpu->to_host(out[0]), gpu->to_host(out[1])}, c);
}

TEST(OnnxSessionCuda, HostInputIsRejectedNamingTheInput) {
  AITUNE_REQUIRE_CUDA();
  auto gpu = OnnxSession::create(fixture("multi_dtype.onnx"), test::cuda_config());
  const auto c = multi_dtype_case(2);
  const Tensor mask = gpu->to_device(c.mask);
  expect_error([&] { gpu->infer({c.ids.view(), mask.view()}); }, ErrorCode::kInvalidArgument, {"ids"});
  const auto out = gpu->infer({gpu->to_device(c.ids).view(), mask.view()});
  expect_multi_dtype_outputs({gpu->to_host(out.at(0)), gpu->to_host(out.at(1))}, c);
}

TEST(OnnxSessionCuda, StateMachineReleasesAndRecreates) {
  AITUNE_REQUIRE_CUDA();
  auto gpu = OnnxSession::create(fixture("mlp.onnx"), strict_cuda_config());
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const Tensor y = test::load_fixture_npy("mlp_y.npy");
  const Tensor xd = gpu->to_device(x);
  gpu->activate();
  expect_allclose_f32(gpu->to_host(gpu->infer({xd.view()}).at(0)), y, kTol);
  gpu->deactivate();
  EXPECT_EQ(gpu->state(), SessionState::kInactive);
  expect_error([&] { gpu->infer({xd.view()}); }, ErrorCode::kState);
  gpu->activate();
  expect_allclose_f32(gpu->to_host(gpu->infer({gpu->to_device(x).view()}).at(0)), y, kTol);
}

TEST(OnnxSessionCuda, ConcurrentInfer) {
  AITUNE_REQUIRE_CUDA();
  constexpr int kThreads = 8;
  constexpr int kCalls = 50;
  auto gpu = OnnxSession::create(fixture("mlp.onnx"), strict_cuda_config());
  auto cpu = cpu_backend("mlp.onnx");
  std::vector<Tensor> dev_inputs(kThreads), expected(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    const Tensor x = test::make_pattern_f32({1 + t % 4, 64}, static_cast<uint32_t>(500 + t));
    dev_inputs[t] = gpu->to_device(x);
    expected[t] = cpu->infer({x.view()}).at(0);
  }
  std::string first_failure;
  const int failures = test::run_concurrently(kThreads, kCalls, [&](int t, int) -> std::string {
    const Tensor got = gpu->to_host(gpu->infer({dev_inputs[t].view()}).at(0));
    const auto g = values_of<float>(got), w = values_of<float>(expected[t]);
    if (g.size() != w.size()) return "output has " + std::to_string(g.size()) + " elements";
    for (std::size_t i = 0; i < g.size(); ++i)
      if (std::fabs(g[i] - w[i]) > kTol) return "element " + std::to_string(i) + " differs from the CPU provider";
    return "";
  }, first_failure);
  EXPECT_EQ(failures, 0) << first_failure;
}

TEST(OnnxSessionTensorRt, MlpMatchesCpu) {
  const ProviderStatus st = test::runtime()->provider_status(ExecutionProvider::kTensorRT);
  if (!st.available) GTEST_SKIP() << "TensorRT execution provider unavailable: " << st.reason;
  OnnxSessionConfig config;
  config.provider = ExecutionProvider::kTensorRT;
  auto trt = OnnxSession::create(fixture("mlp.onnx"), config);
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const auto out = trt->infer({trt->to_device(x).view()});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].device().kind, DeviceKind::kCUDA);
  expect_allclose_f32(trt->to_host(out[0]), test::load_fixture_npy("mlp_y.npy"), 1e-3);
}

}  // namespace
}  // namespace aitune
