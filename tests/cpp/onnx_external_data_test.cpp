// Tests for onnx_external_data_locations: every place of an ONNX model a tensor can live,
// every field order of an external_data entry, malformed and hostile protobuf bytes.
#include "aitune/onnx_external_data.hpp"  // not in aitune.hpp
#include "onnx_wire.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {

namespace w = test::onnx_wire;
using test::expect_error;
using test::fixture;
using test::ScopedTempDir;
using Locations = std::vector<std::string>;

Locations scan(const std::string& bytes) { return onnx_external_data_locations_in(bytes, "test.onnx"); }

TEST(OnnxExternalData, InitializerInEitherFieldOrder) {
  EXPECT_EQ(scan(w::model(w::graph({w::external_tensor("w", "weights.bin")}))), Locations{"weights.bin"});
  // Regression (issue 17): value before key is valid protobuf; a byte-pattern scan missed it.
  EXPECT_EQ(scan(w::model(w::graph({w::external_tensor("w", "weights.bin", true)}))), Locations{"weights.bin"});
}

TEST(OnnxExternalData, EveryPlaceATensorCanLive) {
  const std::string sub = w::graph({w::external_tensor("s", "sub.bin", true)});
  EXPECT_EQ(scan(w::model(w::graph({}, {w::node_with_attribute(6, sub)}))), Locations{"sub.bin"}) << "attribute g";
  EXPECT_EQ(scan(w::model(w::graph({}, {w::node_with_attribute(11, sub)}))), Locations{"sub.bin"}) << "attribute graphs";
  EXPECT_EQ(scan(w::model(w::graph({}, {w::node_with_attribute(5, w::external_tensor("c", "t.bin"), "Constant")}))),
            Locations{"t.bin"})
      << "attribute t";
  EXPECT_EQ(scan(w::model(w::graph({}, {w::node_with_attribute(10, w::external_tensor("c", "ts.bin"), "Constant")}))),
            Locations{"ts.bin"})
      << "attribute tensors";
  const std::string sparse = w::sparse_tensor(w::external_tensor("v", "v.bin"), w::external_tensor("i", "i.bin", true));
  EXPECT_EQ(scan(w::model(w::graph({}, {}, {sparse}))), (Locations{"i.bin", "v.bin"})) << "sparse_initializer";
  EXPECT_EQ(scan(w::model(w::graph({}, {w::node_with_attribute(22, sparse, "Constant")}))), (Locations{"i.bin", "v.bin"}))
      << "attribute sparse_tensor";
  EXPECT_EQ(scan(w::model(w::graph({}), {w::node_with_attribute(5, w::external_tensor("f", "f.bin"), "Constant")})),
            Locations{"f.bin"})
      << "function body";
  // A subgraph three levels down, and duplicates collapsed, sorted.
  const std::string deep = w::graph({}, {w::node_with_attribute(6, w::graph({}, {w::node_with_attribute(6, sub)}))});
  EXPECT_EQ(scan(w::model(w::graph({w::external_tensor("a", "z.bin"), w::external_tensor("b", "sub.bin")},
                                   {w::node_with_attribute(6, deep)}))),
            (Locations{"sub.bin", "z.bin"}));
}

