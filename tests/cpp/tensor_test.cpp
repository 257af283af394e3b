// Tests for TensorView (DLPack import, contiguity, sizes), Tensor (host allocation,
// ownership, DLPack export), Device and shape printing.
#include "test_support.hpp"

namespace aitune {
namespace {

using test::expect_error;

DLTensor make_dl(void* data, DLDataType dtype, std::vector<int64_t>& shape, int64_t* strides,
                 DLDevice device = DLDevice{kDLCPU, 0}, uint64_t byte_offset = 0) {
  DLTensor t{};
  t.data = data;
  t.device = device;
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dtype;
  t.shape = shape.data();
  t.strides = strides;
  t.byte_offset = byte_offset;
  return t;
}

TEST(Device, ToString) {
  EXPECT_EQ(Device::cpu().to_string(), "cpu");
  EXPECT_EQ(Device::cuda().to_string(), "cuda:0");
  EXPECT_EQ(Device::cuda(3).to_string(), "cuda:3");
  EXPECT_EQ(Device::cuda(1), (Device{DeviceKind::kCUDA, 1}));
  EXPECT_NE(Device::cuda(0), Device::cpu());
}

TEST(Shape, ToString) {
  EXPECT_EQ(shape_to_string({2, 3, 224, 224}), "[2, 3, 224, 224]");
  EXPECT_EQ(shape_to_string({7}), "[7]");
  EXPECT_EQ(shape_to_string({}), "[]");
}

TEST(TensorView, FromDlpackCompact) {
  std::vector<float> buf(6);
  std::vector<int64_t> shape = {2, 3};
  DLTensor dl = make_dl(buf.data(), DLDataType{kDLFloat, 32, 1}, shape, nullptr);
  TensorView v = TensorView::from_dlpack(dl);
  EXPECT_EQ(v.data, buf.data());
  EXPECT_EQ(v.dtype, DType::kFloat32);
  EXPECT_EQ(v.shape, (Shape{2, 3}));
  EXPECT_TRUE(v.strides.empty() || v.strides == (Shape{3, 1})) << shape_to_string(v.strides);
  EXPECT_EQ(v.device, Device::cpu());
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.numel(), 6);
  EXPECT_EQ(v.nbytes(), 24u);
}

TEST(TensorView, FromDlpackStridesAndByteOffset) {
  // A transposed view of a [3, 4] int64 buffer, starting one row in: shape [4, 2],
  // strides [1, 4] (in elements), byte_offset = one row of 4 int64.
  std::vector<int64_t> buf(12);
  std::vector<int64_t> shape = {4, 2};
  std::vector<int64_t> strides = {1, 4};
  DLTensor dl = make_dl(buf.data(), DLDataType{kDLInt, 64, 1}, shape, strides.data(), DLDevice{kDLCPU, 0},
                        4 * sizeof(int64_t));
  TensorView v = TensorView::from_dlpack(dl);
  EXPECT_EQ(v.data, static_cast<void*>(buf.data() + 4)) << "byte_offset must be folded into data";
  EXPECT_EQ(v.dtype, DType::kInt64);
  EXPECT_EQ(v.shape, (Shape{4, 2}));
  EXPECT_EQ(v.strides, (Shape{1, 4}));
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_EQ(v.numel(), 8);
  EXPECT_EQ(v.nbytes(), 64u);
}

TEST(TensorView, FromDlpackDevices) {
  float dummy = 0;
  std::vector<int64_t> shape = {1};
  DLTensor cuda = make_dl(&dummy, DLDataType{kDLFloat, 32, 1}, shape, nullptr, DLDevice{kDLCUDA, 2});
  EXPECT_EQ(TensorView::from_dlpack(cuda).device, Device::cuda(2));
  // Pinned host memory counts as host.
  DLTensor pinned = make_dl(&dummy, DLDataType{kDLFloat, 32, 1}, shape, nullptr, DLDevice{kDLCUDAHost, 0});
  EXPECT_EQ(TensorView::from_dlpack(pinned).device, Device::cpu());
  DLTensor vulkan = make_dl(&dummy, DLDataType{kDLFloat, 32, 1}, shape, nullptr, DLDevice{kDLVulkan, 0});
  expect_error([&] { TensorView::from_dlpack(vulkan); }, ErrorCode::kInvalidArgument);
}

TEST(TensorView, FromDlpackUnsupportedDtype) {
  float dummy[2] = {};
  std::vector<int64_t> shape = {1};
  DLTensor complex = make_dl(dummy, DLDataType{5 /* kDLComplex */, 64, 1}, shape, nullptr);
  expect_error([&] { TensorView::from_dlpack(complex); }, ErrorCode::kDTypeMismatch);
  DLTensor vec = make_dl(dummy, DLDataType{kDLFloat, 32, 2}, shape, nullptr);
  expect_error([&] { TensorView::from_dlpack(vec); }, ErrorCode::kDTypeMismatch);
}

TEST(TensorView, FromDlpackScalar) {
  double value = 2.5;
  std::vector<int64_t> shape;
  DLTensor dl = make_dl(&value, DLDataType{kDLFloat, 64, 1}, shape, nullptr);
  TensorView v = TensorView::from_dlpack(dl);
  EXPECT_TRUE(v.shape.empty());
  EXPECT_EQ(v.numel(), 1);
  EXPECT_EQ(v.nbytes(), 8u);
  EXPECT_TRUE(v.is_contiguous());
}

TensorView view_of(Shape shape, Shape strides) {
  TensorView v;
  v.data = reinterpret_cast<void*>(0x1000);
  v.dtype = DType::kFloat32;
  v.shape = std::move(shape);
  v.strides = std::move(strides);
  return v;
}

TEST(TensorView, IsContiguous) {
  EXPECT_TRUE(view_of({2, 3, 4}, {}).is_contiguous()) << "empty strides mean compact";
  EXPECT_TRUE(view_of({2, 3, 4}, {12, 4, 1}).is_contiguous());
  EXPECT_FALSE(view_of({3, 2}, {1, 3}).is_contiguous()) << "transposed";
  EXPECT_FALSE(view_of({2, 3}, {4, 1}).is_contiguous()) << "padded rows";
  EXPECT_FALSE(view_of({2, 3}, {6, 2}).is_contiguous()) << "every other element";
  EXPECT_FALSE(view_of({4}, {2}).is_contiguous());
  EXPECT_TRUE(view_of({4}, {1}).is_contiguous());
  // No element, nothing to lay out (torch: x[:, :0] * 2 has strides (1, 1) for shape [2, 0]);
  // read as not contiguous, an empty output failed the whole tune.
  EXPECT_TRUE(view_of({2, 0}, {1, 1}).is_contiguous()) << "empty";
  EXPECT_TRUE(view_of({0, 3}, {7, 2}).is_contiguous()) << "empty";
  // Axes of extent 1 may carry any stride (torch gives them arbitrary ones).
  EXPECT_TRUE(view_of({2, 1, 3}, {3, 999, 1}).is_contiguous());
  EXPECT_TRUE(view_of({1, 4}, {1, 1}).is_contiguous());
  EXPECT_TRUE(view_of({1, 4}, {4, 1}).is_contiguous());
  EXPECT_TRUE(view_of({3, 1}, {1, 1}).is_contiguous());
  EXPECT_TRUE(view_of({1, 1}, {0, 0}).is_contiguous());
  EXPECT_FALSE(view_of({2, 1, 3}, {1, 999, 2}).is_contiguous()) << "transposed around an extent-1 axis";
  EXPECT_TRUE(view_of({}, {}).is_contiguous()) << "scalar";
}

TEST(TensorView, NumelAndNbytes) {
  TensorView v = view_of({2, 3, 4}, {});
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.nbytes(), 96u);
  v.dtype = DType::kFloat16;
  EXPECT_EQ(v.nbytes(), 48u);
  v.dtype = DType::kInt64;
  EXPECT_EQ(v.nbytes(), 192u);
  v.dtype = DType::kBool;
  EXPECT_EQ(v.nbytes(), 24u);
  EXPECT_EQ(view_of({0, 5}, {}).numel(), 0);
  EXPECT_EQ(view_of({0, 5}, {}).nbytes(), 0u);
  EXPECT_EQ(view_of({}, {}).numel(), 1);
}

