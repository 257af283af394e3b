// Element-wise comparison of candidate outputs with reference outputs.
#include "aitune/correctness.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "aitune/error.hpp"
#include "base/enum_names.hpp"
#include "tuning/tensor_elements.hpp"

namespace aitune {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
using detail::element;
using detail::integer_element;

// |a - b| of two integers as a double, without overflow; at least 1 when they differ.
double integer_distance(int64_t a, int64_t b) {
  uint64_t d = a > b ? static_cast<uint64_t>(a) - static_cast<uint64_t>(b)
                     : static_cast<uint64_t>(b) - static_cast<uint64_t>(a);
  return static_cast<double>(d);
}

std::string fmt(double v) {
  std::ostringstream out;
  out.precision(3);
  out << v;
  return out.str();
}

void require_host_contiguous(const TensorView& t, const std::string& name, const char* which) {
  if (t.device.kind != DeviceKind::kCPU)
    throw Error(ErrorCode::kInvalidArgument, "compare_output: " + std::string(which) + " '" + name + "' is on " +
                                                 t.device.to_string() + "; correctness checks read host memory");
  if (!t.is_contiguous())
    throw Error(ErrorCode::kInvalidArgument,
                "compare_output: " + std::string(which) + " '" + name + "' is not contiguous");
}

OutputCheck failed(OutputCheck check, std::string why) {
  check.passed = false;
  check.failure = std::move(why);
  check.required_atol = check.required_rtol = kInf;
  return check;
}

double json_number(double v) { return std::isfinite(v) ? v : -1; }  // JSON has no infinity

constexpr detail::EnumNames<Precision, 4> kPrecisionNames{{
    {Precision::kStrict, "fp32"},
    {Precision::kTF32, "tf32"},
    {Precision::kFP16, "fp16"},
    {Precision::kBF16, "bf16"},
}};

}  // namespace

std::string_view precision_name(Precision precision) noexcept { return detail::enum_name(kPrecisionNames, precision); }

Precision parse_precision(std::string_view text) {
  if (auto precision = detail::enum_value(kPrecisionNames, text)) return *precision;
  if (text == "strict") return Precision::kStrict;
  throw Error(ErrorCode::kInvalidArgument,
              "precision must be one of 'fp32', 'tf32', 'fp16', 'bf16', got '" + std::string(text) + "'");
}

PrecisionLimit parse_precision_limit(std::string_view text) {
  if (text == "any") return std::nullopt;
  try {
    return parse_precision(text);
  } catch (const Error&) {
    throw Error(ErrorCode::kInvalidArgument,
                "precision must be one of 'any', 'fp32', 'tf32', 'fp16', 'bf16', got '" + std::string(text) + "'");
  }
}

std::string_view precision_limit_name(const PrecisionLimit& limit) noexcept {
  return limit ? precision_name(*limit) : std::string_view("any");
}

bool precision_allowed(Precision candidate, const PrecisionLimit& limit) noexcept {
  if (!limit || candidate == *limit) return true;
  switch (candidate) {
    case Precision::kStrict: return true;
    case Precision::kTF32: return *limit != Precision::kStrict;
    case Precision::kFP16:
    case Precision::kBF16: return false;  // equal to the limit was handled above
  }
  return false;
}

Tolerance default_tolerance(DType dtype, Precision precision) noexcept {
  if (!dtype_is_floating(dtype)) return {0, 0};
  bool half = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  switch (precision) {
    case Precision::kStrict:
      if (dtype == DType::kFloat64) return {1e-6, 1e-6, true};
      return half ? Tolerance{1e-2, 1e-2, true} : Tolerance{1e-4, 1e-4, true};
    case Precision::kTF32: return half ? Tolerance{1e-2, 1e-2, true} : Tolerance{5e-3, 5e-3, true};
    case Precision::kFP16: return {1e-2, 1e-2, true};
    case Precision::kBF16: return {5e-2, 5e-2, true};
  }
  return {0, 0};
}

// A few elements two orders of magnitude above all the rest (a diagonal of 1e6 over values
// near 1), or mask sentinels far above them (masked_fill with -1e9 or finfo.min), would set
// an RMS that hides any error of the rest: a 64 x 64 output with a 1e6 diagonal has RMS
// 1.25e5, an fp32 atol of 12.5, and passed a graph doubling every off-diagonal value; -1e9
// in every row hid a baked branch 0.77 off and a Dropout left in training mode. The largest
// elements are left out of the scale (the rtol judges them, as the values they are) where
// they stand far above the RMS of the values below them (at least 1): 100x for up to 5 % of
// the elements, 1e4x for up to half of them.
constexpr double kOutlierShare = 0.05, kOutlierGap = 100;
constexpr double kSentinelShare = 0.5, kSentinelGap = 1e4;
// Enough magnitudes, picked evenly, to find the cut without sorting a 200 MB output.
constexpr std::size_t kScaleSampleSize = std::size_t{1} << 16;