TEST(OnnxExternalData, EpContextEngineFilesWithEmbedModeZero) {
  // embed_mode=0: ep_cache_context is an engine file ORT loads from the model's directory.
  EXPECT_EQ(scan(w::model(w::graph({}, {w::ep_context_node(0, "model_ctx.engine")}))), Locations{"model_ctx.engine"});
  EXPECT_EQ(scan(w::model(w::graph({}, {w::ep_context_node(0, "model_ctx.engine", true)}))),
            Locations{"model_ctx.engine"})
      << "attributes before op_type";
  // Together with external data, and inside a subgraph.
  const std::string sub = w::graph({}, {w::ep_context_node(0, "sub.engine")});
  EXPECT_EQ(scan(w::model(w::graph({w::external_tensor("w", "w.bin")}, {w::node_with_attribute(6, sub)}))),
            (Locations{"sub.engine", "w.bin"}));
  // embed_mode=1 (and the default, no embed_mode) embeds the engine's bytes: no file.
  EXPECT_EQ(scan(w::model(w::graph({}, {w::ep_context_node(1, "\x01\x02engine bytes")}))), Locations{});
  const std::string no_mode = w::bytes_field(4, "EPContext") +
                              w::bytes_field(5, w::bytes_field(1, "ep_cache_context") + w::bytes_field(4, "bytes"));
  EXPECT_EQ(scan(w::model(w::graph({}, {no_mode}))), Locations{});
  // Another op with the same attribute names references nothing.
  const std::string other = w::bytes_field(4, "Custom") +
                            w::bytes_field(5, w::bytes_field(1, "embed_mode") + w::varint_field(3, 0)) +
                            w::bytes_field(5, w::bytes_field(1, "ep_cache_context") + w::bytes_field(4, "x.engine"));
  EXPECT_EQ(scan(w::model(w::graph({}, {other}))), Locations{});
  // embed_mode=0 naming no file is malformed.
  expect_error([&] { scan(w::model(w::graph({}, {w::ep_context_node(0, "")}))); }, ErrorCode::kModelInvalid,
               {"EPContext", "embed_mode=0"});
}

TEST(OnnxExternalData, OnlyLocationEntriesOfTensorsCount) {
  // A "location" entry in metadata_props (ModelProto field 14) names no tensor data.
  const std::string m = w::model(w::graph({})) + w::bytes_field(14, w::entry("location", "not-data.bin"));
  EXPECT_EQ(scan(m), Locations{});
  // The last value of a repeated key field wins, as in protobuf.
  const std::string twice = w::bytes_field(1, "location") + w::bytes_field(2, "first.bin") + w::bytes_field(2, "last.bin");
  EXPECT_EQ(scan(w::model(w::graph({w::bytes_field(8, "w") + w::bytes_field(13, twice)}))), Locations{"last.bin"});
  EXPECT_EQ(scan(""), Locations{});
  EXPECT_EQ(scan(w::model(w::graph({}))), Locations{});
}

TEST(OnnxExternalData, UnknownFieldsAndGroupsAreSkipped) {
  // Fixed64 (1), fixed32 (5), varint (0), a group (3..4) around a fake entry, unknown fields.
  std::string g = w::varint((99u << 3) | 1) + std::string(8, 'x') + w::varint((98u << 3) | 5) + std::string(4, 'y') +
                  w::varint_field(97, 300) + w::varint((96u << 3) | 3) + w::bytes_field(13, w::entry("location", "no.bin")) +
                  w::varint((96u << 3) | 4);
  g += w::bytes_field(5, w::external_tensor("w", "yes.bin"));
  EXPECT_EQ(scan(w::model(g)), Locations{"yes.bin"});
}

TEST(OnnxExternalData, MalformedBytesAreModelInvalid) {
  const std::string good = w::model(w::graph({w::external_tensor("w", "weights.bin")}));
  for (std::size_t cut : {good.size() - 1, good.size() / 2, std::size_t{3}}) {
    SCOPED_TRACE(cut);
    expect_error([&] { scan(good.substr(0, cut)); }, ErrorCode::kModelInvalid);
  }
  // A length far past the end, an over-long varint, wire types 6 and 7, an unmatched end-group.
  expect_error([&] { scan(w::varint((7u << 3) | 2) + w::varint(1ull << 40)); }, ErrorCode::kModelInvalid);
  expect_error([&] { scan(std::string(11, '\xff')); }, ErrorCode::kModelInvalid);
  expect_error([&] { scan(w::varint((7u << 3) | 6)); }, ErrorCode::kModelInvalid);
  expect_error([&] { scan(w::varint((7u << 3) | 4)); }, ErrorCode::kModelInvalid);
  // An entry "location" without a value.
  expect_error([&] { scan(w::model(w::graph({w::bytes_field(13, w::bytes_field(1, "location"))}))); },
               ErrorCode::kModelInvalid);
  // A location longer than any path.
  expect_error([&] { scan(w::model(w::graph({w::external_tensor("w", std::string(kOnnxMaxLocationBytes + 1, 'a'))}))); },
               test::ErrorExpectation{{ErrorCode::kModelInvalid}, {}, {"location"}});
}

