// TensorView (non-owning, over DLPack) and Tensor (owning, exportable by DLPack).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "aitune/device.hpp"
#include "aitune/dtype.hpp"

namespace aitune {

/// Shape of a tensor, one extent per axis.
using Shape = std::vector<int64_t>;

/// "[2, 3, 224, 224]".
std::string shape_to_string(const Shape& shape);

/// The number of elements of a tensor of this shape (1 for a scalar's empty shape).
int64_t shape_numel(const Shape& shape) noexcept;

/// A non-owning view of tensor memory: pointer, element type, shape, strides (in
/// elements, as DLPack and torch count them) and device. The caller keeps the memory
/// alive for as long as the view is used. Cheap to copy; not thread-affine.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Shape shape;
  Shape strides;  ///< empty means compact row-major
  Device device;

  /// Wraps a DLTensor (byte_offset folded into data). Throws Error(kDTypeMismatch)
  /// for an element type aitune does not handle and Error(kInvalidArgument) for a
  /// device that is neither host nor CUDA.
  static TensorView from_dlpack(const DLTensor& tensor);

  int64_t numel() const noexcept;
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  /// True when the strides are compact row-major (axes of extent 1 may have any stride).
  bool is_contiguous() const noexcept;
};

/// An owning tensor. Its memory is held by a shared owner (a host buffer it
/// allocated, or an ORT value for outputs ORT allocated on the device), so copies of
/// a Tensor share memory, and an exported DLPack tensor keeps the owner alive until
/// the consumer calls its deleter. Thread safety: like a shared_ptr.
class Tensor {
 public:
  Tensor() = default;

  /// Allocates zero-filled host memory of `dtype` and `shape`.
  static Tensor empty_host(DType dtype, const Shape& shape);

  /// Takes a view whose memory `owner` keeps alive (e.g. an Ort::Value).
  static Tensor adopt(TensorView view, std::shared_ptr<void> owner);

  const TensorView& view() const noexcept { return view_; }
  void* data() const noexcept { return view_.data; }
  DType dtype() const noexcept { return view_.dtype; }
  const Shape& shape() const noexcept { return view_.shape; }
  const Device& device() const noexcept { return view_.device; }
  std::size_t nbytes() const noexcept { return view_.nbytes(); }
  bool defined() const noexcept { return owner_ != nullptr; }

  /// Exports a DLPack tensor sharing this tensor's memory (no copy). The returned
  /// object owns a reference to the memory; the consumer must call its `deleter`.
  DLManagedTensor* to_dlpack() const;

 private:
  TensorView view_;
  std::shared_ptr<void> owner_;
};

}  // namespace aitune
