// Device printing.
#include "aitune/device.hpp"

namespace aitune {

std::string Device::to_string() const {
  return kind == DeviceKind::kCPU ? std::string("cpu") : "cuda:" + std::to_string(index);
}

}  // namespace aitune
