"""Strategies, correctness against eager, performance validation, batch search, reports:
the C++ tuning engine as the torch front end drives it (CPU provider)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import aitune
import aitune.torch as ait
from aitune import _core
from aitune.torch import ModuleState, TorchEagerBackend
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig
from torch_models import MLP, cpu_backend

TOL = dict(atol=1e-4, rtol=1e-4)


def _report(model: ait.Module):
    (report,) = model.ait_reports.values()
    return report


class BranchOnSign(torch.nn.Module):
    """Python control flow on the data: the trace exporter bakes in the branch its example
    input took, so the export is wrong for every sample that takes the other one."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return -self.fc(x)


def _half_positive_half_negative():
    # Batches of 1 and of 2 (consecutive pairs) keep the sign of their samples.
    return [torch.full((4,), 1.0) + 0.1 * i for i in range(4)] + [torch.full((4,), -1.0) - 0.1 * i for i in range(4)]


def test_trace_export_wrong_for_half_the_samples_is_rejected_and_eager_kept():
    inner = BranchOnSign().eval()
    # allow_trace_warnings: past the refusal of the export (test_semantics_control_flow), to the check
    strategy = ait.FirstWinsStrategy([cpu_backend(use_dynamo=False, allow_trace_warnings=True), TorchEagerBackend()])
    model = ait.Module(inner, "branch", strategy=strategy)
    ait.tune(model, _half_positive_half_negative(), disable_external_logging=True)
    assert model.ait_state is ModuleState.TUNED
    assert list(model.ait_backends.values()) == ["TorchEagerBackend"]
    report = _report(model)
    assert report.winner is None
    assert {c.status for c in report.candidates} == {"incorrect"}
    assert all("output_0" in c.reason and "elements beyond atol" in c.reason for c in report.candidates)
    for x in (torch.full((2, 4), 1.0), torch.full((2, 4), -1.0)):  # both branches stay right
        torch.testing.assert_close(model(x), inner(x), **TOL)


def test_one_backend_with_only_wrong_candidates_raises_numeric_mismatch():
    model = ait.Module(BranchOnSign().eval(), "branch",
                       strategy=ait.OneBackendStrategy(cpu_backend(use_dynamo=False, allow_trace_warnings=True)))
    with pytest.raises(ait.NumericMismatchError, match=r"every candidate differs from eager.*output_0"):
        ait.tune(model, _half_positive_half_negative(), ignore_failing_modules=False, disable_external_logging=True)
    assert model.ait_state is ModuleState.PASSTHROUGH


@pytest.mark.parametrize(
    "make",
    [
        lambda backends: ait.MaxThroughputStrategy(backends),
        lambda backends: ait.MinLatencyStrategy(backends),
        lambda backends: ait.LatencyBudgetStrategy(backends, budget_ms=1000.0),
    ],
    ids=["max-throughput", "min-latency", "latency-budget"],
)
def test_measuring_strategies_see_every_variant_of_every_backend(make):
    inner = MLP().eval()
    model = ait.Module(inner, "mlp", strategy=make([cpu_backend(use_dynamo=True), cpu_backend(use_dynamo=False)]))
    ait.tune(model, torch.randn(16))
    report = _report(model)
    assert len(report.candidates) == 6  # 3 CPU variants x 2 exporters
    assert {c.group for c in report.candidates} == {0, 1}
    assert report.winner is not None
    winner = report.candidates[report.winner]
    assert winner.status == "selected"
    passed = [c for c in report.candidates if c.p50_us is not None]
    assert len(passed) == 6 and all(c.max_abs_error < 1e-4 for c in passed)
    if isinstance(model.ait_strategy, ait.MinLatencyStrategy):
        assert winner.p50_us == min(c.p50_us for c in passed)
    else:
        assert winner.throughput == max(c.throughput for c in passed)
    x = torch.randn(2, 16)
    torch.testing.assert_close(model(x), inner(x), **TOL)
    assert winner.name in next(iter(model.ait_backends.values()))


