// .npy reader/writer. The format is a magic string, a Python-dict header and raw C-order
// data; no packaged C++ library covers it without pulling in a tensor framework
// (xtensor), so the few lines live here. The header is parsed by a small bounded parser
// of exactly what numpy writes (a regex over it crashed on long headers: issue 17).
#include "aitune/npy.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "aitune/error.hpp"
#include "io/npy_reader.hpp"

namespace aitune {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

[[noreturn]] void malformed(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "'" + path + "' is not a supported .npy file: " + what);
}

// A cursor over the header dict; every read is bounded by the dict's size.
class HeaderCursor {
 public:
  HeaderCursor(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  void skip_space() {
    while (i_ < text_.size() && (text_[i_] == ' ' || text_[i_] == '\t' || text_[i_] == '\n' || text_[i_] == '\r')) ++i_;
  }
  bool at_end() {
    skip_space();
    return i_ >= text_.size();
  }
  char peek() {
    skip_space();
    return i_ < text_.size() ? text_[i_] : '\0';
  }
  bool accept(char c) {
    if (peek() != c) return false;
    ++i_;
    return true;
  }
  void expect(char c, const char* where) {
    if (!accept(c)) fail(std::string("expected '") + c + "' " + where);
  }
  // A Python string literal in single or double quotes, without escapes.
  std::string_view string(const char* where) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(std::string("expected a quoted string ") + where);
    const std::size_t start = ++i_;
    while (i_ < text_.size() && text_[i_] != quote) {
      if (text_[i_] == '\\') fail("escape sequences in header strings are not supported");
      ++i_;
    }
    if (i_ >= text_.size()) fail(std::string("unterminated string ") + where);
    return text_.substr(start, i_++ - start);
  }
  bool boolean(const char* where) {
    skip_space();
    for (auto [word, value] : {std::pair<std::string_view, bool>{"True", true}, {"False", false}}) {
      if (text_.substr(i_, word.size()) == word) {
        i_ += word.size();
        return value;
      }
    }
    fail(std::string("expected True or False ") + where);
  }
  // A non-negative decimal integer that fits in int64 (numpy writes dims this way).
  int64_t dimension() {
    skip_space();
    const std::size_t start = i_;
    uint64_t value = 0;
    while (i_ < text_.size() && text_[i_] >= '0' && text_[i_] <= '9') {
      value = value * 10 + static_cast<uint64_t>(text_[i_] - '0');
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail("a dimension does not fit in 64 bits");
      ++i_;
    }
    if (i_ == start) fail("shape is not a tuple of non-negative integers");
    return static_cast<int64_t>(value);
  }
  [[noreturn]] void fail(const std::string& what) const {
    malformed(path_, "header " + what + " (at character " + std::to_string(i_) + ")");
  }

 private:
  std::string_view text_;
  const std::string& path_;
  std::size_t i_ = 0;
};

}  // namespace

