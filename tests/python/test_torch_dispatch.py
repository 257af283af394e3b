"""The routes of a tuned ait.Module's dispatch (calls of plain tensors served in C++ after
the first of their form): they give what the general path gives, and reject, fall back
or raise exactly as that path does."""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch
from torch_models import MLP, cpu_strategy

import aitune
import aitune.torch as ait
from aitune.torch import flatten
from aitune.torch.dispatch import call_layout, positional_defaults


class TwoInputs(torch.nn.Module):
    """Two tensors and a non-tensor default, all positional-or-keyword."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x, y, scale=2.0):
        return {"out": self.fc(x) * scale + y, "x_sum": x.sum(-1)}


def _strategy():
    return cpu_strategy(use_dynamo=False, tune_provider_options=False)


def _tuned(module, name, samples, **kwargs):
    model = ait.Module(module, name, strategy=_strategy(), **kwargs)
    ait.tune(model, samples)
    return model


def _no_general_path(monkeypatch):
    """From now on, a call that a route does not serve fails the test."""
    monkeypatch.setattr(flatten, "flatten_arguments", lambda *a: pytest.fail("the general path ran"))


def _assert_identical(a, b):
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_identical(a[key], b[key])
    else:
        assert torch.equal(a, b) and a.dtype == b.dtype and a.shape == b.shape


def _error_text(call) -> tuple[type, str, list]:
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value), list(getattr(info.value, "__notes__", []))


def test_call_layout_admits_only_calls_that_leave_fixed_defaults_out():
    def forward(x, y, scale=2.0, mask=None, weights=[1.0]):  # noqa: B006 - a mutable default on purpose
        pass

    import inspect

    positional = positional_defaults(inspect.signature(forward))
    assert call_layout(positional, 1, ()) is None  # y is required
    assert call_layout(positional, 2, ()) is None  # weights' default is mutable
    assert call_layout(positional, 2, ("weights",)) == ("weights",)
    assert call_layout(positional, 5, ()) == ()
    assert call_layout(positional, 6, ()) is None  # too many arguments: binding raises
    assert call_layout(positional, 1, ("weights", "y")) == ("y", "weights")  # binding order
    assert call_layout(positional, 1, ("x", "y", "weights")) is None  # x given twice
    assert call_layout(positional, 0, ("z",)) is None  # no such parameter
    assert call_layout(None, 1, ()) is None  # *args, **kwargs or keyword-only parameters


class HuggingFaceShaped(torch.nn.Module):
    """A forward shaped like Hugging Face's: keyword tensors, None defaults, a trailing
    ``**kwargs`` (BertModel, DistilBert..., GPT2LMHeadModel all end in one)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **kwargs):
        hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        return {"last_hidden_state": hidden, "pooled": hidden.mean(1)}


def test_a_forward_ending_in_kwargs_gets_routes_for_keyword_calls(monkeypatch):
    """Issue 28: HF forwards end in ``**kwargs``; their keyword calls took the general
    path (inspect's binding, flattening, rebuilding) on every call, 1.6x the session."""
    import inspect

    positional = positional_defaults(inspect.signature(HuggingFaceShaped().forward))
    assert positional is not None and positional[2] == "kwargs"
    assert call_layout(positional, 0, ("attention_mask", "input_ids")) == ("input_ids", "attention_mask")
    assert call_layout(positional, 0, ("input_ids", "other")) is None  # a keyword only **kwargs takes
    inner = HuggingFaceShaped().eval()
    ids, mask = torch.randint(0, 50, (6,)), torch.ones(6, dtype=torch.int64)
    model = _tuned(inner, "hf-shaped", [{"input_ids": ids, "attention_mask": mask}] * 2)
    batch = dict(input_ids=torch.randint(0, 50, (2, 6)), attention_mask=torch.ones(2, 6, dtype=torch.int64))
    with torch.no_grad():
        first = model(**batch)  # the general path, which adds the route
        assert model._ait_calls.direct is not None and len(model._ait_calls.direct) == 1
        _no_general_path(monkeypatch)
        _assert_identical(model(**batch), first)
        _assert_identical(model(attention_mask=batch["attention_mask"], input_ids=batch["input_ids"]), first)
        torch.testing.assert_close(first, inner(**batch), atol=1e-5, rtol=1e-5)
        monkeypatch.undo()
        with pytest.raises(ait.GraphNotRecordedError):  # a keyword **kwargs takes is another call
            model(**batch, output_attentions=True)


