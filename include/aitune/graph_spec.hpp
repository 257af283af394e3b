// TensorSpec / GraphSpec: what a graph accepts, derived from recorded samples.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "aitune/dtype.hpp"
#include "aitune/shape_condition.hpp"
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
  /// Per axis, the extents go from min_shape in steps of this (a range declared as a
  /// multiple, `2 * Dim("h")`: only even heights); empty, or 1 on an axis: every extent.
  Shape step;

  std::size_t rank() const noexcept { return min_shape.size(); }
  bool is_dynamic(std::size_t axis) const { return min_shape.at(axis) != max_shape.at(axis); }
  /// Indices of the dynamic axes, ascending.
  std::vector<int> dynamic_axes() const;
  /// True when `shape` has this rank and every extent lies in [min, max] (and on an axis
  /// with a step, is min plus a multiple of it).
  bool accepts(const Shape& shape) const;
  /// The step of `axis` (1 where none is set).
  int64_t step_of(std::size_t axis) const { return axis < step.size() ? step[axis] : 1; }
  /// "float32[1..8, 3, 224, 224]" (batch axis marked with 'b'; "8..32 step 2" for a step).
  std::string to_string() const;

  bool operator==(const TensorSpec&) const = default;
};

/// Whether the rows of a batch are computed apart from each other, so that requests
/// joined into one call (serving) each get exactly what they would get alone. A model
/// whose outputs mix rows (a batch mean, `a @ b.T` over the batch, logits flattened over
/// batch and sequence) computes something else for a request joined with others.
enum class BatchRows {
  kUnchecked,    ///< not known (a spec written before the check, or nothing to check it with)
  kIndependent,  ///< checked by the tuner: each row of a batch equals that row run alone
  kCoupled,      ///< checked: a row of a batch differs from it alone, or an output has no batch axis
};
std::string_view batch_rows_name(BatchRows rows) noexcept;
/// The BatchRows a name of batch_rows_name stands for; Error(kInvalidArgument) naming the
/// three for another.
BatchRows parse_batch_rows(std::string_view name);

/// The inputs and outputs of one graph, in call order. Value type; thread-compatible.
struct GraphSpec {
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::vector<int64_t> batch_sizes;  ///< distinct batch sizes seen while recording, ascending
  /// Conditions the exported model was captured under (a branch of the model's code on a
  /// shape, ShapeCondition): a call whose input shapes violate one is outside the graph
  /// even where every extent lies in its range.
  std::vector<ShapeCondition> conditions;
  /// Whether requests may share a call (BatchRows), and why, as the tuner found it; a
  /// server joins requests only for kIndependent (serving_batches.hpp).
  BatchRows batch_rows = BatchRows::kUnchecked;
  std::string batch_rows_reason;

  /// Index of the input named `name`, or nullopt.
  std::optional<std::size_t> find_input(const std::string& name) const;
  /// The first condition these input shapes (in input order) violate, or nullptr.
  const ShapeCondition* violated_condition(ShapeRefs shapes) const;
  const ShapeCondition* violated_condition(const std::vector<Shape>& shapes) const;
  /// Throws Error(kShapeMismatch) naming the inputs' shapes and the first condition they
  /// violate, if any.
  void check_conditions(ShapeRefs shapes) const;
  void check_conditions(const std::vector<Shape>& shapes) const;

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

  /// Declares that input `input` takes every extent in [min, max] on `axis` (max = kUnbounded:
  /// no upper bound), beyond what was recorded: the ranges a user gives `ait.Module`'s
  /// `dynamic_shapes`. build() then checks that every recorded extent lies inside the range
  /// and widens the axis to it; it widens the same way every output axis whose extent
  /// equalled this one in every recorded call (a hidden state's sequence axis), and, where
  /// the axis is the input's batch axis, every batch axis. Throws Error(kInvalidArgument) for
  /// a negative axis or min, or max < min; build() throws it for an input the graph does
  /// not have, an axis beyond its rank, or a recorded extent outside the range.
  /// `step` > 1: only min, min + step, ... up to max (a multiple a model's code needs); the
  /// recorded extents must be among them.
  void declare_range(const std::string& input, int axis, int64_t min, int64_t max, int64_t step = 1);

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

  struct DeclaredRange {
    std::string input;
    int axis;
    int64_t min, max, step;
  };
  void apply(const DeclaredRange& range, GraphSpec& spec) const;

  std::vector<Accumulator> inputs_, outputs_;
  std::vector<std::vector<Shape>> input_shapes_, output_shapes_;  ///< per recorded call, for declared ranges
  std::vector<DeclaredRange> declared_;
  std::vector<int64_t> batch_sizes_;
  std::size_t num_samples_ = 0;
};

}  // namespace aitune