AtolScale measure_atol_scale(const TensorView& expected) {
  require_host_contiguous(expected, "(expected)", "expected");
  AtolScale out;
  if (!dtype_is_floating(expected.dtype)) return out;
  const auto n = static_cast<std::size_t>(expected.numel());
  std::vector<double> picked;
  const std::size_t stride = std::max<std::size_t>(1, n / kScaleSampleSize);
  for (std::size_t i = 0; i < n; i += stride) {
    double e = element(expected, i);
    if (std::isfinite(e)) picked.push_back(std::abs(e));
  }
  std::sort(picked.begin(), picked.end());
  // The first magnitude of the top share that stands its gap above everything below it.
  const auto m = picked.size();
  double below = 0;  // sum of squares of picked[0..c)
  const auto share_from = [m](double share) {
    return static_cast<std::size_t>(std::ceil((1 - share) * static_cast<double>(m)));
  };
  const std::size_t outliers_from = share_from(kOutlierShare), sentinels_from = share_from(kSentinelShare);
  for (std::size_t c = 0; c < m; ++c) {
    const double gap = c >= outliers_from ? kOutlierGap : kSentinelGap;
    if (c >= sentinels_from && c > 0 && picked[c] >= gap * std::max(1.0, std::sqrt(below / static_cast<double>(c)))) {
      out.cut = picked[c];
      break;
    }
    below += picked[c] * picked[c];
  }
  double sum = 0;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double e = element(expected, i);
    if (!std::isfinite(e)) continue;
    if (std::abs(e) >= out.cut) {
      ++out.outliers;
      continue;
    }
    sum += e * e;
    ++kept;
  }
  out.scale = kept ? std::max(1.0, std::sqrt(sum / static_cast<double>(kept))) : 1.0;
  return out;
}

double atol_scale(const TensorView& expected) { return measure_atol_scale(expected).scale; }

double relative_l2_limit(const Tolerance& table) noexcept { return std::max(table.rtol, 1e-3); }

const Tolerance* ToleranceSpec::given(const std::string& name, DType dtype) const {
  if (dtype == DType::kBool) return nullptr;  // a mask is right or wrong, whatever is given
  if (auto it = per_output.find(name); it != per_output.end()) return &it->second;
  // A tolerance for every output is for the floating ones: indices and counts stay exact
  // unless a per-output tolerance names them.
  if (all && dtype_is_floating(dtype)) return &*all;
  return nullptr;
}

Tolerance ToleranceSpec::for_output(const std::string& name, DType dtype) const {
  if (dtype == DType::kBool) return {0, 0};
  if (const Tolerance* user = given(name, dtype)) return *user;
  return default_tolerance(dtype, precision);
}