def test_routes_give_the_general_paths_outputs_for_every_call_form(monkeypatch):
    inner = TwoInputs().eval()
    model = _tuned(inner, "two", [(torch.randn(16), torch.randn(8)) for _ in range(2)])
    x, y = torch.randn(2, 16), torch.randn(2, 8)
    fast_forms = [((x, y), {}), ((x,), {"y": y}), ((), {"y": y, "x": x})]
    general_forms = [((x, y, 2.0), {}), ((x, y), {"scale": 2.0})]  # non-tensor values: always the general path
    with torch.no_grad():
        general = [model(*a, **k) for a, k in fast_forms + general_forms]  # first calls add routes
        assert len(model._ait_calls.direct) == 3  # one per keyword layout
        for (args, kwargs), expected in zip(fast_forms + general_forms, general):
            _assert_identical(model(*args, **kwargs), expected)
            _assert_identical(expected, general[0])
        _no_general_path(monkeypatch)
        for (args, kwargs), expected in zip(fast_forms, general):
            _assert_identical(model(*args, **kwargs), expected)
        torch.testing.assert_close(general[0], inner(x, y), atol=1e-4, rtol=1e-4)


def test_routes_still_reject_wrong_dtype_rank_shape_device_and_structure(monkeypatch):
    model = _tuned(TwoInputs().eval(), "two", [(torch.randn(16), torch.randn(8)) for _ in range(2)])
    x, y = torch.randn(2, 16), torch.randn(2, 8)
    bad_calls = [
        lambda: model(x.double(), y),  # dtype
        lambda: model(x[None], y),  # rank
        lambda: model(torch.randn(2, 17), y),  # shape
        lambda: model(x, torch.empty(2, 8, device="meta")),  # device
        lambda: model(x, y, 3.0),  # another non-tensor value
        lambda: model((x,), y),  # another structure
        lambda: model(x, y=y, z=y),  # a call that does not bind
    ]
    cold = [_error_text(call) for call in bad_calls]
    with torch.no_grad():
        model(x, y)
        model(x, y=y)
    assert model._ait_calls.direct
    warm = [_error_text(call) for call in bad_calls]
    assert warm == cold
    types = [t for t, _, _ in warm]
    assert types[:2] == [ait.GraphNotRecordedError] * 2 and types[4:6] == [ait.GraphNotRecordedError] * 2
    assert types[2] is aitune.ShapeMismatchError and types[3] is aitune.InvalidArgumentError
    assert types[6] is TypeError
    assert "input_x: float32 rank 2" in warm[0][1] and "input_x: float64 rank 2" in warm[0][1]
    assert any("recorded for this graph" in note for note in warm[2][2])
    assert "input_y" in warm[3][1] and "meta" in warm[3][1]

    # A shape the session refuses matches a route; the call then goes to the general path,
    # which owns the message (the note naming the recorded graph): once more, same error.
    assert _error_text(bad_calls[2]) == cold[2]


def test_routes_fall_back_eagerly_with_one_warning(monkeypatch):
    inner = MLP().eval()
    model = _tuned(inner, "mlp", torch.randn(16), eager_fallback=True)  # batch sizes 1..2
    with torch.no_grad():
        model(torch.randn(2, 16))  # adds a route
        assert len(model._ait_calls.direct) == 1
        big = torch.randn(5, 16)  # outside the graph's batch range: the session refuses it
        with pytest.warns(RuntimeWarning, match="outside the graph spec.*running eagerly"):
            _assert_identical(model(big), inner(big))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _assert_identical(model(big), inner(big))  # warned once
        _no_general_path(monkeypatch)
        x = torch.randn(2, 16)
        torch.testing.assert_close(model(x), inner(x), atol=1e-4, rtol=1e-4)  # still served by the route
        monkeypatch.undo()
        bad = torch.randn(2, 3, 16)  # rank: no graph, eager
        with pytest.warns(RuntimeWarning, match="no recorded graph matches"):
            _assert_identical(model(bad), inner(bad))


