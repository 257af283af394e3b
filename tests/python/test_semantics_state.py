"""Issue 27 item 2: a forward that updates the module's state is never tuned into a
graph that silently stops updating it."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState
from aitune.torch.export import ExportError


class Counter(torch.nn.Module):
    def __init__(self, in_place: bool):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))
        self.in_place = in_place

    def forward(self, x):
        if self.in_place:
            self.calls += 1
        else:
            self.calls = self.calls + 1
        return self.linear(x)


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "assigned"])
@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_buffer_updated_in_forward_is_refused_naming_it(use_dynamo, in_place):
    inner = Counter(in_place).eval()
    model = ait.Module(inner, "counter", strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    with pytest.raises(ExportError, match=r"forward changes the module's state \(calls\)"):
        ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    before = float(inner.calls)
    model(torch.randn(1, 4))
    model(torch.randn(1, 4))
    assert float(inner.calls) == before + 2  # the update keeps happening


def test_batchnorm_in_train_mode_is_refused_naming_its_statistics():
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    model = ait.Module(inner, "bn", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    with pytest.raises(ExportError, match=r"1\.running_mean.*1\.running_var"):
        ait.tune(model, [torch.randn(4) for _ in range(4)], batch_sizes=[2], ignore_failing_modules=False)


def test_state_left_alone_tunes():
    inner = Counter(True).eval()
    inner.forward = lambda x: inner.linear(x)  # reads no state, writes none
    model = ait.Module(inner, "plain", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    assert model.ait_state is ModuleState.TUNED


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "assigned"])
def test_tunings_own_calls_leave_the_state_as_the_recorded_calls_left_it(in_place):
    """Tuning calls forward far more often than the samples do (export, the eager reference,
    profiling); a counter or running statistics updated in forward must not keep those
    calls: after ait.tune the state is what the recorded calls (the user's) made it."""
    samples = [torch.randn(4) for _ in range(2)]
    recorded = Counter(in_place).eval()
    ait.tune(ait.Module(recorded, "counter-dry", strategy=cpu_strategy()), samples, dry_run=True, progress=False)
    calls_recorded = float(recorded.calls)
    assert 0 < calls_recorded <= 4  # the batches of 1 and 2

    inner = Counter(in_place).eval()
    model = ait.Module(inner, "counter", strategy=cpu_strategy(use_dynamo=False))
    ait.tune(model, samples, progress=False)  # refused for ONNX (above): stays eager, with a warning
    assert model.ait_state is ModuleState.PASSTHROUGH
    assert float(inner.calls) == calls_recorded
    assert "calls" in dict(inner.named_buffers())
    model(torch.randn(1, 4))
    assert float(inner.calls) == calls_recorded + 1  # and the buffer the module holds keeps counting


class DoublesItsInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        x.mul_(2)  # the caller's tensor changes
        return self.linear(x)


def test_forward_changing_its_input_in_place_is_refused_naming_it():
    """The recorded sample would be the input after the change, not the one the outputs came
    from (every candidate then looked wrong, blamed on a node), and an ONNX graph cannot
    write its input back: refused while recording, naming the input."""
    model = ait.Module(DoublesItsInput().eval(), "doubles", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ValueError, match=r"forward changed its input \['x'\] in place"):
        ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    x = torch.ones(1, 4)
    model(x)
    assert torch.equal(x, torch.full((1, 4), 2.0))  # eager, as the user wrote it


class WritesIntoItsCacheList(torch.nn.Module):
    """Keeps its updated cache in the list it is given (``cache[i] = ...``): no tensor
    changes in place, the caller's list does."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, cache):
        h = self.linear(x)
        cache[0] = cache[0] + h  # the caller's list now holds a new tensor
        return h


def test_forward_changing_a_list_it_is_given_is_refused_naming_it():
    """A forward that replaces an item of a list it is given (a KV cache kept in the
    caller's list) changes what the caller holds; a graph returns outputs only, so the tuned
    module (general path or route) left the caller's list as it was: silently not eager's
    result. Refused while recording, naming the argument; the module stays eager."""
    inner = WritesIntoItsCacheList().eval()
    model = ait.Module(inner, "cache-list", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ValueError, match=r"forward changed its input \['cache'\] \(an item of a list or dict"):
        ait.tune(model, [{"x": torch.randn(4), "cache": [torch.randn(4)]} for _ in range(2)],
                 ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    x, before = torch.randn(1, 4), torch.randn(1, 4)
    cache = [before]
    with torch.no_grad():
        h = model(x, cache)
    assert cache[0] is not before and torch.allclose(cache[0], before + h)  # eager, as the user wrote it


class KeepsPythonState(torch.nn.Module):
    """Updates plain Python attributes in forward (no buffer): a call counter, a list of
    what it saw. Neither changes the outputs, so only watching the attributes tells."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)
        self.inner.calls = 0  # on a submodule: named by its path
        self.seen = []
        self.lazy = None  # set once, on the first call: a memo, not state that keeps changing

    def forward(self, x):
        if self.lazy is None:
            self.lazy = "ready"
        self.inner.calls += 1
        self.seen.append(x.shape[0])
        return self.inner(x)


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_python_attributes_updated_in_forward_are_refused_naming_them(use_dynamo):
    """An ONNX graph drops every Python side effect of forward: the tuned module would
    silently stop counting and stop appending. Refused like a buffer update, naming the
    attributes; tuning's own calls leave them as the recorded calls did, and the module
    stays eager (the attributes keep changing)."""
    samples = [torch.randn(4) for _ in range(2)]
    recorded = KeepsPythonState().eval()
    ait.tune(ait.Module(recorded, "py-state-dry", strategy=cpu_strategy()), samples, dry_run=True, progress=False)

    inner = KeepsPythonState().eval()
    model = ait.Module(inner, "py-state", strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    with pytest.raises(ExportError, match=r"forward changes the module's state \(inner\.calls, seen\)") as refused:
        ait.tune(model, samples, ignore_failing_modules=False, progress=False)
    assert "lazy" not in str(refused.value)
    assert model.ait_state is ModuleState.PASSTHROUGH
    assert inner.inner.calls == recorded.inner.calls and inner.seen == recorded.seen
    model(torch.randn(1, 4))
    assert inner.inner.calls == recorded.inner.calls + 1 and inner.seen == [*recorded.seen, 1]


class CountsAndMemoizes(torch.nn.Module):
    """A call counter used only for logging and a cache of a value computed from the
    weights, stored on every call: harmless to the outputs."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)
        self.calls = 0
        self.inner.bias_cache = {}

    def forward(self, x):
        self.calls += 1
        self.inner.bias_cache["bias"] = self.inner.bias.detach() * 0  # stored again on every call
        return self.inner(x) + self.inner.bias_cache["bias"]


def test_harmless_attributes_let_a_counter_and_a_cache_be_exported():
    """Declared with harmless_attributes (a bare name, a path), the counter and the cache no
    longer refuse the export; the refusal without them names the option; an entry naming no
    attribute is refused; a wrong type is refused at wrapping."""
    samples = [torch.randn(4) for _ in range(2)]
    refused = ait.Module(CountsAndMemoizes().eval(), "harmless-refused", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ExportError, match=r"(?s)\(calls, inner\.bias_cache\).*harmless_attributes"):
        ait.tune(refused, samples, ignore_failing_modules=False, progress=False)

    inner = CountsAndMemoizes().eval()
    model = ait.Module(inner, "harmless", strategy=cpu_strategy(tune_provider_options=False),
                       harmless_attributes=["calls", "inner.bias_cache"])
    ait.tune(model, samples, ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.TUNED
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.allclose(model(x), inner.inner(x), atol=1e-5)

    typo = ait.Module(CountsAndMemoizes().eval(), "harmless-typo", strategy=cpu_strategy(tune_provider_options=False),
                      harmless_attributes=["calls", "inner.bias_cahce"])
    with pytest.raises(ValueError, match=r"harmless_attributes names \['inner\.bias_cahce'\]"):
        ait.tune(typo, samples, ignore_failing_modules=False, progress=False)
    with pytest.raises(TypeError, match="harmless_attributes must be a list"):
        ait.Module(CountsAndMemoizes(), "harmless-str", harmless_attributes="calls")


class DropoutNormHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.norm(self.fc(x)))


def test_a_submodule_put_in_train_mode_after_tuning_runs_eagerly_until_back_in_eval(caplog, monkeypatch):
    """Monte Carlo dropout (the model in eval(), its Dropout layers put back in train()) and a
    BatchNorm left to update its statistics: the wrapped module itself stays in eval(), so
    the graph (exported in eval) kept serving, silently without dropout and with frozen
    statistics. A call while any submodule is in another mode than at tuning runs eagerly,
    naming the submodules once in the log, on the C++ half's routes as on the general path;
    back in eval() the graph serves again."""
    inner = DropoutNormHead().eval()
    model = ait.Module(inner, "mc-dropout", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.ones(2, 4)
    with torch.no_grad():
        model(x)
    assert model._ait_calls.direct is not None, "the C++ half serves this call form now"
    inner.drop.train()
    with caplog.at_level("WARNING", logger="aitune"), torch.no_grad():
        torch.manual_seed(0)
        sampled = model(x)
        torch.manual_seed(0)
        expected = inner(x)
        again = model(x)
    torch.testing.assert_close(sampled, expected)  # the same dropout mask: it ran eagerly
    assert not torch.equal(sampled, again), "dropout draws a new mask per call"
    messages = [r.getMessage() for r in caplog.records if "drop (Dropout)" in r.getMessage()]
    assert len(messages) == 1 and "train mode" in messages[0], caplog.text
    inner.drop.eval()
    with torch.no_grad(), monkeypatch.context() as patch:
        expected = inner(x)
        patch.setattr(inner, "forward", lambda *a, **k: pytest.fail("the eager forward ran"))
        torch.testing.assert_close(model(x), expected)
    inner.norm.train()
    before = inner.norm.running_mean.clone()
    with torch.no_grad():
        model(torch.randn(2, 4))
    assert not torch.equal(inner.norm.running_mean, before), "BatchNorm in train() updates its statistics"


def test_weights_written_in_place_after_tuning_deactivate_the_graphs_at_the_next_call(caplog):
    """A weight written in place under torch.no_grad() after tuning (an edit, a copy_ from
    elsewhere): the ONNX graph holds the old weights, and a routed call (served in C++
    without Python) computed the old model, silently (0.49 off). The C++ half serves routed
    calls only while the version counters of the weights are as tuning left them: the next
    call runs the new weights eagerly, and the module says which weight changed."""
    inner = DropoutNormHead().eval()
    model = ait.Module(inner, "edited", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        model(x), model(x)  # the second call is routed: the C++ half serves it
        assert model._ait_calls.direct is not None
        before = model(x).clone()
        inner.fc.weight.mul_(2)
        with caplog.at_level("WARNING", logger="aitune"):
            after = model(x)
        torch.testing.assert_close(after, inner(x))
        assert not torch.allclose(after, before)
    assert not model.ait_active
    assert any("changed in place (fc.weight)" in r.getMessage() for r in caplog.records), caplog.text
    model.activate()  # knowingly: the graphs run the weights they were tuned with, and stay active
    with torch.no_grad():
        torch.testing.assert_close(model(x), before)
        torch.testing.assert_close(model(x), before)
    assert model.ait_active


@pytest.mark.parametrize("how", ["parameter", "buffer", "submodule"])
def test_weights_replaced_on_the_wrapped_module_deactivate_the_graphs(how, caplog):
    """A weight replaced by assignment on the wrapped module (``fc.weight = nn.Parameter(w)``,
    ``register_buffer`` again, or with its submodule: ``model.fc = nn.Linear(...)``, as
    timm's reset_classifier and transformers' resize_token_embeddings do) moves no version
    counter: the graph held the old tensors' values and routed calls computed the old
    model, silently. The C++ half watches the objects in the weights' and submodules'
    slots: the next call runs eagerly and the module says which."""
    inner = DropoutNormHead().eval()
    inner.register_buffer("offset", torch.zeros(4))
    forward = type(inner).forward
    inner.forward = lambda x: forward(inner, x) + inner.offset
    model = ait.Module(inner, "replaced", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        model(x), model(x)
        assert model._ait_calls.direct is not None
        before = model(x).clone()
        if how == "parameter":
            inner.fc.weight = torch.nn.Parameter(inner.fc.weight * 2)
            named = "fc.weight"
        elif how == "buffer":
            inner.register_buffer("offset", torch.ones(4))
            named = "offset"
        else:
            inner.fc = torch.nn.Linear(4, 4)
            named = "fc"
        with caplog.at_level("WARNING", logger="aitune"):
            after = model(x)
        torch.testing.assert_close(after, inner.forward(x))
        assert not torch.allclose(after, before)
    assert not model.ait_active
    said = ("replaced with the submodules holding them (fc)" if how == "submodule"
            else f"replaced by other tensors ({named})")
    assert any(said in r.getMessage() for r in caplog.records), caplog.text


def test_loading_the_weights_a_module_has_keeps_its_graphs(caplog):
    """load_state_dict of the values the weights hold (a checkpoint round trip), on the
    module or on a parent, writes them in place and so moves their version counters: no
    change of the model, so the graphs stay active and routed calls go on."""
    inner = DropoutNormHead().eval()
    model = ait.Module(inner, "reloaded", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    parent = torch.nn.Sequential(model)
    x = torch.randn(2, 4)
    with torch.no_grad(), caplog.at_level("WARNING", logger="aitune"):
        model(x), model(x)
        version = inner.fc.weight._version
        model.load_state_dict(model.state_dict())
        parent.load_state_dict(parent.state_dict())
        assert inner.fc.weight._version > version  # written in place, twice
        torch.testing.assert_close(model(x), inner(x))
        model(x)
    assert model.ait_active and model._ait_calls.direct is not None
    assert not [r for r in caplog.records if "changed" in r.getMessage()], caplog.text


_OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.5),
    # one kernel for the whole update, no version counter moved (0.32-0.40 off, silently, in a
    # session-31 probe): weight_changes.see_fused_optimizer_steps moves them
    "sgd-fused": lambda params: torch.optim.SGD(params, lr=0.5, fused=True),
    "adamw-fused": lambda params: torch.optim.AdamW(params, lr=0.5, fused=True),
}


@pytest.mark.parametrize("make_optimizer", _OPTIMIZERS.values(), ids=_OPTIMIZERS.keys())
def test_weights_changed_by_calls_run_eagerly_in_train_mode_deactivate_the_graphs(caplog, make_optimizer):
    """Fine-tuning through the tuned module (train(), optimizer steps) or a BatchNorm left in
    train() changes the weights in place while the calls run eagerly; back in eval(), the
    graph (holding the weights it was tuned with) computed the old model, silently. The first
    call back in the tuned mode compares the version counters of the parameters and buffers:
    changed, the module is deactivated (eager, its new weights), saying which."""
    inner = DropoutNormHead().eval()
    model = ait.Module(inner, "fine-tuned", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        model(x)
    model.train()
    optimizer = make_optimizer(model.parameters())
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(2, 4)).pow(2).sum().backward()
        optimizer.step()
    model.eval()
    with caplog.at_level("WARNING", logger="aitune"), torch.no_grad():
        torch.testing.assert_close(model(x), inner(x))  # the trained weights
        torch.testing.assert_close(model(x), inner(x))
    assert not model.ait_active
    assert any("changed in place" in r.getMessage() and "fc.weight" in r.getMessage() for r in caplog.records), \
        caplog.text

    untouched = DropoutNormHead().eval()
    model = ait.Module(untouched, "train-no-step", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    untouched.drop.train()  # dropout only: nothing changes in place
    with torch.no_grad():
        model(x)
    untouched.drop.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), untouched(x))
        model(x)
    assert model.ait_active and model._ait_calls.direct is not None, "the graph serves again, by the C++ half"


class WritesRowsOfItsCache(torch.nn.Module):
    """A KV-cache-like buffer written row by row and read back whole: the outputs depend on
    what earlier calls left in it."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(2, 4))

    def forward(self, x):
        self.cache[: x.shape[0]] = self.fc(x)
        return self.cache.sum(0)


def test_outputs_that_read_state_a_call_changed_are_refused_naming_the_state():
    """Eager is not repeatable here (the second call reads what the first left), so the tune
    stops before any export; the refusal said only 'depends on state that each call
    changes'. It names the buffers the recorded calls changed."""
    model = ait.Module(WritesRowsOfItsCache().eval(), "row-cache", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ait.TuningError, match=r"changed the module's state \(cache\)"):
        ait.tune(model, [torch.randn(4) for _ in range(3)], ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH


class WritesItsInputThroughData(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        x.data.add_(1.0)  # no version counter moves: not seen as "forward changes its input"
        return self.fc(x)


def test_an_input_written_through_data_is_named_among_the_causes():
    """A forward writing its input through ``.data`` is not repeatable either; the refusal
    named random numbers and changing state only (a session-31 probe)."""
    model = ait.Module(WritesItsInputThroughData().eval(), "data-write",
                       strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ait.TuningError, match=r"not deterministic.*x\.data\.add_"):
        ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)


def _tuned_and_routed(inner: torch.nn.Module, name: str):
    """``inner`` (4 features in) tuned on the CPU and called until the C++ half routes its
    calls: (the ait.Module, an input)."""
    model = ait.Module(inner, name, strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        model(x), model(x)
    assert model._ait_calls.direct is not None
    return model, x


class ScaledByAPlainTensor(torch.nn.Module):
    """Keeps a tensor as a plain attribute (not ``register_buffer``): the export holds it
    as a constant all the same."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.scale = torch.ones(4)

    def forward(self, x):
        return self.fc(x) * self.scale


@pytest.mark.parametrize("how", ["in-place", "assigned", "equal-copy-then-in-place"])
def test_a_tensor_kept_as_a_plain_attribute_is_watched_like_a_buffer(how, caplog):
    """``self.scale.mul_(3)`` or ``self.scale = other`` after tuning: the graph held the old
    values and computed the old model, silently. Now the tensor's counter and slot are
    watched with the weights'. An equal copy assigned is no change, and is watched from then on."""
    inner = ScaledByAPlainTensor().eval()
    model, x = _tuned_and_routed(inner, "plain-tensor")
    with torch.no_grad():
        if how == "assigned":
            inner.scale = torch.full((4,), 3.0)
        else:
            if how == "equal-copy-then-in-place":
                inner.scale = inner.scale.clone()  # the same values again: the graph still holds them
                torch.testing.assert_close(model(x), ScaledByAPlainTensor.forward(inner, x))
                assert model.ait_active and model._ait_calls.cpp.attributes_clear()
            inner.scale.mul_(3)
        with caplog.at_level("WARNING", logger="aitune"):
            after = model(x)
        torch.testing.assert_close(after, ScaledByAPlainTensor.forward(inner, x))
    assert not model.ait_active
    named = "replaced by other tensors (scale)" if how == "assigned" else "changed in place (scale)"
    assert any(named in r.getMessage() for r in caplog.records), caplog.text


class ScaledByAnArray(torch.nn.Module):
    """Keeps a numpy array and reads it through ``torch.from_numpy``: a constant to the export."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.table = np.ones(4, dtype=np.float32)

    def forward(self, x):
        return self.fc(x) * torch.from_numpy(self.table)


@pytest.mark.parametrize("how", ["assigned", "equal-copy"])
def test_a_numpy_array_attribute_reassigned_is_watched_like_a_tensor(how, caplog):
    """``model.table = np.full(4, 3.0)`` after tuning: the graph held the old array (3.17 off
    eager in a probe), silently. The array's slot is watched as a tensor attribute's; an equal
    copy is no change."""
    inner = ScaledByAnArray().eval()
    model, x = _tuned_and_routed(inner, "numpy-table")
    inner.table = np.full(4, 3.0 if how == "assigned" else 1.0, dtype=np.float32)
    with torch.no_grad(), caplog.at_level("WARNING", logger="aitune"):
        after = model(x)
    torch.testing.assert_close(after, ScaledByAnArray.forward(inner, x))
    assert model.ait_active is (how == "equal-copy")
    if how == "assigned":
        assert any("replaced by other tensors (table)" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize("how", ["append", "add_module"])
def test_a_submodule_added_to_a_sequential_after_tuning_deactivates_the_graphs(how, caplog):
    """``Sequential.append`` (or ``add_module``) after tuning: forward runs the new layer,
    the graph did not, silently (0.9 off). A key added to a watched ``_modules`` dict now
    counts as a change, named."""
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    model, x = _tuned_and_routed(inner, "appended")
    with torch.no_grad():
        if how == "append":
            inner.append(torch.nn.Softmax(-1))
        else:
            inner.add_module("act", torch.nn.Tanh())
        with caplog.at_level("WARNING", logger="aitune"):
            after = model(x)
        torch.testing.assert_close(after, torch.nn.Sequential.forward(inner, x))
    assert not model.ait_active
    named = "2" if how == "append" else "act"
    assert any(f"added since tuning ({named})" in r.getMessage() for r in caplog.records), caplog.text


def test_torchs_containers_in_another_mode_are_no_change(caplog, monkeypatch):
    """weight_norm added after model.eval() creates its parametrization containers in train
    mode; a later .eval() put them in eval mode and every call ran eagerly (their code never
    reads `training`). A Dropout in another mode still runs the call eagerly."""
    import logging

    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Dropout(0.5), torch.nn.Linear(64, 16)).eval()
    torch.nn.utils.parametrizations.weight_norm(net[0])
    model = ait.Module(net, "weight-norm", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(32) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 32)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="aitune"):
        expected = net(x)
        model.eval()
        # the wrapped module's own instance forward (not its class's: a class patch is a change)
        monkeypatch.setattr(net, "forward", lambda *a, **k: pytest.fail("ran eagerly"), raising=False)
        torch.testing.assert_close(model(x), expected)
        monkeypatch.undo()
        net[1].train()  # Monte Carlo dropout: the graph has none
        model(x)
    said = [r.getMessage() for r in caplog.records if "another mode" in r.getMessage()]
    assert len(said) == 1 and "1 (Dropout)" in said[0] and "parametriz" not in said[0], said


class AppendsToItsList(torch.nn.Module):
    """Collects an intermediate feature for the caller in the list it is given."""

    def forward(self, x, feats):
        feats.append(x * 2)
        return x + 1


@pytest.mark.parametrize("how", ["call", "tune"])
def test_forward_appending_to_a_list_it_is_given_is_refused_naming_it(how):
    """An appended tensor made the arguments flatten to more tensors after the call than
    before, and the in-place check raised `zip() argument 2 is shorter than argument 1`
    (from calling the untuned module, which records, and from ait.tune). Now the same
    refusal as an item replaced: the call runs eagerly and ait.tune names the argument."""
    model = ait.Module(AppendsToItsList().eval(), f"appends-{how}", strategy=cpu_strategy(tune_provider_options=False))
    x = torch.ones(1, 2)
    if how == "call":
        feats = []
        assert torch.equal(model(x, feats), x + 1)  # recorded by calling: eagerly, appended as eager does
        assert len(feats) == 1 and torch.equal(feats[0], x * 2)
        assert not model.ait_graphs  # not recorded: no graph would append
        return
    with pytest.raises(ValueError, match=r"forward changed its input \['feats'\] \(an item of a list or dict"):
        ait.tune(model, [{"x": torch.randn(2), "feats": []} for _ in range(2)],
                 ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    feats = []
    with torch.no_grad():
        model(x, feats)
    assert len(feats) == 1 and torch.equal(feats[0], x * 2)  # eager, as the user wrote it


class KeepsNestedPythonState(torch.nn.Module):
    """A counter in a SimpleNamespace and a list inside a dict, updated in forward: the
    attributes themselves stay the same objects, only what they hold changes."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.stats = types.SimpleNamespace(calls=0)
        self.history = {"norms": []}

    def forward(self, x):
        self.stats.calls += 1
        self.history["norms"].append(float(x.detach().norm()))
        return self.linear(x)


def test_python_state_nested_in_plain_holders_is_refused_naming_them():
    """Watched by identity alone, ``self.stats.calls += 1`` and ``self.history["norms"]
    .append(...)`` were dropped by the graph silently, and tuning's own calls left the
    counter at 368 for 3 samples (a session-35 probe)."""
    samples = [torch.randn(4) for _ in range(3)]
    recorded = KeepsNestedPythonState().eval()
    ait.tune(ait.Module(recorded, "nested-dry", strategy=cpu_strategy()), samples, dry_run=True, progress=False)
    inner = KeepsNestedPythonState().eval()
    model = ait.Module(inner, "nested-state", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ExportError, match=r"forward changes the module's state \(history, stats\)"):
        ait.tune(model, samples, ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    assert inner.stats.calls == recorded.stats.calls and inner.history == recorded.history


class UnregisteredHead(torch.nn.Module):
    """A head kept where nn.Module does not register it: a plain list, or a namespace."""

    def __init__(self, where: str):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        head = torch.nn.Linear(4, 4)
        if where == "list":
            self.heads = [head]
        else:
            self.settings = types.SimpleNamespace(head=head)
        self.where = where

    def head(self) -> torch.nn.Linear:
        return self.heads[0] if self.where == "list" else self.settings.head

    def forward(self, x):
        return self.head()(self.linear(x))


@pytest.mark.parametrize("where", ["list", "namespace"])
def test_weights_of_a_module_kept_in_a_plain_holder_written_after_tuning_deactivate_the_graphs(where, caplog):
    """An export holds such a head's weights as constants, but they were not watched: after
    an in-place write the tuned module went on computing the old head, 0.6-6 off, silently
    (a session-35 probe)."""
    import logging

    inner = UnregisteredHead(where).eval()
    model = ait.Module(inner, f"unregistered-{where}", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False,
             performance_validation=False)
    assert model.ait_backends
    x = torch.randn(2, 4)
    with torch.no_grad():
        inner.head().weight.mul_(2.0)
        with caplog.at_level(logging.WARNING, logger="aitune"):
            torch.testing.assert_close(model(x), inner(x))
    assert any("changed in place" in r.getMessage() and "head" in r.getMessage() for r in caplog.records)


class Totals:
    """An object of the user's own class (watched by identity alone) holding a tensor."""

    def __init__(self):
        self.total = torch.zeros(4)


class WritesATensorItHoldsInAnObject(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.totals = Totals()

    def forward(self, x):
        self.totals.total.add_(x.detach().sum(0))
        return self.linear(x)


def test_a_tensor_outside_the_buffers_written_in_forward_is_refused_without_pointing_to_the_trace():
    """torch.export refuses "Constant lifted_tensor_0 is mutated in the forward method"; the
    hint spoke of control flow and named use_dynamo=False, whose trace drops the write
    silently (a session-35 probe)."""
    model = ait.Module(WritesATensorItHoldsInAnObject().eval(), "object-total",
                       strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ExportError, match="neither a parameter nor a registered buffer") as refused:
        ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    assert "use_dynamo=False" not in str(refused.value)


_CALLS = 0


class CountsInAGlobal(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        global _CALLS
        _CALLS += 1
        return self.linear(x)


def test_a_module_global_forward_assigns_is_refused_as_state_and_put_back():
    """``global CALLS; CALLS += 1`` was dropped by the graph silently: tuned calls stopped
    counting (a session-35 probe). Refused like an attribute, naming the global, and
    tuning's own calls leave it where the recorded calls left it."""
    global _CALLS
    _CALLS = 0
    model = ait.Module(CountsInAGlobal().eval(), "global-calls", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ExportError, match=r"forward changes the module's state \([\w.]*_CALLS\)"):
        ait.tune(model, [torch.randn(4) for _ in range(3)], ignore_failing_modules=False, progress=False)
    recorded = _CALLS
    assert recorded <= 6, recorded  # the samples' own calls, not tuning's hundreds
    model(torch.randn(1, 4))
    assert _CALLS == recorded + 1


class CountsOnItsClass(torch.nn.Module):
    """A call counter and a history kept on the class, shared by every instance."""

    calls = 0
    history: list = []

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        type(self).calls += 1
        return self.linear(x)


class KeepsHistoryOnItsClass(CountsOnItsClass):
    def forward(self, x):
        self.history.append(1)
        return self.linear(x)


@pytest.mark.parametrize("kind", [CountsOnItsClass, KeepsHistoryOnItsClass], ids=["counter", "list"])
def test_state_forward_keeps_on_its_class_is_refused_naming_it_and_put_back(kind):
    """``type(self).calls += 1`` was tuned: the graph stopped counting silently, tuning's own
    calls pushed the counter to hundreds, and a warning per dispatched call named the class
    value as "replaced" (375 lines; a session-36 probe). Refused like an attribute, naming
    the class value, and tuning's own calls leave it where the recorded calls left it."""
    CountsOnItsClass.calls, CountsOnItsClass.history[:] = 0, []
    model = ait.Module(kind().eval(), "class-state", strategy=cpu_strategy(tune_provider_options=False))
    name = "calls" if kind is CountsOnItsClass else "history"
    with pytest.raises(ExportError, match=rf"forward changes the module's state \(CountsOnItsClass\.{name}\)"):
        ait.tune(model, [torch.randn(4) for _ in range(3)], ignore_failing_modules=False, progress=False)
    recorded = CountsOnItsClass.calls + len(CountsOnItsClass.history)
    assert recorded <= 6, recorded  # the samples' own calls, not tuning's hundreds
    model(torch.randn(1, 4))
    assert CountsOnItsClass.calls + len(CountsOnItsClass.history) == recorded + 1


def test_a_class_value_declared_harmless_is_not_state():
    CountsOnItsClass.calls = 0
    model = ait.Module(CountsOnItsClass().eval(), "class-harmless", strategy=cpu_strategy(tune_provider_options=False),
                       harmless_attributes=["calls"])
    ait.tune(model, [torch.randn(4) for _ in range(3)], ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.TUNED


class UpdatesTheObjectItIsGiven(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, stats):
        stats.calls += 1
        stats.last_norm = x.norm()
        return self.linear(x)


class Stats:  # a user class, compared by identity
    def __init__(self):
        self.calls, self.last_norm = 0, None


@pytest.mark.parametrize("kind", [lambda: types.SimpleNamespace(calls=0, last_norm=None), Stats],
                         ids=["namespace", "object"])
def test_forward_updating_an_object_it_is_given_is_refused_naming_it(kind):
    """forward set ``stats.calls += 1; stats.last_norm = x.norm()`` on an object it was given:
    recorded, the export then wrote a FakeTensor and its own calls' count into the caller's
    object and failed with a GraphNotRecordedError whose two sides read the same (a
    session-36 probe). Refused at recording like a list it changes, naming the argument."""
    stats = kind()
    model = ait.Module(UpdatesTheObjectItIsGiven().eval(), "updates-object",
                       strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ValueError, match=r"forward changed the attributes of its input \['stats'\]"):
        ait.tune(model, [((torch.randn(4),), {"stats": stats}) for _ in range(3)], ignore_failing_modules=False,
                 progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    assert isinstance(stats.last_norm, torch.Tensor) and type(stats.last_norm) is torch.Tensor  # no FakeTensor
    assert stats.calls <= 6, stats.calls
    calls = stats.calls
    model(torch.randn(1, 4), stats=stats)
    assert stats.calls == calls + 1  # eager, as the user wrote it


def test_an_object_argument_forward_only_reads_is_no_change():
    class Settings:
        def __init__(self):
            self.scale = 2.0

    model = ait.Module(ReadsSettings().eval(), "reads-object", strategy=cpu_strategy(tune_provider_options=False))
    settings = Settings()
    ait.tune(model, [((torch.randn(4),), {"settings": settings}) for _ in range(2)], ignore_failing_modules=False,
             progress=False)
    assert model.ait_state is ModuleState.TUNED


class ReadsSettings(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, settings):
        return self.linear(x) * settings.scale


class OffsetOnItsClass(torch.nn.Module):
    """Reads a tensor its class body defines (``self.OFFSET``): a constant to the export."""

    OFFSET = torch.zeros(4)

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) + self.OFFSET


@pytest.mark.parametrize("how", ["in-place", "assigned"])
def test_a_tensor_its_class_holds_is_watched_like_a_plain_tensor_attribute(how, caplog):
    """``Class.OFFSET.add_(5)`` or ``Class.OFFSET = other`` after tuning: the graph held the
    old values, 5 off eager, silently (a session-36 probe). Now the class's tensors are
    watched: the call runs eagerly, naming it."""
    saved = OffsetOnItsClass.OFFSET
    inner = OffsetOnItsClass().eval()
    try:
        model, x = _tuned_and_routed(inner, f"class-tensor-{how}")
        with torch.no_grad():
            if how == "assigned":
                OffsetOnItsClass.OFFSET = torch.full((4,), 5.0)
            else:
                OffsetOnItsClass.OFFSET.add_(5)
            with caplog.at_level("WARNING", logger="aitune"):
                after = model(x)
            torch.testing.assert_close(after, OffsetOnItsClass.forward(inner, x))
        assert "OffsetOnItsClass.OFFSET" in caplog.text, caplog.text
    finally:
        OffsetOnItsClass.OFFSET = saved
        saved.zero_()