OutputCheck compare_output(const std::string& name, const TensorView& actual, const TensorView& expected,
                           Tolerance tolerance) {
  require_host_contiguous(actual, name, "actual");
  require_host_contiguous(expected, name, "expected");
  OutputCheck check;
  check.name = name;
  check.dtype = actual.dtype;
  check.shape = actual.shape;
  check.tolerance = tolerance;
  check.atol_applied = tolerance.atol;
  if (actual.dtype != expected.dtype)
    return failed(check, "dtype " + std::string(dtype_name(actual.dtype)) + ", expected " +
                             std::string(dtype_name(expected.dtype)));
  if (actual.shape != expected.shape)
    return failed(check, "shape " + shape_to_string(actual.shape) + ", expected " + shape_to_string(expected.shape));

  const auto n = static_cast<std::size_t>(actual.numel());
  const AtolScale measured = measure_atol_scale(expected);
  check.scale = measured.scale;
  check.scale_outliers = measured.outliers;
  const double atol = tolerance.scaled ? tolerance.atol * check.scale : tolerance.atol;
  check.atol_applied = atol;
  // Parts of very different sizes along one axis: each judged as its own output.
  const MagnitudeGroups groups = magnitude_groups(expected);
  std::vector<double> group_atol, group_err2, group_exp2;
  std::size_t inner = 1, axis_size = 1;
  if (groups.split()) {
    check.magnitude_axis = groups.axis;
    axis_size = static_cast<std::size_t>(expected.shape[static_cast<std::size_t>(groups.axis)]);
    for (std::size_t a = static_cast<std::size_t>(groups.axis) + 1; a < expected.shape.size(); ++a)
      inner *= static_cast<std::size_t>(expected.shape[a]);
    check.magnitude_groups.resize(groups.scale.size());
    for (std::size_t g = 0; g < groups.scale.size(); ++g) {
      auto& group = check.magnitude_groups[g];
      group.indices = groups.indices(g);
      group.scale = groups.scale[g];
      group.atol_applied = tolerance.scaled ? tolerance.atol * group.scale : tolerance.atol;
      group_atol.push_back(group.atol_applied);
    }
    check.atol_applied = *std::min_element(group_atol.begin(), group_atol.end());
    group_err2.assign(group_atol.size(), 0.0);
    group_exp2.assign(group_atol.size(), 0.0);
  }
  // required_atol: the largest error among elements the rtol alone does not cover;
  // required_rtol: the largest relative error among elements the atol alone does not cover.
  double required_atol = 0, required_rtol = 0;
  double err2 = 0, exp2 = 0, act2 = 0, dot = 0;  // relative L2 and cosine over finite elements
  double rest_max = 0, rest_err2 = 0, rest_exp2 = 0;  // the same over the elements below the outliers
  const bool integers = !dtype_is_floating(actual.dtype);
  // NaN / Inf the reference has where the candidate has another value (ONNX Runtime's
  // ReduceMax drops a NaN torch.amax propagates): which side has it says where to look.
  int64_t reference_only_nan = 0, reference_only_inf = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double a = element(actual, i), e = element(expected, i);
    bool a_nan = std::isnan(a), e_nan = std::isnan(e);
    if (a_nan || e_nan) {
      if (a_nan != e_nan) ++check.unexpected_nan;
      if (e_nan && !a_nan) ++reference_only_nan;
      continue;  // NaN where the reference has NaN too is a match
    }
    bool a_inf = std::isinf(a), e_inf = std::isinf(e);
    if (a_inf || e_inf) {
      if (a != e) ++check.unexpected_inf;
      if (e_inf && !a_inf) ++reference_only_inf;
      continue;
    }
    double diff = integers ? integer_distance(integer_element(actual, i), integer_element(expected, i)) : std::abs(a - e);
    err2 += diff * diff;
    exp2 += e * e;
    if (std::abs(e) < measured.cut) {
      rest_max = std::max(rest_max, diff);
      rest_err2 += diff * diff;
      rest_exp2 += e * e;
    }
    act2 += a * a;
    dot += a * e;
    double scale = std::abs(e);
    double rel = scale > 0 ? diff / scale : (diff > 0 ? kInf : 0);
    check.max_abs_error = std::max(check.max_abs_error, diff);
    if (std::isfinite(rel)) check.max_rel_error = std::max(check.max_rel_error, rel);
    GroupCheck* group = nullptr;
    double element_atol = atol;
    if (groups.split()) {
      const auto g = static_cast<std::size_t>(groups.group_of[(i / inner) % axis_size]);
      group = &check.magnitude_groups[g];
      element_atol = group_atol[g];
      ++group->elements;
      group->max_abs_error = std::max(group->max_abs_error, diff);
      group_err2[g] += diff * diff;
      group_exp2[g] += e * e;
    }
    bool within_atol = diff <= element_atol, within_rtol = diff <= tolerance.rtol * scale;
    if (!within_rtol) required_atol = std::max(required_atol, diff);
    if (!within_atol) required_rtol = std::max(required_rtol, rel);
    if (!within_atol && !within_rtol) {
      ++check.mismatched;
      if (group) ++group->mismatched;
    }
  }
  for (std::size_t g = 0; g < check.magnitude_groups.size(); ++g)
    check.magnitude_groups[g].rel_l2_error =
        group_exp2[g] > 0 ? std::sqrt(group_err2[g] / group_exp2[g]) : (group_err2[g] > 0 ? kInf : 0);
  check.required_atol = required_atol;
  check.required_rtol = required_rtol;
  check.rel_l2_error = exp2 > 0 ? std::sqrt(err2 / exp2) : (err2 > 0 ? kInf : 0);
  if (check.scale_outliers) {
    check.rest_max_abs_error = rest_max;
    check.rest_rel_l2_error = rest_exp2 > 0 ? std::sqrt(rest_err2 / rest_exp2) : (rest_err2 > 0 ? kInf : 0);
  }
  check.cosine_similarity = exp2 > 0 && act2 > 0 ? dot / std::sqrt(exp2 * act2) : (exp2 == act2 ? 1 : 0);
  // Top-1 agreement where the last dimension reads as classes or vocabulary.
  if (dtype_is_floating(actual.dtype) && actual.shape.size() >= 2 && actual.shape.back() >= 2 && n > 0) {
    const auto classes = static_cast<std::size_t>(actual.shape.back());
    const std::size_t rows = n / classes;
    std::size_t agree = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t base = r * classes;
      std::size_t best_a = 0, best_e = 0;
      double top_a = element(actual, base), top_e = element(expected, base);
      double lo = kInf, hi = -kInf;  // the row's errors, over elements finite in both
      for (std::size_t c = 0; c < classes; ++c) {
        const double a = element(actual, base + c), e = element(expected, base + c);
        if (c > 0 && a > top_a) {
          best_a = c;
          top_a = a;
        }
        if (c > 0 && e > top_e) {
          best_e = c;
          top_e = e;
        }
        if (std::isfinite(a) && std::isfinite(e)) {
          lo = std::min(lo, a - e);
          hi = std::max(hi, a - e);
        }
      }
      if (hi >= lo) check.max_row_error_spread = std::max(check.max_row_error_spread, hi - lo);
      if (best_a == best_e) ++agree;
      else check.top1_flip_margins.push_back(top_e - element(expected, base + best_a));
    }
    check.top1_agreement = rows ? static_cast<double>(agree) / static_cast<double>(rows) : 1.0;
  }
  if (check.unexpected_nan || check.unexpected_inf) {
    const bool nan = check.unexpected_nan > 0;
    const int64_t total = nan ? check.unexpected_nan : check.unexpected_inf;
    const int64_t reference_only = nan ? reference_only_nan : reference_only_inf;
    const std::string what = nan ? "NaN" : "infinite";
    auto count = [](int64_t k) { return std::to_string(k) + (k == 1 ? " is " : " are "); };
    std::string sides;
    if (total - reference_only > 0)
      sides += count(total - reference_only) + what + " here where the reference is " +
               (nan ? "not" : "not, or is of the other sign");
    if (reference_only > 0)
      sides += std::string(sides.empty() ? "" : ", ") + count(reference_only) + what +
               " in the reference where this output is " + (nan ? "a number" : "not") +
               (nan ? " (an op that treats NaN otherwise: torch.amax / max propagate it, ONNX Runtime's "
                      "ReduceMax / Max drop it)"
                    : "");
    return failed(check, std::to_string(total) + " of " + std::to_string(n) + " elements differ in being " + what +
                             ": " + sides);
  }
  // The whole output in proportion (OutputCheck::rel_l2_limit): where the atol exceeds what
  // the output's size warrants, the elements' errors together still must not.
  std::string beyond_l2;
  if (tolerance.scaled && dtype_is_floating(expected.dtype)) {
    const double limit = relative_l2_limit(tolerance);
    check.rel_l2_limit = limit;
    const auto judge = [&](double rel_l2, double expected2, const std::string& what) {
      if (expected2 <= 0 || !(rel_l2 > limit)) return;  // an all-zero reference: the atol rules
      check.rel_l2_beyond = true;
      beyond_l2 += (beyond_l2.empty() ? "" : "; ") + what + "relative L2 error " + fmt(rel_l2) + " > " + fmt(limit);
    };
    if (groups.split()) {
      for (std::size_t g = 0; g < group_exp2.size(); ++g)
        judge(check.magnitude_groups[g].rel_l2_error, group_exp2[g],
              "on indices " + check.magnitude_groups[g].indices + " of axis " + std::to_string(groups.axis) + ", ");
    } else if (check.scale_outliers) {
      judge(*check.rest_rel_l2_error, rest_exp2,
            "on the " + std::to_string(n - static_cast<std::size_t>(check.scale_outliers)) + " elements below its " +
                std::to_string(check.scale_outliers) + " huge ones, ");
    } else {
      judge(check.rel_l2_error, exp2, "");
    }
  }
  check.passed = check.mismatched == 0 && !check.rel_l2_beyond;
  if (!check.passed && check.mismatched == 0) {
    check.failure = beyond_l2 + " (every element within atol=" + fmt(check.atol_applied) + " or rtol=" +
                    fmt(tolerance.rtol) + ", max abs error " + fmt(check.max_abs_error) +
                    "; that atol is the table's absolute floor, more than values of this output's size can show: in "
                    "proportion to the output the errors are beyond the table's; output_tolerances accepts them)";
  } else if (!check.passed) {
    std::string bound;
    if (!groups.split()) {
      bound = "atol=" + fmt(atol) +
              (tolerance.scaled
                   ? " (" + fmt(tolerance.atol) + " x output RMS " + fmt(check.scale) +
                         (check.scale_outliers ? ", the RMS of all but its " + std::to_string(check.scale_outliers) +
                                                     " elements far above the rest (outliers or mask sentinels), which the rtol judges"
                                               : std::string()) +
                         ")"
                   : "");
    } else {
      // Each group that failed, by its indices, its atol and the sizes beside it.
      const std::string axis = std::to_string(groups.axis);
      for (const auto& group : check.magnitude_groups) {
        if (!group.mismatched) continue;
        if (!bound.empty()) bound += "; ";
        bound += "atol=" + fmt(group.atol_applied) +
                 (tolerance.scaled ? " (" + fmt(tolerance.atol) + " x RMS " + fmt(group.scale) + ")" : "") +
                 " on indices " + group.indices + " of axis " + axis + " (" + std::to_string(group.mismatched) +
                 " elements, max abs error " + fmt(group.max_abs_error) + ")";
      }
      std::string sizes;
      for (const auto& group : check.magnitude_groups)
        sizes += (sizes.empty() ? "" : ", ") + group.indices + " RMS " + fmt(group.scale);
      bound += "; the output's values are of different sizes along axis " + axis + " (" + sizes +
               "), each part judged as an output of its own";
    }
    // An index, count or mask is compared exactly: a tolerance that would pass it says
    // nothing (topk indices over ties "would pass with atol=48" is no advice).
    const bool exact = !dtype_is_floating(expected.dtype) && tolerance.atol == 0 && tolerance.rtol == 0;
    check.failure =
        exact ? std::to_string(check.mismatched) + " of " + std::to_string(n) + " elements differ (max abs error " +
                    fmt(check.max_abs_error) + "; " + std::string(dtype_name(expected.dtype)) +
                    (expected.dtype == DType::kBool
                         // a flag has no ties to excuse it (signbit(-0.0) False where eager gives True)
                         ? std::string(" outputs are compared exactly: a mask or flag is right or wrong)")
                         : std::string(" outputs are compared exactly: an index, count or mask is right or wrong; "
                                       "indices over ties may differ legitimately: return the values, or give this "
                                       "output output_tolerances)"))
              : std::to_string(check.mismatched) + " of " + std::to_string(n) + " elements beyond " + bound +
                    " and rtol=" + fmt(tolerance.rtol) + " (max abs error " + fmt(check.max_abs_error) +
                    ", max rel error " + fmt(check.max_rel_error) + "; would pass with atol=" + fmt(required_atol) +
                    (std::isfinite(required_rtol)
                         ? " or rtol=" + fmt(required_rtol)
                         // max rel error is over nonzero references: "rel 1, rtol=inf" read as a contradiction
                         : std::string(", and with no rtol: an element whose reference is 0 is off")) +
                    ")";
    if (check.rel_l2_beyond) check.failure += "; " + beyond_l2;
  }
  return check;
}

