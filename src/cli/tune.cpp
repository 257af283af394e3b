// `aitune tune MODEL.onnx`: the tuning engine on an ONNX file, no Python: samples from
// .npy files (or random), the CPU provider in fp32 as the reference, the engine's
// candidate plan (the one `ait.tune` evaluates) checked and measured, a strategy's choice,
// a report and optionally a checkpoint. `--list-candidates` prints the plan only.
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <iostream>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "aitune/candidates.hpp"
#include "aitune/checkpoint.hpp"
#include "aitune/error.hpp"
#include "aitune/tune_driver.hpp"
#include "aitune/tuner.hpp"
#include "aitune/ort_runtime.hpp"
#include "arguments.hpp"
#include "commands.hpp"
#include "inputs.hpp"
#include "model_facts.hpp"

namespace aitune::cli {
namespace {

// The command line of `aitune tune` (what the engine gets of it is TunerOptions and a
// CandidateRequest).
struct CliTuneArgs {
  std::string model;
  std::string provider = "auto";
  int device_id = 0;
  std::string strategy = "max-throughput";
  double latency_budget_ms = 0;
  std::string samples;                 // directory of NAME.npy, or of sample subdirectories
  std::vector<int64_t> batch_sizes = {1, 2};  // random samples: extent of symbolic first axes
  std::vector<std::string> dims;       // SYMBOL=VALUE for other symbolic extents
  std::vector<std::string> provider_options;
  std::optional<double> atol, rtol;
  std::vector<std::string> output_tolerances;  // NAME=ATOL,RTOL
  bool no_variants = false;
  bool no_transformer_fusions = false;
  std::string exporter = "dynamo";  // how the model was exported: picks the fusion ait.tune would try
  bool list_candidates = false;
  std::string precision = "any";  // the loosest precision a chosen candidate may compute in
  bool performance_validation = false;
  bool find_max_batch_size = false;
  int64_t max_batch_size = 4096;
  double time_cap_s = 5;
  std::string report;
  std::string checkpoint;
  bool quiet = false;
};

Tolerance parse_tolerance(const std::string& text, const std::string& what) {
  auto comma = text.find(',');
  try {
    if (comma == std::string::npos) throw std::invalid_argument(text);
    std::size_t a = 0, r = 0;
    double atol = std::stod(text.substr(0, comma), &a), rtol = std::stod(text.substr(comma + 1), &r);
    if (a != comma || r != text.size() - comma - 1 || !std::isfinite(atol) || !std::isfinite(rtol) || atol < 0 ||
        rtol < 0)
      throw std::invalid_argument(text);
    return {atol, rtol};
  } catch (const std::exception&) {
    throw Error(ErrorCode::kInvalidArgument, what + " '" + text + "' is not ATOL,RTOL (two finite non-negative numbers)");
  }
}

// A recorded call: the reference's inputs and outputs, and its batch (the extent of the
// first input's first axis when that axis is symbolic, else 1).
struct Recorded {
  std::vector<Tensor> inputs, outputs;
  int64_t batch_size = 1;
};

std::vector<TensorRecord> records_of(const std::vector<IoInfo>& ios, const std::vector<Tensor>& tensors) {
  std::vector<TensorRecord> out;
  for (std::size_t i = 0; i < ios.size(); ++i) out.push_back({ios[i].name, tensors[i].dtype(), tensors[i].shape()});
  return out;
}

// The reference run again on the first sample gives the same bytes, or no candidate can be
// judged against it: a model with random operators (RandomNormalLike) had every candidate
// called "incorrect ... would pass with atol=1.59", as if the candidates were at fault.
void check_repeatable(const OnnxSession& reference, const std::vector<TensorView>& views,
                      const std::vector<Tensor>& first, const std::string& model) {
  // Floats within 1e-5 of each other pass: a threaded reduction may round otherwise from run
  // to run, which the candidates' tolerance covers; random operators differ by far more.
  auto close = [](const auto* x, const auto* y, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const double u = static_cast<double>(x[i]), v = static_cast<double>(y[i]);
      if (!(std::abs(u - v) <= 1e-5 * (1.0 + std::abs(u))) && !(std::isnan(u) && std::isnan(v))) return false;
    }
    return true;
  };
  const auto again = reference.infer(views);
  for (std::size_t j = 0; j < first.size() && j < again.size(); ++j) {
    const auto a = first[j].view(), b = again[j].view();
    bool same = a.shape == b.shape && a.nbytes() == b.nbytes() && std::memcmp(a.data, b.data, a.nbytes()) == 0;
    if (!same && a.shape == b.shape && a.dtype == b.dtype && a.dtype == DType::kFloat32)
      same = close(static_cast<const float*>(a.data), static_cast<const float*>(b.data), a.nbytes() / sizeof(float));
    if (!same && a.shape == b.shape && a.dtype == b.dtype && a.dtype == DType::kFloat64)
      same = close(static_cast<const double*>(a.data), static_cast<const double*>(b.data), a.nbytes() / sizeof(double));
    if (!same)
      throw Error(ErrorCode::kInvalidArgument,
                  "'" + model + "' gives other values of output '" + reference.outputs()[j].name +
                      "' when run twice on the same input (random operators such as RandomNormal, or a "
                      "nondeterministic kernel): no candidate can be checked against it, so it is not tuned");
  }
}

std::vector<std::map<std::string, Tensor>> random_samples(const OnnxSession& reference, const CliTuneArgs& o) {
  auto dims = parse_dims(o.dims, reference.inputs());
  std::mt19937 rng(0);
  std::vector<std::map<std::string, Tensor>> samples;
  // The batch: the symbol on the first symbolic first axis. Another symbol on a first axis
  // is no batch (MatMul(a[M, K], b[K2, P]): K2 took the batch size too, and every sample
  // failed inside ONNX Runtime, whatever --dim K2 said).
  std::optional<std::string> batch_symbol;
  for (const auto& io : reference.inputs())
    if (!batch_symbol && !io.shape.empty() && io.shape[0] < 0) batch_symbol = io.symbolic_dims[0];
  const bool batched = batch_symbol.has_value();
  auto is_batch = [&](const IoInfo& io, std::size_t axis) {
    return batched && axis == 0 && io.shape[0] < 0 && io.symbolic_dims[0] == *batch_symbol;
  };
  if (batched && dims.count(*batch_symbol))  // it was ignored: the batch sizes set it
    throw Error(ErrorCode::kInvalidArgument,
                "--dim " + *batch_symbol + ": '" + *batch_symbol + "' is the batch axis (the first axis of the inputs), "
                "which --batch-sizes sets in random samples; give --batch-sizes " + std::to_string(dims[*batch_symbol]));
  // Symbolic extents other than the batch that no --dim sets take 1 in every sample, so the
  // tuned graph accepts only 1 there: said, since nothing else showed it until a run of
  // another length was refused by the checkpoint.
  std::vector<std::string> fixed;
  for (const auto& io : reference.inputs())
    for (std::size_t i = 0; i < io.shape.size() && i < io.symbolic_dims.size(); ++i)
      if (io.shape[i] < 0 && !is_batch(io, i) && !dims.count(io.symbolic_dims[i]))
        fixed.push_back("'" + (io.symbolic_dims[i].empty() ? "?" : io.symbolic_dims[i]) + "' (" + io.name +
                        " axis " + std::to_string(i) + ")");
  if (!fixed.empty()) {
    std::string listed;
    for (const auto& f : fixed) listed += (listed.empty() ? "" : ", ") + f;
    std::cerr << "aitune: note: the random samples hold 1 on the symbolic dimension(s) " << listed
              << ", so the tuned graph accepts only 1 there; give --dim SYMBOL=N, or --samples of the extents to "
                 "accept\n";
  }
  for (int64_t batch : batched ? o.batch_sizes : std::vector<int64_t>{1}) {
    auto with_batch = dims;
    if (batched) with_batch[*batch_symbol] = batch;
    std::map<std::string, Tensor> sample;
    for (const auto& io : reference.inputs()) sample[io.name] = random_input(io, nullptr, with_batch, rng);
    samples.push_back(std::move(sample));
  }
  return samples;
}

constexpr const char* kNeedsFrontEnd = "needs ait.tune (Python front end)";

// One line per planned candidate: name, precision, the model it runs on, and whether only
// the Python front end can make that model. Tab-separated, so scripts can read it.
void print_plan(const std::vector<PlannedCandidate>& plan) {
  for (const auto& c : plan) {
    std::cout << c.name << "\t" << precision_name(c.precision) << "\t"
              << (c.model_transform.empty() ? "exported" : c.model_transform);
    if (c.needs_front_end()) {
      std::cout << "\t" << kNeedsFrontEnd;
      if (c.only_where_fusion_applies()) std::cout << ", only where the fusion applies";
    }
    std::cout << "\n";
  }
}

int tune_model(const CliTuneArgs& o) {
  // A budget is the latency-budget strategy's alone: given with another (the default
  // max-throughput) it was ignored without a word.
  if (o.latency_budget_ms > 0 && o.strategy != "latency-budget")
    throw Error(ErrorCode::kInvalidArgument, "--latency-budget-ms is the budget of --strategy latency-budget, not of "
                                             "--strategy " + o.strategy + "; give --strategy latency-budget with it");
  // ... and the strategy without a budget is said in the option's name (it was the field's,
  // "latency_budget_ms > 0, got 0", though nothing was given)
  if (o.strategy == "latency-budget" && !(o.latency_budget_ms > 0))
    throw Error(ErrorCode::kInvalidArgument, "--strategy latency-budget needs --latency-budget-ms MS (> 0)" +
                                                 std::string(o.latency_budget_ms != 0
                                                                 ? ", got " + std::to_string(o.latency_budget_ms)
                                                                 : ""));
  StrategyConfig strategy;
  strategy.kind = parse_strategy_kind(o.strategy);
  strategy.latency_budget_ms = o.latency_budget_ms;
  strategy.performance_validation = o.performance_validation;
  strategy.validate();

  OnnxSessionConfig base;
  base.provider = resolve_provider(o.provider);
  // Asked for by name, an unavailable provider is the documented exit 3, not "no
  // candidate chosen" (1) after every candidate failed.
  if (auto status = OrtRuntime::load()->provider_status(base.provider); !status.available && !o.list_candidates)
    throw Error(ErrorCode::kProviderUnavailable, "--provider " + std::string(execution_provider_name(base.provider)) +
                                                     " is not available here: " + status.reason);
  base.device_id = o.device_id;
  base.provider_options = assignments(o.provider_options, "--provider-option");
  take_session_options(base.provider_options, base);
  // Checked once here: a bad option failed every candidate, and the tune exited 1 naming none.
  OnnxSession::check_config(base);

  // The reference: the CPU provider in fp32 with ORT's defaults.
  OnnxSessionConfig cpu;
  cpu.provider = ExecutionProvider::kCPU;
  auto reference = OnnxSession::create(o.model, cpu);
  const auto& ins = reference->inputs();
  auto given = o.samples.empty() ? random_samples(*reference, o) : load_sample_dir(o.samples, ins);

  std::vector<Recorded> recorded;
  GraphSpecBuilder builder;
  for (auto& sample : given) {
    Recorded r;
    std::vector<TensorView> views;
    for (const auto& io : ins) {
      r.inputs.push_back(sample.at(io.name));
      views.push_back(r.inputs.back().view());
    }
    r.outputs = reference->infer(views);
    if (recorded.empty()) check_repeatable(*reference, views, r.outputs, o.model);
    if (!ins.empty() && !ins[0].shape.empty() && ins[0].shape[0] < 0 && !r.inputs[0].shape().empty())
      r.batch_size = r.inputs[0].shape()[0];
    builder.record(records_of(ins, r.inputs), records_of(reference->outputs(), r.outputs), r.batch_size);
    recorded.push_back(std::move(r));
  }
  GraphSpec spec = builder.build();

  CandidateRequest request;
  request.base = base;
  request.spec = spec;
  request.precision_limit = parse_precision_limit(o.precision);
  request.model_precision = model_precision(ins, reference->outputs());
  request.has_convolutions = has_convolutions(onnx_operator_types(o.model));
  request.tune_provider_options = !o.no_variants;
  request.transformer_fusions = !o.no_transformer_fusions;
  request.use_dynamo = o.exporter == "dynamo";
  const auto plan = plan_candidates(request);
  if (plan.empty())
    throw Error(ErrorCode::kInvalidArgument, "no candidate of the " + std::string(execution_provider_name(base.provider)) +
                                                 " provider computes within --precision " + o.precision);
  if (o.list_candidates) {
    print_plan(plan);
    return 0;
  }
  // Where the results go, checked before the tuning they would otherwise be refused after.
  if (!o.checkpoint.empty()) Checkpoint::check_save_target(o.checkpoint);
  if (!o.report.empty()) {
    // A report inside the checkpoint directory (or an existing checkpoint) is removed by
    // the save that replaces it: "report: ckpt/r.json" was printed for a file that was gone.
    namespace fs = std::filesystem;
    const fs::path report = fs::weakly_canonical(fs::absolute(o.report));
    if (!o.checkpoint.empty()) {
      const fs::path relative = report.lexically_relative(fs::weakly_canonical(fs::absolute(o.checkpoint)));
      if (!relative.empty() && *relative.begin() != "..")
        throw Error(ErrorCode::kInvalidArgument,
                    "--report '" + o.report + "' is inside the checkpoint '" + o.checkpoint +
                        "': its save replaces that directory whole and would remove it; write the report elsewhere "
                        "(the checkpoint keeps its own copy, " + Checkpoint::graph_directory("graph_0") +
                        "/tune_report.json)");
    }
    // Some other checkpoint keeps no copy of this report (the message said it did, naming a
    // file of the checkpoint above, which that one need not have).
    if (const auto inside = Checkpoint::enclosing_checkpoint(report.string()); !inside.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  "--report '" + o.report + "' is inside the checkpoint '" + inside +
                      "': a save over it removes any file its manifest does not list; write the report elsewhere");
  }
  if (!o.report.empty()) check_output_file(o.report, "the report");

  TunerOptions options;
  options.profile.time_cap_s = o.time_cap_s;
  if (o.atol || o.rtol) options.tolerances.all = Tolerance{o.atol.value_or(0), o.rtol.value_or(0)};
  for (const auto& t : o.output_tolerances) {
    std::vector<std::string> output_names;
    for (const auto& io : reference->outputs()) output_names.push_back(io.name);
    auto [name, value] = split_named_assignment(t, "--output-tolerance", output_names, "model's outputs");
    options.tolerances.per_output[name] = parse_tolerance(value, "--output-tolerance " + name);
  }
  options.batch_search.enabled = o.find_max_batch_size;
  options.batch_search.max_batch_size = o.max_batch_size;
  if (!o.quiet) options.log = [](const std::string& line) { std::cerr << "aitune: " << line << "\n"; };

  std::vector<TuneSample> samples;
  for (const auto& r : recorded) {
    TuneSample s;
    for (const auto& t : r.inputs) s.inputs.push_back(t.view());
    for (const auto& t : r.outputs) s.expected.push_back(t.view());
    s.batch_size = r.batch_size;
    samples.push_back(std::move(s));
  }
  GraphTuner tuner(o.model, spec, samples, options);

  // The CLI's side of the one driver (tune_driver.hpp): the CPU session is the reference,
  // and its one backend evaluates the plan on the model as given.
  struct CliFrontEnd : TuneFrontEnd {
    const CliTuneArgs& o;
    OnnxSession& reference;
    const std::vector<PlannedCandidate>& plan;
    std::vector<std::string> front_end_only;
    CliFrontEnd(const CliTuneArgs& args, OnnxSession& ref, const std::vector<PlannedCandidate>& p)
        : o(args), reference(ref), plan(p) {}
    void run_reference(const std::vector<TensorView>& inputs) override { reference.infer(inputs); }
    void add_candidates(std::size_t, GraphTuner& tuner, int group) override {
      for (std::size_t i = 0; i < plan.size(); ++i) {
        const auto& c = plan[i];
        if (c.needs_front_end()) {  // its model is made by a Python transform
          front_end_only.push_back(c.name);
          if (!o.quiet)
            std::cerr << "aitune: [" << i + 1 << "/" << plan.size() << "] " << c.name << ": skipped: " << kNeedsFrontEnd
                      << " (model transform '" << c.model_transform << "')\n";
          continue;
        }
        if (!o.quiet) std::cerr << "aitune: [" << i + 1 << "/" << plan.size() << "] " << c.name << "\n";
        tuner.evaluate_onnx(o.model, {c.name, c.config, c.precision}, "OnnxSession", group);
      }
    }
    void warn(const std::string& line) override {
      if (!o.quiet) std::cerr << "aitune: " << line << "\n";
    }
  } front_end(o, *reference, plan);
  DriverStrategy driver;
  driver.choice = strategy;
  driver.backends = {{"OnnxSession", "OnnxSession", false}};
  // The CLI has no eager to fall back to, so anything but a winner is a failure (eager kept
  // by validation included).
  const TuneOutcome outcome = drive_tune(tuner, driver, front_end, "reference (cpu fp32)");
  const auto& front_end_only = front_end.front_end_only;
  const auto& report = tuner.report();
  std::cout << report.summary_table();
  if (!front_end_only.empty()) {
    std::cout << "not evaluated here, " << kNeedsFrontEnd << ":";
    for (const auto& name : front_end_only) std::cout << " " << name << (&name == &front_end_only.back() ? "" : ";");
    std::cout << "\n";
  }
  if (!o.report.empty()) {
    std::ofstream out(o.report);
    out << report.to_json() << "\n";
    if (!out) throw Error(ErrorCode::kIo, "cannot write the report to '" + o.report + "'");
    std::cout << "report: " << o.report << "\n";
  }
  auto winner = outcome.kind == TuneOutcomeKind::kWinner ? tuner.take_winner() : nullptr;
  if (!winner) {
    std::cerr << "aitune: no candidate was chosen: " << report.decision << "\n";
    return 1;
  }
  if (!o.checkpoint.empty()) {
    CheckpointManifest manifest;
    manifest.module_name = std::filesystem::path(o.model).stem().string();
    manifest.metadata_json = report.to_json(-1);
    CheckpointGraph graph;
    graph.key = "graph_0";
    graph.graph_spec = winner->graph_spec();
    graph.backend_config = winner->config();
    std::string names_in, names_out;
    for (const auto& t : spec.inputs) names_in += (names_in.empty() ? "\"" : ",\"") + t.name + "\"";
    for (const auto& t : spec.outputs) names_out += (names_out.empty() ? "\"" : ",\"") + t.name + "\"";
    graph.structure_json = "{\"inputs\":[" + names_in + "],\"outputs\":[" + names_out + "]}";
    manifest.graphs.push_back(graph);
    // The report beside the graph, as ait.save keeps it: `aitune report CHECKPOINT` reads
    // it (a CLI checkpoint had none, and the command refused the directory).
    const std::string report_file = (std::filesystem::temp_directory_path() /
                                     ("aitune-tune-report-" + std::to_string(::getpid()) + ".json")).string();
    {
      std::ofstream out(report_file, std::ios::trunc);
      out << report.to_json() << "\n";
      if (!out) throw Error(ErrorCode::kIo, "cannot write the report for the checkpoint to '" + report_file + "'");
    }
    const std::string graph_dir = Checkpoint::graph_directory("graph_0");
    try {
      Checkpoint::save(o.checkpoint, manifest,
                       {{graph_dir + "/model_raw.onnx", o.model}, {graph_dir + "/tune_report.json", report_file}});
    } catch (...) {
      std::filesystem::remove(report_file);
      throw;
    }
    std::filesystem::remove(report_file);
    std::cout << "checkpoint: " << o.checkpoint << " (run it with: aitune run " << o.checkpoint << ")\n";
  }
  return 0;
}

}  // namespace

