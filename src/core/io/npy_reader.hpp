// Private: the .npy reader over any seekable stream (load_npy's file, the fuzz target's memory).
#pragma once

#include <cstddef>
#include <istream>
#include <string>
#include <string_view>

#include "aitune/tensor.hpp"

namespace aitune::detail {

/// numpy's own limit on the header (numpy.lib.format: max_header_size = 10000).
inline constexpr std::size_t kNpyMaxHeaderBytes = 10000;
/// numpy's limit on dimensions (NPY_MAXDIMS in numpy 2).
inline constexpr std::size_t kNpyMaxDims = 64;

/// What the header dict of a .npy file says.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

/// Parses the header dict ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }")
/// as numpy's literal_eval would for the subset numpy writes: exactly the keys descr,
/// fortran_order and shape, once each; a string, a bool, a tuple of at most kNpyMaxDims
/// non-negative integers. Error(kInvalidArgument) naming `path` otherwise.
NpyHeader parse_npy_header(std::string_view dict, const std::string& path);

/// Reads a whole .npy stream (`in` positioned at its start) into a host tensor; `path`
/// names it in messages. Nothing is allocated beyond what the stream holds.
Tensor read_npy(std::istream& in, const std::string& path);

}  // namespace aitune::detail