bool SampleCheck::passed() const noexcept {
  return std::all_of(outputs.begin(), outputs.end(), [](const OutputCheck& c) { return c.passed; });
}

namespace {

// A failed output the user's metric cannot excuse: a tolerance the user gave (a hard limit),
// NaN or Inf where eager has none, another dtype or shape. A metric scores what it looks at
// (a top-1 over the logits); an output it ignores would otherwise come back NaN, or past the
// very limit the user set, silently (a session-33 probe).
const OutputCheck* unexcused(const std::vector<SampleCheck>& samples, const SampleCheck** where) noexcept {
  for (const auto& s : samples)
    for (const auto& o : s.outputs)
      if (!o.passed && (o.tolerance_given || o.unexpected_nan > 0 || o.unexpected_inf > 0 ||
                        o.failure.rfind("dtype ", 0) == 0 || o.failure.rfind("shape ", 0) == 0)) {
        if (where) *where = &s;
        return &o;
      }
  return nullptr;
}

}  // namespace

bool CorrectnessReport::passed() const noexcept {
  if (user_metric) return user_metric->passed() && unexcused(samples, nullptr) == nullptr;
  return std::all_of(samples.begin(), samples.end(), [](const SampleCheck& s) { return s.passed(); });
}

std::vector<OutputAccuracy> CorrectnessReport::outputs() const {
  std::vector<OutputAccuracy> out;
  auto worst = [](std::optional<double>& into, const std::optional<double>& v, bool larger) {
    if (!v) return;
    into = !into ? *v : (larger ? std::max(*into, *v) : std::min(*into, *v));
  };
  for (const auto& s : samples)
    for (const auto& o : s.outputs) {
      auto it = std::find_if(out.begin(), out.end(), [&](const OutputAccuracy& a) { return a.name == o.name; });
      if (it == out.end()) {
        out.push_back({});
        it = std::prev(out.end());
        it->name = o.name;
        it->dtype = o.dtype;
      }
      it->mismatched = std::max(it->mismatched, o.mismatched);
      it->max_abs_error = std::max(it->max_abs_error, o.max_abs_error);
      it->rel_l2_error = std::max(it->rel_l2_error, o.rel_l2_error);
      it->cosine_similarity = std::min(it->cosine_similarity, o.cosine_similarity);
      worst(it->top1_agreement, o.top1_agreement, false);
      it->top1_flips += static_cast<int64_t>(o.top1_flip_margins.size());
      if (o.top1_near_ties) it->top1_near_ties = it->top1_near_ties.value_or(0) + *o.top1_near_ties;
      worst(it->eager_at_precision_max_abs_error, o.eager_at_precision_max_abs_error, true);
      worst(it->eager_at_precision_rel_l2_error, o.eager_at_precision_rel_l2_error, true);
      worst(it->error_ratio, o.error_ratio, true);
      // The rule that decided the worst sample: a failure's, else a calibrated pass's.
      if (!o.passed && it->passed) it->rule = o.rule;
      else if (it->passed && o.rule == "calibrated") it->rule = o.rule;
      it->passed = it->passed && o.passed;
    }
  return out;
}

