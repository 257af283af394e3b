// `aitune run MODEL.onnx|CHECKPOINT`: runs a model, or a graph of a saved checkpoint, on a
// provider with given or random inputs and prints output summaries and latency percentiles.
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <iomanip>
#include <iostream>
#include <map>
#include <vector>
#include <optional>
#include <sstream>
#include <random>

#include "aitune/checkpoint.hpp"
#include "aitune/error.hpp"
#include "aitune/latency_stats.hpp"
#include "aitune/npy.hpp"
#include "aitune/onnx_session.hpp"
#include "arguments.hpp"
#include "commands.hpp"
#include "inputs.hpp"

namespace aitune::cli {
namespace {

struct RunOptions {
  std::string model;     // an .onnx file or a checkpoint directory
  std::string graph;     // checkpoint graph key ("" = its only graph)
  std::string provider;  // "" = cpu for a model, the saved provider for a checkpoint
  std::optional<int> device_id;  // unset: 0 for a model, the saved device for a checkpoint
  std::vector<std::string> inputs;   // NAME=FILE.npy
  std::vector<std::string> dims;     // SYMBOL=VALUE for random inputs
  std::vector<std::string> provider_options;  // KEY=VALUE
  int iterations = 100;
  int warmup = 10;
  std::string save_outputs;  // directory for NAME.npy
};

// min / max / mean of a host tensor, as doubles.
std::string summary(const Tensor& t) {
  auto n = static_cast<std::size_t>(t.view().numel());
  if (n == 0) return "empty";
  // NaNs are counted apart: min and max skip them by IEEE comparison, so an all-NaN output
  // read "min inf, max -inf, mean nan" (a probe).
  double lo = INFINITY, hi = -INFINITY, sum = 0;
  std::size_t nans = 0;
  auto visit = [&](auto* p) {
    for (std::size_t i = 0; i < n; ++i) {
      double v = static_cast<double>(p[i]);
      if (std::isnan(v)) {
        ++nans;
        continue;
      }
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      sum += v;
    }
  };
  switch (t.dtype()) {
    case DType::kFloat32: visit(static_cast<const float*>(t.data())); break;
    case DType::kFloat64: visit(static_cast<const double*>(t.data())); break;
    case DType::kInt64: visit(static_cast<const int64_t*>(t.data())); break;
    case DType::kInt32: visit(static_cast<const int32_t*>(t.data())); break;
    case DType::kInt16: visit(static_cast<const int16_t*>(t.data())); break;
    case DType::kInt8: visit(static_cast<const int8_t*>(t.data())); break;
    case DType::kUInt8:
    case DType::kBool: visit(static_cast<const uint8_t*>(t.data())); break;
    default: return "(summary not computed for " + std::string(dtype_name(t.dtype())) + ")";
  }
  if (nans == n) return "all " + std::to_string(n) + " values NaN";
  std::ostringstream out;
  out << std::setprecision(6) << "min " << lo << ", max " << hi << ", mean " << sum / static_cast<double>(n - nans);
  if (nans) out << " (of the values that are not NaN; " << nans << " NaN)";
  return out.str();
}

// The backend of a checkpoint's graph: everything verified, the saved configuration
// with the command line's provider, device and options over it.
std::unique_ptr<OnnxSession> checkpoint_backend(const RunOptions& o,
                                                       const std::map<std::string, std::string>& provider_options) {
  auto checkpoint = Checkpoint::load(o.model);
  std::string key = o.graph;
  if (key.empty()) {
    // The default is the only graph this engine runs: a section saved by ait.save may hold
    // graphs kept eager (or compiled by torch.compile) beside its ONNX Runtime graphs, and
    // those run only in the Python front end.
    std::vector<std::string> runnable, others;
    for (const auto& k : checkpoint.graph_keys())
      (checkpoint.graph(k).backend == kOnnxRuntimeBackendName ? runnable : others).push_back(k);
    auto join = [](const std::vector<std::string>& keys) {
      std::string names;
      for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
      return names;
    };
    std::string not_here;
    for (const auto& k : others)
      not_here += (not_here.empty() ? "" : ", ") + k + " (" + checkpoint.graph(k).backend + ")";
    if (runnable.empty() && others.empty())  // a checkpoint may keep only a front end's metadata
      throw Error(ErrorCode::kInvalidArgument, "checkpoint '" + checkpoint.directory() + "' holds no graph to run");
    if (runnable.empty())  // exit 3 as for --graph naming one (docs/checkpoints.md): a backend that needs Python
      throw Error(ErrorCode::kBackendUnavailable,
                  "checkpoint '" + checkpoint.directory() + "' holds no graph this engine runs: " + not_here +
                      " run only in the Python front end (ait.load runs them)");
    if (runnable.size() != 1)
      throw Error(ErrorCode::kInvalidArgument,
                  "checkpoint '" + checkpoint.directory() + "' has " + std::to_string(runnable.size()) +
                      " ONNX Runtime graphs (" + join(runnable) + "); choose one with --graph" +
                      (others.empty() ? "" : "; the others run only in the Python front end: " + not_here));
    key = runnable.front();
  }
  const auto& graph = checkpoint.graph(key);
  CheckpointBackendOverrides overrides;
  if (!o.provider.empty()) overrides.provider = resolve_provider(o.provider);
  if (o.device_id) overrides.device_id = *o.device_id;
  // Session settings among them (threads, optimisation level) go to the session, as for
  // an .onnx file; the rest are the provider's.
  OnnxSessionConfig session = graph.backend_config;
  std::map<std::string, std::string> provider_only = provider_options;
  take_session_options(provider_only, session);
  if (provider_options.count("intra_op_threads")) overrides.intra_op_threads = session.intra_op_threads;
  if (provider_options.count("inter_op_threads")) overrides.inter_op_threads = session.inter_op_threads;
  if (provider_options.count("graph_optimization_level"))
    overrides.graph_optimization_level = session.graph_optimization_level;
  if (!provider_only.empty()) overrides.provider_options = provider_only;
  std::cout << "checkpoint: " << checkpoint.directory() << " (module '" << checkpoint.manifest().module_name
            << "', graph '" << key << "', " << graph.artifacts.size() << " artifacts verified)\n";
  return checkpoint.create_session(key, overrides);
}

// Checks --save-outputs DIR before anything runs: a directory there, or one that can be
// made under the nearest directory that exists (made only when the outputs are written: a
// run refused before them left an empty DIR behind).
void check_output_directory(const std::string& dir) {
  namespace fs = std::filesystem;
  // Not into a checkpoint, as `report -o` is not: its files are its manifest's, and a save
  // over it removes any other (the outputs were written there, exit 0). Asked of a file in
  // DIR, so that DIR being the checkpoint's own directory counts too.
  if (const auto checkpoint = Checkpoint::enclosing_checkpoint((fs::path(dir) / "output.npy").string());
      !checkpoint.empty())
    throw Error(ErrorCode::kInvalidArgument, "refusing to write the outputs into the checkpoint '" + checkpoint +
                                                 "' (--save-outputs '" + dir + "'): its files are its manifest's, "
                                                 "and a save over it removes any other; write them elsewhere");
  std::error_code ec;
  auto st = fs::status(dir, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) throw Error(ErrorCode::kIo, "--save-outputs '" + dir + "' exists and is not a directory");
    return;
  }
  fs::path ancestor = fs::absolute(dir, ec).parent_path();
  while (!ancestor.empty() && !fs::exists(ancestor, ec) && ancestor != ancestor.root_path()) ancestor = ancestor.parent_path();
  if (!fs::is_directory(ancestor, ec) || ::access(ancestor.c_str(), W_OK) != 0)
    throw Error(ErrorCode::kIo, "--save-outputs: cannot create the directory '" + dir + "': '" + ancestor.string() +
                                    "' is not a directory this process can write");
}

void make_output_directory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::kIo, "--save-outputs: cannot create the directory '" + dir + "': " + ec.message());
}