def test_tensor_subclasses_requires_grad_and_strided_views_give_equal_outputs():
    inner = MLP().eval()
    model = _tuned(inner, "mlp", torch.randn(16))
    x = torch.randn(16, 2)
    with torch.no_grad():
        expected = model(x.t().contiguous())
        _assert_identical(model(x.t()), expected)  # a strided view (the backend copies it)
        _assert_identical(model(torch.nn.Parameter(x.t().contiguous())), expected)  # subclass: general path
    leaf = x.t().contiguous().requires_grad_()
    with torch.no_grad():  # gradients off: the session serves it (detached for DLPack)
        _assert_identical(model(leaf), expected)
    out = model(leaf)  # gradients on: eager, autograd intact (issue 17), not a detached session output
    assert out.requires_grad
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_retuning_drops_the_cached_graphs():
    model = _tuned(MLP().eval(), "mlp", torch.randn(16))
    x = torch.randn(2, 16)
    with torch.no_grad():
        model(x)
    assert model._ait_calls.direct
    ait.tune(model, torch.randn(3, 16), clear_cache=True)  # now rank 3 inputs
    assert model._ait_calls.direct is None
    with pytest.raises(ait.GraphNotRecordedError):
        model(x)
    with torch.no_grad():
        model(torch.randn(2, 3, 16))
    assert model._ait_calls.direct


def test_a_loaded_module_starts_without_routes(tmp_path):
    inner = MLP().eval()
    model = _tuned(inner, "mlp", torch.randn(16))
    x = torch.randn(2, 16)
    with torch.no_grad():
        expected = model(x)
        ait.save(model, tmp_path / "mlp.ait")
        loaded = ait.load(ait.Module(inner, "mlp"), tmp_path / "mlp.ait")
        assert loaded._ait_calls.direct is None
        _assert_identical(loaded(x), expected)
        _assert_identical(loaded(x), expected)  # served by the route the first call added
    assert len(loaded._ait_calls.direct) == 1


def test_routes_serve_forward_past_the_guards(monkeypatch):
    """A module with hooks reaches forward through nn.Module.__call__; forward still finds
    the route (no binding, no flattening), and the hooks still run."""
    inner = MLP().eval()
    model = _tuned(inner, "mlp", torch.randn(16))
    x = torch.randn(2, 16)
    with torch.no_grad():
        plain = model(x)  # adds the route
        handle = model.register_forward_hook(lambda module, args, output: output * 2)
        _no_general_path(monkeypatch)
        _assert_identical(model(x), plain * 2)
        _assert_identical(model.forward(x), plain)
        handle.remove()
        monkeypatch.undo()
        with pytest.raises(aitune.ShapeMismatchError) as info:  # the route matches, the session refuses
            model.forward(torch.randn(2, 17))
        assert any("recorded for this graph" in note for note in info.value.__notes__)


def test_calls_recorded_under_autocast_are_refused_naming_autocast():
    """A pipeline that runs its module under torch.autocast while ait.tune records: the
    tune runs eager again without autocast (float32 where the calls returned bfloat16), and
    the refusal said eager PyTorch was not deterministic and its forward drew random
    numbers. It must name autocast and what to do; the module stays eager, serving the
    pipeline's autocast calls as the module gives them."""
    model = ait.Module(MLP().eval(), "autocast-recorded", strategy=_strategy())

    def pipeline(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x)

    samples = [torch.randn(16) for _ in range(2)]
    with pytest.raises(ait.TuningError, match=r"recorded under torch\.autocast") as raised:
        ait.tune(pipeline, samples, ignore_failing_modules=False)
    assert "not deterministic" not in str(raised.value) and "autocast off" in str(raised.value)
    ait.tune(pipeline, samples)  # ignore_failing_modules: the module stays eager
    assert model.ait_state is ait.ModuleState.PASSTHROUGH
    with torch.no_grad():
        assert pipeline(torch.randn(2, 16)).dtype == torch.bfloat16