Command add_tune(CLI::App& app) {
  auto* sub = app.add_subcommand("tune", "Tune an ONNX model: check and measure provider-option variants, choose one");
  auto o = std::make_shared<CliTuneArgs>();
  sub->add_option("model", o->model, "path to an .onnx file")->required()->check(non_empty_path());
  sub->add_option("--provider", o->provider, "cpu, cuda, tensorrt or auto (CUDA if available, else CPU)")
      ->capture_default_str();
  sub->add_option("--device-id", o->device_id, "CUDA device index")->capture_default_str()
      ->check(CLI::TypeValidator<int>())->check(CLI::Range(0, kMaxDeviceId));
  sub->add_option("--strategy", o->strategy,
                  "one-backend, first-wins, max-throughput, min-latency or latency-budget")->capture_default_str();
  sub->add_option("--latency-budget-ms", o->latency_budget_ms, "p50 budget of the latency-budget strategy")
      ->check(finite_in(0, 1e9));
  auto* samples =
      sub->add_option("--samples", o->samples, "directory of NAME.npy files (one sample) or of sample subdirectories")->check(non_empty_path());
  // Both shape random samples only: given with --samples they were ignored without a word.
  sub->add_option("--batch-sizes", o->batch_sizes, "random samples: extents of symbolic first axes")
      ->delimiter(',')->capture_default_str()
      ->check(CLI::TypeValidator<int64_t>())->check(CLI::Range(int64_t{1}, kMaxBatchSize))->excludes(samples);
  sub->add_option("--dim", o->dims, "SYMBOL=VALUE for other symbolic extents of random samples, VALUE in [1, 2^31-1] (default 1)")
      ->excludes(samples);
  sub->add_option("--provider-option", o->provider_options, "KEY=VALUE fixed in every candidate (repeatable)");
  sub->add_option("--atol", o->atol, "absolute tolerance for every output (default: by dtype and precision)")
      ->check(finite_in(0, 1e30));
  sub->add_option("--rtol", o->rtol, "relative tolerance for every output")->check(finite_in(0, 1e30));
  sub->add_option("--output-tolerance", o->output_tolerances, "NAME=ATOL,RTOL for one output (repeatable)");
  sub->add_option("--precision", o->precision,
                  "loosest precision tuning may choose: any, fp32, tf32 (fp32 or TF32), fp16 (adds fp16), bf16")
      ->capture_default_str();
  sub->add_flag("--no-variants", o->no_variants, "one strict candidate instead of the provider-option variants");
  sub->add_flag("--no-transformer-fusions", o->no_transformer_fusions,
                "plan no fused-graph candidates (ait.tune's transformer_fusions=False)");
  sub->add_option("--exporter", o->exporter,
                  "how the model was exported, which picks the fusion pass ait.tune would plan: dynamo or trace")
      ->capture_default_str()->check(CLI::IsMember({"dynamo", "trace"}));
  sub->add_flag("--list-candidates", o->list_candidates,
                "print the candidates ait.tune would evaluate for this model (name, precision, model transform; "
                "those whose model needs the Python front end marked) and exit");
  sub->add_flag("--performance-validation", o->performance_validation,
                "keep nothing unless the winner beats the CPU reference by 1.01x");
  sub->add_flag("--find-max-batch-size", o->find_max_batch_size, "search the largest useful batch for the winner");
  sub->add_option("--max-batch-size", o->max_batch_size, "upper limit of the batch search")
      ->capture_default_str()->check(CLI::TypeValidator<int64_t>())->check(CLI::Range(int64_t{1}, kMaxBatchSize));
  sub->add_option("--time-cap", o->time_cap_s, "seconds of profiling per candidate at most")
      ->capture_default_str()->check(finite_in(1e-3, kMaxTimeCapS));
  sub->add_option("--report", o->report, "write the JSON report to this file")->check(non_empty_path());
  sub->add_option("--checkpoint", o->checkpoint, "save the winner as a checkpoint directory (aitune run loads it)")->check(non_empty_path());
  sub->add_flag("--quiet", o->quiet, "no progress lines on stderr");
  return {sub, [o] { return tune_model(*o); }};
}

}  // namespace aitune::cli
