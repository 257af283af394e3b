// TensorSpec / GraphSpec: what a graph accepts, derived from recorded samples.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "aitune/dtype.hpp"
#include "aitune/tensor.hpp"

namespace aitune {

/// Extent used in a TensorSpec's max_shape for an axis with no upper bound.
inline constexpr int64_t kUnbounded = -1;

/// One input or output of a graph: element type and, per axis, the range of extents
/// it takes. An axis is dynamic when min != max; the batch axis (if any) is the axis
/// whose extent followed the batch size used while recording.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape min_shape;
  Shape max_shape;  ///< kUnbounded where nothing limits the axis
  std::optional<int> batch_axis;

  std::size_t rank() const noexcept { return min_shape.size(); }
  bool is_dynamic(std::size_t axis) const { return min_shape.at(axis) != max_shape.at(axis); }
  /// Indices of the dynamic axes, ascending.
  std::vector<int> dynamic_axes() const;
  /// True when `shape` has this rank and every extent lies in [min, max].
  bool accepts(const Shape& shape) const;
  /// "float32[1..8, 3, 224, 224]" (batch axis marked with 'b').
  std::string to_string() const;

  bool operator==(const TensorSpec&) const = default;
};

/// The inputs and outputs of one graph, in call order. Value type; thread-compatible.
struct GraphSpec {
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::vector<int64_t> batch_sizes;  ///< distinct batch sizes seen while recording, ascending

  /// Index of the input named `name`, or nullopt.
  std::optional<std::size_t> find_input(const std::string& name) const;

  std::string to_json(int indent = 2) const;
  /// Throws Error(kInvalidArgument) naming the field that is missing or malformed.
  static GraphSpec from_json(const std::string& text);

  bool operator==(const GraphSpec&) const = default;
};

/// Name, element type and shape of one tensor seen in a recorded call.
struct TensorRecord {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
};

/// Accumulates recorded calls of one graph and derives its GraphSpec:
/// min/max per axis over all samples; an axis is dynamic when min != max; the batch
/// axis of a tensor is its first axis whose extent equalled the batch size in every
/// sample, found only once at least two different batch sizes were recorded.
class GraphSpecBuilder {
 public:
  /// Adds one call. Every call must name the same tensors in the same order with the
  /// same dtypes and ranks; otherwise Error(kInvalidArgument / kDTypeMismatch /
  /// kShapeMismatch) names the tensor and what differed. `batch_size` <= 0 means the
  /// call has no batch.
  void record(const std::vector<TensorRecord>& inputs, const std::vector<TensorRecord>& outputs,
              int64_t batch_size);

  std::size_t num_samples() const noexcept { return num_samples_; }

  /// Throws Error(kState) when nothing was recorded.
  GraphSpec build() const;

 private:
  struct Accumulator {
    TensorRecord first;
    Shape min_shape, max_shape;
    std::vector<bool> tracks_batch;
  };
  static void merge(std::vector<Accumulator>& acc, const std::vector<TensorRecord>& records,
                    int64_t batch_size, bool first, const char* what);

  std::vector<Accumulator> inputs_, outputs_;
  std::vector<int64_t> batch_sizes_;
  std::size_t num_samples_ = 0;
};

}  // namespace aitune