def test_a_call_under_autocast_runs_eagerly_as_autocast_asks(caplog, monkeypatch, tmp_path):
    """Graphs recorded without autocast compute in float32: served under torch.autocast they
    silently returned float32 where the module returns the autocast dtype. Such calls run
    eagerly (said once), the C++ half's guard included; outside autocast the graph serves
    again. A checkpoint keeps the autocast state the graphs were recorded in."""
    inner = MLP().eval()
    model = _tuned(inner, "autocast-mlp", [torch.randn(16) for _ in range(2)])
    x = torch.randn(2, 16)
    with torch.no_grad():
        model(x)
        assert model._ait_calls.direct is not None, "the C++ half serves this call form now"
        with caplog.at_level("WARNING", logger="aitune"), torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            model(x)
            expected = inner(x)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out, expected)
        assert sum("autocast" in r.getMessage() for r in caplog.records) == 1, caplog.text
        path = ait.save(model, tmp_path / "ckpt")
        loaded = ait.load(ait.Module(inner, "autocast-mlp-loaded"), path)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert loaded(x).dtype == torch.bfloat16
        expected = inner(x)
        monkeypatch.setattr(inner, "forward", lambda *a, **k: pytest.fail("the eager forward ran"))
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
        assert model(x).dtype == torch.float32


def test_calls_under_torch_func_transforms_and_fake_tensors_run_eagerly(caplog):
    """A tuned module under torch.vmap raised GraphNotRecordedError for the per-sample rank
    (or, with a graph of that rank, 'tensor is on cpu but the cpu session runs on cpu'); under
    FakeTensorMode 'null data pointer'. Eager computes both: so does the tuned module."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from torch_models import cpu_strategy

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    model = ait.Module(net, "no-data", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(lambda x: model(x[0]), [torch.randn(16) for _ in range(3)], batch_sizes=[1], progress=False,
             ignore_failing_modules=False)  # rank-1 calls recorded: vmap's per-sample view has that rank
    x = torch.randn(5, 16)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="aitune"):
        torch.testing.assert_close(torch.vmap(model)(x), torch.vmap(net)(x))
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            out = model(mode.from_tensor(x))
        assert isinstance(out, FakeTensor) and out.shape == (5, 4)
        torch.testing.assert_close(model(x[0]), net(x[0]))  # the graph serves plain calls still
    said = [r.getMessage() for r in caplog.records if "runs eagerly in PyTorch: a tuned graph reads" in r.getMessage()]
    assert len(said) == 2 and "torch.func transform" in said[0] and "FakeTensorMode" in said[1], said


class _Residual(torch.nn.Module):
    """A model holding a tuned module: what a user traces, exports or compiles whole."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x[:, :4] + self.inner(x)


def _tuned_residual_pair():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    reference = _Residual(copy.deepcopy(net)).eval()
    model = ait.Module(net, "held", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(16) for _ in range(3)], batch_sizes=[2], progress=False, ignore_failing_modules=False)
    return _Residual(model).eval(), reference


def test_a_jit_trace_of_a_model_holding_a_tuned_module_records_its_ops(caplog, tmp_path):
    """torch.jit.trace and torch.onnx.export(dynamo=False) of a parent recorded the tuned
    module's graph outputs as constants: the example's values for every input (0.7 off in
    a probe, silently). Under the tracer the module runs eagerly, said once."""
    parent, reference = _tuned_residual_pair()
    x, other = torch.randn(2, 16), torch.randn(2, 16)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="aitune"):
        traced = torch.jit.trace(parent, x)
        torch.testing.assert_close(traced(other), reference(other))
        torch.onnx.export(parent, (x,), str(tmp_path / "parent.onnx"), dynamo=False, input_names=["x"])
        torch.testing.assert_close(parent(other), reference(other))  # the graph serves plain calls still
    import onnxruntime

    (exported,) = onnxruntime.InferenceSession(str(tmp_path / "parent.onnx")).run(None, {"x": other.numpy()})
    torch.testing.assert_close(torch.from_numpy(exported), reference(other), atol=1e-5, rtol=1e-5)
    said = [r.getMessage() for r in caplog.records if "JIT tracer" in r.getMessage()]
    assert len(said) == 1 and "runs eagerly in PyTorch" in said[0], said