def test_latency_budget_nobody_meets_takes_the_lowest_latency():
    model = ait.Module(MLP().eval(), "mlp", strategy=ait.LatencyBudgetStrategy([cpu_backend()], budget_ms=1e-9))
    ait.tune(model, torch.randn(16))
    report = _report(model)
    assert "no candidate meets" in report.decision
    winner = report.candidates[report.winner]
    assert winner.p50_us == min(c.p50_us for c in report.candidates if c.p50_us is not None)
    assert any(c.status == "over budget" for c in report.candidates)


def test_strategy_arguments_are_checked():
    with pytest.raises(ValueError, match="budget_ms"):
        ait.LatencyBudgetStrategy([cpu_backend()], budget_ms=0)
    with pytest.raises(TypeError, match="non-empty"):
        ait.MaxThroughputStrategy([])
    with pytest.raises(TypeError, match="Backend"):
        ait.MinLatencyStrategy(["cpu"])


class ManySmallOps(torch.nn.Module):
    """Eager pays Python and dispatch overhead per op; ORT runs the same graph in C++."""

    def forward(self, x):
        for _ in range(100):
            x = x * 1.0001 + 0.0001
        return x


def test_performance_validation_keeps_a_backend_only_when_it_beats_eager(caplog):
    ait.enable_performance_validation(True)
    model = ait.Module(ManySmallOps().eval(), "ops", strategy=ait.OneBackendStrategy(cpu_backend()))
    ait.tune(model, torch.randn(8))
    winner = _report(model).candidates[_report(model).winner]
    assert winner.speedup_vs_eager > 1.01
    assert "ONNXRuntimeBackend" in next(iter(model.ait_backends.values()))

    ait.enable_performance_validation(True, min_speedup=1e6)  # nothing is a million times faster
    model = ait.Module(ManySmallOps().eval(), "ops", strategy=ait.OneBackendStrategy(cpu_backend()))
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.tune(model, torch.randn(8))
    assert model.ait_state is ModuleState.TUNED
    (described,) = model.ait_backends.values()
    assert described.startswith("TorchEagerBackend (") and "eager kept" in described
    assert "eager kept" in caplog.text
    assert any(c.status == "slower than eager" for c in _report(model).candidates)
    x = torch.randn(3, 8)
    torch.testing.assert_close(model(x), ManySmallOps()(x))


def test_performance_validation_arguments_are_checked():
    with pytest.raises(TypeError):
        ait.enable_performance_validation("yes")
    with pytest.raises(ValueError, match="min_speedup"):
        ait.enable_performance_validation(True, min_speedup=0)
    with pytest.raises(ValueError, match="max_batch_size"):
        ait.enable_find_max_batch_size(True, max_batch_size=0)


def test_find_max_batch_size_widens_the_batch_range():
    ait.enable_find_max_batch_size(True, max_batch_size=16)
    inner = MLP().eval()
    model = ait.Module(inner, "mlp", strategy=ait.OneBackendStrategy(cpu_backend()))
    ait.tune(model, torch.randn(16), batch_sizes=[1, 2])
    report = _report(model)
    largest = report.max_batch_size
    assert largest is not None and 4 <= largest <= 16
    x = torch.randn(largest, 16)
    torch.testing.assert_close(model(x), inner(x), **TOL)
    with pytest.raises(_core.ShapeMismatchError):
        model(torch.randn(largest + 1, 16))
    assert json.loads(report.to_json())["batch_search"]["correctness"] == "passed"


