// `aitune inspect MODEL.onnx|CHECKPOINT`: inputs/outputs, dtypes, symbolic dims, opset,
// external data; for a checkpoint, its manifest (after verifying every file).
#include <filesystem>
#include <iostream>

#include "arguments.hpp"
#include "aitune/checkpoint.hpp"
#include "aitune/error.hpp"
#include "aitune/onnx_external_data.hpp"
#include "aitune/onnx_session.hpp"
#include "commands.hpp"

namespace aitune::cli {
namespace fs = std::filesystem;
namespace {

std::string dims_to_string(const IoInfo& io) {
  if (!io.rank_known) return " (no shape declared: rank unknown)";
  std::string out = "[";
  for (std::size_t i = 0; i < io.shape.size(); ++i) {
    if (i) out += ", ";
    out += io.shape[i] >= 0 ? std::to_string(io.shape[i]) : (io.symbolic_dims[i].empty() ? "?" : io.symbolic_dims[i]);
  }
  return out + "]";
}

// Manifest summary of a verified checkpoint.
int inspect_checkpoint(const std::string& dir) {
  auto checkpoint = Checkpoint::load(dir);
  const auto& m = checkpoint.manifest();
  std::cout << "checkpoint: " << checkpoint.directory() << " (all artifacts verified)\n";
  std::cout << "format version: " << m.format_version << "; written by aitune " << m.aitune_version
            << ", ONNX Runtime " << m.onnxruntime_version << ", at " << m.created << "\n";
  std::cout << "module: " << m.module_name << "\n";
  for (const auto& g : m.graphs) {
    if (!checkpoint.runs_in_engine(g.key)) {  // a front end's section: its own fields, no model
      std::cout << "graph " << g.key << ": " << g.backend << " (section version " << g.section_version
                << ", run by " << find_checkpoint_section(g.backend)->runs_where << "): " << g.section_json << "\n";
      for (const auto& a : g.artifacts)
        std::cout << "  artifact " << a.path << ": " << human_bytes(a.size) << ", sha256 " << a.sha256.substr(0, 16)
                  << "...\n";
      continue;
    }
    const auto& c = g.backend_config;
    std::cout << "graph " << g.key << ": " << g.backend << " on " << execution_provider_name(c.provider)
              << " (device " << c.device_id << "), model " << g.model << "\n";
    for (const auto& [k, v] : c.provider_options) std::cout << "  provider option " << k << "=" << v << "\n";
    for (auto [title, list] : {std::pair{"input", &g.graph_spec.inputs}, std::pair{"output", &g.graph_spec.outputs}})
      for (const auto& t : *list) std::cout << "  " << title << " " << t.name << ": " << t.to_string() << "\n";
    // the sizes inside those ranges the graph still refuses (a branch of the model's code)
    for (const auto& c : g.graph_spec.conditions) std::cout << "  holds only where " << c.to_string() << "\n";
    for (const auto& a : g.artifacts)
      std::cout << "  artifact " << a.path << ": " << human_bytes(a.size) << ", sha256 " << a.sha256.substr(0, 16)
                << "...\n";
  }
  return 0;
}

}  // namespace

Command add_inspect(CLI::App& app) {
  auto* sub = app.add_subcommand("inspect", "Show a model's inputs, outputs, opset and external data, or a checkpoint's manifest");
  auto model = std::make_shared<std::string>();
  sub->add_option("model", *model, "path to an .onnx file or a checkpoint directory")->required()->check(non_empty_path());
  return {sub, [model] {
            if (fs::is_directory(*model)) return inspect_checkpoint(*model);
            OnnxSessionConfig config;
            config.provider = ExecutionProvider::kCPU;  // introspection needs no device
            config.graph_optimization_level = GraphOptimizationLevel::kDisableAll;
            auto backend = OnnxSession::create(*model, config);
            std::cout << "model: " << *model << " (" << human_bytes(fs::file_size(*model)) << ")\n";
            std::cout << "opset: " << backend->opset() << "\n";
            for (auto [title, list] : {std::pair{"inputs", &backend->inputs()}, std::pair{"outputs", &backend->outputs()}}) {
              std::cout << title << ":\n";
              for (const auto& io : *list)
                std::cout << "  " << io.name << ": " << dtype_name(io.dtype) << dims_to_string(io) << "\n";
            }
            auto files = onnx_external_data_locations(*model);
            if (files.empty()) {
              std::cout << "external data: none\n";
            } else {
              std::uintmax_t total = 0;
              std::cout << "external data:\n";
              for (const auto& f : files) {
                auto p = fs::path(*model).parent_path() / f;
                std::error_code ec;
                auto size = fs::file_size(p, ec);
                std::cout << "  " << f << ": " << (ec ? std::string("missing") : human_bytes(size)) << "\n";
                if (!ec) total += size;
              }
              std::cout << "  total: " << human_bytes(total) << "\n";
            }
            return 0;
          }};
}

}  // namespace aitune::cli
