"""Tuning under ``torch.inference_mode()``, as inference code runs: its tensors keep no
version counter, so the recording cannot tell from one whether it was changed in place."""

from __future__ import annotations

import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()


def test_tune_under_inference_mode():
    inner = _mlp()
    model = ait.Module(inner, "inference-mode", strategy=cpu_strategy(tune_provider_options=False))
    with torch.inference_mode():
        samples = [torch.randn(4) for _ in range(2)]  # inference tensors
        ait.tune(model, samples, ignore_failing_modules=False)
        x = torch.randn(2, 4)
        torch.testing.assert_close(model(x), inner(x), atol=1e-5, rtol=1e-5)
    assert model.ait_state is ModuleState.TUNED
    x = torch.randn(2, 4)  # and outside it
    torch.testing.assert_close(model(x), inner(x), atol=1e-5, rtol=1e-5)


def test_inference_mode_sample_changed_after_its_call_is_recorded_as_called():
    """A pipeline that changes its input in place after the module's call: the recording
    keeps what the module was called with (a normal tensor's change would be refused by
    its version counter; an inference tensor has none, so it is copied)."""
    model = ait.Module(_mlp(), "inference-mode-changed", strategy=cpu_strategy(tune_provider_options=False))

    def pipeline(x):
        y = model(x)
        x.zero_()  # the caller's batch, changed after the call
        return y

    with torch.inference_mode():
        samples = [torch.full((4,), 1.0 + i) for i in range(2)]
        ait.tune(pipeline, samples, batch_sizes=[1], ignore_failing_modules=False)
    (graph,) = model.ait_graphs
    recorded = sorted(float(s.inputs[0].sum()) for s in graph.samples)
    assert recorded == [4.0, 8.0], recorded
