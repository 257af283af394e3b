// Correctness: comparing a candidate's outputs with reference outputs, per output,
// with absolute and relative tolerances (Polygraphy's rule), NaN/Inf, shape and dtype.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "aitune/dtype.hpp"
#include "aitune/magnitude_groups.hpp"
#include "aitune/tensor.hpp"

namespace aitune {

/// An element passes when |actual - expected| <= atol OR |actual - expected| <= rtol * |expected|:
/// it fails only when it exceeds both (as Polygraphy decides).
///
/// With `scaled`, atol is relative to the output's magnitude: the atol applied is
/// atol * max(1, RMS of the expected output's finite elements). Rounding errors of
/// fp32/TF32/fp16 arithmetic grow with the size of the values computed, so an output
/// whose values are in the hundreds gets an absolute bound in proportion, while a wrong
/// result (an error of the order of the values themselves) still fails. The defaults
/// (`default_tolerance`) are scaled; a tolerance a user gives is absolute.
struct Tolerance {
  double atol = 0;
  double rtol = 0;
  bool scaled = false;
  bool operator==(const Tolerance&) const = default;
};

/// The factor a scaled atol is multiplied by for this expected output: max(1, RMS of its
/// finite elements), leaving out outliers and mask sentinels (the largest elements where
/// each is at least 100x the RMS of the values below it, for up to 5 % of the elements, or
/// 1e4x, for up to half: a 1e6 diagonal over values near 1, masked_fill(-1e9), whose RMS
/// would excuse any error of the rest; the rtol judges them); 1 for integer and bool
/// outputs. `expected` must be in host memory and contiguous.
struct AtolScale {
  double scale = 1;
  int64_t outliers = 0;  ///< finite elements left out of the RMS
  double cut = std::numeric_limits<double>::infinity();  ///< |value| from which an element is one
};
AtolScale measure_atol_scale(const TensorView& expected);
double atol_scale(const TensorView& expected);

/// Numeric precision a candidate computes in, which sets its default tolerance for
/// floating-point outputs: a TF32 or fp16 variant is not held to strict fp32 bounds.
/// Ordered from exact to loose (kStrict is the model's own dtype, fp32 for fp32 models).
enum class Precision { kStrict, kTF32, kFP16, kBF16 };
/// "fp32", "tf32", "fp16", "bf16": the names reports, the CLI and the Python API use.
std::string_view precision_name(Precision precision) noexcept;
/// Inverse of precision_name ("strict" is accepted for kStrict); Error(kInvalidArgument) otherwise.
Precision parse_precision(std::string_view text);

/// The loosest precision tuning may choose (`ONNXRuntimeBackendConfig.precision`,
/// `aitune tune --precision`); nullopt means "any". A limit admits itself and every
/// stricter precision: "fp32" only kStrict, "tf32" adds kTF32, "fp16" adds kFP16, "bf16"
/// adds kBF16 (not kFP16: fp16's narrower range is not what a bf16 user asked for).
using PrecisionLimit = std::optional<Precision>;
/// "any" or a precision_name; Error(kInvalidArgument) naming the valid values otherwise.
PrecisionLimit parse_precision_limit(std::string_view text);
std::string_view precision_limit_name(const PrecisionLimit& limit) noexcept;
bool precision_allowed(Precision candidate, const PrecisionLimit& limit) noexcept;

/// The documented defaults. Strict: float64 1e-6/1e-6, float32 1e-4/1e-4, float16 and
/// bfloat16 1e-2/1e-2; TF32: floating outputs 5e-3/5e-3 (fp16/bf16 outputs keep 1e-2);
/// FP16: floating outputs 1e-2/1e-2; BF16 (8 mantissa bits, 8x coarser than fp16):
/// floating outputs 5e-2/5e-2; all with a scaled atol (`Tolerance::scaled`). Integer and
/// bool outputs must match exactly (0/0).
Tolerance default_tolerance(DType dtype, Precision precision = Precision::kStrict) noexcept;

/// Tolerances for one comparison: per-output overrides win over `all`, which wins over
/// the precision's default for the output's dtype. `all` applies to floating outputs only
/// (integer outputs stay exact unless a per-output override names them); bool outputs are
/// always exact. Value type.
struct ToleranceSpec {
  std::optional<Tolerance> all;
  std::map<std::string, Tolerance> per_output;
  Precision precision = Precision::kStrict;

