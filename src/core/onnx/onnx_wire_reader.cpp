// Maps an ONNX model file read-only for the wire-level walks (onnx_wire_reader.hpp).
#include "onnx/onnx_wire_reader.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace aitune::detail {

MappedModel::MappedModel(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kIo, "cannot open ONNX model '" + path + "': " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) throw Error(ErrorCode::kIo, "cannot stat ONNX model '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(ErrorCode::kIo, "ONNX model '" + path + "' is not a regular file");
  if (st.st_size == 0) return;  // nothing to map: an empty view
  const auto size = static_cast<std::size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) throw Error(ErrorCode::kIo, "cannot map ONNX model '" + path + "': " + std::strerror(errno));
  data_ = map;
  size_ = size;
}

MappedModel::~MappedModel() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace aitune::detail
