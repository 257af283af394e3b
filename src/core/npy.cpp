// .npy reader/writer. The format is a magic string, a Python-dict header and raw C-order
// data; no packaged C++ library covers it without pulling in a tensor framework
// (xtensor), so the few lines live here.
#include "aitune/npy.hpp"

#include <cstring>
#include <fstream>
#include <regex>

#include "aitune/error.hpp"

namespace aitune {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

[[noreturn]] void malformed(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "'" + path + "' is not a supported .npy file: " + what);
}

}  // namespace

Tensor load_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kIo, "cannot open '" + path + "': " + std::strerror(errno));
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, kMagic, 6) != 0) malformed(path, "bad magic");
  int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) malformed(path, "truncated header");
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) malformed(path, "truncated header");
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    malformed(path, "format version " + std::to_string(major));
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) malformed(path, "truncated header");

  std::smatch m;
  if (!std::regex_search(header, m, std::regex(R"('descr'\s*:\s*'([^']+)')"))) malformed(path, "no 'descr'");
  std::string descr = m[1];
  auto dtype = dtype_from_numpy(descr);
  if (!dtype) malformed(path, "dtype '" + descr + "' (little-endian bool/int/uint8/float only)");
  if (!std::regex_search(header, m, std::regex(R"('fortran_order'\s*:\s*(True|False))")))
    malformed(path, "no 'fortran_order'");
  if (m[1] == "True") malformed(path, "Fortran order");
  if (!std::regex_search(header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))"))) malformed(path, "no 'shape'");
  Shape shape;
  std::string dims = m[1];
  if (!std::regex_match(dims, std::regex(R"(\s*(\d+\s*,\s*)*(\d+\s*,?\s*)?)")))
    malformed(path, "shape (" + dims + ") is not a tuple of integers");
  std::regex num(R"(\d+)");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it)
    shape.push_back(std::stoll(it->str()));

  // Check the data is all there before allocating: a corrupt header must not allocate
  // whatever size it claims.
  auto data_start = in.tellg();
  in.seekg(0, std::ios::end);
  auto available = static_cast<uint64_t>(in.tellg() - data_start);
  in.seekg(data_start);
  uint64_t expected = dtype_size(*dtype);
  for (auto d : shape) {
    if (d != 0 && expected > available / static_cast<uint64_t>(d) + 1)
      malformed(path, "data truncated (shape " + shape_to_string(shape) + " needs more than the " +
                          std::to_string(available) + " bytes present)");
    expected *= static_cast<uint64_t>(d);
  }
  if (expected > available)
    malformed(path, "data truncated (expected " + std::to_string(expected) + " bytes for shape " +
                        shape_to_string(shape) + ", found " + std::to_string(available) + ")");
  Tensor t = Tensor::empty_host(*dtype, shape);
  if (!in.read(static_cast<char*>(t.data()), static_cast<std::streamsize>(t.nbytes())))
    malformed(path, "data truncated (expected " + std::to_string(t.nbytes()) + " bytes for shape " +
                        shape_to_string(shape) + ")");
  return t;
}

void save_npy(const std::string& path, const Tensor& tensor) {
  if (tensor.device().kind != DeviceKind::kCPU)
    throw Error(ErrorCode::kInvalidArgument, "save_npy('" + path + "'): tensor is on " + tensor.device().to_string());
  if (!tensor.view().is_contiguous())
    throw Error(ErrorCode::kInvalidArgument, "save_npy('" + path + "'): tensor is not contiguous");
  auto descr = dtype_to_numpy(tensor.dtype());
  if (!descr)
    throw Error(ErrorCode::kInvalidArgument,
                "save_npy('" + path + "'): numpy has no " + std::string(dtype_name(tensor.dtype())));
  std::string dims;
  for (auto d : tensor.shape()) dims += std::to_string(d) + ",";
  if (tensor.shape().size() > 1) dims.pop_back();
  std::string header = "{'descr': '" + *descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Pad so that magic + 2 length bytes + header is a multiple of 64, ending in '\n'.
  std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorCode::kIo, "cannot write '" + path + "': " + std::strerror(errno));
  out.write(kMagic, 6);
  out.put(1);
  out.put(0);
  out.put(static_cast<char>(header.size() & 0xff));
  out.put(static_cast<char>(header.size() >> 8));
  out << header;
  out.write(static_cast<const char*>(tensor.data()), static_cast<std::streamsize>(tensor.nbytes()));
  if (!out) throw Error(ErrorCode::kIo, "write to '" + path + "' failed");
}

}  // namespace aitune
