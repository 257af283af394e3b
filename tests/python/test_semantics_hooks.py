"""Issue 27 item 7: forward hooks run where eager runs them, around the tuned graph."""

from __future__ import annotations

import logging

import pytest
import torch
from torch_models import MLP, cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState

EXPORTERS = pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])


def _strategy(use_dynamo):
    return cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False)


def _no_eager(model):
    model.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a tuned module")


@EXPORTERS
@pytest.mark.parametrize("where", ["wrapped", "proxy"])
def test_pre_hook_supplying_the_batch_records_and_keeps_running(use_dynamo, where):
    inner = MLP().eval()
    batches = []

    def inject(module, args):
        return (batches[-1],)

    model = ait.Module(inner, "injected", strategy=_strategy(use_dynamo))
    (inner if where == "wrapped" else model).register_forward_pre_hook(inject)

    def feed(x):
        batches.append(x)
        return model()  # no arguments: the hook supplies the input

    ait.tune(feed, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False)
    assert model.ait_state is ModuleState.TUNED
    (graph,) = model.ait_graphs
    assert graph.input_names == ["input_x"]
    x = torch.randn(2, 16)
    batches.append(x)
    expected = MLP.forward(inner, x)
    _no_eager(model)
    torch.testing.assert_close(model(), expected, atol=1e-4, rtol=1e-4)


@EXPORTERS
def test_output_hook_applies_once_and_its_side_effect_keeps_happening(use_dynamo):
    inner = MLP().eval()
    calls = []

    def shift(module, args, output):
        calls.append(1)
        return output + 100.0

    inner.register_forward_hook(shift)
    model = ait.Module(inner, "shifted", strategy=_strategy(use_dynamo))
    ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False)
    assert model.ait_state is ModuleState.TUNED
    x = torch.randn(2, 16)
    expected = inner(x)  # the hook once
    calls.clear()
    _no_eager(model)
    for _ in range(3):  # the first call takes the Python path, the later ones could be routed
        torch.testing.assert_close(model(x), expected, atol=1e-4, rtol=1e-4)
    assert len(calls) == 3


@EXPORTERS
def test_pre_hook_with_a_side_effect_runs_on_every_tuned_call(use_dynamo):
    inner = MLP().eval()
    seen = []
    inner.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))  # before wrapping
    model = ait.Module(inner, "counted", strategy=_strategy(use_dynamo))
    ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False)
    seen.clear()
    _no_eager(model)
    for _ in range(3):
        model(torch.randn(2, 16))
    assert seen == [torch.Size([2, 16])] * 3
    later = []
    model.register_forward_pre_hook(lambda module, args: later.append(1))  # after tuning, on the proxy
    model(torch.randn(2, 16))
    assert len(later) == 1 and len(seen) == 4


def test_hook_on_a_submodule_is_named_in_a_warning(caplog):
    inner = MLP().eval()
    counter = []

    def count_calls(module, args, output):
        counter.append(1)

    next(iter(inner.children())).register_forward_hook(count_calls)
    model = ait.Module(inner, "sub-hooked", strategy=_strategy(False))
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False)
    assert any("count_calls" in r.getMessage() and "submodules" in r.getMessage() for r in caplog.records)


def test_a_hook_registered_on_a_submodule_after_tuning_runs_and_the_call_is_eager(caplog, monkeypatch):
    """A feature-extraction hook registered on a layer after tuning (Grad-CAM, embeddings):
    the graph has no submodules, so the hook never ran and the tuned outputs ignored what it
    returned, and nothing said so. A call while a submodule's forward hooks differ from
    tuning's runs eagerly (hooks included), said once in the log naming the submodule; once
    the hook is removed the graph serves again."""
    inner = MLP().eval()
    model = ait.Module(inner, "sub-hook-later", strategy=_strategy(False))
    ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 16)
    with torch.no_grad():
        model(x)
    assert model._ait_calls.direct is not None, "the C++ half serves this call form now"
    features = []
    handle = inner.fc1.register_forward_hook(lambda module, args, output: features.append(output))
    zero = inner.act.register_forward_hook(lambda module, args, output: torch.zeros_like(output))
    with caplog.at_level(logging.WARNING, logger="aitune"), torch.no_grad():
        out = model(x)
        model(x)
    assert len(features) == 2, "the hook ran on every call"
    torch.testing.assert_close(out, inner.fc2.bias.expand(2, -1))  # the zeroing hook applied, as eager
    messages = [r.getMessage() for r in caplog.records if "hooks" in r.getMessage()]
    assert len(messages) == 1 and "fc1" in messages[0] and "act" in messages[0], caplog.text
    handle.remove()
    zero.remove()
    with torch.no_grad():
        expected = inner(x)
        _no_eager(model)
        torch.testing.assert_close(model(x), expected)
    assert len(features) == 2


def test_a_submodule_hook_removed_after_tuning_is_no_longer_applied(caplog):
    """A hook present while tuning is exported into the graph (its effect on tensors); removed
    later, the graph would keep applying it: calls run eagerly instead, as the module now is."""
    inner = MLP().eval()
    handle = inner.act.register_forward_hook(lambda module, args, output: output * 0)
    model = ait.Module(inner, "sub-hook-removed", strategy=_strategy(False))
    ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), inner(x))
        handle.remove()
        torch.testing.assert_close(model(x), inner(x))


