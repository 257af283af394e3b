// Triton export: the model repository written from a checkpoint (a model directory per
// graph, an ensemble for a chain) through temporary directories renamed into place.
#include "aitune/triton_export.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "aitune/error.hpp"
#include "aitune/onnx_external_data.hpp"
#include "triton/triton_text.hpp"

namespace aitune {
namespace fs = std::filesystem;

using detail::join;
using detail::quote;
using detail::tensor_list;

namespace {

std::string random_suffix() {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  std::ostringstream out;
  out << std::hex << rng();
  return out.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) throw Error(ErrorCode::kIo, "cannot write '" + path.string() + "'");
}

void copy_into(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  if (!ec) fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot copy '" + from.string() + "' to '" + to.string() + "': " + ec.message());
}

// One model being written: its temporary directory and final place.
struct Staged {
  fs::path tmp, target, aside;
  bool renamed = false;
};

// The README.md of one graph model: where it came from and what config.pbtxt lacks.
std::string model_readme(const std::string& name, const CheckpointGraph& graph, const Checkpoint& checkpoint,
                         const TritonModelConfig& config, const std::string& source) {
  std::ostringstream out;
  out << "# " << name << "\n\n"
      << "Exported by aitune from graph `" << graph.key << "` of "
      << (source.empty() ? "the checkpoint `" + checkpoint.directory() + "`" : source) << " (module `"
      << checkpoint.manifest().module_name << "`).\n\n"
      << "- `1/model.onnx` is the ONNX model that won tuning (`" << graph.model << "`), byte for byte, with its "
      << "external data beside it.\n"
      << "- Tuned on the " << execution_provider_name(graph.backend_config.provider) << " execution provider; "
      << "max_batch_size " << config.max_batch_size << ".\n";
  for (auto [title, list] : {std::pair{"input", &graph.graph_spec.inputs}, std::pair{"output", &graph.graph_spec.outputs}})
    for (const auto& t : *list) out << "- " << title << " `" << t.name << "`: " << t.to_string() << "\n";
  out << "\n## Not expressed in config.pbtxt\n\n";
  if (config.not_expressed.empty()) {
    out << "Nothing: every setting of the tuned configuration is in config.pbtxt.\n";
  } else {
    for (const auto& note : config.not_expressed) out << "- " << note << "\n";
  }
  return out.str();
}

// A plain chain: graphs ordered so that each one's inputs are exactly the previous one's
// outputs (names and dtypes), batching agreeing. The order, or the reason there is none.
std::vector<std::size_t> chain_order(const std::vector<const CheckpointGraph*>& graphs,
                                     const std::vector<int>& batch_sizes, std::string& why_not) {
  auto signature = [](const std::vector<TensorSpec>& tensors) {
    std::map<std::string, DType> out;
    for (const auto& t : tensors) out[t.name] = t.dtype;
    return out;
  };
  const std::size_t n = graphs.size();
  std::vector<std::optional<std::size_t>> next(n);
  std::vector<int> predecessors(n, 0);
  for (std::size_t a = 0; a < n; ++a)
    for (std::size_t b = 0; b < n; ++b)
      if (a != b && signature(graphs[a]->graph_spec.outputs) == signature(graphs[b]->graph_spec.inputs)) {
        if (next[a]) {
          why_not = "the outputs of graph '" + graphs[a]->key + "' are the inputs of more than one graph";
          return {};
        }
        next[a] = b;
        ++predecessors[b];
      }
  std::vector<std::size_t> heads;
  for (std::size_t i = 0; i < n; ++i)
    if (predecessors[i] == 0) heads.push_back(i);
  if (heads.size() != 1) {
    std::vector<std::string> unfed;
    for (auto i : heads) unfed.push_back("'" + graphs[i]->key + "'");
    why_not = heads.empty() ? "the graphs feed each other in a cycle"
                            : "no plain chain: graphs " + join(unfed, ", ") +
                                  " take inputs that no other graph produces (an ensemble needs each graph's "
                                  "inputs to be exactly the previous graph's outputs, by name and dtype)";
    return {};
  }
  std::vector<std::size_t> order{heads.front()};
  while (next[order.back()] && order.size() <= n) order.push_back(*next[order.back()]);
  if (order.size() != n) {
    why_not = "the graphs do not form one chain (it ends after " + std::to_string(order.size()) + " of " +
              std::to_string(n) + " graphs)";
    return {};
  }
  std::set<std::string> produced;
  for (const auto& t : graphs[order.front()]->graph_spec.inputs) produced.insert(t.name);
  for (auto i : order)
    for (const auto& t : graphs[i]->graph_spec.outputs)
      if (!produced.insert(t.name).second) {
        why_not = "tensor '" + t.name + "' would be produced twice in the ensemble (graph '" + graphs[i]->key + "')";
        return {};
      }
  for (std::size_t i = 1; i < n; ++i)
    if ((batch_sizes[order[i]] > 0) != (batch_sizes[order[0]] > 0)) {
      why_not = "graph '" + graphs[order[i]]->key + "' and graph '" + graphs[order[0]]->key +
                "' disagree on batching (max_batch_size " + std::to_string(batch_sizes[order[i]]) + " vs " +
                std::to_string(batch_sizes[order[0]]) + ")";
      return {};
    }
  return order;
}

std::string ensemble_config(const std::string& name, const std::vector<const CheckpointGraph*>& graphs,
                            const std::vector<std::string>& names, const std::vector<std::size_t>& order,
                            int max_batch_size) {
  const bool batching = max_batch_size > 0;
  std::ostringstream out;
  out << "# Written by aitune: the chain " << join([&] {
    std::vector<std::string> steps;
    for (auto i : order) steps.push_back(names[i]);
    return steps;
  }(), " -> ") << ".\n";
  out << "name: " << quote(name) << "\nplatform: \"ensemble\"\nmax_batch_size: " << max_batch_size << "\n";
  out << tensor_list("input", graphs[order.front()]->graph_spec.inputs, batching);
  out << tensor_list("output", graphs[order.back()]->graph_spec.outputs, batching);
  out << "ensemble_scheduling {\n  step [\n";
  for (std::size_t s = 0; s < order.size(); ++s) {
    const auto& spec = graphs[order[s]]->graph_spec;
    out << "    {\n      model_name: " << quote(names[order[s]]) << "\n      model_version: -1\n";
    for (const auto& t : spec.inputs)
      out << "      input_map { key: " << quote(t.name) << " value: " << quote(t.name) << " }\n";
    for (const auto& t : spec.outputs)
      out << "      output_map { key: " << quote(t.name) << " value: " << quote(t.name) << " }\n";
    out << "    }" << (s + 1 < order.size() ? "," : "") << "\n";
  }
  out << "  ]\n}\n";
  return out.str();
}

// Graphs kept out of ONNX Runtime, so the export can say they were not exported: the
// manifest's graphs of sections this engine does not run (eager, torch_compile), and
// those an older aitune.torch recorded in the metadata (format 1 and 2: eager_graphs).
std::vector<std::string> eager_graph_notes(const CheckpointManifest& manifest) {
  std::vector<std::string> notes;
  for (const auto& g : manifest.graphs) {
    const auto* section = find_checkpoint_section(g.backend);
    if (section && section->runs_in_engine) continue;
    notes.push_back("graph '" + g.key + "' is a '" + g.backend + "' graph, run by " +
                    std::string(section ? section->runs_where : "another aitune") +
                    "; it has no ONNX model and was not exported");
  }
  auto metadata = nlohmann::json::parse(manifest.metadata_json, nullptr, false);
  if (!metadata.is_object() || !metadata.contains("aitune.torch")) return notes;
  const auto& torch = metadata["aitune.torch"];
  if (!torch.is_object() || !torch.contains("eager_graphs") || !torch["eager_graphs"].is_array()) return notes;
  for (const auto& entry : torch["eager_graphs"]) {
    std::string key = entry.is_object() && entry.contains("key") && entry["key"].is_string()
                          ? entry["key"].get<std::string>()
                          : "?";
    std::string why = entry.is_object() && entry.contains("note") && entry["note"].is_string()
                          ? entry["note"].get<std::string>()
                          : "TorchEagerBackend";
    notes.push_back("graph '" + key + "' runs eagerly in PyTorch (" + why +
                    "); it has no ONNX model and was not exported");
  }
  return notes;
}

// Leaves under a tree spec node of torch's pytree JSON (docs/checkpoints.md, "The
// structure of a graph"): a leaf (type null) is one; a node, those of its children.
std::size_t leaf_count(const nlohmann::json& node, int depth = 0) {
  if (!node.is_object() || depth > 100) return 0;
  if (!node.contains("type") || node["type"].is_null()) return 1;
  std::size_t n = 0;
  if (node.contains("children_spec") && node["children_spec"].is_array())
    for (const auto& child : node["children_spec"]) n += leaf_count(child, depth + 1);
  return n;
}

// The forward's non-tensor arguments of the call a graph was recorded from (`scale=2.0`):
// constants of the exported ONNX graph, which a Triton request cannot set. Read from the
// front end's structure (names from its tree spec's top dict of parameters); "" when the
// graph has none or no structure this reads.
std::string constant_arguments(const std::string& structure_json) {
  const auto s = nlohmann::json::parse(structure_json, nullptr, false);
  if (!s.is_object() || !s.contains("inputs") || !s["inputs"].is_object()) return "";
  const auto& inputs = s["inputs"];
  if (!inputs.contains("leaves") || !inputs["leaves"].is_array()) return "";
  const auto& leaves = inputs["leaves"];
  std::vector<std::string> names(leaves.size());
  if (inputs.contains("treespec") && inputs["treespec"].is_array() && inputs["treespec"].size() == 2) {
    const auto& top = inputs["treespec"][1];
    const auto keys = top.is_object() && top.contains("context") && top["context"].is_string()
                          ? nlohmann::json::parse(top["context"].get<std::string>(), nullptr, false)
                          : nlohmann::json();
    if (keys.is_array() && top.contains("children_spec") && top["children_spec"].is_array() &&
        top["children_spec"].size() == keys.size()) {
      std::size_t at = 0;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const std::size_t n = leaf_count(top["children_spec"][i]);
        const std::string key = keys[i].is_string() ? keys[i].get<std::string>() : keys[i].dump();
        for (std::size_t j = 0; j < n && at < names.size(); ++j, ++at) names[at] = n == 1 ? key : key + "[" + std::to_string(j) + "]";
      }
    }
  }
  std::string listed;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const auto& leaf = leaves[i];
    if (!leaf.is_object() || leaf.contains("tensor") || !leaf.contains("type")) continue;
    const std::string name = names[i].empty() ? "input leaf " + std::to_string(i) : names[i];
    const std::string type = leaf["type"].is_string() ? leaf["type"].get<std::string>() : leaf["type"].dump();
    // None has no value recorded: its type says it all ("? (none)" read as a formatting fault)
    const std::string value =
        type == "none" ? "None"
                       : (leaf.contains("value") ? leaf["value"].dump() : std::string("(value not recorded)")) + " (" +
                             type + ")";
    listed += (listed.empty() ? "" : ", ") + name + " = " + value;
  }
  return listed;
}

}  // namespace

