"""TorchCompileBackend: torch.compile candidates checked and measured by the engine next
to ONNX Runtime's, external candidates in the engine, and the checkpoint that stores the
decision and recompiles on load (CPU)."""

from __future__ import annotations

import copy
import json
import time
import types

import pytest
import torch

import aitune.torch as ait
from aitune import _core
from aitune.torch.backend import TorchCompileBackend, TorchCompileBackendConfig
from aitune.torch.backend.torch_compile_backend import TorchCompileTunedGraph
from torch_models import MLP, cpu_backend

P = _core.Precision


def test_config_validates_and_limits_precisions():
    assert TorchCompileBackendConfig().mode == "reduce-overhead"
    with pytest.raises(ValueError, match="mode must be one of"):
        TorchCompileBackendConfig(mode="fast")
    with pytest.raises(ValueError, match="precisions must be None or a non-empty sequence"):
        TorchCompileBackendConfig(precisions=("fp8",))
    with pytest.raises(ValueError, match="precisions"):
        TorchCompileBackendConfig(precisions="fp16")
    with pytest.raises(ValueError, match="precision must be one of 'any'"):
        TorchCompileBackendConfig(precision="half")
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert TorchCompileBackendConfig().candidate_precisions(cuda) == ["fp32", "tf32", "fp16"]
    assert TorchCompileBackendConfig().candidate_precisions(cpu) == ["fp32"]
    assert TorchCompileBackendConfig(precision="tf32").candidate_precisions(cuda) == ["fp32", "tf32"]
    assert TorchCompileBackendConfig(precisions=("fp16", "bf16"), precision="bf16").candidate_precisions(cuda) == [
        "bf16"]


def test_in_place_outputs_applies_only_to_a_module_with_an_in_place_variant_and_its_own_weights():
    """TorchCompileBackendConfig(in_place_outputs=True) compiles a module's in-place variant
    only where it has one and the candidate runs the module's own weights (a half-weights
    copy casts the inputs it would write); a graph without a variant cannot be made in
    place (a typed error naming the module), and a non-bool flag is refused."""

    class Step(MLP):
        def in_place_variant(self):
            return self

    config = TorchCompileBackendConfig(in_place_outputs=True)
    assert config.in_place_for(Step(), "module") and not config.in_place_for(Step(), "half")
    assert not config.in_place_for(MLP(), "module")
    assert not TorchCompileBackendConfig().in_place_for(Step(), "module")
    with pytest.raises(ValueError, match="in_place_outputs must be a bool"):
        TorchCompileBackendConfig(in_place_outputs="yes")
    graph = types.SimpleNamespace(module=MLP())
    with pytest.raises(ValueError, match="MLP offers no in_place_variant"):
        TorchCompileTunedGraph(graph, "fp32", "default", [torch.float32], device=torch.device("cpu"), in_place=True)
    with pytest.raises(ValueError, match="in_place needs the module's own weights"):
        TorchCompileTunedGraph(types.SimpleNamespace(module=Step()), "fp16", "default", [torch.float32],
                               device=torch.device("cpu"), weights="half", in_place=True)


def _tuner(outputs_scale: float = 1.0):
    builder = _core.GraphSpecBuilder()
    x = torch.randn(2, 4)
    builder.record([("x", "float32", [2, 4])], [("y", "float32", [2, 4])], 2)
    options = _core.TunerOptions()
    options.profile.warmup_calls, options.profile.window_calls, options.profile.time_cap_s = 1, 5, 0.5
    tuner = _core.GraphTuner("g", builder.build(), [([x], [x * 2], 2)], options)
    tuner.profile_reference(lambda: None)
    return tuner, x


def test_external_candidates_are_checked_profiled_and_chosen_like_any():
    tuner, x = _tuner()
    calls = []
    right = tuner.evaluate_external("double", "Ext", 0, P.STRICT, '{"k": 1}', lambda i: [x * 2],
                                    lambda: calls.append(1))
    wrong = tuner.evaluate_external("triple", "Ext", 0, P.STRICT, "{}", lambda i: [x * 3], lambda: None)

    def boom():
        raise RuntimeError("compiler exploded")

    failed = tuner.evaluate_external("boom", "Ext", 0, P.FP16, "{}", lambda i: [x * 2], boom)
    report = tuner.select(_core.StrategyConfig(_core.StrategyKind.MIN_LATENCY, performance_validation=False))
    c = report.candidates
    assert c[right].status == "selected" and c[right].p50_us is not None and len(calls) > 5
    assert json.loads(c[right].config_json) == {"k": 1}
    assert c[wrong].status == "incorrect" and "beyond" in c[wrong].reason
    assert c[failed].status == "failed" and "compiler exploded" in c[failed].reason
    assert c[failed].precision == P.FP16
    assert tuner.take_winner() is None  # the front end keeps its own runnable


