"""What a call passes besides the recorded tensors: a tuned call gives the result eager
gives for the arguments of that call, never one baked in from the recorded calls."""

from __future__ import annotations

import logging

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
