// The tuning engine: tolerances, profiler settings, strategies, GraphTuner and its report.
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <stdexcept>

#include "aitune/candidates.hpp"
#include "aitune/tune_driver.hpp"
#include "aitune/tune_outcome.hpp"
#include "aitune/error.hpp"
#include "aitune/fp32_node_search.hpp"
#include "aitune/tensorrt_options.hpp"
#include "aitune/onnx_nodes.hpp"
#include "aitune/tune_report_html.hpp"
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

// A host copy of a Python array, in engine-owned memory (the array may be reused).
Tensor host_copy(nb::handle item, const std::string& what) {
  TensorView v = view_of(nb::cast<AnyArray>(item), what);
  if (v.device.kind != DeviceKind::kCPU || !v.is_contiguous())
    throw Error(ErrorCode::kInvalidArgument, what + " must be a contiguous host array");
  Tensor host = Tensor::empty_host(v.dtype, v.shape);
  if (v.nbytes()) std::memcpy(host.data(), v.data, v.nbytes());
  return host;
}

// Host copies of a Python sequence of arrays (a sample's outputs), each named `what` and
// its index in errors.
std::vector<Tensor> host_copies(nb::handle items, const std::string& what) {
  std::vector<Tensor> out;
  for (nb::handle item : items) out.push_back(host_copy(item, what + " " + std::to_string(out.size())));
  return out;
}

// A Python object that the engine holds while the GIL is released: taken and dropped
// with the GIL held, whichever thread lets it go.
std::shared_ptr<nb::object> gil_held(nb::object object) {
  return std::shared_ptr<nb::object>(new nb::object(std::move(object)), [](nb::object* o) {
    nb::gil_scoped_acquire gil;
    delete o;
  });
}

// A Python error as the engine's Error (a python_error must not outlive the GIL), its
// message after `what: ` (none when `what` is null).
[[noreturn]] void rethrow_as_engine_error(nb::python_error& error, const char* what) {
  std::string message = what ? std::string(what) + ": " + error.what() : std::string(error.what());
  throw Error(ErrorCode::kInternal, message);
}

// `held()` as the engine calls it, without the GIL: the GIL taken for the call, a Python
// error leaving as the engine's Error (rethrow_as_engine_error's `what`).
std::function<void()> engine_call(std::shared_ptr<nb::object> held, const char* what) {
  return [held = std::move(held), what] {
    nb::gil_scoped_acquire gil;
    try {
      (*held)();
    } catch (nb::python_error& e) {
      rethrow_as_engine_error(e, what);
    }
  };
}

// The engine's SessionCallFactory from the front end's `module_call(session) -> callable`,
// called by the engine without the GIL. The session goes to Python as a reference: the
// callable (and whatever keeps the session object) is dropped before the session is.
SessionCallFactory session_call_factory(nb::object module_call) {
  auto factory = gil_held(std::move(module_call));
  return [factory](OnnxSession& session) -> std::function<void()> {
    nb::gil_scoped_acquire gil;
    std::shared_ptr<nb::object> call;
    try {
      call = gil_held((*factory)(nb::cast(&session, nb::rv_policy::reference)));
    } catch (nb::python_error& e) {
      rethrow_as_engine_error(e, "module_call");
    }
    return engine_call(std::move(call), "the module's call of the candidate");
  };
}

std::optional<double> max_abs_error(const CandidateResult& c) {
  if (!c.correctness) return std::nullopt;
  return c.correctness->max_abs_error();
}

// The front end's side of the one driver (TuneFrontEnd) over a Python object with the
// methods run_reference(), add_candidates(backend, group), explain_failures(), warn(line)
// and the attribute fatal_errors (exception types that stop a tune: a lost CUDA context).
// The driver runs without the GIL; each call takes it. A Python exception is kept as it
// is and reaches the caller unchanged when the driver lets it through; to the driver it
// is a FatalTuneError (fatal_errors, or not an Exception: KeyboardInterrupt) or a
// backend's failure whose reason is "TypeName: message".
// The C++ exceptions that stand for a kept Python one while it crosses the driver.
struct PythonBackendError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct PythonFatalError : FatalTuneError {
  using FatalTuneError::FatalTuneError;
};

class PyTuneFrontEnd final : public TuneFrontEnd {
 public:
  explicit PyTuneFrontEnd(nb::object front_end)
      : front_end_(std::move(front_end)), fatal_(front_end_.attr("fatal_errors")) {}