class _LargeBatchPath(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.fc(x)
        if x.shape[0] > 2:  # a large-batch code path
            y = y * 10
        return y


def test_find_max_batch_size_checks_the_widened_batch_against_eager_run_at_it():
    """Recorded at batches 1 and 2, the search widened the range to 4..16 after checking
    the graph against the batch-2 sample's outputs repeated: a forward that computes
    otherwise above batch 2 returned the small-batch branch there, silently (10x off).
    The widened batch is now checked against eager run at it, so the range stays as
    recorded, the report says why, and batch 3 is refused."""
    inner = _LargeBatchPath().eval()
    model = ait.Module(inner, "large-batch-path", strategy=ait.OneBackendStrategy(cpu_backend()))
    ait.tune(model, torch.randn(16), batch_sizes=[1, 2], find_max_batch_size=True, max_batch_size=16)
    report = _report(model)
    assert report.max_batch_size == 2
    correctness = json.loads(report.to_json())["batch_search"]["correctness"]
    assert correctness not in ("passed", "not needed", "not run") and "max abs" in correctness.lower()
    x = torch.randn(2, 16)
    torch.testing.assert_close(model(x), inner(x), **TOL)
    with pytest.raises(_core.ShapeMismatchError):
        model(torch.randn(3, 16))


def test_the_switches_are_per_call_tune_options_with_process_defaults():
    """ait.tune(performance_validation=, min_speedup=, find_max_batch_size=, max_batch_size=)
    decide for one call; left out, the defaults set by ait.enable_* apply (conftest turns
    validation off for every test)."""
    assert not ait.performance_validation_enabled()
    model = ait.Module(ManySmallOps().eval(), "ops", strategy=ait.OneBackendStrategy(cpu_backend()))
    ait.tune(model, torch.randn(8), performance_validation=True, min_speedup=1e6)  # this call only
    (described,) = model.ait_backends.values()
    assert "eager kept" in described
    assert not ait.performance_validation_enabled()  # the default is untouched
    ait.tune(model, torch.randn(8))  # the default again: no validation, the backend stays
    assert "ONNXRuntimeBackend" in next(iter(model.ait_backends.values()))

    assert ait.TuneOptions().find_max_batch_size is False
    ait.enable_find_max_batch_size(True, max_batch_size=8)
    options = ait.TuneOptions()
    assert options.find_max_batch_size and options.max_batch_size == 8
    assert options.tuner_options().max_batch_size == 8
    assert not ait.TuneOptions(find_max_batch_size=False).tuner_options().find_max_batch_size
    config = ait.TuneOptions(performance_validation=True, min_speedup=2.0).strategy_config(_core.StrategyKind.MIN_LATENCY)
    assert config.performance_validation and config.min_speedup == 2.0
    with pytest.raises(ValueError, match="min_speedup"):
        ait.tune(model, torch.randn(8), min_speedup=-1.0)
    with pytest.raises(ValueError, match="max_batch_size"):
        ait.TuneOptions(max_batch_size=0)


def test_strategies_are_plain_data():
    backend = cpu_backend()
    one = ait.OneBackendStrategy(backend=backend)
    assert one.backends == [backend] and one.kind is _core.StrategyKind.ONE_BACKEND and one.propagate_errors
    budget = ait.LatencyBudgetStrategy([backend], budget_ms=5)
    assert budget.backends == [backend] and budget.latency_budget_ms == 5.0 and budget.budget_ms == 5.0
    first = ait.FirstWinsStrategy((backend, TorchEagerBackend()))
    assert first.stop_at_first_success and isinstance(first.backends, list) and len(first.backends) == 2
    assert not hasattr(first, "tune")  # the driver (graph_tuning.tune_graph) reads strategies, they do not drive
    with pytest.raises(TypeError, match="backend must be a Backend"):
        ait.OneBackendStrategy("cpu")
    with pytest.raises(TypeError, match="one Backend"):
        ait.MaxThroughputStrategy(backend)
    assert repr(budget).startswith("LatencyBudgetStrategy([ONNXRuntimeBackend[")


def test_tolerance_overrides_accept_a_known_deviation():
    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand_like(x)  # eager and ORT never agree closer than [0, 1)

    strict = ait.Module(Noisy(), "noisy", strategy=ait.OneBackendStrategy(cpu_backend(use_dynamo=False)))
    with pytest.raises(ait.NondeterministicModuleError):  # eager cannot be the reference at the default tolerance
        ait.tune(strict, torch.randn(32), ignore_failing_modules=False)
    loose = ait.Module(Noisy(), "noisy", strategy=ait.OneBackendStrategy(cpu_backend(use_dynamo=False)))
    # the user's tolerance holds for eager against itself too: within it, eager is a reference
    ait.tune(loose, torch.randn(32), output_tolerances={"output_0": (1.0, 0.0)}, ignore_failing_modules=False)
    assert loose.ait_state is ModuleState.TUNED
    assert "ONNXRuntimeBackend" in next(iter(loose.ait_backends.values()))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tolerance=(1e-3,)), "tolerance must be an \\(atol, rtol\\) pair"),
        (dict(tolerance=(-1, 0)), "must not be negative"),
        (dict(output_tolerances={"output_0": "tight"}), "output_tolerances\\['output_0'\\]"),
        # NaN compares false with every error: a NaN atol or rtol would pass every element
        (dict(tolerance=(float("nan"), 1e-3)), "tolerance must not be NaN"),
        (dict(output_tolerances={"output_0": (1e-3, float("nan"))}), "output_tolerances\\['output_0'\\] must not be NaN"),
        # an infinite bound passes any output as NaN does (a sign-flipped branch was selected)
        (dict(tolerance=(float("inf"), 0.0)), "tolerance must be finite"),
        (dict(output_tolerances={"output_0": (0.0, float("inf"))}), "output_tolerances\\['output_0'\\] must be finite"),
        # numbers, not what float() reads: a string or a bool was taken
        (dict(tolerance=("1e-3", "1e-3")), "tolerance must be an \\(atol, rtol\\) pair of numbers"),
        (dict(output_tolerances={"output_0": (True, False)}), "must be an \\(atol, rtol\\) pair of numbers"),
        # without a metric the drop allowed is ignored: the user believes a rule is applied
        (dict(max_accuracy_drop=0.01), "max_accuracy_drop=0.01 is given without accuracy"),
    ],
)
def test_bad_tolerances_fail_before_recording(kwargs, message):
    model = ait.Module(MLP().eval(), "mlp", strategy=ait.OneBackendStrategy(cpu_backend()))
    with pytest.raises(ValueError, match=message):
        ait.tune(model, torch.randn(16), **kwargs)
    assert model.ait_state is ModuleState.INIT