  Tolerance for_output(const std::string& name, DType dtype) const;
  /// Whether the tolerance of this output is one the user gave (per output, or `all` for a
  /// floating output) rather than the table's: a limit the calibrated rule does not widen.
  bool given_for(const std::string& name, DType dtype) const { return given(name, dtype) != nullptr; }
  /// The tolerance the user gave this output, or null (a bool output: none applies).
  const Tolerance* given(const std::string& name, DType dtype) const;
  bool operator==(const ToleranceSpec&) const = default;
};

/// One magnitude group of an output (magnitude_groups.hpp): its slices along
/// OutputCheck::magnitude_axis, judged as an output of its own would be.
struct GroupCheck {
  std::string indices;      ///< its indices along the axis, as ranges ("4:84", "0:2, 5")
  double scale = 1;         ///< max(1, RMS of its finite expected values): its atol's scale
  double atol_applied = 0;  ///< the atol applied to its elements
  int64_t elements = 0;     ///< its elements finite in both outputs
  int64_t mismatched = 0;   ///< its elements beyond both atol and rtol
  double max_abs_error = 0;
  double rel_l2_error = 0;  ///< over its elements finite in both
  /// The calibrated rule, per group: eager-at-P's errors on the same group and the ratio.
  std::optional<double> eager_at_precision_max_abs_error;
  std::optional<double> eager_at_precision_rel_l2_error;
  std::optional<double> error_ratio;
};

/// The result of comparing one output of one sample.
struct OutputCheck {
  std::string name;
  bool passed = false;
  std::string failure;  ///< why it failed ("" when passed): shape, dtype, NaN, Inf or values
  DType dtype = DType::kFloat32;
  Shape shape;          ///< the actual shape
  Tolerance tolerance;  ///< as given (a scaled atol before scaling)
  double atol_applied = 0;  ///< the atol applied: tolerance.atol, times atol_scale when scaled
                            ///< (split into magnitude groups: the smallest group's)
  double scale = 1;         ///< atol_scale(expected) (computed for every floating output)
  int64_t scale_outliers = 0;  ///< elements the scale left out (measure_atol_scale)
  bool tolerance_given = false;  ///< the user's tolerance (ToleranceSpec::given_for): a hard limit
  /// With scale_outliers: the errors over the other elements alone. The calibrated rule
  /// judges them on their own too: eager's errors on a few huge values would otherwise
  /// excuse any error of the rest.
  std::optional<double> rest_max_abs_error;
  std::optional<double> rest_rel_l2_error;
  /// Where the expected output splits into magnitude groups (magnitude_groups.hpp): the
  /// axis (-1: no split) and each group's check. A scaled atol is then each group's own,
  /// and the calibrated rule judges each group that fails the table on its own errors.
  int64_t magnitude_axis = -1;
  std::vector<GroupCheck> magnitude_groups;
  double max_abs_error = 0;
  double max_rel_error = 0;     ///< |a - e| / |e| over elements with e != 0
  int64_t mismatched = 0;       ///< elements beyond both atol and rtol
  /// Under the table's own tolerance (scaled, not given), floating outputs: the bound on
  /// the output's relative L2 error, max(rtol, 1e-3) (relative_l2_limit), judged over each
  /// magnitude group where it splits, over the elements below its outliers where it has
  /// some, else whole; unset where none applies. An output of RMS below 1 keeps the table's
  /// absolute atol, larger than its values can be (a 32k-vocabulary softmax, values near
  /// 3e-5, under an atol of 1e-4): element by element anything passes, as a wrong
  /// temperature did; in proportion to the output it is tens of percent off.
  std::optional<double> rel_l2_limit;
  bool rel_l2_beyond = false;   ///< its relative L2 error (or a group's, or the rest's) exceeds rel_l2_limit
  int64_t unexpected_nan = 0;   ///< NaN in actual where expected is not NaN (and vice versa)
  int64_t unexpected_inf = 0;   ///< Inf in actual that expected does not have (and vice versa)
  /// The smallest atol that passes with this rtol, and the smallest rtol that passes with
  /// this atol (infinite when no finite value would pass, e.g. NaN or shape mismatch).
  double required_atol = 0;
  double required_rtol = 0;
  /// ||actual - expected||_2 / ||expected||_2 over elements finite in both (0 when both
  /// are zero, infinite when only expected is); the error measure of the calibrated rule.
  double rel_l2_error = 0;
  /// cos(actual, expected) over elements finite in both (1 when both are zero).
  double cosine_similarity = 1;
  /// Floating outputs of rank >= 2 whose last dimension has >= 2 entries (classes,
  /// vocabulary): the fraction of rows whose argmax over the last dimension agrees.
  std::optional<double> top1_agreement;
  /// With top1_agreement, per row whose argmax moved, in row order: the reference's margin
  /// expected[its argmax] - expected[actual's argmax] (>= 0; NaN where either is NaN).
  std::vector<double> top1_flip_margins;
  /// With top1_agreement: the largest, over rows, of max - min of (actual - expected) over
  /// the row's elements finite in both. A row's argmax moves from class i to j only when
  /// error_j - error_i >= the reference's margin, so no flip of a wider margin comes from
  /// errors of this spread; a constant added to a row (a softmax-invariant shift) has 0.
  double max_row_error_spread = 0;

