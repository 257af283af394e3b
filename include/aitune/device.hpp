// Device: where a tensor's memory lives (host or one CUDA device).
#pragma once

#include <string>

namespace aitune {

/// Kind of memory a tensor lives in. Host memory pinned by CUDA counts as kCPU.
enum class DeviceKind { kCPU, kCUDA };

/// A device: kind plus index (always 0 for kCPU).
struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::kCUDA, index}; }

  bool operator==(const Device&) const = default;

  /// "cpu" or "cuda:N", as torch prints it.
  std::string to_string() const;
};

}  // namespace aitune
