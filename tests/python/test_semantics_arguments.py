"""What a call passes besides the recorded tensors: a tuned call gives the result eager
gives for the arguments of that call, never one baked in from the recorded calls."""

from __future__ import annotations

import logging
import types

import numpy as np
import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait


class TensorDefault(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, bias=torch.zeros(8)):  # noqa: B008 - the default under test
        return self.linear(x) + bias


def test_a_tensor_default_left_out_while_recording_is_an_input_of_the_graph():
    """Recorded with calls that leave ``bias`` out, the export ran forward's own default,
    which it baked in as a constant while the binding listed ``bias`` among the graph's
    inputs: ``m(x, bias=torch.ones(8))`` returned the zero-bias result, 1.0 off, silently
    (a session-35 probe)."""
    eager = TensorDefault().eval()
    model = ait.Module(eager, "tensor-default", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(8) for _ in range(3)], ignore_failing_modules=False, performance_validation=False)
    assert model.ait_backends, "the graph serves the calls below"
    x = torch.randn(2, 8)
    with torch.no_grad():
        for args, kwargs in (((x,), {}), ((x,), {"bias": torch.ones(8)}), ((x, torch.full((8,), -2.0)), {})):
            torch.testing.assert_close(model(*args, **kwargs), eager(*args, **kwargs))


class CheckedIds(torch.nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 8)
        self.how = how

    def forward(self, ids):
        if self.how == "check":
            torch._check((ids >= 0).all().item(), lambda: "ids must be non-negative")
        else:
            torch._assert_async((ids >= 0).all(), "ids must be non-negative")
        return self.embedding(ids)


@pytest.mark.parametrize("how, use_dynamo", [("check", True), ("assert_async", True), ("assert_async", False)])
def test_a_check_of_input_values_the_graph_drops_is_said_naming_the_line(how, use_dynamo, caplog):
    """ONNX has no assertion: ``torch._check(... .item())`` and ``torch._assert_async`` leave
    the graph, so an id of -1 read embedding row 9 where eager raises. Tuned with
    ``disable_external_logging=True``, aitune's own warnings of the export were swallowed
    with the exporters' output too (a session-35 probe)."""
    eager = CheckedIds(how).eval()
    model = ait.Module(eager, f"checked-{how}", strategy=cpu_strategy(use_dynamo=use_dynamo,
                                                                      tune_provider_options=False))
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.tune(model, [torch.randint(0, 10, (5,)) for _ in range(3)], ignore_failing_modules=False,
                 performance_validation=False, disable_external_logging=True)
    said = [r.getMessage() for r in caplog.records if "drops 1 check(s) of input values" in r.getMessage()]
    assert len(said) == 1 and "test_semantics_arguments.py" in said[0] and "ids >= 0" in said[0], said
    good = torch.randint(0, 10, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(model(good), eager(good))


class Scale:
    """A callable object with a setting, passed as an argument."""

    def __init__(self, k: float):
        self.k = k

    def __call__(self, t):
        return t * self.k


class Holder:
    def __init__(self):
        self.a = types.SimpleNamespace(b=types.SimpleNamespace(k=2.0))
        self.table = [1.0] * 100


class ReadsItsArgument(torch.nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.how = how

    def forward(self, x, arg):
        y = self.linear(x)
        if self.how in ("callable", "module"):
            return arg(y)
        if self.how == "deep":
            return y * arg.a.b.k
        if self.how == "table":
            return y * arg.table[50]
        return y * float(arg[1500])


def _changed(how: str, arg) -> None:
    if how == "callable":
        arg.k = 5.0
    elif how == "module":
        with torch.no_grad():
            arg.weight.mul_(3.0)
    elif how == "deep":
        arg.a.b.k = 5.0
    elif how == "table":
        arg.table[50] = 7.0
    else:
        arg[1500] = 9.0


@pytest.mark.parametrize("how", ["callable", "module", "deep", "table", "array"])
def test_an_argument_object_changed_after_tuning_is_another_call(how):
    """The graph holds what an argument object held as constants. A callable object (keyed
    by identity alone), an nn.Module's weights, a setting three levels deep, a list of more
    than 64 numbers and a NumPy array of more than 1000 elements (keyed by its summarised
    repr) changed after tuning were served the old constants, 1.2 to 8.6 off, silently
    (a session-35 probe). Such a call is another call: refused, naming the argument."""
    arg = {"callable": lambda: Scale(2.0), "module": lambda: torch.nn.Linear(8, 8).eval(), "deep": Holder,
           "table": Holder, "array": lambda: np.ones(3000)}[how]()
    eager = ReadsItsArgument(how).eval()
    model = ait.Module(eager, f"argument-{how}", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(lambda x: model(x, arg), [torch.randn(8) for _ in range(2)], ignore_failing_modules=False,
             progress=False, performance_validation=False)
    assert model.ait_backends
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x, arg), eager(x, arg))
        _changed(how, arg)
        with pytest.raises(ait.GraphNotRecordedError, match="arg"):
            model(x, arg)
