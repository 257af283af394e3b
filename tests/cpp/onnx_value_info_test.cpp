// onnx_values_without_rank: the graph inputs and outputs declared without a shape (rank
// unknown), told from scalars (an empty shape), read from the wire format.
#include "aitune/onnx_value_info.hpp"

#include <fstream>
#include <gtest/gtest.h>

#include "onnx_wire.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {

namespace w = test::onnx_wire;
using Names = std::set<std::string>;

// ValueInfoProto {name = 1, type = 2: TypeProto {tensor_type = 1: {elem_type = 1, shape = 2}}};
// `shape` nullptr: no shape field at all.
std::string tensor_value(const std::string& name, const std::string* shape) {
  std::string tensor = w::varint_field(1, 1);
  if (shape) tensor += w::bytes_field(2, *shape);
  return w::bytes_field(1, name) + w::bytes_field(2, w::bytes_field(1, tensor));
}

TEST(OnnxValueInfo, ValuesWithoutAShapeAreToldFromScalars) {
  test::ScopedTempDir dir;
  const std::string scalar;                                                    // shape {}: rank 0
  const std::string matrix = w::bytes_field(1, w::varint_field(1, 2)) + w::bytes_field(1, w::bytes_field(2, "n"));
  const std::string sequence = w::bytes_field(1, "seq") + w::bytes_field(2, w::bytes_field(4, ""));  // not a tensor
  std::string graph = w::bytes_field(2, "g");
  graph += w::bytes_field(11, tensor_value("x", nullptr)) + w::bytes_field(11, tensor_value("s", &scalar)) +
           w::bytes_field(11, tensor_value("m", &matrix)) + w::bytes_field(11, sequence);
  graph += w::bytes_field(12, tensor_value("y", nullptr)) + w::bytes_field(12, tensor_value("z", &matrix));
  const std::string path = dir.file("model.onnx");
  std::ofstream(path, std::ios::binary) << w::model(graph);
  EXPECT_EQ(onnx_values_without_rank(path), (Names{"x", "y"}));
}

TEST(OnnxValueInfo, MalformedAndMissingFilesAreTypedErrors) {
  test::ScopedTempDir dir;
  const std::string path = dir.file("model.onnx");
  const std::string model = w::model(w::bytes_field(11, tensor_value("x", nullptr)));
  std::ofstream(path, std::ios::binary) << model.substr(0, model.size() - 3);
  test::expect_error([&] { onnx_values_without_rank(path); }, ErrorCode::kModelInvalid,
                     {"model.onnx", "not a well-formed protobuf"});
  test::expect_error([&] { onnx_values_without_rank(dir.file("nosuch.onnx")); }, ErrorCode::kIo, {"nosuch.onnx"});
}

}  // namespace
}  // namespace aitune