def test_external_outputs_must_be_host_arrays():
    tuner, x = _tuner()
    i = tuner.evaluate_external("bad", "Ext", 0, P.STRICT, "{}", lambda i: [x.t()], lambda: None)  # not contiguous
    assert tuner.report.candidates[i].status == "failed"
    assert "contiguous host arrays" in tuner.report.candidates[i].reason


@pytest.fixture(scope="module")
def compiled_mlp():
    """One compile for the tests below (a CPU compile takes tens of seconds)."""
    import os
    import tempfile

    cache = tempfile.mkdtemp(prefix="aitune-compile-test-")
    old = os.environ.get("AITUNE_CACHE_DIR")
    os.environ["AITUNE_CACHE_DIR"] = cache
    ait.enable_performance_validation(False)
    try:
        torch.manual_seed(0)
        inner = MLP().eval()
        strategy = ait.MaxThroughputStrategy([
            cpu_backend(tune_provider_options=False),
            TorchCompileBackend(TorchCompileBackendConfig(mode="default")),
        ])
        model = ait.Module(inner, "compiled-mlp", strategy=strategy)
        ait.tune(model, [torch.randn(16) for _ in range(4)], batch_sizes=[2], disable_external_logging=True)
        yield model, inner
    finally:
        ait.enable_performance_validation(True)
        if old is None:
            os.environ.pop("AITUNE_CACHE_DIR", None)
        else:
            os.environ["AITUNE_CACHE_DIR"] = old


def test_compile_candidate_competes_with_onnx_runtime_in_one_report(compiled_mlp):
    model, _ = compiled_mlp
    (report,) = model.ait_reports.values()
    (compiled,) = [c for c in report.candidates if c.backend.startswith("TorchCompileBackend")]
    assert compiled.name == "torch.compile[mode=default] fp32" and compiled.precision == P.STRICT
    assert compiled.status in ("selected", "not chosen"), compiled.reason
    assert compiled.max_abs_error < 1e-4 and compiled.p50_us > 0
    assert json.loads(compiled.config_json)["precision"] == "fp32"
    assert any(c.backend.startswith("ONNXRuntimeBackend") and c.status in ("selected", "not chosen")
               for c in report.candidates)
    assert "torch.compile[mode=default] fp32" in report.summary_table()


def _force_compiled(model, inner):
    """The module's graph running in the compile candidate, whichever won on this machine."""
    ((key, (graph, _)),) = model._ait_tuned.items()
    tuned = TorchCompileTunedGraph(graph, "fp32", "default", [torch.float32])
    model._ait_set_tuned({key: (graph, tuned)})  # a new dispatch: its C++ half runs this graph
    return tuned


def test_compiled_graph_runs_saves_its_decision_and_recompiles_on_load(compiled_mlp, tmp_path):
    model, inner = compiled_mlp
    tuned = _force_compiled(model, inner)
    x = torch.randn(2, 16)
    torch.testing.assert_close(model(x), inner(x), atol=1e-5, rtol=1e-5)
    assert "TorchCompileBackend[mode=default, precision=fp32]" in model.ait_backends.values()

    path = ait.save(model, tmp_path / "ckpt")
    manifest = json.loads((path / "manifest.json").read_text())
    meta = json.loads(manifest["metadata"]) if isinstance(manifest.get("metadata"), str) else manifest["metadata"]
    assert meta["aitune.torch"]["format_version"] == 4  # an aitune without manifest sections refuses it
    (entry,) = manifest["graphs"]  # the manifest's torch_compile section
    assert entry["backend"] == "torch_compile" and entry["model"] == ""  # nothing but the decision is stored
    assert entry["section"]["config"] == tuned.config() == {"precision": "fp32", "mode": "default", "dynamic": None,
                                                            "output_dtypes": ["float32"]}

    fresh = ait.Module(MLP().eval(), "compiled-mlp")
    fresh.ait_module.load_state_dict(inner.state_dict())  # a compiled graph runs the module's own weights
    start = time.perf_counter()
    ait.load(fresh, path)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    out = fresh(x)  # compiles here
    first_call_s = time.perf_counter() - start
    torch.testing.assert_close(out, inner(x), atol=1e-5, rtol=1e-5)
    assert "TorchCompileBackend[mode=default, precision=fp32]" in fresh.ait_backends.values()
    print(f"ait.load {load_s:.3f} s, first call (recompile) {first_call_s:.1f} s")


