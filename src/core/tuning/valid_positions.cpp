// Correctness checks that leave out the positions a model leaves undefined (padding).
#include "aitune/valid_positions.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "aitune/error.hpp"

namespace aitune {
namespace {

bool mask_at(const TensorView& mask, std::size_t i) {
  switch (dtype_size(mask.dtype)) {
    case 1: return static_cast<const uint8_t*>(mask.data)[i] != 0;
    case 2: return static_cast<const uint16_t*>(mask.data)[i] != 0;
    case 4: return static_cast<const uint32_t*>(mask.data)[i] != 0;
    case 8: return static_cast<const uint64_t*>(mask.data)[i] != 0;
  }
  return true;
}

bool is_prefix(const Shape& prefix, const Shape& shape) {
  return prefix.size() <= shape.size() && std::equal(prefix.begin(), prefix.end(), shape.begin());
}

}  // namespace

bool ValidPositions::empty() const noexcept {
  return std::all_of(masks.begin(), masks.end(), [](const TensorView& m) { return m.data == nullptr; });
}

SampleCheck compare_sample_at_valid_positions(const std::string& sample, const std::vector<std::string>& output_names,
                                              const std::vector<TensorView>& actual,
                                              const std::vector<TensorView>& expected,
                                              const ValidPositions& valid, const ToleranceSpec& tolerances) {
  if (valid.empty() || actual.size() != expected.size() || valid.masks.size() != actual.size())
    return compare_sample(sample, output_names, actual, expected, tolerances);
  std::vector<Tensor> filled;  // candidate outputs with the undefined positions taken from the reference
  std::vector<TensorView> views;
  int64_t left_out = 0, positions = 0;
  std::string bad_mask;
  for (std::size_t o = 0; o < actual.size(); ++o) {
    const TensorView& mask = valid.masks[o];
    const TensorView& a = actual[o];
    const TensorView& e = expected[o];
    if (mask.data == nullptr || a.dtype != e.dtype || a.shape != e.shape) {
      views.push_back(a);  // nothing to leave out, or compare_sample reports the mismatch
      continue;
    }
    if (mask.device.kind != DeviceKind::kCPU || !mask.is_contiguous() || !is_prefix(mask.shape, a.shape) ||
        !a.is_contiguous() || !e.is_contiguous() || a.device.kind != DeviceKind::kCPU ||
        e.device.kind != DeviceKind::kCPU) {
      bad_mask = output_names.at(o) + ": the valid-positions mask " + shape_to_string(mask.shape) +
                 " does not prefix the output's shape " + shape_to_string(a.shape) +
                 " (or it, the output or the reference is not a contiguous host tensor)";
      break;
    }
    const auto n_positions = static_cast<std::size_t>(mask.numel());
    const std::size_t inner = n_positions ? a.nbytes() / n_positions : 0;  // bytes per position
    Tensor copy = Tensor::empty_host(a.dtype, a.shape);
    std::memcpy(copy.data(), a.data, a.nbytes());
    for (std::size_t p = 0; p < n_positions; ++p) {
      if (mask_at(mask, p)) continue;
      std::memcpy(static_cast<char*>(copy.data()) + p * inner, static_cast<const char*>(e.data) + p * inner, inner);
      ++left_out;
    }
    positions += static_cast<int64_t>(n_positions);
    views.push_back(copy.view());
    filled.push_back(std::move(copy));
  }
  if (!bad_mask.empty()) {
    SampleCheck check;
    check.sample = sample;
    OutputCheck failure;
    failure.name = "(valid positions)";
    failure.passed = false;
    failure.failure = bad_mask;
    failure.required_atol = failure.required_rtol = std::numeric_limits<double>::infinity();
    check.outputs.push_back(std::move(failure));
    return check;
  }
  const std::string label = sample + " (" + std::to_string(left_out) + " of " + std::to_string(positions) +
                            " positions undefined by " + (valid.source.empty() ? "the mask" : valid.source) +
                            ", left out)";
  return compare_sample(label, output_names, views, expected, tolerances);
}

}  // namespace aitune