def test_output_tolerance_naming_no_output_is_refused_naming_the_outputs():
    """A typo in output_tolerances left that output at the default tolerance, silently (the
    CLI's --output-tolerance already refused an unknown name)."""
    model = ait.Module(MLP().eval(), "mlp", strategy=ait.OneBackendStrategy(cpu_backend()))
    with pytest.raises(ValueError, match=r"output_tolerances names 'logits', which no recorded graph outputs; "
                                         r"the outputs are: 'output_0'"):
        ait.tune(model, torch.randn(16), output_tolerances={"logits": (1e-2, 1e-2)}, progress=False)
    assert model.ait_state is ModuleState.INIT


def test_variants_can_be_switched_off():
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu", tune_provider_options=False))
    model = ait.Module(MLP().eval(), "mlp", strategy=ait.OneBackendStrategy(backend))
    ait.tune(model, torch.randn(16))
    assert [c.name for c in _report(model).candidates] == ["cpu"]
    with pytest.raises(ValueError, match="provider_options"):
        ONNXRuntimeBackendConfig(provider_options={"use_tf32": [0]})


def test_report_file_summary_table_and_logging(cache_dir, caplog):
    model = ait.Module(MLP().eval(), "mlp", strategy=ait.OneBackendStrategy(cpu_backend()))
    with caplog.at_level(logging.DEBUG, logger="aitune"):
        ait.tune(model, torch.randn(16))
    (graph,) = model.ait_graphs
    report = json.loads((cache_dir / "mlp" / graph.key / "tune_report.json").read_text())
    assert report["graph"] == f"mlp/{graph.key}"
    assert report["eager"]["host_us"]["p50"] > 0
    assert len(report["candidates"]) == 3
    for candidate in report["candidates"]:
        assert candidate["correctness"]["samples"][0]["outputs"][0]["name"] == "output_0"
        assert set(candidate["profile"]["host_us"]) >= {"p50", "p90", "p95", "p99", "mean", "std"}
        assert candidate["session_creation_ms"] > 0 and candidate["first_run_ms"] > 0
    # The summary table goes through logging at INFO, the engine's steps at DEBUG.
    assert "candidate" in caplog.text and "speed-up" in caplog.text and "decision:" in caplog.text
    assert "creating the session" in caplog.text


