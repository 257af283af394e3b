"""Issue 27 item 5: an interrupt during an export or a candidate leaves the process able
to tune again and the module as it was."""

from __future__ import annotations

import pytest
import torch
from torch_models import MLP, cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState, candidate_isolation


class InterruptedOnce(MLP):
    """Raises KeyboardInterrupt the first time it is exported (as Ctrl-C would, mid-export)."""

    interrupted = False

    def forward(self, x):
        exporting = torch.compiler.is_compiling() or torch.jit.is_tracing()
        if exporting and not InterruptedOnce.interrupted:
            InterruptedOnce.interrupted = True
            raise KeyboardInterrupt
        return super().forward(x)


def _samples():
    return [torch.randn(16) for _ in range(2)]


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_interrupt_during_export_then_tune_again(use_dynamo):
    InterruptedOnce.interrupted = False
    inner = InterruptedOnce().eval()
    model = ait.Module(inner, "interrupted", strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    with pytest.raises(KeyboardInterrupt):
        ait.tune(model, _samples(), ignore_failing_modules=False, disable_external_logging=True)
    assert InterruptedOnce.interrupted
    assert model.ait_state is not ModuleState.TUNED  # as it was: recorded, running eagerly
    x = torch.randn(2, 16)
    torch.testing.assert_close(model(x), MLP.forward(inner, x))
    ait.tune(model, _samples(), ignore_failing_modules=False, disable_external_logging=True)
    assert model.ait_state is ModuleState.TUNED
    torch.testing.assert_close(model(x), MLP.forward(inner, x), atol=1e-4, rtol=1e-4)


def test_interrupt_during_a_candidate_keeps_the_tuned_graphs(monkeypatch):
    inner = MLP().eval()
    model = ait.Module(inner, "retuned", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    ait.tune(model, _samples(), ignore_failing_modules=False)
    tuned_backends = model.ait_backends

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(candidate_isolation, "evaluate", interrupt)
        with pytest.raises(KeyboardInterrupt):
            ait.tune(model, _samples(), ignore_failing_modules=False)
    assert model.ait_state is ModuleState.TUNED and model.ait_backends == tuned_backends
    x = torch.randn(2, 16)
    model.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a tuned module")
    torch.testing.assert_close(model(x), MLP.forward(inner, x), atol=1e-4, rtol=1e-4)
    del model.ait_module.forward
    ait.tune(model, _samples(), ignore_failing_modules=False)  # and tuning again works
    assert model.ait_state is ModuleState.TUNED