TEST(Tensor, DefaultIsUndefined) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.data(), nullptr);
}

TEST(Tensor, EmptyHostIsZeroFilledAndWritable) {
  Tensor t = Tensor::empty_host(DType::kFloat32, {2, 3});
  ASSERT_TRUE(t.defined());
  ASSERT_NE(t.data(), nullptr);
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.view().numel(), 6);
  EXPECT_TRUE(t.view().is_contiguous());
  const auto* p = static_cast<const float*>(t.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(p[i], 0.0f) << i;
  static_cast<float*>(t.data())[5] = 7.0f;
  EXPECT_EQ(test::values_of<float>(t)[5], 7.0f);

  Tensor big = Tensor::empty_host(DType::kInt64, {1000});
  EXPECT_EQ(big.nbytes(), 8000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big.data()) % alignof(int64_t), 0u) << "misaligned";
  const auto vals = test::values_of<int64_t>(big);
  EXPECT_TRUE(std::all_of(vals.begin(), vals.end(), [](int64_t x) { return x == 0; }));

  Tensor scalar = Tensor::empty_host(DType::kFloat64, {});
  EXPECT_TRUE(scalar.defined());
  EXPECT_EQ(scalar.nbytes(), 8u);
}

TEST(Tensor, CopiesShareMemory) {
  Tensor a = Tensor::empty_host(DType::kInt32, {4});
  Tensor b = a;
  EXPECT_EQ(a.data(), b.data());
  static_cast<int32_t*>(b.data())[2] = 42;
  EXPECT_EQ(static_cast<int32_t*>(a.data())[2], 42);
}

// An owner that records when it is released.
std::shared_ptr<void> tracked_owner(std::vector<float>* storage, bool* released) {
  return std::shared_ptr<void>(storage, [released](void* p) {
    *released = true;
    delete static_cast<std::vector<float>*>(p);
  });
}