int run_model(const RunOptions& o) {
  if (!o.save_outputs.empty()) check_output_directory(o.save_outputs);
  std::map<std::string, std::string> provider_options = assignments(o.provider_options, "--provider-option");
  std::unique_ptr<OnnxSession> backend;
  if (std::filesystem::is_directory(o.model)) {
    backend = checkpoint_backend(o, provider_options);
  } else {
    if (!o.graph.empty())
      throw Error(ErrorCode::kInvalidArgument, "--graph selects a graph of a checkpoint directory; '" + o.model +
                                                   "' is not a directory");
    OnnxSessionConfig config;
    config.provider = resolve_provider(o.provider.empty() ? "cpu" : o.provider);
    config.device_id = o.device_id.value_or(0);
    config.provider_options = provider_options;
    take_session_options(config.provider_options, config);
    backend = OnnxSession::create(o.model, config);
  }
  const OnnxSessionConfig& config = backend->config();
  // Refused before anything runs or is written (it failed after the run, the outputs
  // before it already saved).
  if (!o.save_outputs.empty())
    for (const auto& io : backend->outputs())
      if (io.dtype == DType::kBFloat16)
        throw Error(ErrorCode::kInvalidArgument, "--save-outputs: output '" + io.name +
                                                     "' is bfloat16, which a .npy file cannot hold (numpy has no "
                                                     "bfloat16); run without --save-outputs");

  const std::map<std::string, Tensor> given = load_input_files(o.inputs, backend->inputs());
  const auto dims = dims_with_given(parse_dims(o.dims, backend->inputs()), given, backend->inputs());
  for (const auto& [name, t] : given)
    if (!backend->graph_spec().find_input(name)) {
      std::string names;
      for (const auto& io : backend->inputs()) names += (names.empty() ? "" : ", ") + io.name;
      throw Error(ErrorCode::kInvalidArgument, "--input names unknown input '" + name + "'; the model takes: " + names);
    }
  std::mt19937 rng(0);
  std::vector<Tensor> device_inputs;
  std::vector<TensorView> views;
  for (const auto& io : backend->inputs()) {
    auto it = given.find(io.name);
    auto index = backend->graph_spec().find_input(io.name);
    const TensorSpec* spec = index ? &backend->graph_spec().inputs[*index] : nullptr;
    Tensor host = it != given.end() ? it->second : random_input(io, spec, dims, rng);
    std::cout << "input " << io.name << ": " << dtype_name(host.dtype()) << shape_to_string(host.shape())
              << (it != given.end() ? " from file" : " random") << "\n";
    device_inputs.push_back(backend->to_device(host));
    views.push_back(device_inputs.back().view());
  }

  auto clock = std::chrono::steady_clock::now;
  auto t0 = clock();
  auto outputs = backend->infer(views);
  double first_us = std::chrono::duration<double, std::micro>(clock() - t0).count();
  for (int i = 0; i < o.warmup; ++i) backend->infer(views);
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(o.iterations));
  for (int i = 0; i < o.iterations; ++i) {
    auto start = clock();
    outputs = backend->infer(views);
    samples.push_back(std::chrono::duration<double, std::micro>(clock() - start).count());
  }
  if (!o.save_outputs.empty()) make_output_directory(o.save_outputs);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    Tensor host = backend->to_host(outputs[i]);
    const auto& name = backend->outputs()[i].name;
    std::cout << "output " << name << ": " << dtype_name(host.dtype()) << shape_to_string(host.shape()) << " on "
              << outputs[i].device().to_string() << ", " << summary(host) << "\n";
    if (!o.save_outputs.empty()) {
      // Output names come from the model (or a checkpoint): never a path of their own.
      const auto file = std::filesystem::path(o.save_outputs) / output_file_name(name);
      save_npy(file.string(), host);
      std::cout << "  saved as " << file.string() << "\n";
    }
  }
  auto stats = summarize_latencies(samples);
  std::cout << std::fixed << std::setprecision(1) << "latency (" << execution_provider_name(config.provider) << ", "
            << stats.count << " runs after " << o.warmup << " warm-up): p50 " << stats.p50 << " us, p90 "
            << stats.p90 << " us, mean " << stats.mean << " us; first run " << first_us << " us\n";
  return 0;
}

}  // namespace

