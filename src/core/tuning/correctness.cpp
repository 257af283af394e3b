// Element-wise comparison of candidate outputs with reference outputs.
#include "aitune/correctness.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "aitune/error.hpp"
#include "base/enum_names.hpp"

namespace aitune {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double half_to_double(uint16_t h) {
  uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  double value;
  if (exp == 0) {
    value = std::ldexp(static_cast<double>(mant), -24);  // subnormal
  } else if (exp == 31) {
    value = mant ? std::numeric_limits<double>::quiet_NaN() : kInf;
  } else {
    value = std::ldexp(static_cast<double>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -value : value;
}

double bfloat16_to_double(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Element i of a contiguous host tensor as a double.
double element(const TensorView& t, std::size_t i) {
  switch (t.dtype) {
    case DType::kFloat32: return static_cast<const float*>(t.data)[i];
    case DType::kFloat64: return static_cast<const double*>(t.data)[i];
    case DType::kFloat16: return half_to_double(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kBFloat16: return bfloat16_to_double(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(t.data)[i]);
    case DType::kInt32: return static_cast<const int32_t*>(t.data)[i];
    case DType::kInt16: return static_cast<const int16_t*>(t.data)[i];
    case DType::kInt8: return static_cast<const int8_t*>(t.data)[i];
    case DType::kUInt8:
    case DType::kBool: return static_cast<const uint8_t*>(t.data)[i];
  }
  return 0;
}

bool is_floating(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
         dtype == DType::kFloat64;
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
  if (!is_floating(dtype)) return {0, 0};
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

double atol_scale(const TensorView& expected) {
  require_host_contiguous(expected, "(expected)", "expected");
  if (!is_floating(expected.dtype)) return 1;
  const auto n = static_cast<std::size_t>(expected.numel());
  double sum = 0;
  std::size_t finite = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double e = element(expected, i);
    if (!std::isfinite(e)) continue;
    sum += e * e;
    ++finite;
  }
  return finite ? std::max(1.0, std::sqrt(sum / static_cast<double>(finite))) : 1.0;
}

Tolerance ToleranceSpec::for_output(const std::string& name, DType dtype) const {
  if (auto it = per_output.find(name); it != per_output.end()) return it->second;
  if (all) return *all;
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
  check.scale = atol_scale(expected);
  const double atol = tolerance.scaled ? tolerance.atol * check.scale : tolerance.atol;
  check.atol_applied = atol;
  // required_atol: the largest error among elements the rtol alone does not cover;
  // required_rtol: the largest relative error among elements the atol alone does not cover.
  double required_atol = 0, required_rtol = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double a = element(actual, i), e = element(expected, i);
    bool a_nan = std::isnan(a), e_nan = std::isnan(e);
    if (a_nan || e_nan) {
      if (a_nan != e_nan) ++check.unexpected_nan;
      continue;  // NaN where the reference has NaN too is a match
    }
    bool a_inf = std::isinf(a), e_inf = std::isinf(e);
    if (a_inf || e_inf) {
      if (a != e) ++check.unexpected_inf;
      continue;
    }
    double diff = std::abs(a - e);
    double scale = std::abs(e);
    double rel = scale > 0 ? diff / scale : (diff > 0 ? kInf : 0);
    check.max_abs_error = std::max(check.max_abs_error, diff);
    if (std::isfinite(rel)) check.max_rel_error = std::max(check.max_rel_error, rel);
    bool within_atol = diff <= atol, within_rtol = diff <= tolerance.rtol * scale;
    if (!within_rtol) required_atol = std::max(required_atol, diff);
    if (!within_atol) required_rtol = std::max(required_rtol, rel);
    if (!within_atol && !within_rtol) ++check.mismatched;
  }
  check.required_atol = required_atol;
  check.required_rtol = required_rtol;
  if (check.unexpected_nan) {
    return failed(check, std::to_string(check.unexpected_nan) + " of " + std::to_string(n) +
                             " elements are NaN in one output but not in the other");
  }
  if (check.unexpected_inf) {
    return failed(check, std::to_string(check.unexpected_inf) + " of " + std::to_string(n) +
                             " elements are infinite in one output but not in the other");
  }
  check.passed = check.mismatched == 0;
  if (!check.passed) {
    check.failure = std::to_string(check.mismatched) + " of " + std::to_string(n) + " elements beyond atol=" +
                    fmt(atol) + (tolerance.scaled ? " (" + fmt(tolerance.atol) + " x output RMS " + fmt(check.scale) + ")" : "") +
                    " and rtol=" + fmt(tolerance.rtol) + " (max abs error " +
                    fmt(check.max_abs_error) + ", max rel error " + fmt(check.max_rel_error) +
                    "; would pass with atol=" + fmt(required_atol) + " or rtol=" + fmt(required_rtol) + ")";
  }
  return check;
}

bool SampleCheck::passed() const noexcept {
  return std::all_of(outputs.begin(), outputs.end(), [](const OutputCheck& c) { return c.passed; });
}

bool CorrectnessReport::passed() const noexcept {
  return std::all_of(samples.begin(), samples.end(), [](const SampleCheck& s) { return s.passed(); });
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
                         {"max_abs_error", o.max_abs_error},
                         {"max_rel_error", o.max_rel_error},
                         {"mismatched", o.mismatched},
                         {"unexpected_nan", o.unexpected_nan},
                         {"unexpected_inf", o.unexpected_inf},
                         {"required_atol", json_number(o.required_atol)},
                         {"required_rtol", json_number(o.required_rtol)}});
    }
    samples_json.push_back({{"sample", s.sample}, {"passed", s.passed()}, {"outputs", outputs}});
  }
  nlohmann::json j = {{"passed", passed()},
                      {"max_abs_error", json_number(max_abs_error())},
                      {"max_rel_error", json_number(max_rel_error())},
                      {"samples", samples_json}};
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
  }
  return check;
}

}  // namespace aitune