double CorrectnessReport::max_abs_error() const noexcept {
  double m = 0;
  for (const auto& s : samples)
    for (const auto& o : s.outputs) m = std::max(m, o.max_abs_error);
  return m;
}

double CorrectnessReport::max_rel_error() const noexcept {
  double m = 0;
  for (const auto& s : samples)
    for (const auto& o : s.outputs) m = std::max(m, o.max_rel_error);
  return m;
}

std::string CorrectnessReport::first_failure() const {
  if (user_metric) {
    const SampleCheck* where = nullptr;
    if (const OutputCheck* o = unexcused(samples, &where))
      return where->sample + ": " + o->name + ": " + o->failure +
             (o->tolerance_given ? " (a tolerance given for this output is a limit the accuracy metric does not lift)"
                                 : " (the accuracy metric does not excuse NaN, Inf, another dtype or shape)");
    if (user_metric->passed()) return "";
    if (!std::isfinite(user_metric->score))
      return "user accuracy metric returned " + fmt(user_metric->score) + " for this candidate, not a finite number";
    return "user accuracy metric " + fmt(user_metric->score) + " vs eager's " + fmt(user_metric->baseline) +
           ": drop " + fmt(user_metric->drop()) + " > maximum " + fmt(user_metric->max_drop);
  }
  for (const auto& s : samples)
    for (const auto& o : s.outputs)
      if (!o.passed) return s.sample + ": " + o.name + ": " + o.failure;
  return "";
}

