// The tuning engine: tolerances, profiler settings, strategies, GraphTuner and its report.
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "aitune/candidates.hpp"
#include "aitune/error.hpp"
#include "aitune/tensorrt_options.hpp"
#include "aitune/tuner.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {
namespace {

// A GraphTuner and the Python arrays its samples view: they live as long as it does.
struct PyGraphTuner {
  nb::list arrays;
  std::unique_ptr<GraphTuner> tuner;
};

using PySample = std::tuple<std::vector<AnyArray>, std::vector<AnyArray>, int64_t>;

std::optional<double> max_abs_error(const CandidateResult& c) {
  if (!c.correctness) return std::nullopt;
  return c.correctness->max_abs_error();
}

}  // namespace

void bind_tuning(nb::module_& m) {
  nb::enum_<Precision>(m, "Precision", "Numeric precision of a candidate; sets its default tolerances.")
      .value("STRICT", Precision::kStrict)
      .value("TF32", Precision::kTF32)
      .value("FP16", Precision::kFP16)
      .value("BF16", Precision::kBF16);
  m.def("precision_name", [](Precision p) { return std::string(precision_name(p)); }, nb::arg("precision"),
        "'fp32', 'tf32', 'fp16' or 'bf16'.");
  m.def("parse_precision", [](const std::string& s) { return parse_precision(s); }, nb::arg("text"));
  m.def(
      "precision_allowed",
      [](Precision candidate, const std::string& limit) {
        return precision_allowed(candidate, parse_precision_limit(limit));
      },
      nb::arg("candidate"), nb::arg("limit"),
      "Whether a candidate of this precision may be chosen under limit ('any', 'fp32', 'tf32', 'fp16', 'bf16'); "
      "ValueError for another limit.");

  nb::class_<Tolerance>(m, "Tolerance", "An element fails only when beyond both atol and rtol * |expected|.")
      .def(nb::init<>())
      .def("__init__", [](Tolerance* t, double atol, double rtol) { new (t) Tolerance{atol, rtol}; },
           nb::arg("atol"), nb::arg("rtol"))
      .def_rw("atol", &Tolerance::atol)
      .def_rw("rtol", &Tolerance::rtol)
      .def("__eq__", [](const Tolerance& a, const Tolerance& b) { return a == b; })
      .def("__repr__", [](const Tolerance& t) {
        return "Tolerance(atol=" + std::to_string(t.atol) + ", rtol=" + std::to_string(t.rtol) + ")";
      });
  m.def(
      "default_tolerance",
      [](const std::string& dtype, Precision precision) { return default_tolerance(dtype_from_name(dtype), precision); },
      nb::arg("dtype"), nb::arg("precision") = Precision::kStrict,
      "The documented default tolerance for an output dtype and a candidate precision.");

  nb::class_<ProfileConfig>(m, "ProfileConfig", "How candidates and eager are measured.")
      .def(nb::init<>())
      .def_rw("warmup_calls", &ProfileConfig::warmup_calls)
      .def_rw("window_calls", &ProfileConfig::window_calls)
      .def_rw("stable_windows", &ProfileConfig::stable_windows)
      .def_rw("stability", &ProfileConfig::stability)
      .def_rw("max_windows", &ProfileConfig::max_windows)
      .def_rw("time_cap_s", &ProfileConfig::time_cap_s)
      .def("validate", &ProfileConfig::validate);

  nb::enum_<StrategyKind>(m, "StrategyKind")
      .value("ONE_BACKEND", StrategyKind::kOneBackend)
      .value("FIRST_WINS", StrategyKind::kFirstWins)
      .value("MAX_THROUGHPUT", StrategyKind::kMaxThroughput)
      .value("MIN_LATENCY", StrategyKind::kMinLatency)
      .value("LATENCY_BUDGET", StrategyKind::kLatencyBudget);
  m.def("parse_strategy_kind", [](const std::string& s) { return parse_strategy_kind(s); }, nb::arg("text"));

  nb::class_<StrategyConfig>(m, "StrategyConfig", "A strategy and its performance validation.")
      .def(
          "__init__",
          [](StrategyConfig* s, StrategyKind kind, double budget, bool validation, double min_speedup) {
            new (s) StrategyConfig{kind, budget, validation, min_speedup};
            s->validate();
          },
          nb::arg("kind") = StrategyKind::kMaxThroughput, nb::arg("latency_budget_ms") = 0.0,
          nb::arg("performance_validation") = true, nb::arg("min_speedup") = 1.01)
      .def_rw("kind", &StrategyConfig::kind)
      .def_rw("latency_budget_ms", &StrategyConfig::latency_budget_ms)
      .def_rw("performance_validation", &StrategyConfig::performance_validation)
      .def_rw("min_speedup", &StrategyConfig::min_speedup)
      .def("describe", &StrategyConfig::describe);

  nb::class_<OnnxCandidate>(m, "OnnxCandidate", "A full session configuration to try.")
      .def("__init__",
           [](OnnxCandidate* c, std::string name, OnnxSessionConfig config, Precision precision,
              std::string transform, std::map<std::string, int64_t> fused) {
             new (c) OnnxCandidate{std::move(name), std::move(config), precision, std::move(transform), std::move(fused)};
           },
           nb::arg("name"), nb::arg("config"), nb::arg("precision") = Precision::kStrict, nb::arg("transform") = "",
           nb::arg("fused_operators") = std::map<std::string, int64_t>{})
      .def_ro("name", &OnnxCandidate::name)
      .def_ro("config", &OnnxCandidate::config)
      .def_ro("precision", &OnnxCandidate::precision)
      .def_ro("transform", &OnnxCandidate::transform)
      .def_ro("fused_operators", &OnnxCandidate::fused_operators)
      .def("__repr__", [](const OnnxCandidate& c) { return "OnnxCandidate(" + c.name + ")"; });
  m.def("provider_variants", &provider_variants, nb::arg("base"), nb::arg("spec"),
        "The variants a session configuration expands into (see candidates.hpp).");
  m.def("candidate_name", &candidate_name, nb::arg("config"));

  nb::class_<CandidateRequest>(m, "CandidateRequest", "What the candidate plan is made from (candidates.hpp).")
      .def(nb::init<>())
      .def_rw("base", &CandidateRequest::base)
      .def_rw("spec", &CandidateRequest::spec)
      .def_prop_rw(
          "precision_limit",
          [](const CandidateRequest& r) { return std::string(precision_limit_name(r.precision_limit)); },
          [](CandidateRequest& r, const std::string& limit) { r.precision_limit = parse_precision_limit(limit); },
          "'any', 'fp32', 'tf32', 'fp16' or 'bf16'.")
      .def_rw("model_precision", &CandidateRequest::model_precision)
      .def_rw("has_convolutions", &CandidateRequest::has_convolutions)
      .def_rw("tune_provider_options", &CandidateRequest::tune_provider_options)
      .def_rw("transformer_fusions", &CandidateRequest::transformer_fusions)
      .def_rw("use_dynamo", &CandidateRequest::use_dynamo)
      .def_rw("tensorrt_cache_root", &CandidateRequest::tensorrt_cache_root);
  nb::class_<PlannedCandidate>(m, "PlannedCandidate", "One candidate of the plan and the model it runs on.")
      .def_ro("name", &PlannedCandidate::name)
      .def_ro("config", &PlannedCandidate::config)
      .def_ro("precision", &PlannedCandidate::precision)
      .def_ro("model_transform", &PlannedCandidate::model_transform,
              "'' (the export), or transform steps joined by '+' ('fp16', 'ort_fusions', 'ort_fusions+fp16').")
      .def_prop_ro("needs_front_end", &PlannedCandidate::needs_front_end)
      .def_prop_ro("only_where_fusion_applies", &PlannedCandidate::only_where_fusion_applies)
      .def("__repr__", [](const PlannedCandidate& c) {
        return "PlannedCandidate(" + c.name + ", " + std::string(precision_name(c.precision)) +
               (c.model_transform.empty() ? "" : ", model_transform=" + c.model_transform) + ")";
      });
  m.def("plan_candidates", &plan_candidates, nb::arg("request"),
        "The candidates tuning evaluates for one graph, in order (the same plan `aitune tune --list-candidates` "
        "prints); empty when none computes within the precision limit.");
  m.def("model_transform_steps", [](const std::string& name) { return model_transform::steps(name); }, nb::arg("name"),
        "The steps of a model transform name ('ort_fusions+fp16' -> ['ort_fusions', 'fp16']).");
  m.def("tensorrt_provider_options", &tensorrt_provider_options, nb::arg("spec"), nb::arg("cache_dir"),
        nb::arg("user") = std::map<std::string, std::string>{},
        "TensorRT options: engine/timing caches under cache_dir, profiles from the spec, `user` winning.");

  nb::class_<CandidateResult>(m, "CandidateResult", "One measured candidate of a graph.")
      .def_ro("name", &CandidateResult::name)
      .def_ro("backend", &CandidateResult::backend)
      .def_ro("group", &CandidateResult::group)
      .def_ro("config_json", &CandidateResult::config_json)
      .def_ro("precision", &CandidateResult::precision)
      .def_prop_ro("precision_name", [](const CandidateResult& c) { return std::string(precision_name(c.precision)); })
      .def_ro("transform", &CandidateResult::transform)
      .def_ro("fused_operators", &CandidateResult::fused_operators)
      .def_prop_ro("status", [](const CandidateResult& c) { return std::string(candidate_status_name(c.status)); })
      .def_ro("reason", &CandidateResult::reason)
      .def_prop_ro("max_abs_error", &max_abs_error)
      .def_prop_ro("p50_us", [](const CandidateResult& c) -> std::optional<double> {
        if (!c.profile) return std::nullopt;
        return c.profile->host_us.p50;
      })
      .def_prop_ro("device_p50_us", [](const CandidateResult& c) -> std::optional<double> {
        if (!c.profile || !c.profile->device_us) return std::nullopt;
        return c.profile->device_us->p50;
      })
      .def_prop_ro("throughput", [](const CandidateResult& c) -> std::optional<double> {
        if (!c.profile) return std::nullopt;
        return c.profile->throughput;
      })
      .def_ro("speedup_vs_eager", &CandidateResult::speedup_vs_eager)
      .def_ro("session_creation_ms", &CandidateResult::session_creation_ms)
      .def_ro("first_run_ms", &CandidateResult::first_run_ms)
      .def_prop_ro("correctness_json", [](const CandidateResult& c) -> std::optional<std::string> {
        if (!c.correctness) return std::nullopt;
        return c.correctness->to_json(-1);
      })
      .def("__repr__", [](const CandidateResult& c) {
        return "CandidateResult(" + c.name + ", " + std::string(candidate_status_name(c.status)) + ")";
      });

  nb::class_<TuneReport>(m, "TuneReport", "Everything tuning one graph decided and measured.")
      .def_ro("graph", &TuneReport::graph)
      .def_ro("candidates", &TuneReport::candidates)
      .def_ro("winner", &TuneReport::winner)
      .def_ro("decision", &TuneReport::decision)
      .def_ro("tuning_s", &TuneReport::tuning_s)
      .def_prop_ro("eager_p50_us", [](const TuneReport& r) -> std::optional<double> {
        if (!r.eager) return std::nullopt;
        return r.eager->host_us.p50;
      })
      .def_prop_ro("max_batch_size", [](const TuneReport& r) -> std::optional<int64_t> {
        if (!r.batch_search) return std::nullopt;
        return r.batch_search->max_batch;
      })
      .def("to_json", &TuneReport::to_json, nb::arg("indent") = 2)
      .def("summary_table", &TuneReport::summary_table);

  nb::class_<TunerOptions>(m, "TunerOptions", "What a GraphTuner does besides evaluating candidates.")
      .def(nb::init<>())
      .def_rw("profile", &TunerOptions::profile)
      .def_prop_rw(
          "tolerance", [](const TunerOptions& o) { return o.tolerances.all; },
          [](TunerOptions& o, std::optional<Tolerance> t) { o.tolerances.all = t; },
          "Overrides every output's default tolerance (None: defaults by dtype and precision).")
      .def_prop_rw(
          "output_tolerances", [](const TunerOptions& o) { return o.tolerances.per_output; },
          [](TunerOptions& o, std::map<std::string, Tolerance> t) { o.tolerances.per_output = std::move(t); },
          "Per output name; wins over `tolerance`.")
      .def_prop_rw(
          "find_max_batch_size", [](const TunerOptions& o) { return o.batch_search.enabled; },
          [](TunerOptions& o, bool v) { o.batch_search.enabled = v; })
      .def_prop_rw(
          "max_batch_size", [](const TunerOptions& o) { return o.batch_search.max_batch_size; },
          [](TunerOptions& o, int64_t v) { o.batch_search.max_batch_size = v; })
      .def_prop_rw(
          "batch_min_gain", [](const TunerOptions& o) { return o.batch_search.min_gain; },
          [](TunerOptions& o, double v) { o.batch_search.min_gain = v; })
      .def_rw("cuda_stream", &TunerOptions::cuda_stream)
      .def_rw("reference_precision", &TunerOptions::reference_precision,
              "Precision the reference was computed in; defaults are the looser of it and the candidate's.")
      .def_prop_rw(
          "log", [](const TunerOptions&) { return nb::none(); },
          [](TunerOptions& o, nb::object fn) {
            if (fn.is_none()) {
              o.log = nullptr;
              return;
            }
            nb::callable callable = nb::borrow<nb::callable>(fn);
            o.log = [callable](const std::string& line) {
              nb::gil_scoped_acquire gil;
              callable(line);
            };
          },
          "A callable taking one log line (called from the engine, with the GIL taken).");

  nb::class_<PyGraphTuner>(m, "GraphTuner", "The tuning engine for one graph.")
      .def(
          "__init__",
          [](PyGraphTuner* self, std::string graph, GraphSpec spec, nb::list samples, TunerOptions options) {
            std::vector<TuneSample> tune_samples;
            for (nb::handle item : samples) {
              // (inputs, expected, batch) or, with positions the model leaves undefined,
              // (inputs, expected, batch, [mask or None per output], mask source)
              nb::tuple fields = nb::cast<nb::tuple>(item);
              if (fields.size() != 3 && fields.size() != 5)
                throw Error(ErrorCode::kInvalidArgument,
                            "GraphTuner: a sample is (inputs, expected, batch_size[, valid masks, source])");
              auto [inputs, expected, batch] = nb::cast<PySample>(nb::make_tuple(fields[0], fields[1], fields[2]));
              TuneSample s;
              if (fields.size() == 5) {
                for (nb::handle mask : nb::cast<nb::list>(fields[3]))
                  s.valid.masks.push_back(mask.is_none() ? TensorView{} : view_of(nb::cast<AnyArray>(mask), "valid positions"));
                s.valid.source = nb::cast<std::string>(fields[4]);
              }
              for (std::size_t i = 0; i < inputs.size(); ++i)
                s.inputs.push_back(view_of(inputs[i], i < spec.inputs.size() ? spec.inputs[i].name : "?"));
              for (std::size_t i = 0; i < expected.size(); ++i)
                s.expected.push_back(view_of(expected[i], i < spec.outputs.size() ? spec.outputs[i].name : "?"));
              s.batch_size = batch;
              tune_samples.push_back(std::move(s));
            }
            new (self) PyGraphTuner{samples, std::make_unique<GraphTuner>(std::move(graph), std::move(spec),
                                                                         std::move(tune_samples), std::move(options))};
          },
          nb::arg("graph"), nb::arg("spec"), nb::arg("samples"), nb::arg("options"),
          "samples: [(inputs, expected_host_outputs, batch_size[, valid_masks, source])], arrays kept alive by the "
          "tuner; valid_masks: per output a host mask prefixing its shape (None: all defined), non-zero where "
          "the output is defined, the rest left out of the checks.")
      .def(
          "profile_reference",
          [](PyGraphTuner& t, nb::callable run, const std::string& label) {
            t.tuner->profile_reference([&](const std::vector<TensorView>&) { run(); }, label);
          },
          nb::arg("run"), nb::arg("label") = "eager",
          "Profiles `run()` (eager on the largest-batch sample, CUDA work on options.cuda_stream).")
      .def(
          "add_failed",
          [](PyGraphTuner& t, const std::string& name, const std::string& backend, int group, const std::string& why,
             Precision precision) { return t.tuner->add_failed(name, backend, group, why, precision); },
          nb::arg("name"), nb::arg("backend"), nb::arg("group"), nb::arg("reason"),
          nb::arg("precision") = Precision::kStrict)
      .def(
          "evaluate_onnx",
          [](PyGraphTuner& t, const std::string& model_path, const OnnxCandidate& candidate,
             const std::string& backend, int group, std::vector<std::size_t> model_inputs) {
            nb::gil_scoped_release release;
            return t.tuner->evaluate_onnx(model_path, candidate, backend, group, model_inputs);
          },
          nb::arg("model_path"), nb::arg("candidate"), nb::arg("backend"), nb::arg("group"),
          nb::arg("model_inputs") = std::vector<std::size_t>{})
      .def(
          "evaluate_external",
          [](PyGraphTuner& t, const std::string& name, const std::string& backend, int group, Precision precision,
             const std::string& config_json, nb::callable outputs, nb::callable run) {
            ExternalCandidate c;
            c.name = name;
            c.precision = precision;
            c.config_json = config_json;
            // Called with the GIL held (evaluate_external does not release it). Outputs are
            // copied into engine-owned host memory: the arrays may be reused by the caller.
            c.outputs = [&outputs](std::size_t index) {
              std::vector<Tensor> out;
              for (nb::handle item : outputs(index)) {
                TensorView v = view_of(nb::cast<AnyArray>(item), "output " + std::to_string(out.size()));
                if (v.device.kind != DeviceKind::kCPU || !v.is_contiguous())
                  throw Error(ErrorCode::kInvalidArgument, "external candidate outputs must be contiguous host arrays");
                Tensor host = Tensor::empty_host(v.dtype, v.shape);
                if (v.nbytes()) std::memcpy(host.data(), v.data, v.nbytes());
                out.push_back(std::move(host));
              }
              return out;
            };
            c.run = [&run] { run(); };
            return t.tuner->evaluate_external(c, backend, group);
          },
          nb::arg("name"), nb::arg("backend"), nb::arg("group"), nb::arg("precision"), nb::arg("config_json"),
          nb::arg("outputs"), nb::arg("run"),
          "A candidate run outside ONNX Runtime: outputs(i) -> host arrays of sample i; run() runs the profile "
          "sample (timed). Checked and profiled like an ONNX candidate; take_winner() is None for it.")
      .def(
          "select",
          [](PyGraphTuner& t, const StrategyConfig& strategy) {
            nb::gil_scoped_release release;
            return t.tuner->select(strategy);
          },
          nb::arg("strategy"), nb::rv_policy::copy)
      .def("take_winner", [](PyGraphTuner& t) { return t.tuner->take_winner(); })
      .def_prop_ro("report", [](const PyGraphTuner& t) { return t.tuner->report(); })
      .def_prop_ro("spec", [](const PyGraphTuner& t) { return t.tuner->spec(); });
}

}  // namespace aitune::python