def test_a_hook_elsewhere_costs_one_python_call_and_a_swapped_hook_is_seen(monkeypatch):
    """The C++ half reads torch's hook handle counter per call: a hook registered on an
    unrelated module sends one call to the Python path, which finds the module's own hooks
    as they were and lets the C++ half serve again. One hook removed and another added on
    the same submodule (same count) is a change: eager, the new hook runs."""
    from aitune.torch.dispatch import ModuleDispatch

    inner = MLP().eval()
    first = inner.fc1.register_forward_hook(lambda module, args, output: None)
    model = ait.Module(inner, "sub-hook-counter", strategy=_strategy(False))
    ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 16)
    unrelated = torch.nn.Linear(2, 2)
    unrelated.register_forward_hook(lambda module, args, output: None)
    general = []
    real_call = ModuleDispatch.call
    monkeypatch.setattr(ModuleDispatch, "call", lambda self, *a: general.append(1) or real_call(self, *a))
    with torch.no_grad():
        expected = inner(x)
        for _ in range(3):
            torch.testing.assert_close(model(x), expected)
    assert len(general) == 1, "after one call on the Python path the C++ half serves again"
    first.remove()
    seen = []
    inner.fc1.register_forward_hook(lambda module, args, output: seen.append(1))
    with torch.no_grad():
        model(x)
    assert seen == [1]


def _doubles_linear_outputs(module, args, output):
    return output * 2 if isinstance(module, torch.nn.Linear) else None


def test_global_forward_hooks_registered_after_tuning_run_the_call_eagerly(caplog):
    """A hook for every module's forward (``register_module_forward_hook``) registered after
    tuning ran on no submodule of the graph, silently (a doubled Linear output left the
    module 1.4 off). Now such calls run eagerly, hooks and all, with one warning, and the
    graph serves again once the hook is removed."""
    inner = MLP().eval()
    model = ait.Module(inner, "global-hooked", strategy=_strategy(True))
    ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 16)
    with torch.no_grad():
        plain = model(x).clone()
        handle = torch.nn.modules.module.register_module_forward_hook(_doubles_linear_outputs)
        try:
            with caplog.at_level(logging.WARNING, logger="aitune"):
                hooked, again = model(x), model(x)
            expected = MLP.forward(inner, x)  # with the hook on each Linear
        finally:
            handle.remove()
        assert not torch.allclose(expected, plain)
        torch.testing.assert_close(hooked, expected)
        torch.testing.assert_close(again, expected)
        said = [r.getMessage() for r in caplog.records if "forward hooks for every module" in r.getMessage()]
        assert len(said) == 1 and "_doubles_linear_outputs" in said[0], said
        _no_eager(model)
        torch.testing.assert_close(model(x), plain)  # the graph again


def test_tuning_under_global_forward_hooks_is_refused_naming_them():
    """Registered while the graphs are exported, a global hook's effect on every submodule
    would stay in the graphs after it is removed: ait.tune refuses, naming it."""
    model = ait.Module(MLP().eval(), "tuned-under-global-hook", strategy=_strategy(True))
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
    try:
        with pytest.raises(ait.GlobalHooksTuningError, match="lambda"):
            ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False, progress=False)
    finally:
        handle.remove()
    assert model.ait_state is not ModuleState.TUNED


class _Doubling(torch.nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("patch", ["forward", "class", "class forward"])
def test_a_forward_or_class_replaced_on_an_instance_runs_eagerly(patch, caplog, monkeypatch):
    """Adapter libraries patch ``module.forward = ...`` on an instance; ``__class__ = Other``
    swaps every method; a global patch replaces a class's forward (``torch.nn.Linear.forward
    = ...``, every instance at once). The graphs kept serving the old model (7.3 and 0.59 off
    eager in a session-25 probe; the class patch until session 27); now such calls run
    eagerly, said once, and the graph serves again once the patch is undone."""
    torch.manual_seed(0)
    inner = MLP().eval()
    model = ait.Module(inner, "patched", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False)
    x = torch.randn(2, 16)
    first = next(m for m in inner.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="aitune"):
        torch.testing.assert_close(model(x), inner(x))
        if patch == "forward":
            original = first.forward
            first.forward = lambda t: original(t) + 1.0
        elif patch == "class forward":
            class_forward = torch.nn.Linear.forward
            monkeypatch.setattr(torch.nn.Linear, "forward", lambda self, t: class_forward(self, t) * 3.0)
        else:
            first.__class__ = _Doubling
        expected = inner(x)
        torch.testing.assert_close(model(x), expected)
        said = [r.getMessage() for r in caplog.records if "calls run eagerly in PyTorch" in r.getMessage()]
        assert len(said) == 1 and ("forward was replaced" in said[0] or "class was changed" in said[0]
                                   or "forward of modules' class was replaced" in said[0]), said
        if patch == "class":
            first.__class__ = torch.nn.Linear
        elif patch == "class forward":
            monkeypatch.undo()
        else:
            del first.forward
        inner.forward = lambda *a, **k: pytest.fail("eager forward ran after the patch was undone")
        torch.testing.assert_close(model(x), MLP.forward(inner, x))
