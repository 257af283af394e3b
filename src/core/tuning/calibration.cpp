// The calibrated acceptance rule: a candidate's error against eager PyTorch's own error
// at the candidate's precision.
#include <algorithm>
#include "aitune/calibration.hpp"

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "aitune/error.hpp"

namespace aitune {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string fmt(double v) {
  std::ostringstream out;
  out.precision(3);
  out << v;
  return out.str();
}

// a / b where b is eager's error: 0 when both are 0, infinite when only b is.
double ratio(double a, double b) {
  if (b > 0) return a / b;
  return a > 0 ? kInf : 0;
}

// Values beyond the table, element by element or in proportion to the output
// (OutputCheck::rel_l2_beyond), not NaN, Inf, shape or dtype.
bool value_failure(const OutputCheck& c) {
  return !c.passed && (c.mismatched > 0 || c.rel_l2_beyond) && c.unexpected_nan == 0 && c.unexpected_inf == 0;
}

// A magnitude group that failed the table: an element beyond it, or its relative L2 error.
bool group_failed(const OutputCheck& c, const GroupCheck& g) {
  return g.mismatched > 0 || (c.rel_l2_limit && g.rel_l2_error > *c.rel_l2_limit);
}

}  // namespace

void raise_to_level_over_samples(EagerAtPrecision& eager) {
  struct Level {
    double max_abs = 0, rel_l2 = 0;
    double mismatched_fraction = 0;  // of an integer or bool output's elements
    std::optional<double> rest_max_abs, rest_rel_l2;  // over the samples with outliers set apart
  };
  std::map<std::string, Level> levels;
  for (const auto& s : eager.samples)
    for (const auto& o : s.outputs) {
      Level& l = levels[o.name];
      l.max_abs = std::max(l.max_abs, o.max_abs_error);
      l.rel_l2 = std::max(l.rel_l2, o.rel_l2_error);
      if (const auto n = shape_numel(o.shape); n > 0)
        l.mismatched_fraction = std::max(l.mismatched_fraction, static_cast<double>(o.mismatched) / static_cast<double>(n));
      if (o.rest_max_abs_error) l.rest_max_abs = std::max(l.rest_max_abs.value_or(0.0), *o.rest_max_abs_error);
      if (o.rest_rel_l2_error) l.rest_rel_l2 = std::max(l.rest_rel_l2.value_or(0.0), *o.rest_rel_l2_error);
    }
  for (auto& s : eager.samples)
    for (auto& o : s.outputs) {
      const Level& l = levels.at(o.name);
      o.max_abs_error = l.max_abs;
      o.rel_l2_error = l.rel_l2;
      // An integer or bool output is judged by how many of its elements differ (below): that
      // count too as its level, a fraction of the elements where samples differ in batch.
      if (!dtype_is_floating(o.dtype))
        o.mismatched = std::max(o.mismatched, static_cast<int64_t>(std::ceil(l.mismatched_fraction *
                                                                         static_cast<double>(shape_numel(o.shape)))));
      if (o.rest_max_abs_error && l.rest_max_abs) o.rest_max_abs_error = l.rest_max_abs;
      if (o.rest_rel_l2_error && l.rest_rel_l2) o.rest_rel_l2_error = l.rest_rel_l2;
    }
}

void validate_accuracy_factor(double factor) {
  if (!std::isfinite(factor) || factor < 1)
    throw Error(ErrorCode::kInvalidArgument, "accuracy_factor must be a finite number >= 1, got " + fmt(factor));
}

// Top-1 disagreement a reduced precision may always have, whatever eager's own, counting
// only flips beyond a near-tie (below): a candidate's errors are not eager's, and a few
// rows whose margin is just above eager's largest error spread may flip where eager's
// errors happened to spare them on a few samples (a Llama-shaped model's logits on the
// H200: TF32 flipped 0.4 % of 256 rows where eager TF32 flipped none, with an error below
// eager's). A wrong graph moves far more rows, and its errors fail the ratio anyway.
constexpr double kTop1DisagreementFloor = 0.01;

// A row whose argmax moved from the reference's class i to j is a near-tie, noise and not
// a disagreement, when the reference's margin x_i - x_j is at most the bound returned
// here. Moving the argmax takes err_j - err_i >= x_i - x_j; eager at P makes at most
// `spread` of such a difference in any row (OutputCheck::max_row_error_spread), and the
// candidate may err `factor` times as much as eager: a flip within factor x spread is what
// errors of the allowed size do to near-tied classes. It is at most 2 x factor x eager's
// max abs error (spread <= 2 x max abs), the margin that errors passing the max-abs ratio
// could flip; the spread is tighter, and rightly so: an error added alike to a whole row
// (eager's max abs error large, its spread 0) moves no argmax, and excuses no flip.
double near_tie_bound(double factor, const OutputCheck& eager) { return factor * eager.max_row_error_spread; }