  void run_reference(const std::vector<TensorView>&) override {
    call([&] { front_end_.attr("run_reference")(); }, kNoBackend);
  }
  void add_candidates(std::size_t backend, GraphTuner&, int group) override {
    call([&] { front_end_.attr("add_candidates")(backend, group); }, backend);
  }
  void explain_failures(GraphTuner&) override {
    call([&] { front_end_.attr("explain_failures")(); }, kNoBackend);
  }
  void warn(const std::string& line) override {
    call([&] { front_end_.attr("warn")(line); }, kNoBackend);
  }

  // After the driver threw (the GIL held again): the Python exception it carried, with
  // `note` added where a backend's own error was let through; otherwise nothing.
  void rethrow_kept(const std::string& note) {
    if (!kept_) return;
    nb::python_error error = std::move(*kept_);
    kept_.reset();
    if (!note.empty() && !kept_fatal_ && nb::hasattr(error.value(), "add_note"))
      error.value().attr("add_note")(note);
    throw error;
  }
  std::size_t kept_backend() const { return kept_backend_; }

 private:
  static constexpr std::size_t kNoBackend = static_cast<std::size_t>(-1);

  template <typename F>
  void call(F&& f, std::size_t backend) {
    nb::gil_scoped_acquire gil;
    try {
      f();
    } catch (nb::python_error& e) {
      const bool fatal = !PyErr_GivenExceptionMatches(e.type().ptr(), PyExc_Exception) ||
                         PyObject_IsInstance(e.value().ptr(), fatal_.ptr()) == 1;
      std::string reason = nb::cast<std::string>(e.type().attr("__name__")) + ": " +
                           nb::cast<std::string>(nb::str(e.value()));
      kept_.emplace(std::move(e));
      kept_backend_ = backend;
      kept_fatal_ = fatal;
      if (fatal) throw PythonFatalError(reason);
      throw PythonBackendError(reason);
    }
  }