TEST(OnnxExternalData, NestingIsBounded) {
  // Subgraphs nested 200 deep: refused, not a stack overflow (protobuf's own limit is 100).
  std::string g = w::graph({w::external_tensor("w", "deep.bin")});
  for (int i = 0; i < 200; ++i) g = w::graph({}, {w::node_with_attribute(6, g)});
  expect_error([&] { scan(w::model(g)); }, test::ErrorExpectation{{ErrorCode::kModelInvalid}, {}, {"deeper than"}});
  // 30 deep is fine.
  std::string shallow = w::graph({w::external_tensor("w", "deep.bin")});
  for (int i = 0; i < 30; ++i) shallow = w::graph({}, {w::node_with_attribute(6, shallow)});
  EXPECT_EQ(scan(w::model(shallow)), Locations{"deep.bin"});
  // Groups nested 100,000 deep in an unknown field.
  std::string groups;
  for (int i = 0; i < 100000; ++i) groups += w::varint((96u << 3) | 3);
  expect_error([&] { scan(groups); }, ErrorCode::kModelInvalid);
}

TEST(OnnxExternalData, FilesOnDisk) {
  EXPECT_EQ(onnx_external_data_locations(fixture("mlp_ext.onnx")), Locations{"mlp_ext.onnx.data"});
  EXPECT_EQ(onnx_external_data_locations(fixture("mlp.onnx")), Locations{});
  ScopedTempDir dir;
  test::write_file_bytes(dir.file("empty.onnx"), "");
  EXPECT_EQ(onnx_external_data_locations(dir.file("empty.onnx")), Locations{});
  expect_error([&] { onnx_external_data_locations(dir.file("missing.onnx")); },
               test::ErrorExpectation{{ErrorCode::kIo}, {}, {"missing.onnx"}});
  expect_error([&] { onnx_external_data_locations(dir.path().string()); }, ErrorCode::kIo);
  expect_error([&] { onnx_external_data_locations(fixture("corrupt.onnx")); }, ErrorCode::kModelInvalid);
}

// The value-first model is one ORT really loads (so the scanner must see its data file).
TEST(OnnxExternalData, ValueFirstModelIsWhatOrtReads) {
  ScopedTempDir dir;
  std::string bytes = test::read_file_bytes(fixture("mlp_ext.onnx"));
  ASSERT_GT(w::put_location_values_first(bytes), 0u);
  ASSERT_EQ(bytes.find(w::bytes_field(1, "location") + '\x12'), std::string::npos);
  test::write_file_bytes(dir.file("m.onnx"), bytes);
  std::filesystem::copy_file(fixture("mlp_ext.onnx.data"), dir.file("mlp_ext.onnx.data"));
  EXPECT_EQ(onnx_external_data_locations(dir.file("m.onnx")), Locations{"mlp_ext.onnx.data"});
  auto backend = OnnxSession::create(dir.file("m.onnx"), test::cpu_config());
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  test::expect_allclose_f32(backend->infer({x.view()}).at(0), test::load_fixture_npy("mlp_y.npy"), 1e-5);
}

TEST(OnnxExternalData, SafeRelativePaths) {
  for (const char* ok : {"a", "a/b.bin", "w.onnx.data", "x..y"}) EXPECT_TRUE(is_safe_relative_path(ok)) << ok;
  for (const char* bad : {"", "/abs", "../x", "a/../b", "a//b", "./a", "a/", "a\\b", "."})
    EXPECT_FALSE(is_safe_relative_path(bad)) << bad;
  EXPECT_FALSE(is_safe_relative_path(std::string("a\0b", 3)));
}

}  // namespace
}  // namespace aitune