Command add_run(CLI::App& app) {
  auto* sub = app.add_subcommand("run", "Run an ONNX model or a saved checkpoint and report outputs and latency");
  auto o = std::make_shared<RunOptions>();
  sub->add_option("model", o->model, "path to an .onnx file or a checkpoint directory")->required()->check(non_empty_path());
  sub->add_option("--graph", o->graph, "checkpoint graph key (default: the checkpoint's only ONNX Runtime graph)");
  sub->add_option("--provider", o->provider,
                  "cpu, cuda, tensorrt or auto (CUDA if available, else CPU); default: cpu for a model, "
                  "the saved provider for a checkpoint");
  sub->add_option("--device-id", o->device_id, "CUDA device index (default: 0 for a model, the saved one for a checkpoint)")
      ->check(CLI::TypeValidator<int>())->check(CLI::Range(0, kMaxDeviceId));
  sub->add_option("--input", o->inputs, "NAME=FILE.npy (repeatable; NAME may contain '=': the split is where NAME is an input's name); others are random");
  sub->add_option("--dim", o->dims, "SYMBOL=VALUE for symbolic dims of random inputs, VALUE in [1, 2^31-1] (default: the smallest extent the graph spec accepts, 1 for a model)");
  sub->add_option("--provider-option", o->provider_options,
                  "KEY=VALUE passed to the provider (repeatable; over a checkpoint's saved options)");
  sub->add_option("--iterations", o->iterations, "timed runs")->capture_default_str()
      ->check(CLI::TypeValidator<int>())->check(CLI::Range(1, kMaxIterations));
  sub->add_option("--warmup", o->warmup, "untimed runs before timing")->capture_default_str()
      ->check(CLI::TypeValidator<int>())->check(CLI::Range(0, kMaxIterations));
  sub->add_option("--save-outputs", o->save_outputs,
                  "directory to write each output as NAME.npy (bytes other than A-Z a-z 0-9 _ - . in NAME become %XX)")
      ->check(non_empty_path());
  return {sub, [o] { return run_model(*o); }};
}

}  // namespace aitune::cli