  /// The calibrated rule (calibration.hpp), for candidates of a reduced precision whose
  /// eager-at-that-precision outputs were measured: eager-at-P's errors against the same
  /// reference, the candidate's error ratio to them, and which rule decided.
  std::optional<double> eager_at_precision_max_abs_error;
  std::optional<double> eager_at_precision_rel_l2_error;
  std::optional<double> eager_at_precision_top1_agreement;
  /// The calibrated rule's top-1 clause (calibration.hpp), on outputs it judged: the margin
  /// up to which a flip is a near-tie (factor x eager-at-P's max_row_error_spread), and how
  /// many of top1_flip_margins were within it (ignored; the others count as disagreements).
  std::optional<double> top1_near_tie_bound;
  std::optional<int64_t> top1_near_ties;
  std::optional<double> error_ratio;  ///< max(max abs / eager's, rel L2 / eager's); inf when eager's is 0
  /// "table" (passed or failed on the tolerance table), "calibrated" (passed within
  /// factor x eager-at-P's error where the table failed), "calibrated-exceeded" (failed
  /// the table and the calibrated bound).
  std::string rule = "table";
};

/// The bound on an output's relative L2 error under the table's tolerance `table`:
/// max(table.rtol, 1e-3). Every element within its rtol keeps the whole within rtol; the
/// 1e-3 floor leaves strict fp32 room for sums reordered over values that nearly cancel.
double relative_l2_limit(const Tolerance& table) noexcept;

/// Compares two host tensors. Never throws for mismatching tensors (that is a failed
/// check); throws Error(kInvalidArgument) only when either view is not in host memory
/// or not contiguous.
OutputCheck compare_output(const std::string& name, const TensorView& actual, const TensorView& expected,
                           Tolerance tolerance);

/// The checks of one sample, one per output in output order.
struct SampleCheck {
  std::string sample;  ///< e.g. "sample 3 (batch 2)" or "batch 64 (tiled from sample 1)"
  std::vector<OutputCheck> outputs;
  /// Why the candidate was not run at this sample ("" when it was; then outputs is empty):
  /// aitune's own probe at sizes the graph's shape conditions refuse.
  std::string not_run;
  bool passed() const noexcept;
};

/// The user's metric (`ait.tune(..., accuracy=, max_accuracy_drop=)`): a score of the
/// candidate's outputs over all samples, the same score of the reference itself (its
/// baseline), and whether the drop stays within the maximum. When present it decides.
struct UserMetricResult {
  double score = 0;
  double baseline = 0;
  double max_drop = 0;
  double drop() const noexcept { return baseline - score; }
  /// A score that is not a finite number (NaN, inf) fails: it measures nothing.
  bool passed() const noexcept { return std::isfinite(score) && drop() <= max_drop; }
};

/// One output's accuracy over every sample: the worst of each measure, the calibrated
/// comparison and the verdict (what the report's "outputs" list and the table show).
struct OutputAccuracy {
  std::string name;
  DType dtype = DType::kFloat32;
  int64_t mismatched = 0;  ///< the most elements beyond tolerance in one sample
  double max_abs_error = 0;
  double rel_l2_error = 0;
  double cosine_similarity = 1;
  std::optional<double> top1_agreement;
  /// Rows whose argmax moved, over every sample; of them, near-ties the calibrated rule
  /// ignored (nullopt when it judged no sample of this output's top-1).
  int64_t top1_flips = 0;
  std::optional<int64_t> top1_near_ties;
  std::optional<double> eager_at_precision_max_abs_error;
  std::optional<double> eager_at_precision_rel_l2_error;
  std::optional<double> error_ratio;
  std::string rule = "table";
  bool passed = true;
};

/// Every sample's checks of one candidate.
struct CorrectnessReport {
  std::vector<SampleCheck> samples;
  /// The precision whose calibrated rule applied (nullopt: the table alone, fp32
  /// candidates), its factor, and why eager could not be measured at it ("" when it was).
  std::optional<Precision> calibrated_precision;
  double accuracy_factor = 0;
  std::string calibration_note;
  std::optional<UserMetricResult> user_metric;

