// Reading and writing numpy .npy files (format 1.0-3.0, little-endian, C order).
#pragma once

#include <string>

#include "aitune/tensor.hpp"

namespace aitune {

/// Reads a .npy file into a host tensor. Throws Error(kIo) when the file cannot be
/// read and Error(kInvalidArgument) for a malformed header, Fortran order, big-endian
/// data or an unsupported dtype, naming the file.
Tensor load_npy(const std::string& path);

/// Writes a host tensor as .npy (version 1.0). Throws Error(kIo) or
/// Error(kInvalidArgument) for a non-host tensor or bfloat16 (numpy has no such type).
void save_npy(const std::string& path, const Tensor& tensor);

}  // namespace aitune