namespace detail {

NpyHeader parse_npy_header(std::string_view dict, const std::string& path) {
  HeaderCursor c(dict, path);
  NpyHeader h;
  bool has_descr = false, has_order = false, has_shape = false;
  c.expect('{', "at the start of the header dict");
  while (!c.accept('}')) {
    const std::string_view key = c.string("as a header key");
    c.expect(':', "after a header key");
    bool* seen = nullptr;
    if (key == "descr") {
      seen = &has_descr;
      h.descr = std::string(c.string("as 'descr' (structured dtypes are not supported)"));
    } else if (key == "fortran_order") {
      seen = &has_order;
      h.fortran_order = c.boolean("as 'fortran_order'");
    } else if (key == "shape") {
      seen = &has_shape;
      h.shape.clear();
      c.expect('(', "to open 'shape'");
      while (!c.accept(')')) {
        if (h.shape.size() >= kNpyMaxDims)
          c.fail("shape has more than " + std::to_string(kNpyMaxDims) + " dimensions");
        h.shape.push_back(c.dimension());
        if (!c.accept(',')) {
          c.expect(')', "to close 'shape'");
          // "(3)" is an int in Python, not a tuple: numpy never writes it.
          if (h.shape.size() == 1) c.fail("shape (n) is not a tuple; numpy writes (n,)");
          break;
        }
      }
    } else {
      c.fail("has the key '" + std::string(key.substr(0, 64)) + "'; numpy headers have exactly descr, fortran_order, shape");
    }
    if (*seen) c.fail("names '" + std::string(key) + "' twice");
    *seen = true;
    if (!c.accept(',')) {
      c.expect('}', "to close the header dict");
      break;
    }
  }
  if (!c.at_end()) c.fail("has text after the dict");
  if (!has_descr) malformed(path, "no 'descr'");
  if (!has_order) malformed(path, "no 'fortran_order'");
  if (!has_shape) malformed(path, "no 'shape'");
  return h;
}

Tensor read_npy(std::istream& in, const std::string& path) {
  in.seekg(0, std::ios::end);
  const auto end = in.tellg();
  in.seekg(0);
  if (end < 0 || !in) throw Error(ErrorCode::kIo, "cannot read '" + path + "'");
  const auto file_size = static_cast<uint64_t>(end);
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, kMagic, 6) != 0) {
    // an .npz (np.savez: a zip of .npy files) is the likeliest other file here: said as such
    if (in.gcount() >= 4 && std::memcmp(magic, "PK\x03\x04", 4) == 0)
      malformed(path, "a zip archive (an .npz of np.savez?), not one .npy array: save each input with np.save and "
                      "give it as NAME=FILE.npy");
    malformed(path, "bad magic: not a .npy file (np.save writes one)");
  }
  const int major = static_cast<unsigned char>(magic[6]);
  uint64_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) malformed(path, "truncated header");
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) malformed(path, "truncated header");
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint64_t>(b[3]) << 24);
  } else {
    malformed(path, "format version " + std::to_string(major));
  }
  // Both checks come before the header is allocated: a 12-byte file must not make us
  // allocate the 4 GB it claims.
  const uint64_t header_start = static_cast<uint64_t>(in.tellg());
  if (header_len > file_size - header_start)
    malformed(path, "truncated header (it declares " + std::to_string(header_len) + " bytes, the file has " +
                        std::to_string(file_size - header_start) + " after the length)");
  if (header_len > detail::kNpyMaxHeaderBytes)
    malformed(path, "header of " + std::to_string(header_len) + " bytes, more than numpy's limit of " +
                        std::to_string(detail::kNpyMaxHeaderBytes));
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len))) malformed(path, "truncated header");

  const NpyHeader h = parse_npy_header(header, path);
  auto dtype = dtype_from_numpy(h.descr);
  if (!dtype)
    malformed(path, "dtype '" + h.descr.substr(0, 64) + "' (little-endian bool/int/uint8/float only)");
  if (h.fortran_order) malformed(path, "Fortran order");

  // Check the data is all there before allocating: a corrupt header must not allocate
  // whatever size it claims.
  // The product of the non-zero extents must fit in int64 even for an empty array
  // (Tensor computes element counts in int64) and, unless the array is empty, be present.
  const uint64_t available = file_size - header_start - header_len;
  constexpr auto kLimit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t bytes = dtype_size(*dtype);
  bool empty = false;
  for (auto d : h.shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    if (bytes > kLimit / static_cast<uint64_t>(d))
      malformed(path, "shape " + shape_to_string(h.shape) + " of " + h.descr + " has more than 2^63 bytes");
    bytes *= static_cast<uint64_t>(d);
  }
  if (!empty && bytes > available)
    malformed(path, "data truncated (shape " + shape_to_string(h.shape) + " of " + h.descr + " needs " +
                        std::to_string(bytes) + " bytes, the file has " + std::to_string(available) + ")");
  Tensor t = Tensor::empty_host(*dtype, h.shape);
  if (!in.read(static_cast<char*>(t.data()), static_cast<std::streamsize>(t.nbytes())))
    malformed(path, "data truncated (expected " + std::to_string(t.nbytes()) + " bytes for shape " +
                        shape_to_string(h.shape) + ")");
  return t;
}

}  // namespace detail

Tensor load_npy(const std::string& path) {
  // A directory opens as a stream that reads nothing: it was "bad magic: not a .npy file"
  // (a bad argument) where the path names no file at all.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(ErrorCode::kIo, "cannot read '" + path + "': it is a directory, not a .npy file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kIo, "cannot open '" + path + "': " + std::strerror(errno));
  return detail::read_npy(in, path);
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