std::map<std::string, Tolerance> CorrectnessReport::required_tolerances() const {
  std::map<std::string, Tolerance> out;
  for (const auto& s : samples)
    for (const auto& o : s.outputs) {
      auto& t = out[o.name];
      t.atol = std::max(t.atol, o.required_atol);
      t.rtol = std::max(t.rtol, o.required_rtol);
    }
  return out;
}

std::string CorrectnessReport::to_json(int indent) const {
  nlohmann::json samples_json = nlohmann::json::array();
  for (const auto& s : samples) {
    nlohmann::json outputs = nlohmann::json::array();
    for (const auto& o : s.outputs) {
      outputs.push_back({{"name", o.name},
                         {"passed", o.passed},
                         {"failure", o.failure},
                         {"dtype", dtype_name(o.dtype)},
                         {"shape", o.shape},
                         {"atol", o.atol_applied},
                         {"rtol", o.tolerance.rtol},
                         {"atol_scaled", o.tolerance.scaled},
                         {"atol_scale", o.scale},
                         {"atol_scale_outliers", o.scale_outliers},
                         {"tolerance_given", o.tolerance_given},
                         {"rest_max_abs_error", o.rest_max_abs_error ? nlohmann::json(*o.rest_max_abs_error)
                                                                     : nlohmann::json(nullptr)},
                         {"rest_rel_l2_error", o.rest_rel_l2_error ? nlohmann::json(json_number(*o.rest_rel_l2_error))
                                                                   : nlohmann::json(nullptr)},
                         {"max_abs_error", o.max_abs_error},
                         {"max_rel_error", o.max_rel_error},
                         {"mismatched", o.mismatched},
                         {"rel_l2_limit", o.rel_l2_limit ? nlohmann::json(*o.rel_l2_limit) : nlohmann::json(nullptr)},
                         {"rel_l2_beyond", o.rel_l2_beyond},
                         {"unexpected_nan", o.unexpected_nan},
                         {"unexpected_inf", o.unexpected_inf},
                         {"required_atol", json_number(o.required_atol)},
                         {"required_rtol", json_number(o.required_rtol)},
                         {"rel_l2_error", json_number(o.rel_l2_error)},
                         {"cosine_similarity", o.cosine_similarity},
                         {"top1_agreement", o.top1_agreement ? nlohmann::json(*o.top1_agreement) : nlohmann::json(nullptr)},
                         {"top1_flips", o.top1_agreement ? nlohmann::json(o.top1_flip_margins.size()) : nlohmann::json(nullptr)},
                         {"max_row_error_spread", o.top1_agreement ? nlohmann::json(json_number(o.max_row_error_spread))
                                                                   : nlohmann::json(nullptr)},
                         {"top1_near_tie_bound", o.top1_near_tie_bound ? nlohmann::json(json_number(*o.top1_near_tie_bound))
                                                                       : nlohmann::json(nullptr)},
                         {"top1_near_ties", o.top1_near_ties ? nlohmann::json(*o.top1_near_ties) : nlohmann::json(nullptr)},
                         {"eager_at_precision_max_abs_error", o.eager_at_precision_max_abs_error
                                                                  ? nlohmann::json(json_number(*o.eager_at_precision_max_abs_error))
                                                                  : nlohmann::json(nullptr)},
                         {"eager_at_precision_rel_l2_error", o.eager_at_precision_rel_l2_error
                                                                 ? nlohmann::json(json_number(*o.eager_at_precision_rel_l2_error))
                                                                 : nlohmann::json(nullptr)},
                         {"error_ratio", o.error_ratio ? nlohmann::json(json_number(*o.error_ratio)) : nlohmann::json(nullptr)},
                         {"rule", o.rule}});
      if (o.magnitude_axis >= 0) {  // only where the output split (magnitude_groups.hpp)
        nlohmann::json groups = nlohmann::json::array();
        auto optional = [](const std::optional<double>& v) {
          return v ? nlohmann::json(json_number(*v)) : nlohmann::json(nullptr);
        };
        for (const auto& g : o.magnitude_groups)
          groups.push_back({{"indices", g.indices},
                            {"atol_scale", g.scale},
                            {"atol", g.atol_applied},
                            {"elements", g.elements},
                            {"mismatched", g.mismatched},
                            {"max_abs_error", json_number(g.max_abs_error)},
                            {"rel_l2_error", json_number(g.rel_l2_error)},
                            {"eager_at_precision_max_abs_error", optional(g.eager_at_precision_max_abs_error)},
                            {"eager_at_precision_rel_l2_error", optional(g.eager_at_precision_rel_l2_error)},
                            {"error_ratio", optional(g.error_ratio)}});
        outputs.back()["magnitude_axis"] = o.magnitude_axis;
        outputs.back()["magnitude_groups"] = groups;
      }
    }
    samples_json.push_back({{"sample", s.sample}, {"passed", s.passed()}, {"outputs", outputs}});
    if (!s.not_run.empty()) samples_json.back()["not_run"] = s.not_run;
  }
  auto optional_number = [](const std::optional<double>& v) { return v ? nlohmann::json(json_number(*v)) : nlohmann::json(nullptr); };
  // Per output over every sample: the fields the report page and the table show
  // (documented in docs/tuning.md, "The report's accuracy fields").
  nlohmann::json per_output = nlohmann::json::array();
  for (const auto& o : this->outputs())
    per_output.push_back({{"name", o.name},
                          {"max_abs_error", json_number(o.max_abs_error)},
                          {"rel_l2_error", json_number(o.rel_l2_error)},
                          {"cosine_similarity", o.cosine_similarity},
                          {"top1_agreement", optional_number(o.top1_agreement)},
                          {"top1_flips", o.top1_agreement ? nlohmann::json(o.top1_flips) : nlohmann::json(nullptr)},
                          {"top1_near_ties", o.top1_near_ties ? nlohmann::json(*o.top1_near_ties) : nlohmann::json(nullptr)},
                          {"eager_at_precision_max_abs_error", optional_number(o.eager_at_precision_max_abs_error)},
                          {"eager_at_precision_rel_l2_error", optional_number(o.eager_at_precision_rel_l2_error)},
                          {"error_ratio", optional_number(o.error_ratio)},
                          {"rule", o.rule},
                          {"verdict", o.passed ? "passed" : "failed"}});
  nlohmann::json j = {{"passed", passed()},
                      {"max_abs_error", json_number(max_abs_error())},
                      {"max_rel_error", json_number(max_rel_error())},
                      {"calibrated_precision", calibrated_precision ? nlohmann::json(precision_name(*calibrated_precision))
                                                                    : nlohmann::json(nullptr)},
                      {"accuracy_factor", accuracy_factor},
                      {"calibration_note", calibration_note},
                      {"outputs", per_output},
                      {"samples", samples_json}};
  if (user_metric)
    j["user_metric"] = {{"score", json_number(user_metric->score)},
                        {"baseline", json_number(user_metric->baseline)},
                        {"drop", json_number(user_metric->drop())},
                        {"max_drop", user_metric->max_drop},
                        {"passed", user_metric->passed()}};
  else
    j["user_metric"] = nullptr;
  return j.dump(indent);
}

