// Test tool: saves a checkpoint of one fixture model through the C++ API, with a graph
// spec recorded at batch sizes 1 and 4 and the CPU provider, for the tests that run a
// checkpoint in another process (the installed-package consumer example).
//   make_test_checkpoint OUT_DIR MODEL.onnx [KEY]
#include <iostream>

#include "aitune/aitune.hpp"

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::cerr << "usage: make_test_checkpoint OUT_DIR MODEL.onnx [KEY]\n";
    return 2;
  }
  const std::string out = argv[1], model = argv[2], key = argc == 4 ? argv[3] : "graph_0";
  try {
    aitune::OnnxSessionConfig config;
    config.provider = aitune::ExecutionProvider::kCPU;
    auto backend = aitune::OnnxSession::create(model, config);

    // What a front end records: the model's symbolic extents follow the batch size.
    aitune::GraphSpecBuilder builder;
    for (int64_t batch : {1, 4}) {
      auto records = [batch](const std::vector<aitune::IoInfo>& ios) {
        std::vector<aitune::TensorRecord> list;
        for (const auto& io : ios) {
          aitune::Shape shape = io.shape;
          for (auto& d : shape) d = d < 0 ? batch : d;
          list.push_back({io.name, io.dtype, shape});
        }
        return list;
      };
      builder.record(records(backend->inputs()), records(backend->outputs()), batch);
    }

    aitune::CheckpointManifest manifest;
    manifest.module_name = "make_test_checkpoint";
    manifest.metadata_json = R"({"source_model": ")" + model + R"("})";
    aitune::CheckpointGraph graph;
    graph.key = key;
    graph.graph_spec = builder.build();
    graph.backend_config = config;
    graph.structure_json = R"({"inputs": "tuple", "outputs": "tensor"})";
    manifest.graphs.push_back(graph);
    auto written = aitune::Checkpoint::save(
        out, manifest, {{aitune::Checkpoint::graph_directory(key) + "/model_raw.onnx", model}});
    std::cout << "checkpoint " << out << ": graph " << key << ", " << written.graphs[0].artifacts.size()
              << " artifacts\n";
    return 0;
  } catch (const aitune::Error& e) {
    std::cerr << "make_test_checkpoint: " << e.what() << "\n";
    return 1;
  }
}
