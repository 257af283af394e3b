// Calibrated acceptance: a reduced-precision candidate judged against what eager PyTorch
// itself does at that precision (autocast, TF32), not only against a fixed table.
#pragma once

#include <string>
#include <vector>

#include "aitune/correctness.hpp"

namespace aitune {

/// The default factor: a candidate at precision P may err up to twice as much as eager
/// PyTorch at P does on the same samples (`ait.tune(..., accuracy_factor=)`,
/// `TunerOptions::accuracy_factor`).
inline constexpr double kDefaultAccuracyFactor = 2.0;

/// Eager PyTorch at one reduced precision, compared with the strict reference: per sample,
/// its check (metrics only; the tolerance of that precision's table is what it is judged
/// by, which does not matter here). `available` false: eager cannot run at that precision
/// on this device (no TF32 on the host), `reason` says why; candidates keep the table.
struct EagerAtPrecision {
  Precision precision = Precision::kStrict;
  bool available = false;
  std::string reason;
  std::vector<SampleCheck> samples;
};

/// Eager's own fp32 error (the strict yardstick) as its level over the samples: per output,
/// every sample's errors raised to the largest any sample shows. fp32 rounding of one large
/// intermediate lands anywhere within half an ulp, so one sample's error can be a lucky
/// fraction of what the same arithmetic costs on the next; a correct graph rounding once
/// more measured 3.2x eager's error on one seed and 1.0x on others (a session-34 probe).
void raise_to_level_over_samples(EagerAtPrecision& eager);

/// Applies the calibrated rule to `candidate`, the checks of a candidate computing in
/// `eager.precision` (same samples, same order). Per output and sample:
///  - passed by the table: stays passed (the table is the floor), rule "table";
///  - failed by NaN/Inf, shape or dtype: stays failed (no precision excuses those);
///  - failed on values: passes ("calibrated") when error_ratio, the larger of max abs
///    error / eager's and relative L2 error / eager's, is <= factor and, for outputs with a
///    top-1 agreement, its rows whose argmax moved beyond a near-tie are at most
///    max(factor x eager's top-1 disagreement, 1 % of rows); else stays failed
///    ("calibrated-exceeded", the failure naming the errors and ratio, the top-1
///    disagreement, or both). A moved argmax is a near-tie, ignored, when the reference's
///    margin between its top-1 and the candidate's is <= factor x eager's
///    OutputCheck::max_row_error_spread: errors of the allowed size move such a row
///    (top1_near_tie_bound and top1_near_ties record it).
/// The eager-at-P errors and the ratio are recorded on every output either way. With
/// eager unavailable, only the note is set. factor must be >= 1 (Error(kInvalidArgument)).
void apply_calibration(CorrectnessReport& candidate, const EagerAtPrecision& eager, double factor);

/// How a report names the yardstick eager at `precision` is: "eager fp16" for a reduced
/// precision; for strict ("fp32" candidates, calibrated only where they fail the table),
/// eager's own rounding error, measured against the same module run wider (float64, or
/// float32 for a module in fp16 / bf16): "eager fp32 (its own error, against the module
/// run wider)". A strict candidate within factor x that error differs from eager no more
/// than eager differs from the exact result (torch.cdist's matmul form in eager, the exact
/// form in ONNX Runtime: the table rejected the more accurate graph, a session-34 probe).
std::string calibration_yardstick(Precision precision);

/// The factor the calibrated rule applies to a candidate at `precision` given the user's
/// accuracy_factor: that factor, but at least 4 for strict candidates. Eager's own fp32
/// error can be a single rounding of a large intermediate, and a correct graph that
/// rounds there two or three times more (another order of the same fp32 additions)
/// measured 3.2x it, where a wrong graph errs by the size of its values, orders above.
double calibration_factor(Precision precision, double accuracy_factor) noexcept;

/// Error(kInvalidArgument) unless factor is finite and >= 1.
void validate_accuracy_factor(double factor);

}  // namespace aitune
