// `aitune export-triton CHECKPOINT REPOSITORY`: a checkpoint's tuned graphs as a Triton
// Inference Server model repository (aitune::export_triton does the work).
#include <iostream>
#include <memory>
#include <optional>

#include "arguments.hpp"
#include "aitune/checkpoint.hpp"
#include "aitune/triton_export.hpp"
#include "commands.hpp"

namespace aitune::cli {
namespace {

struct ExportTritonOptions {
  std::string checkpoint;
  std::string repository;
  std::string model_name;
  std::optional<int> max_batch_size;
  int instances = 1;
  bool overwrite = false;
};

int export_triton_command(const ExportTritonOptions& o) {
  auto checkpoint = Checkpoint::load(o.checkpoint);  // verified before anything is written
  TritonExportOptions options;
  options.model_name = o.model_name;
  options.max_batch_size = o.max_batch_size;
  options.instances = o.instances;
  options.overwrite = o.overwrite;
  auto result = export_triton(checkpoint, o.repository, options);
  std::cout << "Triton repository: " << result.repository << "\n";
  for (const auto& m : result.models) {
    std::cout << "model " << m.name << ": "
              << (m.graph_key.empty() ? std::string("ensemble") : "graph " + m.graph_key) << ", max_batch_size "
              << m.max_batch_size << ", " << m.directory << "\n";
    for (const auto& note : m.not_expressed) std::cout << "  not expressed: " << note << "\n";
  }
  for (const auto& note : result.notes) std::cout << "note: " << note << "\n";
  return 0;
}

}  // namespace

Command add_export_triton(CLI::App& app) {
  auto* sub = app.add_subcommand("export-triton",
                                 "Write a checkpoint's tuned graphs as a Triton Inference Server model repository");
  auto o = std::make_shared<ExportTritonOptions>();
  sub->add_option("checkpoint", o->checkpoint, "checkpoint directory (ait.save / aitune::Checkpoint::save)")->required()->check(non_empty_path());
  sub->add_option("repository", o->repository, "Triton model repository directory (created if missing)")->required()->check(non_empty_path());
  sub->add_option("--model-name", o->model_name, "model name (default: the checkpoint's module name)");
  sub->add_option("--max-batch-size", o->max_batch_size,
                  "Triton max_batch_size (default: the largest batch recorded; 0 turns batching off)");
  sub->add_option("--instances", o->instances, "instance_group count")->capture_default_str();
  sub->add_flag("--overwrite", o->overwrite, "replace existing models of the same names in the repository");
  return {sub, [o] { return export_triton_command(*o); }};
}

}  // namespace aitune::cli