  nb::object front_end_;
  nb::object fatal_;
  std::optional<nb::python_error> kept_;
  std::size_t kept_backend_ = kNoBackend;
  bool kept_fatal_ = false;
};

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
  // The precision limit, converted from and to text only here (the Python kwargs edge).
  m.def("parse_precision_limit", [](const std::string& s) { return parse_precision_limit(s); }, nb::arg("text"),
        "None for 'any', else the Precision; InvalidArgumentError (a ValueError) naming the valid values.");
  m.def("precision_limit_name", [](std::optional<Precision> limit) { return std::string(precision_limit_name(limit)); },
        nb::arg("limit").none());
  m.def(
      "precision_allowed",
      [](Precision candidate, std::optional<Precision> limit) { return precision_allowed(candidate, limit); },
      nb::arg("candidate"), nb::arg("limit").none(),
      "Whether a candidate of this precision may be chosen under limit (a Precision; None: any).");

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
      .def_rw("final_round_margin", &ProfileConfig::final_round_margin,
              "select()'s final round: passed candidates within this fraction of the best host p50 are "
              "measured again, interleaved (default 0.10).")
      .def_rw("final_round_windows", &ProfileConfig::final_round_windows,
              "Rounds of the final round, one window per finalist each (default 5; 0: no final round).")
      .def_rw("final_round_max", &ProfileConfig::final_round_max,
              "At most this many finalists, the fastest by their first p50 (default 4; one alone is measured again too; 0: no final round).")
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
              std::string transform, std::map<std::string, int64_t> fused, std::vector<std::string> fp32_nodes,
              std::string transform_note) {
             new (c) OnnxCandidate{std::move(name),  std::move(config),     precision,
                                   std::move(transform), std::move(fused), std::move(fp32_nodes),
                                   std::move(transform_note)};
           },
           nb::arg("name"), nb::arg("config"), nb::arg("precision") = Precision::kStrict, nb::arg("transform") = "",
           nb::arg("fused_operators") = std::map<std::string, int64_t>{},
           nb::arg("fp32_nodes") = std::vector<std::string>{}, nb::arg("transform_note") = "")
      .def_ro("fp32_nodes", &OnnxCandidate::fp32_nodes)
      .def_ro("transform_note", &OnnxCandidate::transform_note)
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
      .def_rw("precision_limit", &CandidateRequest::precision_limit,
              "The engine's Precision, or None for any (text is converted at the kwargs edge, "
              "ONNXRuntimeBackendConfig.precision_limit).")
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
  nb::class_<Fp32NodeSearchResult>(m, "Fp32NodeSearchResult", "The nodes an fp16 model keeps in fp32.")
      .def_ro("passed", &Fp32NodeSearchResult::passed)
      .def_ro("kept", &Fp32NodeSearchResult::kept)
      .def_ro("evaluations", &Fp32NodeSearchResult::evaluations)
      .def_ro("unrunnable", &Fp32NodeSearchResult::unrunnable)
      .def_ro("seconds", &Fp32NodeSearchResult::seconds)
      .def_ro("note", &Fp32NodeSearchResult::note);
  m.attr("DEFAULT_FP32_NODE_SEARCH_SECONDS") = kDefaultFp32NodeSearchSeconds;
  m.def(
      "search_fp32_nodes",
      [](const std::vector<std::string>& nodes, nb::callable passes, int max_evaluations, double max_seconds) {
        return search_fp32_nodes(
            nodes,
            [&](const std::vector<std::string>& kept) {
              try {
                return nb::cast<bool>(passes(kept));
              } catch (nb::python_error& e) {
                // An exception (not KeyboardInterrupt / SystemExit) means the model could
                // not be built or run: the engine reports that, not a failed check.
                if (!e.matches(PyExc_Exception)) throw;
                std::string type = nb::cast<std::string>(nb::handle(e.type()).attr("__name__"));
                throw Error(ErrorCode::kModelInvalid, type + ": " + nb::cast<std::string>(nb::str(e.value())));
              }
            },
            max_evaluations, max_seconds);
      },
      nb::arg("nodes"), nb::arg("passes"), nb::arg("max_evaluations") = 24,
      nb::arg("max_seconds") = kDefaultFp32NodeSearchSeconds,
      "Bisection for the smallest set of `nodes` to keep in fp32: passes(kept) -> bool builds and checks the "
      "model keeping `kept` in fp32, raising when it cannot be built or run; no check starts after max_seconds "
      "(wall clock), the set kept so far is used (fp32_node_search.hpp).");
  m.def(
      "eager_nondeterminism",
      [](const std::vector<std::string>& names, nb::list first, nb::list second,
         const std::vector<std::string>& modules_in_training, std::optional<Tolerance> tolerance,
         const std::map<std::string, Tolerance>& output_tolerances) {
        ToleranceSpec tolerances;
        tolerances.all = tolerance;
        tolerances.per_output = output_tolerances;
        std::vector<TensorView> a, b;
        for (nb::handle item : first) a.push_back(view_of(nb::cast<AnyArray>(item), "eager output"));
        for (nb::handle item : second) b.push_back(view_of(nb::cast<AnyArray>(item), "eager output (again)"));
        return eager_nondeterminism(names, a, b, modules_in_training, tolerances);
      },
      nb::arg("output_names"), nb::arg("first"), nb::arg("second"), nb::arg("modules_in_training"),
      nb::arg("tolerance") = nb::none(), nb::arg("output_tolerances") = std::map<std::string, Tolerance>{},
      "Why eager cannot be a reference (its outputs for the same inputs differ between two calls), or None.");
  m.def("rejected_fp16_candidate", &rejected_fp16_candidate, nb::arg("report"), nb::arg("config"),
        "Index of the all-fp16 candidate with this configuration when the check rejected it, else None.");
  m.def("tensorrt_provider_options", &tensorrt_provider_options, nb::arg("spec"), nb::arg("cache_dir"),
        nb::arg("user") = std::map<std::string, std::string>{},
        "TensorRT options: engine/timing caches under cache_dir, profiles from the spec, `user` winning.");

  nb::class_<CandidateResult>(m, "CandidateResult", "One measured candidate of a graph.")
      .def_ro("name", &CandidateResult::name)
      .def_prop_ro("failure_code",
                   [](const CandidateResult& c) {
                     return c.failure_code ? std::string(error_code_name(*c.failure_code)) : std::string();
                   },
                   "the error code name of a failure where one is known ('unsupported_dtype'), else ''")
      .def_ro("backend", &CandidateResult::backend)
      .def_ro("group", &CandidateResult::group)
      .def_ro("config_json", &CandidateResult::config_json)
      .def_ro("precision", &CandidateResult::precision)
      .def_prop_ro("precision_name", [](const CandidateResult& c) { return std::string(precision_name(c.precision)); })
      .def_ro("transform", &CandidateResult::transform)
      .def_ro("fused_operators", &CandidateResult::fused_operators)
      .def_ro("fp32_nodes", &CandidateResult::fp32_nodes)
      .def_ro("transform_note", &CandidateResult::transform_note)
      .def_ro("in_place_outputs", &CandidateResult::in_place_outputs,
              "Outputs its session writes into an input's buffer: output name -> input name.")
      .def_prop_ro("status", [](const CandidateResult& c) { return std::string(candidate_status_name(c.status)); })
      .def_ro("reason", &CandidateResult::reason)
      .def_prop_ro("max_abs_error", &max_abs_error)
      .def_prop_ro("p50_us", [](const CandidateResult& c) -> std::optional<double> {
        if (!c.profile) return std::nullopt;
        return c.profile->host_us.p50;
      })
      .def_prop_ro("first_p50_us", [](const CandidateResult& c) -> std::optional<double> {
        if (!c.first_profile) return std::nullopt;
        return c.first_profile->host_us.p50;
      }, "A finalist's host p50 when first measured, before the final round re-measured it; None otherwise.")
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
      .def_prop_ro("divergence_json", [](const CandidateResult& c) -> std::optional<std::string> {
        if (!c.divergence) return std::nullopt;
        return c.divergence->to_json(-1);
      })
      .def_prop_ro("divergence_summary", [](const CandidateResult& c) -> std::optional<std::string> {
        if (!c.divergence) return std::nullopt;
        return c.divergence->describe();
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
      .def_prop_ro("vacuous_outputs", [](const TuneReport& r) {
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto& v : r.vacuous_outputs) out.emplace_back(v.name, v.why);
        return out;
      }, "[(output name, why)] of reference outputs that cannot judge a candidate (all NaN/Inf, constant).")
      .def_prop_ro("eager_p50_us", [](const TuneReport& r) -> std::optional<double> {
        if (!r.eager) return std::nullopt;
        return r.eager->host_us.p50;
      })
      .def_prop_ro("max_batch_size", [](const TuneReport& r) -> std::optional<int64_t> {
        if (!r.batch_search) return std::nullopt;
        return r.batch_search->max_batch;
      })
      .def("to_json", &TuneReport::to_json, nb::arg("indent") = 2)
      .def("summary_table", &TuneReport::summary_table)
      .def("to_html", [](const TuneReport& r) { return tune_report_html(r.to_json(-1)); },
           "The report as a self-contained HTML page (tune_report_html).");
  m.def("tune_report_html", &tune_report_html, nb::arg("report_json"),
        "A tune report's JSON as a self-contained HTML page; ValueError when it is not a tune report.");
  nb::class_<OnnxNode>(m, "OnnxNode", "A node of an ONNX graph with the module scope its exporter recorded.")
      .def_ro("name", &OnnxNode::name)
      .def_ro("op_type", &OnnxNode::op_type)
      .def_ro("inputs", &OnnxNode::inputs)
      .def_ro("outputs", &OnnxNode::outputs)
      .def_ro("scope", &OnnxNode::scope)
      .def_ro("scopes", &OnnxNode::scopes);
  m.def("onnx_graph_nodes", &onnx_graph_nodes, nb::arg("model_path"),
        "The main graph's nodes in graph order, with module scopes from the exporter's metadata.");

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
      .def_rw("accuracy_factor", &TunerOptions::accuracy_factor,
              "Calibrated acceptance: a reduced-precision candidate may err up to this factor x eager's error at "
              "its precision (default 2).")
      .def_prop_rw(
          "eager_at_precision", [](const TunerOptions&) { return nb::none(); },
          [](TunerOptions& o, nb::object fn) {
            if (fn.is_none()) {
              o.eager_at_precision = nullptr;
              return;
            }
            nb::callable callable = nb::borrow<nb::callable>(fn);
            o.eager_at_precision = [callable](Precision precision,
                                              std::string& reason) -> std::optional<std::vector<std::vector<Tensor>>> {
              nb::gil_scoped_acquire gil;
              nb::object result = callable(precision);
              if (nb::isinstance<nb::str>(result)) {
                reason = nb::cast<std::string>(result);
                return std::nullopt;
              }
              std::vector<std::vector<Tensor>> samples;
              for (nb::handle sample : result) samples.push_back(host_copies(sample, "eager output"));
              return samples;
            };
          },
          "A callable(Precision) -> [[host arrays per output] per sample] of eager PyTorch at that precision, or a "
          "str saying why eager cannot run at it here. Asked once per precision (the GIL taken).")
      .def_prop_rw(
          "reference_at", [](const TunerOptions&) { return nb::none(); },
          [](TunerOptions& o, nb::object fn) {
            if (fn.is_none()) {
              o.reference_at = nullptr;
              return;
            }
            nb::callable callable = nb::borrow<nb::callable>(fn);
            o.reference_at = [callable](const std::vector<TensorView>& inputs,
                                        std::string& reason) -> std::optional<std::vector<Tensor>> {
              nb::gil_scoped_acquire gil;
              nb::list py_inputs;
              // Borrowed for the call only: the callable copies what it keeps.
              for (const auto& v : inputs) py_inputs.append(to_dlpack_capsule(Tensor::adopt(v, std::make_shared<int>(0))));
              nb::object result = callable(py_inputs);
              if (nb::isinstance<nb::str>(result)) {
                reason = nb::cast<std::string>(result);
                return std::nullopt;
              }
              return host_copies(result, "reference output");
            };
          },
          "A callable([DLPack capsules of host inputs, graph order]) -> [host arrays per output] of the reference "
          "run on them, or a str saying why it cannot: the batch search checks a widened batch against it.")
      .def_prop_rw(
          "accuracy_metric", [](const TunerOptions&) { return nb::none(); },
          [](TunerOptions& o, nb::object fn) {
            if (fn.is_none()) {
              o.accuracy_metric = nullptr;
              return;
            }
            nb::callable callable = nb::borrow<nb::callable>(fn);
            o.accuracy_metric = [callable](const std::vector<std::vector<TensorView>>& samples) {
              nb::gil_scoped_acquire gil;
              nb::list py_samples;
              for (const auto& sample : samples) {
                nb::list outputs;
                // Borrowed for the call only: the callable copies what it keeps.
                for (const auto& v : sample) outputs.append(to_dlpack_capsule(Tensor::adopt(v, std::make_shared<int>(0))));
                py_samples.append(outputs);
              }
              return nb::cast<double>(callable(py_samples));
            };
          },
          "A callable([[DLPack capsule per output] per sample]) -> float: the user's accuracy score of a candidate's "
          "outputs (the capsules are valid during the call only). It then decides alone, with max_accuracy_drop.")
      .def_rw("max_accuracy_drop", &TunerOptions::max_accuracy_drop)
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
          [](PyGraphTuner* self, std::string graph, GraphSpec spec, nb::list samples, TunerOptions options,
             std::vector<std::size_t> probes) {
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
            for (auto index : probes) {
              if (index >= tune_samples.size())
                throw Error(ErrorCode::kInvalidArgument, graph + ": probe " + std::to_string(index) +
                                                             " is not a sample index; there are " +
                                                             std::to_string(tune_samples.size()) + " samples");
              tune_samples[index].probe = true;
            }
            new (self) PyGraphTuner{samples, std::make_unique<GraphTuner>(std::move(graph), std::move(spec),
                                                                         std::move(tune_samples), std::move(options))};
          },
          nb::arg("graph"), nb::arg("spec"), nb::arg("samples"), nb::arg("options"),
          nb::arg("probes") = std::vector<std::size_t>{},
          "samples: [(inputs, expected_host_outputs, batch_size[, valid_masks, source])], arrays kept alive by the "
          "tuner; valid_masks: per output a host mask prefixing its shape (None: all defined), non-zero where "
          "the output is defined, the rest left out of the checks. probes: indices of the samples the front end "
          "made itself (TuneSample::probe: a crop between the recorded sizes), never timed, and not run through "
          "a graph whose shape conditions refuse them.")
      .def(
          "profile_reference",
          [](PyGraphTuner& t, nb::callable run, const std::string& label) {
            // Owned: the engine keeps the call for select()'s final round, which runs without
            // the GIL (then a Python error leaves as the engine's Error); called here, with
            // the GIL, a Python error reaches the caller as it is.
            auto held = gil_held(std::move(run));
            t.tuner->profile_reference(
                [held, from_engine = engine_call(held, "reference")](const std::vector<TensorView>&) {
                  if (PyGILState_Check()) {
                    (*held)();
                    return;
                  }
                  from_engine();
                },
                label);
          },
          nb::arg("run"), nb::arg("label") = "eager",
          "Profiles `run()` (eager on the largest-batch sample, CUDA work on options.cuda_stream).")
      .def(
          "add_failed",
          [](PyGraphTuner& t, const std::string& name, const std::string& backend, int group, const std::string& why,
             Precision precision, const std::string& code) {
            std::optional<ErrorCode> known;
            if (!code.empty()) {
              known = error_code_from_name(code);
              if (!known) throw Error(ErrorCode::kInvalidArgument, "add_failed: unknown error code '" + code + "'");
            }
            return t.tuner->add_failed(name, backend, group, why, precision, known);
          },
          nb::arg("name"), nb::arg("backend"), nb::arg("group"), nb::arg("reason"),
          nb::arg("precision") = Precision::kStrict, nb::arg("code") = "",
          "A candidate that failed before it could run; `code`: its failure's error code name "
          "('unsupported_dtype'), where known")
      .def(
          "evaluate_onnx",
          [](PyGraphTuner& t, const std::string& model_path, const OnnxCandidate& candidate,
             const std::string& backend, int group, std::vector<std::size_t> model_inputs, nb::object module_call) {
            SessionCallFactory factory;
            if (!module_call.is_none()) factory = session_call_factory(std::move(module_call));
            nb::gil_scoped_release release;
            return t.tuner->evaluate_onnx(model_path, candidate, backend, group, model_inputs, factory);
          },
          nb::arg("model_path"), nb::arg("candidate"), nb::arg("backend"), nb::arg("group"),
          nb::arg("model_inputs") = std::vector<std::size_t>{}, nb::arg("module_call").none() = nb::none(),
          "module_call(session) -> callable: the call profiled for this candidate, made from its session (an "
          "OnnxSession valid only until the returned callable is dropped): the module's own dispatch, so the "
          "measured latency is the module's. None: the session's infer on the profile sample.")
      .def(
          "check_onnx",
          [](PyGraphTuner& t, const std::string& model_path, const OnnxCandidate& candidate,
             std::vector<std::size_t> model_inputs) {
            nb::gil_scoped_release release;
            return t.tuner->check_onnx(model_path, candidate, model_inputs);
          },
          nb::arg("model_path"), nb::arg("candidate"), nb::arg("model_inputs") = std::vector<std::size_t>{},
          "Whether the candidate passes the check; nothing added to the report (a search step).")
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
            // Kept by the engine for the final round, which select() runs without the GIL:
            // the callable is owned (dropped with the GIL taken), each call takes the GIL, and
            // a Python error leaves as the engine's Error (its message the candidate's reason),
            // not as a python_error that must not outlive the GIL.
            c.run = engine_call(gil_held(std::move(run)), nullptr);
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
      .def("model_path", [](const PyGraphTuner& t, std::size_t candidate) { return t.tuner->model_path(candidate); },
           nb::arg("candidate"), "The ONNX model a candidate ran on ('' when none).")
      .def(
          "first_failing_sample",
          [](const PyGraphTuner& t, std::size_t candidate) { return t.tuner->first_failing_sample(candidate); },
          nb::arg("candidate"), "Index of the first sample the candidate failed its check on; None if none.")
      .def(
          "trace_divergence",
          [](PyGraphTuner& t, std::size_t candidate, std::size_t sample,
             const std::vector<std::tuple<std::string, std::string, AnyArray, std::string, bool>>& eager) {
            std::vector<ModuleOutput> outputs;
            for (const auto& [module, value, array, scope, input] : eager)
              outputs.push_back({module, value, view_of(array, module), scope, input});
            nb::gil_scoped_release release;
            return t.tuner->trace_divergence(candidate, sample, outputs).to_json(-1);
          },
          nb::arg("candidate"), nb::arg("sample"), nb::arg("eager"),
          "eager: [(module path, ONNX value name, host array, exported scope, is the module's input)] in the "
          "order eager computed them (the root module's scope ''); traces where the candidate's graph first diverges on that sample, keeps "
          "it in the report and returns it as JSON.")
      .def("take_winner", [](PyGraphTuner& t) { return t.tuner->take_winner(); })
      .def_prop_ro("report", [](const PyGraphTuner& t) { return t.tuner->report(); })
      .def_prop_ro("spec", [](const PyGraphTuner& t) { return t.tuner->spec(); })
      .def(
          "set_shape_conditions",
          [](PyGraphTuner& t, std::vector<ShapeCondition> conditions) {
            return t.tuner->set_shape_conditions(std::move(conditions));
          },
          nb::arg("conditions"),
          "The conditions the ONNX graphs evaluated from now on were exported under; returns those a recorded "
          "sample violates, which are left out (the check at that sample judges the graph there).");

  // The drivers' shared decisions (tune_outcome.hpp): first-wins early stop and what a
  // finished tune leads to.
  nb::class_<TuneOutcome>(m, "TuneOutcome", "What a finished tune leads to.")
      .def_prop_ro("kind", [](const TuneOutcome& o) { return std::string(tune_outcome_kind_name(o.kind)); },
                   "'winner', 'eager_kept', 'eager_fallback', 'all_incorrect', 'no_candidate' or 'unsupported_dtype'.")
      .def_ro("why", &TuneOutcome::why)
      .def_ro("winner", &TuneOutcome::winner)
      .def_ro("message", &TuneOutcome::message, "A failure's message (each candidate's reason, the table).")
      .def_prop_ro("is_failure", &TuneOutcome::is_failure);
  nb::class_<DriverBackend>(m, "DriverBackend", "One backend of a strategy, as the tuning driver sees it.")
      .def("__init__",
           [](DriverBackend* b, std::string name, std::string kind, bool eager) {
             new (b) DriverBackend{std::move(name), std::move(kind), eager};
           },
           nb::arg("name"), nb::arg("kind"), nb::arg("eager") = false)
      .def_ro("name", &DriverBackend::name)
      .def_ro("kind", &DriverBackend::kind)
      .def_ro("eager", &DriverBackend::eager);
  nb::class_<DriverStrategy>(m, "DriverStrategy", "A strategy as the tuning driver sequences it (tune_driver.hpp).")
      .def("__init__",
           [](DriverStrategy* s, StrategyConfig choice, std::vector<DriverBackend> backends, bool first, bool propagate) {
             new (s) DriverStrategy{std::move(choice), std::move(backends), first, propagate};
           },
           nb::arg("choice"), nb::arg("backends"), nb::arg("stop_at_first_success") = false,
           nb::arg("propagate_errors") = false)
      .def_ro("choice", &DriverStrategy::choice)
      .def_ro("backends", &DriverStrategy::backends)
      .def_ro("stop_at_first_success", &DriverStrategy::stop_at_first_success)
      .def_ro("propagate_errors", &DriverStrategy::propagate_errors);
  m.def(
      "drive_tune",
      [](PyGraphTuner& t, const DriverStrategy& strategy, nb::object front_end, const std::string& reference_label) {
        PyTuneFrontEnd adapter(std::move(front_end));
        try {
          nb::gil_scoped_release release;
          return drive_tune(*t.tuner, strategy, adapter, reference_label);
        } catch (const PythonBackendError&) {
          const std::size_t backend = adapter.kept_backend();
          adapter.rethrow_kept(backend < strategy.backends.size()
                                   ? "while building " + t.tuner->report().graph + " with " +
                                         strategy.backends[backend].name
                                   : std::string());
          throw;
        } catch (const PythonFatalError&) {
          adapter.rethrow_kept("");
          throw;
        }
      },
      nb::arg("tuner"), nb::arg("strategy"), nb::arg("front_end"), nb::arg("reference_label") = "eager",
      "The one tuning driver: profiles the reference, asks each backend for its candidates, first-wins early "
      "stop, eager fallback, the strategy's choice, the outcome (failures with their message). front_end has "
      "run_reference(), add_candidates(backend, group), explain_failures(), warn(line) and fatal_errors (a tuple "
      "of exception types that stop the tune). A backend's exception propagates unchanged (with a note) when the "
      "strategy propagates errors; a fatal one always.");
  m.def("decide_outcome", &decide_outcome, nb::arg("report"), nb::arg("eager_fallback"),
        nb::arg("errors_as_mismatch"));
  m.def("group_succeeded", &group_succeeded, nb::arg("report"), nb::arg("group"),
        "A candidate of this group passed: a first-wins strategy evaluates no later group.");
}

}  // namespace aitune::python