TritonExportResult export_triton(const Checkpoint& checkpoint, const std::string& repository,
                                 const TritonExportOptions& options) {
  const auto& manifest = checkpoint.manifest();
  std::vector<const CheckpointGraph*> graphs;  // those this engine runs: a Triton model each
  for (const auto& g : manifest.graphs)
    if (checkpoint.runs_in_engine(g.key)) graphs.push_back(&g);
  if (graphs.empty())
    // (its graphs, eager or torch.compile, run only in the Python front end: exit 3 as for `aitune run`)
    throw Error(ErrorCode::kBackendUnavailable, "checkpoint '" + checkpoint.directory() +
                                                    "' holds no ONNX Runtime graphs; there is nothing to export to "
                                                    "Triton (its graphs run only in the Python front end)");
  std::string base = options.model_name.empty() ? manifest.module_name : options.model_name;
  if (!is_valid_triton_model_name(base))
    throw Error(ErrorCode::kInvalidArgument,
                (options.model_name.empty() ? "the checkpoint's module name '" + base +
                                                  "' is not a valid Triton model name; pass a model name"
                                            : "Triton model name '" + base + "' is not valid") +
                    " (1 to 255 characters of A-Z a-z 0-9 . _ -, not starting with '.')");
  if (options.instances < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "instances must be >= 1 (the instance_group count), got " + std::to_string(options.instances));

  // -- decide everything before writing anything ----------------------------------------
  const bool several = graphs.size() > 1;
  std::vector<std::string> names;
  for (const auto* g : graphs) names.push_back(several ? base + "_" + g->key : base);
  for (const auto& name : names)
    if (!is_valid_triton_model_name(name))
      throw Error(ErrorCode::kInvalidArgument, "Triton model name '" + name + "' (model name + graph key) is not "
                                               "valid: at most 255 characters of A-Z a-z 0-9 . _ -");

  std::error_code ec;
  fs::path repo = fs::absolute(repository, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot resolve repository path '" + repository + "': " + ec.message());
  if (fs::exists(repo, ec) && !fs::is_directory(repo, ec))
    throw Error(ErrorCode::kInvalidArgument, "Triton repository '" + repo.string() + "' is a file, not a directory");
  {  // Inside the checkpoint, the models would be files its manifest does not list: the next
     // save over the checkpoint (a whole new directory swapped in) removes them silently.
    const fs::path root = fs::weakly_canonical(checkpoint.directory(), ec);
    const fs::path where = fs::weakly_canonical(repo, ec);
    auto r = root.begin();
    auto w = where.begin();
    for (; r != root.end() && w != where.end() && *r == *w; ++r, ++w) {
    }
    if (!root.empty() && r == root.end())
      throw Error(ErrorCode::kInvalidArgument, "Triton repository '" + repo.string() + "' lies inside the checkpoint '" +
                                                   root.string() + "', whose next save would remove it; choose a "
                                                   "directory outside it");
  }

  TritonExportResult result;
  std::vector<TritonModelConfig> configs;
  std::vector<std::map<std::string, std::string>> trt_sources(graphs.size());  // option -> cache dir in checkpoint
  std::vector<int> batch_sizes;
  for (std::size_t i = 0; i < graphs.size(); ++i) {
    const auto& g = *graphs[i];
    std::map<std::string, std::string> trt_paths;
    for (const auto& option : g.path_options) {
      auto it = g.backend_config.provider_options.find(option);
      if (it == g.backend_config.provider_options.end()) continue;
      std::string dir = option == "trt_engine_cache_path" ? "trt_engine_cache" : "trt_timing_cache";
      trt_sources[i][dir] = it->second;  // relative to the checkpoint
      trt_paths[option] = (repo / names[i] / "1" / dir).string();
    }
    configs.push_back(triton_model_config(g, names[i], options.max_batch_size, options.instances, trt_paths));
    if (const std::string constants = constant_arguments(g.structure_json); !constants.empty())
      configs.back().not_expressed.push_back(
          "the forward's non-tensor arguments are constants of the exported graph, fixed at the values tuning "
          "recorded: " + constants + "; a request to this model cannot change them (the tuned module runs "
          "another value eagerly or refuses it)");
    for (const auto& [option, path] : trt_paths)
      configs.back().not_expressed.push_back(
          "provider option " + option + " points at " + path +
          " by absolute path (Triton reads it as given): edit it in config.pbtxt when the repository moves, "
          "e.g. into a container");
    // in the model's README too, where a person reads what config.pbtxt lacks (it was in the
    // export's notes on stdout alone)
    for (const auto& c : g.graph_spec.conditions)
      configs.back().not_expressed.push_back(
          "the graph holds only where `" + c.to_string() +
          "` (the model's code branches on these sizes): Triton does not check it, so requests outside it, or "
          "batches its dynamic batcher forms there, get another branch's numbers");
    batch_sizes.push_back(configs.back().max_batch_size);
  }

  std::optional<std::string> ensemble_text;
  std::vector<std::size_t> order;
  for (auto& note : eager_graph_notes(manifest)) result.notes.push_back(std::move(note));
  if (several) {
    std::string why_not;
    if (!result.notes.empty())
      why_not = "some graphs of the module run eagerly and were not exported";
    else
      order = chain_order(graphs, batch_sizes, why_not);
    if (!order.empty()) {
      int mbs = *std::min_element(batch_sizes.begin(), batch_sizes.end());
      ensemble_text = ensemble_config(base, graphs, names, order, mbs);
    } else {
      result.notes.push_back("wrote " + std::to_string(graphs.size()) + " models, one per graph (" +
                             join(names, ", ") + "), and no ensemble: " + why_not);
    }
  }

  for (const auto* g : graphs)  // what a Triton config cannot express, said (issue 27: never silently)
    for (const auto& c : g->graph_spec.conditions)
      result.notes.push_back("graph '" + g->key + "' holds only where `" + c.to_string() +
                             "` (the model's code branches on these sizes); Triton does not check it, so requests "
                             "outside it, or batches its dynamic batcher forms there, get another branch's numbers "
                             "(aitune serve and the sessions refuse them)");

  std::vector<std::string> entries = names;
  if (ensemble_text) entries.push_back(base);
  for (const auto& name : entries) {
    fs::path target = repo / name;
    if (fs::is_symlink(target, ec) || (fs::exists(target, ec) && !fs::is_directory(target, ec)))
      throw Error(ErrorCode::kInvalidArgument,
                  "repository entry '" + target.string() + "' exists and is not a directory; remove it first");
    if (fs::is_directory(target, ec) && !fs::is_empty(target, ec) && !options.overwrite)
      throw Error(ErrorCode::kInvalidArgument, "repository entry '" + target.string() +
                                                   "' exists and is not empty; pass overwrite to replace it");
  }

  // -- write into temporary directories, then rename into place -------------------------
  fs::create_directories(repo, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot create Triton repository '" + repo.string() + "': " + ec.message());
  std::vector<Staged> staged;
  auto cleanup = [&] {
    for (auto it = staged.rbegin(); it != staged.rend(); ++it) {
      std::error_code ignore;
      if (it->renamed) {  // put the previous entry back
        fs::remove_all(it->target, ignore);
        if (!it->aside.empty()) fs::rename(it->aside, it->target, ignore);
      } else if (!it->aside.empty() && !fs::exists(it->target, ignore)) {
        fs::rename(it->aside, it->target, ignore);
      }
      fs::remove_all(it->tmp, ignore);
    }
  };
  const std::string suffix = ".tmp-" + std::to_string(::getpid()) + "-" + random_suffix();
  try {
    for (std::size_t i = 0; i < graphs.size(); ++i) {
      const auto& g = *graphs[i];
      staged.push_back({repo / ("." + names[i] + suffix), repo / names[i], {}});
      const fs::path& tmp = staged.back().tmp;
      fs::create_directories(tmp / "1");
      fs::path model = checkpoint.model_path(g.key);
      copy_into(model, tmp / "1" / "model.onnx");
      for (const auto& location : onnx_external_data_locations(model.string()))
        copy_into(model.parent_path() / location, tmp / "1" / location);
      for (const auto& [dir, relative] : trt_sources[i]) {
        fs::path source = fs::path(checkpoint.directory()) / relative;
        fs::create_directories(tmp / "1" / dir);
        if (fs::is_directory(source, ec))
          fs::copy(source, tmp / "1" / dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
      }
      write_text(tmp / "config.pbtxt", configs[i].text);
      write_text(tmp / "README.md", model_readme(names[i], g, checkpoint, configs[i], options.source));
      result.models.push_back({names[i], g.key, (repo / names[i]).string(), configs[i].max_batch_size,
                               configs[i].not_expressed});
    }
    if (ensemble_text) {
      staged.push_back({repo / ("." + base + suffix), repo / base, {}});
      const fs::path& tmp = staged.back().tmp;
      fs::create_directories(tmp / "1");  // Triton wants a version directory, empty for an ensemble
      write_text(tmp / "config.pbtxt", *ensemble_text);
      write_text(tmp / "README.md", "# " + base + "\n\nExported by aitune: an ensemble running the graph models " +
                                        [&] {
                                          std::vector<std::string> steps;
                                          for (auto i : order) steps.push_back("`" + names[i] + "`");
                                          return join(steps, " -> ");
                                        }() + " in a chain, each graph's outputs feeding the next one's inputs.\n");
      int mbs = *std::min_element(batch_sizes.begin(), batch_sizes.end());
      result.models.push_back({base, "", (repo / base).string(), mbs, {}});
      result.ensemble = base;
    }
    for (auto& s : staged) {
      if (fs::exists(s.target, ec)) {
        s.aside = s.target.parent_path() / ("." + s.target.filename().string() + suffix + ".old");
        fs::rename(s.target, s.aside);
      }
      fs::rename(s.tmp, s.target);
      s.renamed = true;
    }
  } catch (const fs::filesystem_error& e) {
    cleanup();
    throw Error(ErrorCode::kIo, std::string("Triton export into '") + repo.string() + "' failed: " + e.what());
  } catch (...) {
    cleanup();
    throw;
  }
  for (auto& s : staged)
    if (!s.aside.empty()) fs::remove_all(s.aside, ec);
  result.repository = repo.string();
  return result;
}


}  // namespace aitune