double calibration_factor(Precision precision, double accuracy_factor) noexcept {
  return precision == Precision::kStrict ? std::max(accuracy_factor, 4.0) : accuracy_factor;
}

std::string calibration_yardstick(Precision precision) {
  return precision == Precision::kStrict ? "eager fp32 (its own error, against the module run wider)"
                                         : "eager " + std::string(precision_name(precision));
}

void apply_calibration(CorrectnessReport& candidate, const EagerAtPrecision& eager, double factor) {
  validate_accuracy_factor(factor);
  candidate.accuracy_factor = factor;
  if (!eager.available) {
    candidate.calibration_note = (eager.precision == Precision::kStrict
                                      ? std::string("eager's own fp32 error could not be measured")
                                      : "eager PyTorch cannot run at " + std::string(precision_name(eager.precision))) +
                                 " here (" + eager.reason + "): judged by the tolerance table alone";
    return;
  }
  candidate.calibrated_precision = eager.precision;
  for (std::size_t s = 0; s < candidate.samples.size() && s < eager.samples.size(); ++s) {
    for (auto& c : candidate.samples[s].outputs) {
      const OutputCheck* e = nullptr;
      for (const auto& o : eager.samples[s].outputs)
        if (o.name == c.name) e = &o;
      // Eager at P with another shape, NaN or Inf: its error says nothing to calibrate with.
      if (!e || (!e->passed && !value_failure(*e))) continue;
      c.eager_at_precision_max_abs_error = e->max_abs_error;
      c.eager_at_precision_rel_l2_error = e->rel_l2_error;
      c.eager_at_precision_top1_agreement = e->top1_agreement;
      if (!dtype_is_floating(c.dtype)) {
        // Indices, counts, masks: how far a value moved means nothing (class 9 for 0 is no
        // worse than 1 for 0); how many moved does. The fraction of elements that differ
        // against eager's own at this precision.
        c.error_ratio = ratio(static_cast<double>(c.mismatched), static_cast<double>(e->mismatched));
        if (!value_failure(c) || c.tolerance_given) continue;
        // At a reduced precision a mask or an index may flip on elements at its threshold that
        // eager's own rounding happened to spare (`scores > 0` at a score of -0.004 in bf16,
        // whose error is 0.008: ratio 1 / 0, a session-36 probe); as for top-1 rows, up to 1 %
        // of the elements may always differ. Not at fp32, whose near-ties are rarer than a
        // wrong graph's few moved elements.
        const double floor = eager.precision == Precision::kStrict
                                 ? 0.0
                                 : kTop1DisagreementFloor * static_cast<double>(shape_numel(c.shape));
        if (*c.error_ratio <= factor || static_cast<double>(c.mismatched) <= floor) {
          c.passed = true;
          c.rule = "calibrated";
          c.failure.clear();
        } else {
          c.rule = "calibrated-exceeded";
          c.failure += "; beyond the calibrated bound too: " + std::to_string(c.mismatched) + " of " +
                       std::to_string(shape_numel(c.shape)) + " elements differ vs " +
                       calibration_yardstick(eager.precision) + "'s " + std::to_string(e->mismatched) +
                       " (ratio " + fmt(*c.error_ratio) + " > " + fmt(factor) +
                       (floor > 0 ? ", and above 1 % of the elements" : "") + ")";
        }
        continue;
      }
      c.error_ratio = std::max(ratio(c.max_abs_error, e->max_abs_error), ratio(c.rel_l2_error, e->rel_l2_error));
      // An output split into magnitude groups (magnitude_groups.hpp): each group against
      // eager's errors on the same group (the same reference gives both the same groups),
      // as outputs of their own would be; the output's ratio is the worst of the groups
      // that failed the table (the others passed as their own outputs would).
      const bool split = c.magnitude_axis >= 0 && e->magnitude_axis == c.magnitude_axis &&
                         e->magnitude_groups.size() == c.magnitude_groups.size();
      if (split) {
        std::optional<double> worst;
        for (std::size_t g = 0; g < c.magnitude_groups.size(); ++g) {
          auto& cg = c.magnitude_groups[g];
          const auto& eg = e->magnitude_groups[g];
          cg.eager_at_precision_max_abs_error = eg.max_abs_error;
          cg.eager_at_precision_rel_l2_error = eg.rel_l2_error;
          cg.error_ratio = std::max(ratio(cg.max_abs_error, eg.max_abs_error), ratio(cg.rel_l2_error, eg.rel_l2_error));
          if (group_failed(c, cg)) worst = std::max(worst.value_or(0.0), *cg.error_ratio);
        }
        if (worst) c.error_ratio = worst;
      }
      // An output with a few huge elements (measure_atol_scale): the rest judged on its own
      // errors too, as the table judges it on its own scale; eager's error on the huge ones
      // (an fp16 hidden state's massive activations) would excuse any error of the rest.
      std::optional<double> rest_ratio;
      if (c.rest_max_abs_error && e->rest_max_abs_error && c.rest_rel_l2_error && e->rest_rel_l2_error) {
        rest_ratio = std::max(ratio(*c.rest_max_abs_error, *e->rest_max_abs_error),
                              ratio(*c.rest_rel_l2_error, *e->rest_rel_l2_error));
        c.error_ratio = std::max(*c.error_ratio, *rest_ratio);
      }
      if (!value_failure(c)) continue;
      // A tolerance the user gave is what every candidate must meet (ait.tune's tolerance,
      // output_tolerances): eager's own error at P does not widen it. A bf16 candidate 2e-3
      // off passed "(calibrated)" a limit of 1e-6 given for that very output.
      if (c.tolerance_given) {
        c.failure += "; the tolerance given for this output is a limit (" + calibration_yardstick(eager.precision) +
                     "'s own error, max abs " +
                     fmt(e->max_abs_error) + ", does not widen it)";
        continue;
      }
      // Top-1: the flips beyond a near-tie, against eager's disagreement (every flip of
      // eager's is within its own spread: it is counted as it is).
      bool top1_ok = true;
      int64_t real_flips = 0, rows = 0;
      if (c.top1_agreement && e->top1_agreement && !c.shape.empty() && c.shape.back() > 0) {
        const double bound = near_tie_bound(factor, *e);
        int64_t near_ties = 0;
        for (double margin : c.top1_flip_margins) near_ties += margin <= bound;  // NaN: not a near-tie
        c.top1_near_tie_bound = bound;
        c.top1_near_ties = near_ties;
        real_flips = static_cast<int64_t>(c.top1_flip_margins.size()) - near_ties;
        rows = shape_numel(c.shape) / c.shape.back();
        const double disagreement = rows ? static_cast<double>(real_flips) / static_cast<double>(rows) : 0.0;
        top1_ok = disagreement <= std::max(factor * (1 - *e->top1_agreement), kTop1DisagreementFloor) + 1e-12;
      }
      const bool ratio_ok = *c.error_ratio <= factor;
      if (ratio_ok && top1_ok) {
        c.passed = true;
        c.rule = "calibrated";
        c.failure.clear();
      } else {
        c.rule = "calibrated-exceeded";
        const std::string at = calibration_yardstick(eager.precision);
        c.failure += "; beyond the calibrated bound too: ";
        if (!ratio_ok && !split)
          c.failure += "max abs error " + fmt(c.max_abs_error) + " and rel L2 " + fmt(c.rel_l2_error) + " vs " + at +
                       "'s " + fmt(e->max_abs_error) + " and " + fmt(e->rel_l2_error) + " (ratio " +
                       fmt(*c.error_ratio) + " > " + fmt(factor) + ")";
        if (!ratio_ok && split) {
          std::string beyond;
          for (const auto& cg : c.magnitude_groups) {
            if (!group_failed(c, cg) || *cg.error_ratio <= factor) continue;
            if (!beyond.empty()) beyond += "; ";
            beyond += "on indices " + cg.indices + " of axis " + std::to_string(c.magnitude_axis) +
                      ", max abs error " + fmt(cg.max_abs_error) + " and rel L2 " + fmt(cg.rel_l2_error) + " vs " +
                      at + "'s " + fmt(*cg.eager_at_precision_max_abs_error) + " and " +
                      fmt(*cg.eager_at_precision_rel_l2_error) + " (ratio " + fmt(*cg.error_ratio) + " > " +
                      fmt(factor) + ")";
          }
          c.failure += beyond;
        }
        if (!ratio_ok && rest_ratio && *rest_ratio > factor)
          c.failure += std::string(c.failure.ends_with(": ") ? "" : "; ") + "on the " +
                       std::to_string(shape_numel(c.shape) - c.scale_outliers) + " elements below its " +
                       std::to_string(c.scale_outliers) + " huge ones, max abs error " +
                       fmt(*c.rest_max_abs_error) + " and rel L2 " + fmt(*c.rest_rel_l2_error) + " vs " + at + "'s " +
                       fmt(*e->rest_max_abs_error) + " and " + fmt(*e->rest_rel_l2_error) + " (ratio " +
                       fmt(*rest_ratio) + " > " + fmt(factor) + ")";
        if (!ratio_ok && !top1_ok) c.failure += "; ";
        if (!top1_ok)
          c.failure += "top-1 agreement " + fmt(*c.top1_agreement) + " vs " + at + "'s " + fmt(*e->top1_agreement) +
                       ": " + std::to_string(real_flips) + " of " + std::to_string(rows) +
                       " rows moved to a class the reference ranks more than " + fmt(*c.top1_near_tie_bound) +
                       " below its top-1 (" + fmt(factor) + "x " + at + "'s largest error spread within a row, " +
                       fmt(e->max_row_error_spread) + "), above max(" + fmt(factor) +
                       "x eager's disagreement, 1 % of rows); " + std::to_string(*c.top1_near_ties) +
                       " near-tied flips ignored";
      }
    }
  }
}

}  // namespace aitune