def test_modes_and_compile_time_limit_are_validated_and_planned():
    config = TorchCompileBackendConfig(modes=("default", "reduce-overhead", "max-autotune"), max_compile_s=60)
    assert config.candidate_modes() == ("default", "reduce-overhead", "max-autotune")
    assert TorchCompileBackendConfig(mode="default").candidate_modes() == ("default",)
    for bad in ("default", (), ("default", "default"), ("fast",)):
        with pytest.raises(ValueError, match="modes"):
            TorchCompileBackendConfig(modes=bad)
    for bad in (0, -1, True, "10"):
        with pytest.raises(ValueError, match="max_compile_s"):
            TorchCompileBackendConfig(max_compile_s=bad)


def test_a_compile_over_max_compile_s_fails_its_candidate_with_its_time():
    backend = TorchCompileBackend(TorchCompileBackendConfig(mode="default", max_compile_s=0.01))

    def slow_module_call(tuned):
        time.sleep(0.05)  # the first call: the compile
        return lambda: None

    run = backend._timed_call(types.SimpleNamespace(in_place=False), [], slow_module_call)
    with pytest.raises(_core.InvalidArgumentError, match=r"compiling took .* over max_compile_s=0.01"):
        run()


def test_compile_candidate_returns_the_compiled_outputs_without_copy_or_cast(compiled_mlp, monkeypatch):
    """Issue 28: the candidate adds nothing to torch.compile: no copy (clone) and no cast
    of its outputs after the compiled code; they keep the user's module's dtype."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model, inner = compiled_mlp
    tuned = _force_compiled(model, inner)
    x = torch.randn(2, 16)
    with torch.no_grad():
        tuned.infer([x])  # compiles

        class Ops(TorchDispatchMode):
            seen: list = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                Ops.seen.append(func.overloadpacket.__name__)
                return func(*args, **(kwargs or {}))

        with Ops():
            (out,) = tuned.infer([x])
        assert not {"clone", "_to_copy", "copy_", "to"} & set(Ops.seen), Ops.seen
        assert out.dtype == inner(x).dtype == torch.float32
        torch.testing.assert_close(out, inner(x), atol=1e-5, rtol=1e-5)

        produced = torch.randn(2, 8)
        monkeypatch.setattr(tuned, "_compiled", lambda *args, **kwargs: (produced,))
        (handed,) = tuned.infer([x])
        assert handed is produced and handed.data_ptr() == produced.data_ptr()


def _recorded_mlp():
    """An MLP's recorded graph (tuned with eager: no compile, no export)."""
    from aitune.torch.backend import TorchEagerBackend

    torch.manual_seed(0)
    inner = MLP().eval()
    model = ait.Module(inner, "half-mlp", strategy=ait.OneBackendStrategy(TorchEagerBackend()))
    ait.tune(model, [torch.randn(16) for _ in range(2)])
    (graph,) = model.ait_graphs
    return inner, graph