  /// Per output, over samples (worst values; passed when every sample's passed).
  std::vector<OutputAccuracy> outputs() const;

  /// The user metric's verdict when there is one, else every sample's checks.
  bool passed() const noexcept;
  double max_abs_error() const noexcept;
  double max_rel_error() const noexcept;
  /// The first failure as one sentence ("sample 2 (batch 4): output_0: 12 of 40 elements
  /// beyond atol=1e-4 and rtol=1e-4 (max abs 3.1e-2, ...)"); "" when passed.
  std::string first_failure() const;
  /// Per output name: the smallest (atol at the given rtol, rtol at the given atol) that
  /// would have passed every sample.
  std::map<std::string, Tolerance> required_tolerances() const;
  std::string to_json(int indent = 2) const;
};

/// Compares each actual output with its expected output (same order, equal counts,
/// else a failed check naming the count mismatch).
SampleCheck compare_sample(const std::string& sample, const std::vector<std::string>& output_names,
                           const std::vector<TensorView>& actual, const std::vector<TensorView>& expected,
                           const ToleranceSpec& tolerances);

/// A reference output that cannot judge a candidate: every element NaN/Inf, or every
/// element of every sample the same value (a comparison with it says little).
struct VacuousOutput {
  std::string name;
  std::string why;  ///< "all NaN/Inf" or "constant (every element is 0)"
};
/// The vacuous outputs among the reference outputs: expected[sample][output], named by
/// output_names. Outputs with fewer than two elements over all samples are not judged.
std::vector<VacuousOutput> vacuous_outputs(const std::vector<std::string>& output_names,
                                           const std::vector<std::vector<TensorView>>& expected);

/// Whether eager PyTorch is repeatable: `first` and `second` are its outputs for the same
/// inputs from two calls. Where any output differs beyond the strict table (exact for
/// integers and bools), a candidate cannot be judged against it (dropout in training mode,
/// torch.rand in forward, state read and changed by each call): the returned message says
/// so, naming the differing outputs and `modules_in_training` (dotted names with their
/// class, the likely cause), and what to do. nullopt: repeatable. `tolerances`: the user's
/// overrides (ait.tune's tolerance / output_tolerances), which hold here as in the check: a
/// deviation declared acceptable does not make eager unusable as the reference.
std::optional<std::string> eager_nondeterminism(const std::vector<std::string>& output_names,
                                                const std::vector<TensorView>& first,
                                                const std::vector<TensorView>& second,
                                                const std::vector<std::string>& modules_in_training,
                                                const ToleranceSpec& tolerances = {});

}  // namespace aitune
