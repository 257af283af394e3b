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


class _ModeBranch(torch.nn.Module):
    """A forward that computes otherwise with gradients on, or in inference mode."""

    def __init__(self, on: str):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.on = on

    def forward(self, x):
        y = self.fc(x)
        if self.on == "grad" and torch.is_grad_enabled():
            return y * 2
        if self.on == "inference" and torch.is_inference_mode_enabled():
            return y - 1
        return y


def test_a_forward_that_branches_on_the_grad_mode_runs_eagerly_in_the_other_mode(tmp_path, monkeypatch, caplog):
    """The graphs are exported with gradients off: a forward branching on
    torch.is_grad_enabled() returned the no-grad branch to a user calling with gradients
    on (the default), 2x off, silently; the same for torch.is_inference_mode_enabled().
    The tune sees the difference; such calls run eagerly, said once, also after ait.load.
    A forward that does not branch keeps the graphs in every mode."""
    import logging

    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    for on, mode in (("grad", torch.enable_grad), ("inference", torch.inference_mode)):
        inner = _ModeBranch(on).eval()
        model = ait.Module(inner, f"branch-{on}", strategy=cpu_strategy(tune_provider_options=False))
        ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
        assert model.ait_state is ModuleState.TUNED
        x = torch.randn(2, 4)
        with torch.no_grad():
            torch.testing.assert_close(model(x), inner(x))  # the graphs' mode
        fresh = _ModeBranch(on).eval()
        fresh.load_state_dict(inner.state_dict())
        loaded = ait.load(ait.Module(fresh, f"branch-{on}"), ait.save(model, tmp_path / on))
        assert loaded._ait_calls.grad_modes == (on,)
        for target in (model, loaded):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="aitune"), mode():
                torch.testing.assert_close(target(x), inner(x))
                torch.testing.assert_close(target(x), inner(x))
            said = [r.getMessage() for r in caplog.records if "computes otherwise than its graphs" in r.getMessage()]
            assert len(said) == 1
    plain = ait.Module(_ModeBranch("none").eval(), "branch-none", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(plain, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    assert plain._ait_calls.grad_modes == ()


class _ClampWithGradients(torch.nn.Module):
    """Clamps only with gradients on: no difference on a small first sample."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y.clamp(-1.0, 1.0) if torch.is_grad_enabled() else y


def test_a_grad_mode_branch_the_first_sample_does_not_show_is_found_on_the_others():
    """The modes were tried on the first sample only: a small first sample never reached the
    clamp, and calls with gradients on were served the no-grad graph, 3.1 off eager, silently
    (a session-37 probe). They are tried on each batch size's first sample and the last."""
    torch.manual_seed(0)
    inner = _ClampWithGradients().eval().requires_grad_(False)
    model = ait.Module(inner, "clamp-grad", strategy=cpu_strategy(tune_provider_options=False))
    samples = [torch.full((4,), 0.01)] + [torch.randn(4) * 5 for _ in range(3)]
    ait.tune(model, samples, batch_sizes=[1], ignore_failing_modules=False)
    assert model._ait_calls.grad_modes == ("grad",)
    x = torch.randn(2, 4) * 5
    torch.testing.assert_close(model(x), inner(x))  # gradients on: eagerly