SampleCheck compare_sample(const std::string& sample, const std::vector<std::string>& output_names,
                           const std::vector<TensorView>& actual, const std::vector<TensorView>& expected,
                           const ToleranceSpec& tolerances) {
  SampleCheck check;
  check.sample = sample;
  if (actual.size() != expected.size() || actual.size() != output_names.size()) {
    OutputCheck count;
    count.name = "(outputs)";
    check.outputs.push_back(failed(count, std::to_string(actual.size()) + " outputs, expected " +
                                              std::to_string(expected.size())));
    return check;
  }
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const auto& name = output_names[i];
    check.outputs.push_back(
        compare_output(name, actual[i], expected[i], tolerances.for_output(name, expected[i].dtype)));
    check.outputs.back().tolerance_given = tolerances.given_for(name, expected[i].dtype);
  }
  return check;
}

namespace {

// An output that moves between the samples (of one shape) by no more than the strict
// table lets a candidate err (its atol at the output's scale, or its rtol of the largest
// value), so that a graph ignoring its inputs would pass: a random-weight deep tanh MLP's
// outputs are its last bias, 0.077, plus an input-dependent 4.7e-6, and a graph computing
// the wrong branch passed with an error 2.6x that whole signal (a session-36 probe). What
// it moves by and against what, or nothing.
std::optional<std::string> nearly_constant(const std::vector<std::vector<TensorView>>& expected, std::size_t o) {
  const TensorView* first = nullptr;
  std::vector<double> low, high, sum, sum2;  // per element over the samples
  int same_shape = 0;
  for (const auto& sample : expected) {
    if (o >= sample.size() || !dtype_is_floating(sample[o].dtype)) return std::nullopt;
    const auto& t = sample[o];
    if (first == nullptr) {
      first = &t;
      low.assign(static_cast<std::size_t>(t.numel()), kInf);
      high.assign(low.size(), -kInf);
      sum.assign(low.size(), 0.0);
      sum2.assign(low.size(), 0.0);
    } else if (t.shape != first->shape) {
      continue;
    }
    ++same_shape;
    for (std::size_t i = 0; i < low.size(); ++i) {
      const double v = element(t, i);
      if (!std::isfinite(v)) return std::nullopt;
      low[i] = std::min(low[i], v);
      high[i] = std::max(high[i], v);
      sum[i] += v;
      sum2[i] += v * v;
    }
  }
  if (same_shape < 2) return std::nullopt;
  // The relative L2 bound judges the whole output in proportion to its size: a graph that
  // ignored its inputs (at best each element's mean over the samples) fails it where the
  // output's movement is more than that bound's share of its values. Small values that move
  // by all they are (`fc(x) * 1e-6`) are no constant (the atol alone said they were).
  double deviation2 = 0, values2 = 0;
  for (std::size_t i = 0; i < low.size(); ++i) {
    const double mean = sum[i] / same_shape;
    deviation2 += std::max(0.0, sum2[i] - same_shape * mean * mean);
    values2 += sum2[i];
  }
  double spread = 0, scale = 0;
  for (std::size_t i = 0; i < low.size(); ++i) {
    spread = std::max(spread, high[i] - low[i]);
    scale = std::max({scale, std::abs(low[i]), std::abs(high[i])});
  }
  const Tolerance table = default_tolerance(first->dtype, Precision::kStrict);
  const double allowed = std::max(table.atol * atol_scale(*first), table.rtol * scale);
  if (spread == 0 || spread > allowed) return std::nullopt;
  if (values2 > 0 && std::sqrt(deviation2 / values2) > relative_l2_limit(table)) return std::nullopt;
  return "nearly constant (it moves between the samples by at most " + fmt(spread) + " against values up to " +
         fmt(scale) + ", within the " + fmt(allowed) +
         " the check allows an error: a graph that ignored its inputs would pass; give samples that move it more, "
         "or judge it by a metric, ait.tune(accuracy=...))";
}

}  // namespace

