// `aitune debug-precision MODEL.onnx`: runs every node's outputs under a candidate's
// settings and under fp32 on the CPU, and names the first node beyond tolerance with its
// module scope (like Polygraphy's precision debugging).
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>

#include "aitune/divergence.hpp"
#include "aitune/error.hpp"
#include "aitune/npy.hpp"
#include "arguments.hpp"
#include "commands.hpp"
#include "inputs.hpp"

namespace aitune::cli {
namespace {

struct DebugPrecisionOptions {
  std::string model;
  std::string candidate_model;  // "" = the model itself
  std::string provider = "cpu";
  int device_id = 0;
  std::string precision = "fp32";
  std::optional<double> atol, rtol;
  std::vector<std::string> inputs;  // NAME=FILE.npy
  std::vector<std::string> dims;    // SYMBOL=VALUE for random inputs
  std::vector<std::string> provider_options;
  std::string json;  // file for the report as JSON
};

int debug_precision_command(const DebugPrecisionOptions& o) {
  const Precision precision = parse_precision(o.precision);
  OnnxSessionConfig config;
  config.provider = resolve_provider(o.provider);
  config.device_id = o.device_id;
  // The precision's switch on providers that have one (an explicit option wins).
  if (config.provider == ExecutionProvider::kTensorRT && precision == Precision::kFP16)
    config.provider_options["trt_fp16_enable"] = "1";
  if (config.provider == ExecutionProvider::kCUDA && precision == Precision::kTF32)
    config.provider_options["use_tf32"] = "1";
  for (const auto& [key, value] : assignments(o.provider_options, "--provider-option"))
    config.provider_options[key] = value;
  std::optional<Tolerance> tolerance;
  if (o.atol || o.rtol) {
    Tolerance base = default_tolerance(DType::kFloat32, precision);
    tolerance = Tolerance{o.atol.value_or(base.atol), o.rtol.value_or(base.rtol), o.atol ? false : base.scaled};
  }

  // Inputs: the files given, random values (seed 0, as `aitune run`) for the others.
  OnnxSessionConfig cpu;
  cpu.provider = ExecutionProvider::kCPU;
  const auto probe = OnnxSession::create(o.model, cpu);
  // As a missing MODEL is (exit 4, "an invalid or missing model"): it exited 6, an I/O error.
  if (std::error_code ec; !o.candidate_model.empty() && !std::filesystem::is_regular_file(o.candidate_model, ec))
    throw Error(ErrorCode::kModelInvalid, "--candidate-model '" + o.candidate_model + "': model file not found");
  const std::map<std::string, Tensor> given = load_input_files(o.inputs, probe->inputs());  // as `aitune run`
  const auto dims = dims_with_given(parse_dims(o.dims, probe->inputs()), given, probe->inputs());
  if (!o.json.empty()) check_output_file(o.json, "the JSON report");  // before the comparison, not after
  std::mt19937 rng(0);
  std::map<std::string, Tensor> tensors;
  for (const auto& io : probe->inputs()) {
    auto it = given.find(io.name);
    auto index = probe->graph_spec().find_input(io.name);
    const TensorSpec* spec = index ? &probe->graph_spec().inputs[*index] : nullptr;
    tensors[io.name] = it != given.end() ? it->second : random_input(io, spec, dims, rng);
    std::cout << "input " << io.name << ": " << dtype_name(tensors[io.name].dtype())
              << shape_to_string(tensors[io.name].shape()) << (it != given.end() ? " from file" : " random") << "\n";
  }
  for (const auto& [name, t] : given)
    if (!tensors.count(name) || tensors[name].data() != t.data())
      throw Error(ErrorCode::kInvalidArgument, "--input names unknown input '" + name + "'");
  std::map<std::string, TensorView> views;
  for (const auto& [name, t] : tensors) views.emplace(name, t.view());

  const auto report = debug_precision(o.model, o.candidate_model, config, views, precision, tolerance);
  std::cout << "candidate: " << (o.candidate_model.empty() ? o.model : o.candidate_model) << " on "
            << execution_provider_name(config.provider) << ", checked at " << precision_name(precision) << "\n";
  std::cout << "compared " << report.compared << " node outputs with " << report.reference << " (" << report.skipped
            << " not compared: not floating point, or absent from the candidate)\n";
  if (report.first) {
    const auto& p = *report.first;
    std::cout << "first divergence: node " << p.node << " (" << p.op_type << "), output " << p.value << "\n"
              << "  module: " << (p.module.empty() ? "(no scope in the node's metadata)" : p.module) << "\n"
              << "  " << p.check.failure << "\n";
  } else {
    std::cout << "no node output beyond tolerance\n";
  }
  if (!o.json.empty()) {
    std::ofstream out(o.json, std::ios::trunc);
    out << report.to_json() << "\n";
    if (!out) throw Error(ErrorCode::kIo, "cannot write the JSON report to '" + o.json + "': " + std::strerror(errno));
  }
  return report.first ? 1 : 0;
}

}  // namespace

Command add_debug_precision(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "debug-precision",
      "Compare every node's outputs under a candidate's settings with the fp32 CPU run of the same graph and name "
      "the first node beyond tolerance, with its module scope (exit 0: none, 1: a node diverges)");
  auto o = std::make_shared<DebugPrecisionOptions>();
  sub->add_option("model", o->model, "the .onnx model (the fp32 reference runs it on the CPU)")->required();
  sub->add_option("--candidate-model", o->candidate_model,
                  "a transformed copy of the model that keeps its value names (e.g. its fp16 conversion) to run "
                  "as the candidate (default: the model itself)");
  sub->add_option("--provider", o->provider, "the candidate's provider: cpu, cuda, tensorrt or auto")->capture_default_str();
  sub->add_option("--device-id", o->device_id, "CUDA device index")
      ->check(CLI::TypeValidator<int>())->check(CLI::Range(0, kMaxDeviceId));
  sub->add_option("--precision", o->precision,
                  "the candidate's precision: fp32, tf32, fp16 or bf16; sets the tolerance (as `aitune tune`'s "
                  "defaults) and turns on trt_fp16_enable (tensorrt, fp16) or use_tf32 (cuda, tf32)")
      ->capture_default_str();
  sub->add_option("--atol", o->atol, "absolute tolerance (instead of the precision's, not scaled)")
      ->check(finite_in(0, 1e30));
  sub->add_option("--rtol", o->rtol, "relative tolerance (instead of the precision's)")->check(finite_in(0, 1e30));
  sub->add_option("--input", o->inputs, "NAME=FILE.npy (repeatable); others are random (seed 0)");
  sub->add_option("--dim", o->dims, "SYMBOL=VALUE for symbolic dims of random inputs");
  sub->add_option("--provider-option", o->provider_options, "KEY=VALUE for the candidate's provider (repeatable)");
  sub->add_option("--json", o->json, "also write the result as JSON to this file")->check(non_empty_path());
  return {sub, [o] { return debug_precision_command(*o); }};
}

}  // namespace aitune::cli