TEST(Tensor, AdoptKeepsOwnerAliveUntilLastCopyGoes) {
  bool released = false;
  auto* storage = new std::vector<float>{1, 2, 3, 4};
  TensorView v;
  v.data = storage->data();
  v.dtype = DType::kFloat32;
  v.shape = {2, 2};
  {
    Tensor t = Tensor::adopt(v, tracked_owner(storage, &released));
    EXPECT_TRUE(t.defined());
    EXPECT_EQ(t.data(), storage->data());
    Tensor copy = t;
    t = Tensor();
    EXPECT_FALSE(released) << "a copy still holds the owner";
    EXPECT_EQ(test::values_of<float>(copy), (std::vector<float>{1, 2, 3, 4}));
  }
  EXPECT_TRUE(released);
}

TEST(Tensor, ToDlpackDescribesTheTensor) {
  Tensor t = test::make_host<int32_t>(DType::kInt32, {2, 3}, {0, 1, 2, 3, 4, 5});
  DLManagedTensor* m = t.to_dlpack();
  ASSERT_NE(m, nullptr);
  ASSERT_NE(m->deleter, nullptr);
  const DLTensor& dl = m->dl_tensor;
  EXPECT_EQ(static_cast<char*>(dl.data) + dl.byte_offset, static_cast<char*>(t.data())) << "no copy";
  EXPECT_EQ(dl.device.device_type, kDLCPU);
  EXPECT_EQ(dl.device.device_id, 0);
  ASSERT_EQ(dl.ndim, 2);
  EXPECT_EQ(dl.shape[0], 2);
  EXPECT_EQ(dl.shape[1], 3);
  if (dl.strides != nullptr) {
    EXPECT_EQ(dl.strides[0], 3);
    EXPECT_EQ(dl.strides[1], 1);
  }
  EXPECT_EQ(dl.dtype.code, kDLInt);
  EXPECT_EQ(dl.dtype.bits, 32);
  EXPECT_EQ(dl.dtype.lanes, 1);
  // Importing the export gives the same view back.
  TensorView back = TensorView::from_dlpack(dl);
  EXPECT_EQ(back.data, t.data());
  EXPECT_EQ(back.shape, t.shape());
  EXPECT_EQ(back.dtype, DType::kInt32);
  EXPECT_TRUE(back.is_contiguous());
  m->deleter(m);
}

TEST(Tensor, ToDlpackKeepsMemoryAliveAfterTensorIsDestroyed) {
  bool released = false;
  auto* storage = new std::vector<float>{10, 20, 30, 40, 50, 60};
  TensorView v;
  v.data = storage->data();
  v.dtype = DType::kFloat32;
  v.shape = {3, 2};
  DLManagedTensor* m = nullptr;
  {
    Tensor t = Tensor::adopt(v, tracked_owner(storage, &released));
    m = t.to_dlpack();
    ASSERT_NE(m, nullptr);
  }
  EXPECT_FALSE(released) << "the DLPack export must hold the owner";
  const float* p = static_cast<const float*>(m->dl_tensor.data);
  p = reinterpret_cast<const float*>(reinterpret_cast<const char*>(p) + m->dl_tensor.byte_offset);
  EXPECT_EQ(p[0], 10.0f);
  EXPECT_EQ(p[5], 60.0f);
  ASSERT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.shape[0], 3);  // shape storage outlives the Tensor too
  EXPECT_EQ(m->dl_tensor.shape[1], 2);
  m->deleter(m);
  EXPECT_TRUE(released) << "the deleter must release the owner";
}

TEST(Tensor, TwoExportsEachHoldTheOwner) {
  bool released = false;
  auto* storage = new std::vector<float>{1, 2};
  TensorView v;
  v.data = storage->data();
  v.dtype = DType::kFloat32;
  v.shape = {2};
  DLManagedTensor* a = nullptr;
  DLManagedTensor* b = nullptr;
  {
    Tensor t = Tensor::adopt(v, tracked_owner(storage, &released));
    a = t.to_dlpack();
    b = t.to_dlpack();
  }
  a->deleter(a);
  EXPECT_FALSE(released);
  EXPECT_EQ(static_cast<const float*>(b->dl_tensor.data)[1], 2.0f);
  b->deleter(b);
  EXPECT_TRUE(released);
}

TEST(Tensor, ToDlpackOfCudaViewKeepsDevice) {
  // No memory is touched: the export only describes it.
  bool released = false;
  auto* storage = new std::vector<float>(1);
  TensorView v;
  v.data = storage->data();
  v.dtype = DType::kFloat16;
  v.shape = {4, 8};
  v.device = Device::cuda(1);
  Tensor t = Tensor::adopt(v, tracked_owner(storage, &released));
  EXPECT_EQ(t.device(), Device::cuda(1));
  DLManagedTensor* m = t.to_dlpack();
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(m->dl_tensor.device.device_id, 1);
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLFloat);
  EXPECT_EQ(m->dl_tensor.dtype.bits, 16);
  m->deleter(m);
}

}  // namespace
}  // namespace aitune
