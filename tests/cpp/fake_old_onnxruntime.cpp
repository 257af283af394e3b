// A stand-in for an ONNX Runtime older than aitune's headers: OrtGetApiBase works, but
// GetApi returns null for every API version above 20 (as ORT 1.20 does), for
// ort_runtime_version_check_test.
#include <cstdint>

namespace {
// OrtApiBase's layout (onnxruntime_c_api.h): two function pointers.
struct FakeApiBase {
  const void* (*get_api)(std::uint32_t version) noexcept;
  const char* (*get_version_string)() noexcept;
};

const void* get_api(std::uint32_t version) noexcept {
  static const int kTable = 0;
  return version <= 20 ? &kTable : nullptr;
}
const char* get_version_string() noexcept { return "1.20.0"; }
const FakeApiBase kBase{get_api, get_version_string};
}  // namespace

extern "C" __attribute__((visibility("default"))) const FakeApiBase* OrtGetApiBase() noexcept { return &kBase; }