std::vector<VacuousOutput> vacuous_outputs(const std::vector<std::string>& output_names,
                                           const std::vector<std::vector<TensorView>>& expected) {
  std::vector<VacuousOutput> out;
  // A floating output whose every value is below the table's absolute atol is judged in
  // proportion to its size (OutputCheck::rel_l2_limit), no longer vacuously (session 27-33).
  for (std::size_t o = 0; o < output_names.size(); ++o) {
    std::size_t total = 0, finite = 0;
    bool constant = true, have_first = false;
    double first = 0;
    for (const auto& sample : expected) {
      if (o >= sample.size()) continue;
      const auto& t = sample[o];
      require_host_contiguous(t, output_names[o], "expected");
      const auto n = static_cast<std::size_t>(t.numel());
      total += n;
      for (std::size_t i = 0; i < n; ++i) {
        double v = element(t, i);
        if (!std::isfinite(v)) continue;
        ++finite;
        if (!have_first) {
          first = v;
          have_first = true;
        } else if (v != first) {
          constant = false;
        }
      }
    }
    if (total < 2) continue;
    if (finite == 0) {
      out.push_back({output_names[o], "all NaN/Inf"});
      continue;
    }
    if (!constant) {
      if (auto nearly = nearly_constant(expected, o)) out.push_back({output_names[o], *nearly});
      continue;
    }
    if (finite == total) {
      // A mask's value said as a bool is ("false"), not as the number it is read as ("0").
      const bool is_bool = !expected.empty() && o < expected.front().size() && expected.front()[o].dtype == DType::kBool;
      out.push_back({output_names[o],
                     "constant (every element is " + (is_bool ? std::string(first != 0 ? "true" : "false") : fmt(first)) +
                         ")"});
    }
  }
  return out;
}

std::optional<std::string> eager_nondeterminism(const std::vector<std::string>& output_names,
                                                const std::vector<TensorView>& first,
                                                const std::vector<TensorView>& second,
                                                const std::vector<std::string>& modules_in_training,
                                                const ToleranceSpec& tolerances) {
  std::string differs;
  if (first.size() != second.size()) {
    differs = std::to_string(first.size()) + " outputs, then " + std::to_string(second.size());
  } else {
    for (std::size_t i = 0; i < first.size(); ++i) {
      const std::string name = i < output_names.size() ? output_names[i] : "output_" + std::to_string(i);
      // the user's own tolerance for an output (a deviation declared acceptable) holds here too
      ToleranceSpec strict = tolerances;
      strict.precision = Precision::kStrict;
      OutputCheck check = compare_output(name, second[i], first[i], strict.for_output(name, first[i].dtype));
      if (!check.passed) differs += (differs.empty() ? "" : "; ") + name + ": " + check.failure;
    }
  }
  if (differs.empty()) return std::nullopt;
  std::string message =
      "eager PyTorch is not deterministic: called twice on the same inputs it gave different outputs (" + differs +
      "), so no candidate can be judged against it and none is chosen; ";
  if (!modules_in_training.empty()) {
    std::string names;
    const std::size_t shown = std::min<std::size_t>(modules_in_training.size(), 8);
    for (std::size_t i = 0; i < shown; ++i) names += (i ? ", " : "") + modules_in_training[i];
    if (shown < modules_in_training.size())
      names += " and " + std::to_string(modules_in_training.size() - shown) + " more";
    message += "modules in training mode: " + names + "; call .eval() on the model before tuning it for inference";
  } else {
    message += "its forward draws random numbers (torch.rand, dropout with training=True), depends on state that "
               "each call changes, or writes its inputs where no version counter sees it (x.data.add_(...), "
               "through x.numpy()); make the forward deterministic before tuning it";
  }
  return message;
}

}  // namespace aitune
