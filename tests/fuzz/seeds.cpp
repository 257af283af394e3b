// Built-in seeds of the fuzz targets: valid inputs of each format, made with the same
// code and helpers the tests use, so the mutants start from what aitune really reads.
#include "seeds.hpp"

#include <string_view>

#include "aitune/checkpoint.hpp"
#include "aitune/graph_spec.hpp"
#include "onnx_wire.hpp"

namespace aitune::fuzz {
namespace {

std::string npy(std::string header, std::string_view data, char version = 1) {
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += version;
  bytes += '\0';
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  if (version != 1) bytes += std::string(2, '\0');
  return bytes + header + std::string(data);
}

GraphSpec sample_spec() {
  GraphSpec spec;
  spec.inputs.push_back({"x", DType::kFloat32, {1, 64}, {8, 64}, 0});
  spec.inputs.push_back({"ids", DType::kInt64, {1, 8}, {kUnbounded, 8}, std::nullopt});
  spec.outputs.push_back({"y", DType::kFloat32, {1, 16}, {8, 16}, 0});
  spec.batch_sizes = {1, 2, 8};
  return spec;
}

}  // namespace

std::vector<std::string> npy_seeds() {
  const std::string data(64, '\x01');
  return {
      npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data),
      npy("{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }", data),
      npy("{'descr': '<i8', 'fortran_order': False, 'shape': (), }", data),
      npy("{\"descr\": \"<u1\", \"fortran_order\": False, \"shape\": (0, 5)}", data, 2),
      npy("{'descr': '<f2', 'fortran_order': True, 'shape': (2, 2), }", data, 3),
  };
}

std::vector<std::string> graph_spec_seeds() { return {sample_spec().to_json(), sample_spec().to_json(2)}; }

std::vector<std::string> manifest_seeds() {
  CheckpointManifest m;
  m.aitune_version = "0.1.0";
  m.onnxruntime_version = "1.29.0";
  m.module_name = "mlp";
  m.created = "2026-01-01T00:00:00Z";
  m.metadata_json = R"({"aitune_torch":{"format_version":1,"eager_graphs":[]},"tuning_s":1.5})";
  CheckpointGraph g;
  g.key = "graph_0";
  g.graph_spec = sample_spec();
  g.backend_config.provider = ExecutionProvider::kCUDA;
  g.backend_config.intra_op_threads = 2;
  g.backend_config.provider_options = {{"trt_engine_cache_path", "graphs/graph_0/trt"}};
  g.path_options = {"trt_engine_cache_path"};
  g.model = "graphs/graph_0/model.onnx";
  g.structure_json = R"({"order":[0,1],"inputs":[["x",null]],"outputs":{"y":[0]}})";
  const std::string digest(64, 'a');
  g.artifacts = {{"graphs/graph_0/model.onnx", 1234, digest}, {"graphs/graph_0/model.onnx.data", 5, digest}};
  m.graphs.push_back(g);
  CheckpointManifest two = m;
  g.key = "graph_1";
  g.model = "graphs/graph_1/model.onnx";
  g.path_options.clear();
  g.backend_config.provider_options.clear();
  g.artifacts = {{"graphs/graph_1/model.onnx", 99, digest}};
  two.graphs.push_back(g);
  return {m.to_json(2), two.to_json(-1)};
}

std::vector<std::string> onnx_seeds() {
  namespace w = test::onnx_wire;
  const std::string plain = w::model(w::graph({w::external_tensor("w", "weights.bin")}));
  const std::string value_first = w::model(w::graph({w::external_tensor("w", "weights.bin", true)}));
  const std::string subgraph =
      w::model(w::graph({}, {w::node_with_attribute(6, w::graph({w::external_tensor("s", "sub.bin", true)}))}));
  const std::string attribute_tensor =
      w::model(w::graph({}, {w::node_with_attribute(5, w::external_tensor("c", "const.bin"), "Constant")}));
  const std::string sparse = w::model(w::graph(
      {}, {}, {w::sparse_tensor(w::external_tensor("v", "values.bin"), w::external_tensor("i", "indices.bin", true))}));
  const std::string function =
      w::model(w::graph({}), {w::node_with_attribute(10, w::external_tensor("f", "function.bin"), "Constant")});
  return {plain, value_first, subgraph, attribute_tensor, sparse, function};
}

}  // namespace aitune::fuzz