def test_half_weights_candidate_runs_a_converted_copy_and_leaves_the_module_alone():
    """The half-weights variant: the module's floating weights converted once, in a copy
    (the user's module keeps its fp32 weights), float inputs cast in, outputs cast back
    unless output_dtype="compute"; its name and config say so, with the copy's bytes.
    (The forward that is compiled, run uncompiled: no compile in this test.)"""
    inner, graph = _recorded_mlp()
    x = torch.randn(2, 16)
    tuned = TorchCompileTunedGraph(graph, "bf16", "default", [torch.float32], weights="half")
    forward = tuned._compiled._orig_mod
    assert {p.dtype for p in forward.inner.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in inner.parameters()} == {torch.float32}  # the user's module is untouched
    assert tuned.weights_copy_bytes == sum(p.numel() * 2 for p in inner.parameters())
    with torch.no_grad():
        (out,) = forward(x)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, inner(x), atol=5e-2, rtol=5e-2)
        (computed,) = TorchCompileTunedGraph(graph, "bf16", "default", [torch.float32], weights="half",
                                             output_dtype="compute")._compiled._orig_mod(x)
        assert computed.dtype == torch.bfloat16
        (autocast,) = TorchCompileTunedGraph(graph, "bf16", "default", [torch.float32],
                                             output_dtype="compute")._compiled._orig_mod(x)
        assert autocast.dtype == torch.bfloat16
    assert tuned.config()["weights"] == "half" and "output_dtype" not in tuned.config()
    assert tuned.describe() == "TorchCompileBackend[mode=default, precision=bf16, weights=half]"
    # fp32 candidates compute in the module's dtypes: output_dtype changes nothing there
    assert TorchCompileTunedGraph(graph, "fp32", "default", [torch.float32], output_dtype="compute").config() == {
        "precision": "fp32", "mode": "default", "dynamic": None, "output_dtypes": ["float32"]}
    with pytest.raises(ValueError, match="half weights need precision fp16 or bf16"):
        TorchCompileTunedGraph(graph, "fp32", "default", [torch.float32], weights="half")
    for bad in ({"half_weights": "yes"}, {"output_dtype": "fp16"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TorchCompileBackendConfig(**bad)
    config = TorchCompileBackendConfig(precisions=("fp32", "fp16", "bf16"), half_weights=True)
    assert config.candidate_variants(torch.device("cpu")) == [
        ("fp32", "module"), ("fp16", "module"), ("fp16", "half"), ("bf16", "module"), ("bf16", "half")]


def test_half_weights_by_default_on_cuda_where_the_copy_fits(monkeypatch):
    """half_weights=None (the default): the half-weights candidate joins fp16 / bf16 on CUDA
    (autocast's per-call weight casts cost GPT-2 + LM head 10 % against bare compile on the
    H200, the copy won 15 %), never on the CPU; left out for a module already in that dtype
    and for a copy that would leave under a quarter of the device's free memory. An explicit
    True tries it regardless; False never. (Decided without a GPU: the free memory is faked.)"""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    default = TorchCompileBackendConfig()
    assert default.half_weights is None
    assert default.candidate_variants(cuda) == [("fp32", "module"), ("tf32", "module"), ("fp16", "module"),
                                               ("fp16", "half")]
    assert default.candidate_variants(cpu) == [("fp32", "module")]
    assert TorchCompileBackendConfig(precisions=("bf16",)).candidate_variants(cpu) == [("bf16", "module")]
    assert TorchCompileBackendConfig(half_weights=False).candidate_variants(cuda) == [
        ("fp32", "module"), ("tf32", "module"), ("fp16", "module")]
    module = MLP()
    copy_bytes = sum(p.numel() * 2 for p in module.parameters())
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (copy_bytes * 2, copy_bytes * 10))
    assert default.half_weights_plan(module, "fp16", cuda) is None
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (copy_bytes, copy_bytes * 10))
    why = default.half_weights_plan(module, "fp16", cuda)
    assert why is not None and "less than a quarter" in why and "half_weights=True" in why
    assert TorchCompileBackendConfig(half_weights=True).half_weights_plan(module, "fp16", cuda) is None
    assert "fp16 already" in default.half_weights_plan(copy.deepcopy(module).half(), "fp16", cuda)
    assert default.half_weights_plan(copy.deepcopy(module).half(), "bf16", cpu) is None


def test_half_weights_and_compute_dtype_outputs_tune_and_the_user_is_told(caplog, tmp_path):
    """On the CPU, bf16: both candidates (autocast, half weights) compile, are judged by the
    bf16 rule and named apart; with output_dtype="compute" the tuned module returns bf16,
    which tuning says in a warning, and a checkpoint keeps both settings."""
    import logging

    torch.manual_seed(0)
    inner = MLP().eval()
    backend = TorchCompileBackend(TorchCompileBackendConfig(mode="default", precisions=("bf16",), half_weights=True,
                                                            output_dtype="compute"))
    model = ait.Module(inner, "half-compute-mlp", strategy=ait.OneBackendStrategy(backend))
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.tune(model, [torch.randn(16) for _ in range(4)], batch_sizes=[2], performance_validation=False)
    (report,) = model.ait_reports.values()
    names = {c.name: c for c in report.candidates}
    half = names["torch.compile[mode=default] bf16 (half weights, bf16 outputs)"]
    assert "torch.compile[mode=default] bf16 (bf16 outputs)" in names
    assert half.status in ("selected", "not chosen"), half.reason
    config = json.loads(half.config_json)
    assert config["weights"] == "half" and config["weights_copy_bytes"] == sum(p.numel() * 2 for p in inner.parameters())
    x = torch.randn(2, 16)
    with torch.no_grad():
        assert model(x).dtype == torch.bfloat16
    assert any("returns its outputs as bf16 computes them" in r.getMessage() for r in caplog.records)
    (backend_name,) = model.ait_backends.values()
    assert "output_dtype=compute" in backend_name
    fresh = ait.Module(MLP().eval(), "half-compute-mlp")
    fresh.ait_module.load_state_dict(inner.state_dict())
    ait.load(fresh, ait.save(model, tmp_path / "ckpt"))
    assert list(fresh.ait_backends.values()) == [backend_name]  # weights and output_dtype come back