def test_progress_bar_counts_every_candidate(monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    bars = []

    class Recorder:
        def __init__(self, total, **kwargs):
            self.total, self.updates = total, 0
            bars.append(self)

        def update(self, n):
            self.updates += n

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(tqdm, "tqdm", Recorder)
    model = ait.Module(MLP().eval(), "mlp", strategy=ait.MaxThroughputStrategy([cpu_backend(), cpu_backend(use_dynamo=False)]))
    ait.tune(model, torch.randn(16))
    (bar,) = bars
    # Per backend: three CPU variants and one fused candidate, planned and dropped (a ReLU
    # MLP has nothing to fuse); every planned candidate advances the bar once.
    assert bar.total == 8 and bar.updates == 8


def test_tensorrt_variants_get_their_own_engine_and_timing_caches(tmp_path):
    """TensorRT is not on the test machines: the composition of its candidates is checked
    without a session (engine caches are what a checkpoint saves so loads do not rebuild)."""
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="tensorrt",
                                                          provider_options={"trt_max_workspace_size": "1073741824"}))
    builder = _core.GraphSpecBuilder()
    for batch in (1, 4):
        builder.record([("input_x", "float32", [batch, 16])], [("output_0", "float32", [batch, 8])], batch)
    spec = builder.build()
    candidates = backend.plan(spec, torch.nn.Linear(16, 8), torch.device("cuda", 0), tmp_path)
    assert [c.name.split("[")[0] for c in candidates] == ["tensorrt"] * 3
    paths = set()
    for i, c in enumerate(candidates):
        options = c.config.provider_options
        assert options["trt_engine_cache_path"] == str(tmp_path / "trt" / f"variant_{i}" / "trt_engines")
        assert options["trt_timing_cache_enable"] == "1"
        assert options["trt_profile_min_shapes"] == "input_x:1x16"
        assert options["trt_profile_max_shapes"] == "input_x:4x16"
        assert options["trt_max_workspace_size"] == "1073741824"  # the caller's option kept
        paths.add(options["trt_engine_cache_path"])
    assert len(paths) == 3
    assert candidates[1].precision == _core.Precision.FP16


@pytest.mark.parametrize("strategy_type", [ait.MaxThroughputStrategy, ait.MinLatencyStrategy])
def test_eager_listed_first_in_a_competing_strategy_competes_and_stops_no_backend(strategy_type):
    """Every backend of MaxThroughput / MinLatency competes; TorchEagerBackend listed first
    stopped the driver there before ("no candidates": the ONNX Runtime backend never ran).
    Now eager competes wherever it is listed: a candidate wins only at least as fast as eager
    (performance validation off), otherwise eager is kept and the reason says why."""
    torch.manual_seed(0)
    model = ait.Module(torch.nn.Linear(16, 4).eval(), f"eager_first_{strategy_type.__name__}",
                       strategy=strategy_type([TorchEagerBackend(), cpu_backend()]))
    ait.tune(model, [torch.randn(16) for _ in range(2)], performance_validation=False, disable_external_logging=True)
    report = _report(model)
    assert len(report.candidates) >= 2 and all(c.name.startswith("cpu") for c in report.candidates)
    assert "eager competing" in json.loads(report.to_json())["strategy"]
    if report.winner is None:  # eager was faster: kept, by the strategy's own terms
        (first,) = [c for c in report.candidates if c.status == "slower than eager"]
        assert "eager competes: the strategy lists TorchEagerBackend" in first.reason and "< required 1" in first.reason
        assert list(model.ait_backends.values())[0].startswith("TorchEagerBackend")
    else:
        assert report.candidates[report.winner].speedup_vs_eager >= 1.0


