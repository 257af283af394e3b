// onnx_operator_types: the operator types of every node, subgraphs and functions included,
// read from the wire format; malformed files are typed errors.
#include "aitune/onnx_operators.hpp"

#include <fstream>
#include <gtest/gtest.h>

#include "onnx_wire.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {

namespace w = test::onnx_wire;
using Ops = std::set<std::string>;

std::string write(const test::ScopedTempDir& dir, const std::string& bytes) {
  const std::string path = dir.file("model.onnx");
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(OnnxOperators, NodesOfTheGraphSubgraphsAndFunctions) {
  test::ScopedTempDir dir;
  const std::string conv = w::bytes_field(4, "Conv");
  const std::string sub = w::graph({}, {w::bytes_field(4, "Relu")});
  const std::string model = w::model(w::graph({}, {conv, w::node_with_attribute(6, sub), w::node_with_attribute(11, sub, "Loop")}),
                                     {w::bytes_field(4, "Gemm")});
  EXPECT_EQ(onnx_operator_types(write(dir, model)), (Ops{"Conv", "Gemm", "If", "Loop", "Relu"}));
  EXPECT_EQ(onnx_operator_types(write(dir, "")), Ops{}) << "an empty file has no nodes";
}

TEST(OnnxOperators, MalformedAndMissingFilesAreTypedErrors) {
  test::ScopedTempDir dir;
  const std::string model = w::model(w::graph({}, {w::bytes_field(4, "Conv")}));
  test::expect_error([&] { onnx_operator_types(write(dir, model.substr(0, model.size() - 2))); },
                     ErrorCode::kModelInvalid, {"model.onnx", "not a well-formed protobuf"});
  test::expect_error([&] { onnx_operator_types(write(dir, w::varint((7u << 3) | 3))); }, ErrorCode::kModelInvalid,
                     {"unsupported wire type 3"});
  test::expect_error([&] { onnx_operator_types(dir.file("nosuch.onnx")); }, ErrorCode::kIo, {"nosuch.onnx"});
}

}  // namespace
}  // namespace aitune
