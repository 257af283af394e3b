// Finds the external data files an ONNX model references by scanning its protobuf bytes.
#include "aitune/onnx_external_data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include <string_view>

#include "aitune/error.hpp"

namespace aitune {

std::vector<std::string> onnx_external_data_locations(const std::string& model_path) {
  int fd = ::open(model_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kIo, "cannot open ONNX model '" + model_path + "': " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0)
    throw Error(ErrorCode::kIo, "cannot stat ONNX model '" + model_path + "': " + std::strerror(errno));
  if (st.st_size == 0) return {};
  const auto size = static_cast<std::size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED)
    throw Error(ErrorCode::kIo, "cannot map ONNX model '" + model_path + "': " + std::strerror(errno));
  struct Unmapper {
    void* p;
    std::size_t n;
    ~Unmapper() { ::munmap(p, n); }
  } unmapper{map, size};
  std::string_view bytes(static_cast<const char*>(map), size);

  // Each external data reference is a StringStringEntryProto {key: "location", value:
  // <file>}: field 1 (tag 0x0a) of length 8 holding "location", then field 2 (tag 0x12),
  // a varint length and the file name.
  static constexpr std::string_view kMarker("\x0a\x08location\x12", 11);
  std::set<std::string> files;
  for (auto pos = bytes.find(kMarker); pos != std::string_view::npos; pos = bytes.find(kMarker, pos + 1)) {
    std::size_t i = pos + kMarker.size();
    std::uint64_t len = 0;
    int shift = 0;
    while (i < bytes.size() && shift < 35) {
      auto b = static_cast<unsigned char>(bytes[i++]);
      len |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
      shift += 7;
    }
    if (len > 0 && len < 4096 && i + len <= bytes.size()) files.emplace(bytes.substr(i, len));
  }
  return {files.begin(), files.end()};
}

bool is_safe_relative_path(const std::string& path) noexcept {
  if (path.empty() || path.front() == '/') return false;
  if (path.find('\\') != std::string::npos || path.find('\0') != std::string::npos) return false;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string_view part(path.data() + start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace aitune