def test_the_report_names_one_winner_when_two_backends_make_candidates_of_the_same_names():
    """A dynamo and a trace ONNX Runtime backend make candidates of the same names: the page
    badged both as the winner, and the JSON named only the (ambiguous) name."""
    torch.manual_seed(0)
    backends = [cpu_backend(), cpu_backend(use_dynamo=False)]
    model = ait.Module(torch.nn.Linear(16, 4).eval(), "two_of_each_name", strategy=ait.MaxThroughputStrategy(backends))
    ait.tune(model, [torch.randn(16) for _ in range(2)], performance_validation=False, disable_external_logging=True)
    report = _report(model)
    j = json.loads(report.to_json())
    names = [c["name"] for c in j["candidates"]]
    assert len(names) > len(set(names))  # the premise: names repeat
    assert j["winner_index"] == report.winner and j["candidates"][j["winner_index"]]["status"] == "selected"
    assert j["winner"] == names[report.winner] and j["winner_backend"] == j["candidates"][report.winner]["backend"]
    page = report.to_html()
    assert page.count('class="status winner"') == 1
    assert f'id="candidate-{report.winner}"><h3>{report.winner + 1}. ' in page
    assert f'href="#candidate-{report.winner}"' in page  # the summary links to it


class _ReturnsBatchFlag(torch.nn.Module):
    def __init__(self, flag):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.flag = flag

    def forward(self, x):
        return self.fc(x), self.flag(x.shape[0])  # a "large-batch path" flag handed to the caller


@pytest.mark.parametrize(("flag", "batch_sizes", "widest", "differs"), [
    (lambda batch: batch > 2, [1, 2], 16, 16),
    (lambda batch: batch % 3 != 0, [1, 2], 16, 3),  # the recorded value again at 16, not at 3
], ids=["above-2", "not-multiple-of-3"])
def test_find_max_batch_size_checks_the_non_tensor_outputs_of_the_widened_range(flag, batch_sizes, widest, differs):
    """Recorded at batches 1 and 2 (the flag the same at both), the search widened the range
    to 16 after comparing the tensors only: the graph returned the recorded flag at every
    batch up to 16, where eager says otherwise at 3, silently.
    The flag eager returns at the widened batch, and at the smallest batch the range would
    widen to, is compared too: the range stays as recorded, the report says why (the
    batch and the output), and batch 3 is refused."""
    inner = _ReturnsBatchFlag(flag).eval()
    model = ait.Module(inner, "batch-flag", strategy=ait.OneBackendStrategy(cpu_backend()))
    ait.tune(model, torch.randn(16), batch_sizes=batch_sizes, find_max_batch_size=True, max_batch_size=widest,
             ignore_failing_modules=False, progress=False)
    report = _report(model)
    assert report.max_batch_size == max(batch_sizes)
    correctness = json.loads(report.to_json())["batch_search"]["correctness"]
    recorded = flag(max(batch_sizes))
    assert f"at batch {differs} " in correctness and f"output [1]: bool {recorded}" in correctness, correctness
    for batch in batch_sizes:
        assert model(torch.randn(batch, 16))[1] is flag(batch)
    with pytest.raises(_core.ShapeMismatchError):
        model(torch.randn(3, 16))


def test_a_numeric_mismatch_is_a_tuning_error():
    """Code that catches the tune's failures (``except ait.TuningError``) missed the one a
    OneBackendStrategy raises when every candidate is wrong (a session-37 probe)."""
    assert issubclass(ait.NumericMismatchError, ait.TuningError)
    assert issubclass(ait.TuningError, aitune.AituneError)
