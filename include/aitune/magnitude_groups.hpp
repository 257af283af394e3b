// Magnitude groups: the parts of one output whose values are of very different sizes
// along one axis (a detection head's pixel boxes beside its [0, 1] scores), judged as if
// each part were an output of its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "aitune/tensor.hpp"

namespace aitune {

/// A scaled atol (Tolerance::scaled) follows the size of the values it bounds. One RMS for a
/// whole output is that size only where the output's values are of one size: YOLO's
/// [batch, 4 + classes, anchors] holds box coordinates in pixels (RMS ~300) beside class
/// scores in [0, 1], and the whole output's RMS (~65) would give the scores an fp16 atol of
/// 0.65, wider than their range; a graph computing wrong scores would pass. So where the
/// slices of one axis fall into magnitudes a clear gap apart, each such group of slices is
/// judged as its own output: the table's atol scaled by its own RMS, and, under the
/// calibrated rule, its own errors against eager's on the same group (calibration.hpp).
///
/// How the groups are found, from the expected output alone (so a candidate and eager at
/// a precision, compared with the same reference, get the same groups): per axis with at
/// least two indices and at least two elements per slice, each index's slice RMS over its
/// finite values, floored at 1 (below 1 a scaled atol is the table's own); sorted, these
/// split wherever one is at least `kMagnitudeGap` times the one before. The axis with the
/// widest such gap is chosen; none: one group, the whole output, scaled by its RMS as
/// before. Outputs of one size (logits, hidden states, images) have no such gap: their
/// slices' sizes spread continuously, and the gap is an order of magnitude with no slice
/// in between.
struct MagnitudeGroups {
  static constexpr double kMagnitudeGap = 10;
  int64_t axis = -1;              ///< -1: one group (no split)
  std::vector<int32_t> group_of;  ///< per index along `axis`: its group, 0 = the smallest values
  std::vector<double> scale;      ///< per group: max(1, RMS of its finite expected values)
  bool split() const noexcept { return axis >= 0; }
  /// The indices of group g along the axis, as ranges: "4:84" or "0:2, 5".
  std::string indices(std::size_t g) const;
};

/// The magnitude groups of `expected` (host memory, contiguous); one group for integer
/// and bool outputs and for outputs of rank < 2.
MagnitudeGroups magnitude_groups(const TensorView& expected);

}  // namespace aitune