class _ProdHead(torch.nn.Module):
    """A linear layer and a product: ``prod`` is one of the ops CPU autocast runs in fp32."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        h = self.fc(x)
        return h, h.prod(-1)


def test_a_module_already_in_the_reduced_dtype_is_compiled_as_it_is_without_autocast():
    """The decode benchmark's model is ``.half()``: the fp16 candidate compiled it under
    autocast(fp16) (the half-weights variant is left out: the weights are fp16 already),
    which a user's bare torch.compile of that module does not do; autocast recasts the ops
    it lists (softmax, layer_norm, exp, sum, pow on CUDA; prod on the CPU) to fp32 and back,
    kernels and results the user's compile has not. A module whose floating weights are all
    in the candidate's dtype is now compiled as it is: its outputs are eager's own (dtype
    and values), with output_dtype="compute" too. A module in fp32 keeps autocast."""
    from aitune.torch.backend import TorchEagerBackend

    torch.manual_seed(0)
    inner = _ProdHead().to(torch.bfloat16).eval()
    model = ait.Module(inner, "bf16-prod", strategy=ait.OneBackendStrategy(TorchEagerBackend()))
    ait.tune(model, [torch.randn(16, dtype=torch.bfloat16) for _ in range(2)])
    (graph,) = model.ait_graphs
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = inner(x)
        for output_dtype in ("module", "compute"):
            tuned = TorchCompileTunedGraph(graph, "bf16", "default", [torch.bfloat16, torch.bfloat16],
                                           output_dtype=output_dtype)
            out = tuned._compiled._orig_mod(x)  # the forward that is compiled, run uncompiled
            assert [t.dtype for t in out] == [torch.bfloat16, torch.bfloat16]
            assert all(torch.equal(a, b) for a, b in zip(out, expected))
        # fp32 weights: the bf16 candidate is autocast (prod computed in fp32 there)
        fp32 = _ProdHead().eval()
        fp32_model = ait.Module(fp32, "fp32-prod", strategy=ait.OneBackendStrategy(TorchEagerBackend()))
        ait.tune(fp32_model, [torch.randn(16) for _ in range(2)])
        (fp32_graph,) = fp32_model.ait_graphs
        computed = TorchCompileTunedGraph(fp32_graph, "bf16", "default", [torch.float32, torch.float32],
                                          output_dtype="compute")._compiled._orig_mod(x.float())
        assert [t.dtype for t in computed] == [torch.bfloat16, torch.float32]


class _Relu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc(x).relu()


def test_each_compile_candidate_is_a_function_of_its_own_for_dynamo():
    """Every candidate was torch.compile of one function, ``_PrecisionForward.forward``, and
    dynamo keeps compiled code, its recompile limit and automatic dynamic shapes per code
    object: the second module tuned in a process (a decode step after its prefill) was
    compiled as a recompile of the first one's candidate, the sizes that differed made
    symbolic (``addmm_s33_8_16``: dynamic-shape kernels a user's compile of that module
    has not), and past 8 candidates dynamo ran them eagerly. Each candidate is now a
    function of its own: compiled once, with its own static shapes."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    codes = []
    # A cache hit counts no matmul. inductor's own patch, not monkeypatch: monkeypatch's undo of
    # a config attribute deleted it (every later compile in the process failed on it).
    with torch._inductor.config.patch(force_disable_caches=True):
        for n, rows in enumerate((3, 5)):
            model = ait.Module(_Relu().eval(), f"own-function-{n}", strategy=ait.OneBackendStrategy(
                TorchCompileBackend(TorchCompileBackendConfig(mode="default"))))
            ait.tune(model, lambda size, rows=rows: [torch.randn(rows, 16)], batch_sizes=[1], progress=False,
                     performance_validation=False)
            ((_, (_, tuned)),) = model._ait_tuned.items()
            codes.append(tuned._compiled._orig_mod.forward.__code__)
    assert sorted(counters["aten_mm_info"]) == ["aten.addmm_3_8_16", "aten.addmm_5_8_16"]  # static shapes
    assert codes[0] is not codes[1]
    assert [len(_debug_get_cache_entry_list(code)) for code in codes] == [1, 1]  # no recompile
