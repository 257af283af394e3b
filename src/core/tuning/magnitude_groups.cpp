// Magnitude groups of an expected output (magnitude_groups.hpp).
#include "aitune/magnitude_groups.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tuning/tensor_elements.hpp"

namespace aitune {

std::string MagnitudeGroups::indices(std::size_t g) const {
  std::string out;
  const auto n = static_cast<int64_t>(group_of.size());
  for (int64_t i = 0; i < n;) {
    if (group_of[static_cast<std::size_t>(i)] != static_cast<int32_t>(g)) {
      ++i;
      continue;
    }
    int64_t end = i + 1;
    while (end < n && group_of[static_cast<std::size_t>(end)] == static_cast<int32_t>(g)) ++end;
    if (!out.empty()) out += ", ";
    out += end == i + 1 ? std::to_string(i) : std::to_string(i) + ":" + std::to_string(end);
    i = end;
  }
  return out;
}

MagnitudeGroups magnitude_groups(const TensorView& expected) {
  MagnitudeGroups groups;
  const auto rank = expected.shape.size();
  const auto numel = static_cast<std::size_t>(expected.numel());
  if (!dtype_is_floating(expected.dtype) || rank < 2 || numel == 0) return groups;
  // Per axis, per index along it: the sum of squares and the count of its slice's finite values,
  // in one pass (the indices of each element kept as an odometer).
  std::vector<std::vector<double>> squares(rank);
  std::vector<std::vector<int64_t>> counts(rank);
  for (std::size_t a = 0; a < rank; ++a) {
    squares[a].assign(static_cast<std::size_t>(expected.shape[a]), 0.0);
    counts[a].assign(static_cast<std::size_t>(expected.shape[a]), 0);
  }
  std::vector<int64_t> index(rank, 0);
  for (std::size_t i = 0; i < numel; ++i) {
    const double e = detail::element(expected, i);
    if (std::isfinite(e)) {
      for (std::size_t a = 0; a < rank; ++a) {
        squares[a][static_cast<std::size_t>(index[a])] += e * e;
        ++counts[a][static_cast<std::size_t>(index[a])];
      }
    }
    for (std::size_t a = rank; a-- > 0;) {
      if (++index[a] < expected.shape[a]) break;
      index[a] = 0;
    }
  }
  double widest = 0;
  for (std::size_t a = 0; a < rank; ++a) {
    const auto size = static_cast<std::size_t>(expected.shape[a]);
    if (size < 2 || numel / size < 2) continue;  // one slice, or slices of one element (no RMS)
    std::vector<double> rms(size);
    for (std::size_t i = 0; i < size; ++i)
      rms[i] = counts[a][i] ? std::max(1.0, std::sqrt(squares[a][i] / static_cast<double>(counts[a][i]))) : 1.0;
    std::vector<std::size_t> order(size);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return rms[x] < rms[y]; });
    double gap = 0;
    for (std::size_t k = 1; k < size; ++k) gap = std::max(gap, rms[order[k]] / rms[order[k - 1]]);
    if (gap < MagnitudeGroups::kMagnitudeGap || gap <= widest) continue;
    widest = gap;
    groups.axis = static_cast<int64_t>(a);
    groups.group_of.assign(size, 0);
    std::vector<double> group_squares{0.0};
    std::vector<int64_t> group_counts{0};
    for (std::size_t k = 0; k < size; ++k) {
      if (k > 0 && rms[order[k]] / rms[order[k - 1]] >= MagnitudeGroups::kMagnitudeGap) {
        group_squares.push_back(0.0);
        group_counts.push_back(0);
      }
      groups.group_of[order[k]] = static_cast<int32_t>(group_squares.size() - 1);
      group_squares.back() += squares[a][order[k]];
      group_counts.back() += counts[a][order[k]];
    }
    groups.scale.assign(group_squares.size(), 1.0);
    for (std::size_t g = 0; g < group_squares.size(); ++g)
      if (group_counts[g])
        groups.scale[g] = std::max(1.0, std::sqrt(group_squares[g] / static_cast<double>(group_counts[g])));
  }
  return groups;
}

}  // namespace aitune
