// Private: reading ONNX files at the protobuf wire level (no protobuf dependency): a
// model's bytes mapped read-only, and a bounded reader of wire-format fields that the
// walks over a model (external-data references, operator types) are built on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "aitune/error.hpp"
#include "aitune/onnx_external_data.hpp"

namespace aitune::detail {

/// A model file mapped read-only for as long as this lives. Error(kIo) naming the file
/// when it cannot be opened, is not a regular file or cannot be mapped.
class MappedModel {
 public:
  explicit MappedModel(const std::string& path);
  ~MappedModel();
  MappedModel(const MappedModel&) = delete;
  MappedModel& operator=(const MappedModel&) = delete;

  std::string_view bytes() const noexcept { return {static_cast<const char*>(data_), size_}; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Bounds-checked reading of protobuf wire-format fields of `bytes`; every defect is an
/// Error(kModelInvalid) naming the model (`what`) and the byte offset.
class ProtobufReader {
 public:
  ProtobufReader(std::string_view bytes, const std::string& what) : bytes_(bytes), what_(what) {}

 protected:
  [[noreturn]] void malformed(std::size_t at, const std::string& why) const {
    throw Error(ErrorCode::kModelInvalid, "ONNX model '" + what_ + "' is not a well-formed protobuf: " + why +
                                              " at byte " + std::to_string(at));
  }

  std::uint64_t varint(std::size_t& i, std::size_t end) const {
    std::uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i >= end) malformed(i, "truncated varint");
      auto b = static_cast<unsigned char>(bytes_[i++]);
      value |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return value;
    }
    malformed(i, "varint longer than 10 bytes");
  }

  // The length of a length-delimited field starting at `i`, checked against `end`.
  std::size_t length(std::size_t& i, std::size_t end) const {
    const std::uint64_t n = varint(i, end);
    if (n > end - i) malformed(i, "length " + std::to_string(n) + " runs past the end of its message");
    return static_cast<std::size_t>(n);
  }

  void advance(std::size_t& i, std::size_t end, std::size_t n) const {
    if (n > end - i) malformed(i, "field runs past the end of its message");
    i += n;
  }

  // Skips the payload of a field of `wire_type` that starts at `i`; (deprecated) groups
  // count toward kOnnxMaxMessageDepth like embedded messages.
  void skip(std::size_t& i, std::size_t end, std::uint32_t wire_type, std::uint32_t field, std::size_t depth) const {
    switch (wire_type) {
      case 0: varint(i, end); return;
      case 1: advance(i, end, 8); return;
      case 5: advance(i, end, 4); return;
      case 2: advance(i, end, length(i, end)); return;
      case 3: {  // a group: fields up to the matching end-group tag
        if (depth + 1 > kOnnxMaxMessageDepth)
          malformed(i, "groups nested deeper than " + std::to_string(kOnnxMaxMessageDepth));
        for (;;) {
          if (i >= end) malformed(i, "unterminated group");
          const std::uint64_t tag = varint(i, end);
          const auto wt = static_cast<std::uint32_t>(tag & 7);
          const auto f = tag >> 3;
          if (wt == 4) {
            if (f != field) malformed(i, "mismatched end of group");
            return;
          }
          skip(i, end, wt, static_cast<std::uint32_t>(f), depth + 1);
        }
      }
      default: malformed(i, "invalid wire type " + std::to_string(wire_type));
    }
  }

  std::string_view bytes_;
  const std::string& what_;
};

}  // namespace aitune::detail