def test_torch_compile_of_a_tuned_module_or_a_model_holding_one_compiles_its_forward():
    """torch.compile(tuned module) failed inside dynamo ('add_route(): incompatible function
    arguments'): dynamo traced into the dispatch. It compiles the wrapped module's forward."""
    parent, reference = _tuned_residual_pair()
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(parent.inner, backend="eager")(x), reference.inner(x))
        torch.testing.assert_close(torch.compile(parent, backend="eager")(x), reference(x))
        torch.testing.assert_close(parent(x), reference(x))


def test_calls_under_a_torch_function_or_dispatch_mode_run_eagerly(caplog):
    """A TorchFunctionMode doubling linear changed eager's outputs and not the tuned graph's
    (2x off, silently): a graph runs no PyTorch op a mode could act on. Such calls run
    eagerly, said once per set of modes; outside the modes the graph serves again."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from torch_models import cpu_strategy

    class DoubleLinear(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            return out * 2 if func is torch.nn.functional.linear else out

    class DoubleAddmm(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            return out * 2 if func is torch.ops.aten.addmm.default else out

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    model = ait.Module(net, "under-modes", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(16) for _ in range(3)], batch_sizes=[2], progress=False,
             ignore_failing_modules=False)
    x = torch.randn(2, 16)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="aitune"):
        for mode in (DoubleLinear, DoubleAddmm):
            with mode():
                expected = net(x)
                got, again = model(x), model(x)
            torch.testing.assert_close(got, expected)
            torch.testing.assert_close(again, expected)
        plain = model(x)
    torch.testing.assert_close(plain, net(x), atol=1e-5, rtol=1e-5)
    said = [r.getMessage() for r in caplog.records if "TorchFunctionMode / TorchDispatchMode" in r.getMessage()]
    assert len(said) == 2 and "DoubleLinear" in said[0] and "DoubleAddmm" in said[1], said


class _DoublingLinear(torch.Tensor):
    """A tensor subclass overriding torch's functions (as masked or unit-carrying tensors do)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        return out * 2 if func is torch.nn.functional.linear else out


def test_a_call_with_an_overriding_tensor_subclass_runs_eagerly(caplog):
    """The graph read a subclass input's data and returned a plain tensor, 0.65 off eager,
    which applied the subclass's override: such calls run eagerly, said once per class; a
    plain Parameter input is no such subclass."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
    model = ait.Module(net, "subclass-input", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(3)], batch_sizes=[2], progress=False, ignore_failing_modules=False)
    x = torch.randn(2, 4)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="aitune"):
        got, again = model(x.as_subclass(_DoublingLinear)), model(x.as_subclass(_DoublingLinear))
        expected = net(x.as_subclass(_DoublingLinear))
        plain = model(torch.nn.Parameter(x, requires_grad=False))
    assert type(got) is _DoublingLinear
    torch.testing.assert_close(got.as_subclass(torch.Tensor), expected.as_subclass(torch.Tensor))
    torch.testing.assert_close(again.as_subclass(torch.Tensor), expected.as_subclass(torch.Tensor))
    torch.testing.assert_close(plain, net(x), atol=1e-5, rtol=1e-5)
    said = [r.getMessage() for r in caplog.records if "tensor runs eagerly in PyTorch" in r.getMessage()]
    assert len(said) == 1 and "_DoublingLinear" in said[0], said


class _MakesTensors(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) + torch.arange(4) / 3  # made in the default dtype


def test_calls_under_another_default_dtype_run_eagerly(caplog):
    """torch.set_default_dtype(torch.float64) after tuning: eager returned float64 (its
    arange took the default), the tuned graph float32, silently."""
    from torch_models import cpu_strategy

    torch.manual_seed(0)
    net = _MakesTensors().eval()
    model = ait.Module(net, "default-dtype", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(3)], batch_sizes=[2], progress=False, ignore_failing_modules=False)
    x = torch.randn(2, 4)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="aitune"):
        torch.set_default_dtype(torch.float64)
        try:
            got, expected = model(x), net(x)
        finally:
            torch.set_default_dtype(torch.float32)
        assert got.dtype == expected.dtype == torch.float64
        torch.testing.assert_close(got, expected)
        plain = model(x)
    assert plain.dtype == torch.float32
    assert "called with torch's default dtype float64, its graphs were made under float32" in caplog.text


def test_jacrev_of_a_tuned_module_is_said_as_a_torch_func_call(caplog):
    """jacrev's inputs require grad, so its calls were said as autograd calls (a WARNING
    about inputs requiring grad): they are said as torch.func calls, the result eager's."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval()
    model = ait.Module(net, "jacrev", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(8) for _ in range(2)], progress=False, ignore_failing_modules=False)
    x = torch.randn(8)
    with caplog.at_level(logging.INFO, logger="aitune"):
        torch.testing.assert_close(torch.func.jacrev(model)(x), torch.func.jacrev(net)(x))
    said = [r for r in caplog.records if r.name == "aitune"]
    assert said and all("torch.func transform" in r.getMessage() for r in said), [r.getMessage() for r in said]


