// Example consumer of the installed aitune package: loads a checkpoint (every file
// verified), creates the saved backend and runs N inferences on .npy inputs or on zeros
// shaped from the saved graph spec, then prints a summary of each output.
//   cpp_consumer CHECKPOINT [--graph KEY] [--iterations N] [--input NAME=FILE.npy]...
//                [--provider cpu|cuda|tensorrt] [--device-id N] [--save-outputs DIR]
#include <aitune/aitune.hpp>
#include <aitune/onnx_external_data.hpp>  // is_safe_relative_path: not in aitune.hpp

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace {

struct Args {
  std::string checkpoint, graph, save_outputs;
  int iterations = 10;
  std::map<std::string, std::string> inputs;  // name -> .npy file
  aitune::CheckpointBackendOverrides overrides;
};

Args parse(int argc, char** argv) {
  Args a;
  auto usage = [] {
    throw aitune::Error(aitune::ErrorCode::kInvalidArgument,
                        "usage: cpp_consumer CHECKPOINT [--graph KEY] [--iterations N] [--input NAME=FILE.npy]... "
                        "[--provider cpu|cuda|tensorrt] [--device-id N] [--save-outputs DIR]");
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    auto integer = [&]() -> int {  // the whole value, within int: std::stoi said only "stoi"
      const std::string text = value();
      int n = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
      if (ec != std::errc() || end != text.data() + text.size())
        throw aitune::Error(aitune::ErrorCode::kInvalidArgument, arg + " '" + text + "' is not an integer");
      return n;
    };
    if (arg == "--graph") {
      a.graph = value();
    } else if (arg == "--iterations") {
      a.iterations = integer();
    } else if (arg == "--input") {
      std::string v = value();
      auto eq = v.find('=');
      if (eq == std::string::npos) usage();
      // The same name twice would keep the last file silently: which one ran is unclear.
      if (!a.inputs.emplace(v.substr(0, eq), v.substr(eq + 1)).second)
        throw aitune::Error(aitune::ErrorCode::kInvalidArgument,
                            "--input names '" + v.substr(0, eq) + "' twice; give each input once");
    } else if (arg == "--provider") {
      a.overrides.provider = aitune::parse_execution_provider(value());
    } else if (arg == "--device-id") {
      a.overrides.device_id = integer();
    } else if (arg == "--save-outputs") {
      a.save_outputs = value();
    } else if (a.checkpoint.empty() && arg.rfind("--", 0) != 0) {
      a.checkpoint = arg;
    } else {
      usage();
    }
  }
  if (a.checkpoint.empty() || a.iterations < 1) usage();
  return a;
}

void print_summary(const std::string& name, const aitune::Tensor& t) {
  std::cout << "output " << name << ": " << aitune::dtype_name(t.dtype()) << aitune::shape_to_string(t.shape());
  if (t.dtype() == aitune::DType::kFloat32 && t.view().numel() > 0) {
    const auto* p = static_cast<const float*>(t.data());
    const auto n = static_cast<std::size_t>(t.view().numel());
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += p[i];
    std::cout << " min " << *std::min_element(p, p + n) << " max " << *std::max_element(p, p + n) << " mean "
              << sum / static_cast<double>(n);
  }
  std::cout << "\n";
}

int run(const Args& args) {
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  const auto checkpoint = aitune::Checkpoint::load(args.checkpoint);
  const auto& m = checkpoint.manifest();
  // The first graph this engine runs (an ONNX Runtime graph: a torch.compile or eager graph
  // of the same checkpoint runs only in the Python front end), unless --graph names one.
  std::string key = args.graph;
  if (key.empty()) {
    const auto keys = checkpoint.graph_keys();
    auto runnable = std::find_if(keys.begin(), keys.end(), [&](const auto& k) { return checkpoint.runs_in_engine(k); });
    if (keys.empty())  // a checkpoint may keep only a front end's metadata
      throw aitune::Error(aitune::ErrorCode::kInvalidArgument,
                          "checkpoint '" + checkpoint.directory() + "' holds no graph to run");
    key = runnable != keys.end() ? *runnable : keys.front();  // none in this engine: create_session says why
    if (keys.size() > 1) {  // which graph ran is said, and how to run another
      std::string others;
      for (const auto& k : keys)
        if (k != key) others += (others.empty() ? "" : ", ") + k;
      std::cout << "checkpoint has " << keys.size() << " graphs; running " << key << " (others: " << others
                << "; --graph KEY runs one of them)\n";
    }
  }
  auto backend = checkpoint.create_session(key, args.overrides);
  const double load_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  std::cout << "checkpoint " << checkpoint.directory() << ": module '" << m.module_name << "', format version "
            << m.format_version << ", written by aitune " << m.aitune_version << " with ONNX Runtime "
            << m.onnxruntime_version << "\n";
  std::cout << "ONNX Runtime " << aitune::OrtRuntime::load()->version() << " loaded from "
            << aitune::OrtRuntime::load()->library_path() << "\n";
  std::cout << "graph " << key << " on " << aitune::execution_provider_name(backend->config().provider)
            << ", loaded and verified in " << load_ms << " ms\n";

  // Where outputs go is checked before anything runs (a path under a file fails here).
  if (!args.save_outputs.empty()) {
    std::error_code error;
    std::filesystem::create_directories(args.save_outputs, error);
    if (error || !std::filesystem::is_directory(args.save_outputs))
      throw aitune::Error(aitune::ErrorCode::kIo, "--save-outputs '" + args.save_outputs +
                                                      "' is not a directory that can be written: " +
                                                      (error ? error.message() : "it is a file"));
  }

  // Inputs: from .npy files, else zeros of the smallest shape the saved spec accepts, at
  // the batch of the inputs given (the graph takes one batch on all its batch axes).
  std::vector<aitune::Tensor> inputs;
  std::vector<aitune::TensorView> views;
  const auto& graph_spec = backend->graph_spec();
  for (const auto& [name, file] : args.inputs)  // a misspelt name would leave that input zeros, silently
    if (!graph_spec.find_input(name)) {
      std::string names;
      for (const auto& io : backend->inputs()) names += (names.empty() ? "" : ", ") + io.name;
      throw aitune::Error(aitune::ErrorCode::kInvalidArgument,
                          "--input names unknown input '" + name + "'; graph " + key + " takes: " + names);
    }
  std::map<std::string, aitune::Tensor> given;
  std::optional<int64_t> batch;
  for (const auto& [name, file] : args.inputs) {
    given[name] = aitune::load_npy(file);
    const auto& spec = graph_spec.inputs[graph_spec.find_input(name).value()];
    const auto& shape = given[name].shape();
    if (!batch && spec.batch_axis && static_cast<std::size_t>(*spec.batch_axis) < shape.size())
      batch = shape[static_cast<std::size_t>(*spec.batch_axis)];
  }
  for (const auto& io : backend->inputs()) {  // infer takes them in the model's order
    const auto& spec = graph_spec.inputs[graph_spec.find_input(io.name).value()];
    aitune::Tensor host;
    if (auto it = given.find(spec.name); it != given.end()) {
      host = it->second;
    } else {
      aitune::Shape shape = spec.min_shape;
      for (auto& d : shape) d = std::max<int64_t>(d, 1);
      if (batch && spec.batch_axis) shape[static_cast<std::size_t>(*spec.batch_axis)] = *batch;
      host = aitune::Tensor::empty_host(spec.dtype, shape);
    }
    std::cout << "input " << spec.name << ": " << aitune::dtype_name(host.dtype())
              << aitune::shape_to_string(host.shape()) << (args.inputs.count(spec.name) ? " from file" : " zeros")
              << "\n";
    inputs.push_back(backend->to_device(host));
    views.push_back(inputs.back().view());
  }

  // The first call pays one-time costs (memory arenas, CUDA graph capture, kernel choice):
  // it is reported apart, and the mean is over the calls after it.
  t0 = clock::now();
  std::vector<aitune::Tensor> outputs = backend->infer(views);
  const double first_us = std::chrono::duration<double, std::micro>(clock::now() - t0).count();
  t0 = clock::now();
  for (int i = 0; i < args.iterations; ++i) outputs = backend->infer(views);
  const double total_us = std::chrono::duration<double, std::micro>(clock::now() - t0).count();
  std::cout << args.iterations << " inferences after a first call of " << first_us << " us, mean "
            << total_us / args.iterations << " us\n";

  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const std::string& name = backend->outputs()[i].name;
    aitune::Tensor host = backend->to_host(outputs[i]);
    print_summary(name, host);
    if (!args.save_outputs.empty()) {
      // Output names come from the checkpoint: only a plain file name may become one.
      if (name.find('/') != std::string::npos || !aitune::is_safe_relative_path(name))
        throw aitune::Error(aitune::ErrorCode::kInvalidArgument,
                            "output '" + name + "' is not a plain file name; --save-outputs cannot write it");
      aitune::save_npy((std::filesystem::path(args.save_outputs) / (name + ".npy")).string(), host);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const aitune::Error& e) {
    std::cerr << "cpp_consumer: " << aitune::error_code_name(e.code()) << ": " << e.what() << "\n";
    return e.code() == aitune::ErrorCode::kCheckpointCorrupt ? 5 : 1;
  } catch (const std::exception& e) {
    std::cerr << "cpp_consumer: " << e.what() << "\n";
    return 1;
  }
}
