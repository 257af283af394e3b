// TensorView over DLPack, owning Tensor and its DLPack export.
#include "aitune/tensor.hpp"

#include <algorithm>

#include "aitune/error.hpp"

namespace aitune {

std::string shape_to_string(const Shape& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

TensorView TensorView::from_dlpack(const DLTensor& t) {
  auto dtype = dtype_from_dlpack(t.dtype);
  if (!dtype)
    throw Error(ErrorCode::kDTypeMismatch, "unsupported DLPack dtype (code " + std::to_string(t.dtype.code) +
                                               ", bits " + std::to_string(t.dtype.bits) + ", lanes " +
                                               std::to_string(t.dtype.lanes) + ")");
  TensorView view;
  view.dtype = *dtype;
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost: view.device = Device::cpu(); break;
    case kDLCUDA: view.device = Device::cuda(t.device.device_id); break;
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  "unsupported DLPack device type " + std::to_string(t.device.device_type) + " (only CPU and CUDA)");
  }
  view.data = static_cast<char*>(t.data) + t.byte_offset;
  view.shape.assign(t.shape, t.shape + t.ndim);
  if (t.strides) view.strides.assign(t.strides, t.strides + t.ndim);
  return view;
}

int64_t shape_numel(const Shape& shape) noexcept {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

int64_t TensorView::numel() const noexcept { return shape_numel(shape); }

bool TensorView::is_contiguous() const noexcept {
  if (strides.empty()) return true;
  // No element: any strides lay out nothing (torch calls every empty tensor contiguous).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return true;
  int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

Tensor Tensor::empty_host(DType dtype, const Shape& shape) {
  for (auto d : shape)
    if (d < 0) throw Error(ErrorCode::kInvalidArgument, "negative extent in shape " + shape_to_string(shape));
  TensorView view;
  view.dtype = dtype;
  view.shape = shape;
  view.device = Device::cpu();
  // max(1, n) so that a zero-sized tensor still has a valid, unique pointer.
  std::size_t bytes = std::max<std::size_t>(1, view.nbytes());
  auto buffer = std::shared_ptr<std::byte[]>(new std::byte[bytes]());
  view.data = buffer.get();
  return adopt(std::move(view), std::shared_ptr<void>(buffer, buffer.get()));
}

Tensor Tensor::adopt(TensorView view, std::shared_ptr<void> owner) {
  Tensor t;
  t.view_ = std::move(view);
  t.owner_ = std::move(owner);
  return t;
}

namespace {
// The DLManagedTensor plus what it points into, freed together by the deleter.
struct ManagedContext {
  DLManagedTensor managed{};
  Shape shape;
  Shape strides;
  std::shared_ptr<void> owner;
};
}  // namespace

DLManagedTensor* Tensor::to_dlpack() const {
  if (!defined()) throw Error(ErrorCode::kState, "cannot export an undefined tensor to DLPack");
  auto* ctx = new ManagedContext;
  ctx->shape = view_.shape;
  ctx->strides = view_.strides;
  ctx->owner = owner_;
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = view_.data;
  t.device = view_.device.kind == DeviceKind::kCPU ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, view_.device.index};
  t.ndim = static_cast<int32_t>(ctx->shape.size());
  t.dtype = dtype_to_dlpack(view_.dtype);
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.empty() ? nullptr : ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensor* self) { delete static_cast<ManagedContext*>(self->manager_ctx); };
  return &ctx->managed;
}

}  // namespace aitune