class _ScaledRows(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, t):
        return self.fc(x) * t


def test_inputs_that_disagree_on_the_batch_are_refused_or_run_eagerly():
    """Both inputs followed the batch in every recorded call, and the export made them one
    dimension. A call with 3 rows of x and 1 of t (CLIP's 3 prompts with 1 image) ran the
    graph: ONNX Runtime broadcast t here, and failed inside a Concat on CLIPModel. It is
    now refused naming both inputs, and runs eagerly with eager_fallback."""
    inner = _ScaledRows().eval()
    samples = [{"x": torch.randn(4), "t": torch.randn(1)} for _ in range(4)]
    model = ait.Module(inner, "scaled-rows", strategy=_strategy())
    ait.tune(model, samples, batch_sizes=[1, 2, 4])
    x, t = torch.randn(3, 4), torch.randn(1, 1)
    with pytest.raises(aitune.ShapeMismatchError, match="'input_x' .* and 'input_t' .* disagree on the batch: 3 and 1"):
        model(x, t)
    torch.testing.assert_close(model(x, torch.randn(3, 1).fill_(2.0)), inner(x, torch.full((3, 1), 2.0)))
    fallback = ait.Module(inner, "scaled-rows-fallback", strategy=_strategy(), eager_fallback=True)
    ait.tune(fallback, samples, batch_sizes=[1, 2, 4])
    with pytest.warns(RuntimeWarning, match="disagree on the batch.*running eagerly"):
        out = fallback(x, t)
    torch.testing.assert_close(out, inner(x, t))


def test_a_call_with_gradients_on_says_once_that_the_weights_get_none(caplog):
    """A fine-tune with the tuned module in eval() (frozen BatchNorm, a common recipe): its
    weights got no gradient and only the head after it trained, with no word (a session-32
    probe). The first call a graph serves with gradients on says so, once; calls under
    torch.no_grad() say nothing."""
    torch.manual_seed(0)
    body = ait.Module(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval(), "frozen",
                      strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(body, [torch.randn(16) for _ in range(3)], batch_sizes=[2], progress=False, ignore_failing_modules=False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aitune"):
        with torch.no_grad():
            body(torch.randn(2, 16))
        assert not [r for r in caplog.records if r.name == "aitune"]
        for _ in range(2):
            body(torch.randn(2, 16)).sum()
    said = [r.getMessage() for r in caplog.records if r.name == "aitune"]
    assert len(said) == 1 and "weights require grad (0.weight, 0.bias)" in said[0] and "no gradient" in said[0], said


class _SumsAList(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, extras):
        return self.linear(x) + sum(extras)


def test_a_call_whose_containers_differ_from_the_recorded_ones_says_so():
    """Caches recorded as a tuple, called as a list: the call and the recorded graph were
    described alike (the same names, dtypes and shapes), and nothing said why they did not
    match (a session-36 probe). The containers are named now."""
    model = ait.Module(_SumsAList().eval(), "containers", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [((torch.randn(4), (torch.randn(4), torch.randn(4))), {}) for _ in range(2)],
             ignore_failing_modules=False, progress=False)
    with torch.no_grad(), pytest.raises(ait.GraphNotRecordedError,
                                        match=r"containers that differ from recorded graph 1: .*list\(\*, \*\).* "
                                              r"here, .*tuple\(\*, \*\).* recorded"):
        model(torch.randn(1, 4), [torch.randn(1, 4), torch.randn(1, 4)])
