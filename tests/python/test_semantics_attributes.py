"""A plain Python value an ONNX graph holds as a constant (``x / self.temperature``, a
config flag) reassigned after tuning: the tuned module runs such calls eagerly and says
so, instead of computing the old model (baked_attributes.py)."""

from __future__ import annotations

import fractions
import logging
import os

import numpy as np
import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState


class Settings:
    """A plain object of settings, as a transformers config is, shared by the modules."""

    def __init__(self):
        self.shift = 0.0
        self.note = "tuned"


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.temperature = 1.0
        self.settings = Settings()
        self.calls = 0  # declared harmless where a test changes it

    def forward(self, x):
        return (self.linear(x) / self.temperature + self.settings.shift).softmax(-1)


def _tuned(harmless=()):
    inner = Scaled().eval()
    model = ait.Module(inner, "scaled", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False),
                       harmless_attributes=harmless)
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    assert model.ait_state is ModuleState.TUNED
    eager_calls = []
    forward = inner.forward
    inner.forward = lambda *a, **k: (eager_calls.append(1), forward(*a, **k))[1]  # counts the eager calls
    return inner, model, eager_calls


def _close(model, inner, x) -> bool:
    """The tuned module's output is eager PyTorch's as the module is now (uncounted)."""
    with torch.no_grad():
        return torch.allclose(model(x), type(inner).forward(inner, x), atol=1e-6)


def test_a_reassigned_value_runs_eagerly_until_it_is_back(caplog):
    inner, model, eager_calls = _tuned()
    x = torch.randn(2, 4)
    assert _close(model, inner, x) and eager_calls == []  # the graph serves
    inner.temperature = 0.1
    with caplog.at_level(logging.WARNING, logger="aitune"):
        assert _close(model, inner, x) and _close(model, inner, x)  # eager's outputs, not the graph's
    assert len(eager_calls) == 2
    said = [r.getMessage() for r in caplog.records if "plain Python attributes" in r.getMessage()]
    assert len(said) == 1 and "temperature: 1.0 -> 0.1" in said[0], said  # said once
    model.temperature = 1.0  # through the proxy, a new float object equal to the graph's
    assert _close(model, inner, x) and _close(model, inner, x)
    assert len(eager_calls) == 2  # the graph serves again
    assert model._ait_calls.cpp.attributes_clear()  # and the C++ half's guard takes the new object


def test_a_value_of_a_plain_object_the_module_holds_is_watched():
    inner, model, eager_calls = _tuned()
    x = torch.randn(2, 4)
    inner.settings.shift = 5.0
    assert _close(model, inner, x) and eager_calls == [1]
    inner.settings.shift = 0.0
    inner.settings.note = "read by nothing"  # watched too: forward's reads are not known
    assert _close(model, inner, x) and eager_calls == [1, 1]


def test_new_attributes_and_harmless_ones_leave_the_graph_serving():
    inner, model, eager_calls = _tuned(harmless=("calls",))
    x = torch.randn(2, 4)
    inner.calls = 7  # declared harmless
    inner.added_later = 3.5  # not there when the graphs were exported: nothing they hold
    inner.linear.extra = "x"
    assert _close(model, inner, x) and eager_calls == []
    assert model._ait_calls.cpp.attributes_clear()


def test_a_nan_value_is_equal_to_itself():
    inner = Scaled().eval()
    inner.settings.note = float("nan")
    model = ait.Module(inner, "nan", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    inner.settings.note = float("nan")  # another NaN object (NaN != NaN): the same value
    assert not model._ait_calls.cpp.attributes_clear()
    assert not model._ait_calls.changed_attributes() and model._ait_calls.cpp.attributes_clear()


def test_a_checkpoint_expects_the_values_its_graphs_hold(tmp_path, caplog):
    inner, model, _ = _tuned()
    ait.save(model, tmp_path / "ckpt")
    other = Scaled().eval()
    other.linear.load_state_dict(inner.linear.state_dict())
    other.temperature = 0.5
    x = torch.randn(2, 4)
    with caplog.at_level(logging.WARNING, logger="aitune"):
        loaded = ait.load(ait.Module(other, "scaled"), tmp_path / "ckpt")
        assert _close(loaded, other, x)  # eager: the graph holds 1.0
    said = [r.getMessage() for r in caplog.records if "plain Python attributes" in r.getMessage()]
    assert len(said) == 1 and "ait.load" in said[0] and "temperature: 1.0 -> 0.5" in said[0], said
    assert not loaded._ait_calls.cpp.attributes_clear()
    other.temperature = 1.0
    assert _close(loaded, other, x) and loaded._ait_calls.cpp.attributes_clear()  # the graph serves


class FlaggedSettings:
    """A flag behind a property, kept in a private attribute, as transformers 5 keeps
    ``config.output_attentions`` in ``config._output_attentions``."""

    def __init__(self):
        self._negate = False

    @property
    def negate(self):
        return self._negate

    @negate.setter
    def negate(self, value):
        self._negate = value


class Flagged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.settings = FlaggedSettings()

    def forward(self, x):
        y = self.linear(x)
        return -y if self.settings.negate else y


def test_a_value_behind_a_property_of_a_plain_object_is_watched():
    """transformers 5: ``config.output_attentions = True`` after tuning went unseen (the
    value lives in ``config._output_attentions``, and private values were not watched):
    the graph returned no attentions, silently."""
    inner = Flagged().eval()
    model = ait.Module(inner, "flagged", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(x), inner.linear(x))
        inner.settings.negate = True
        torch.testing.assert_close(model(x), -inner.linear(x))
    assert "settings._negate" in model._ait_calls.attributes.snapshot()


class ImplementationSettings:
    """transformers 5's form: the private property ``_attn_implementation`` over
    ``_attn_implementation_internal`` (``model.set_attn_implementation`` writes the latter)."""

    def __init__(self):
        self._attn_implementation_internal = "sdpa"

    @property
    def _attn_implementation(self):
        return self._attn_implementation_internal


class Implemented(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.config = ImplementationSettings()

    def forward(self, x):
        y = self.linear(x)
        return torch.tanh(y) if self.config._attn_implementation == "eager" else y


def test_a_value_behind_a_private_property_is_watched():
    """Gemma2 tuned under sdpa attention, then ``set_attn_implementation("eager")`` (which
    soft-caps the scores): the graph kept serving, 0.345 off eager, silently."""
    inner = Implemented().eval()
    model = ait.Module(inner, "implemented", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(x), inner.linear(x))
        inner.config._attn_implementation_internal = "eager"
        torch.testing.assert_close(model(x), torch.tanh(inner.linear(x)))
    assert "config._attn_implementation_internal" in model._ait_calls.attributes.snapshot()


class _Shaped(torch.nn.Module):
    """A flag that changes what forward returns: a dict, or a tuple in another order."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.as_dict = True

    def forward(self, x):
        h = self.fc(x)
        if self.as_dict:
            return {"logits": h.softmax(-1), "feats": h}
        return h, h.softmax(-1)


def test_a_flag_that_changes_the_output_structure_of_a_compile_winner_runs_eagerly(caplog):
    """torch.compile recompiles on the flag, but the module rebuilt the compiled outputs in the
    structure recorded with the old value: the tuple came back as the recorded dict, eager's
    features under "logits", with no warning."""
    torch.manual_seed(0)
    inner = _Shaped().eval()
    backend = ait.TorchCompileBackend(ait.TorchCompileBackendConfig(mode="default"))
    model = ait.Module(inner, "compile_structure_flag", strategy=ait.OneBackendStrategy(backend))
    ait.tune(model, [torch.randn(8) for _ in range(2)], batch_sizes=[2], progress=False,
             performance_validation=False)
    assert list(model.ait_backends.values())[0].startswith("TorchCompileBackend")
    x = torch.randn(2, 8)
    inner.as_dict = False
    with caplog.at_level(logging.WARNING, logger="aitune"):
        out = model(x)
    assert isinstance(out, tuple)
    torch.testing.assert_close(out, inner.forward(x))
    assert any("as_dict: True -> False" in r.getMessage() for r in caplog.records), caplog.text
    inner.as_dict = True  # back: the recorded structure holds again
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aitune"):
        out = model(x)
    # (gradients are on here: the one thing said is that the graph gives the weights none)
    assert set(out) == {"logits", "feats"} and all("weights require grad" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(out, inner.forward(x))


class _Kinds(torch.nn.Module):
    """Values an export bakes that are neither numbers nor strings: a numpy scalar, a
    function called through an attribute, a slice."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.scale = np.float32(1.0)
        self.act = torch.relu
        self.keep = slice(0, 8)

    def forward(self, x):
        return self.act(self.linear(x) * float(self.scale))[..., self.keep]


@pytest.mark.parametrize("change", ["scale", "act", "keep", "lambda"])
def test_numpy_scalars_functions_and_slices_are_watched(change):
    """Each was unwatched: a changed numpy scalar ran the old graph 3.2 off eager, a function
    swapped for another 0.8 off, a slice returned the recorded width, silently."""
    inner = _Kinds().eval()
    if change == "lambda":
        inner.act = lambda t: t.relu()  # two lambdas of one line share their qualified name
    model = ait.Module(inner, "kinds", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    ait.tune(model, [torch.randn(8) for _ in range(2)], ignore_failing_modules=False)
    x = torch.randn(2, 8)
    inner.act = inner.act  # the same object assigned again is the same model
    with torch.no_grad():
        torch.testing.assert_close(model(x), inner(x))
        assert model._ait_calls.cpp.attributes_clear()
        if change == "scale":
            inner.scale = np.float32(3.0)
        elif change == "act":
            inner.act = torch.tanh
        elif change == "keep":
            inner.keep = slice(0, 4)
        else:
            inner.act = [lambda t: t.tanh() for _ in range(1)][0]
        torch.testing.assert_close(model(x), inner(x))
    assert {"scale", "act", "keep"} <= set(model._ait_calls.attributes.snapshot())


def test_a_function_attribute_round_trips_a_checkpoint(tmp_path):
    """A checkpoint names a function by its qualified name (its repr's address differs from
    process to process): loaded into a module holding the same function, the graph serves."""
    inner = _Kinds().eval()
    model = ait.Module(inner, "kinds-saved", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    ait.tune(model, [torch.randn(8) for _ in range(2)], ignore_failing_modules=False)
    assert model._ait_calls.attributes.snapshot()["act"] == "<function torch._VariableFunctionsClass.relu>"
    ait.save(model, tmp_path / "kinds")
    other = _Kinds().eval()
    other.load_state_dict(inner.state_dict())
    loaded = ait.load(ait.Module(other, "kinds-saved"), tmp_path / "kinds")
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), inner(x))
    assert loaded._ait_calls.cpp.attributes_clear()


class _ClassTemperature(torch.nn.Module):
    temperature = 1.0  # a default in the class body: read through self

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x) / self.temperature


def test_a_class_default_shadowed_on_the_instance_runs_eagerly(tmp_path, monkeypatch, caplog):
    """``model.temperature = 0.1`` where ``temperature = 1.0`` is defined in the class body
    made an instance attribute that was not watched (added after tuning): the graph kept
    dividing by 1.0, 10x off, silently. The class attribute is watched as read through the
    instance: shadowed by another value, the calls run eagerly and say so; an equal value or
    the attribute deleted again serve the graph; a checkpoint loaded where the class's
    default differs runs eagerly too. Unchanged, the routed calls stay in C++."""
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    inner = _ClassTemperature().eval()
    model = ait.Module(inner, "class-temperature", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        model(x)
        assert model._ait_calls.cpp.attributes_clear()
        inner.temperature = 0.1
        assert not model._ait_calls.cpp.attributes_clear()
        with caplog.at_level(logging.WARNING, logger="aitune"):
            torch.testing.assert_close(model(x), inner(x))
        assert any("temperature: 1.0 -> 0.1" in r.getMessage() for r in caplog.records)
        inner.temperature = 1.0  # equal: the graph serves again
        assert model._ait_calls.changed_attributes() == []
        del inner.temperature
        assert model._ait_calls.changed_attributes() == []
        torch.testing.assert_close(model(x), inner(x))
        path = ait.save(model, tmp_path / "ckpt")

    monkeypatch.setattr(_ClassTemperature, "temperature", 2.0)  # the class as another version defines it
    other = _ClassTemperature().eval()
    other.load_state_dict(inner.state_dict())
    with caplog.at_level(logging.WARNING, logger="aitune"):
        loaded = ait.load(ait.Module(other, "class-temperature"), path)
    assert any("temperature: 1.0 -> 2.0" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), other(x))


SCALE = 2.0  # a module global forward reads: the export keeps 2.0 as a constant
USE_SHIFT = False


class _GlobalReader(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x) * SCALE
        return y + 1.0 if USE_SHIFT else y


def _globals_changed_run_eagerly(inner, name, monkeypatch, caplog):
    """Tunes ``inner``, then sets SCALE and USE_SHIFT in turn: each call runs eagerly, naming
    the global, and the graph serves again once it is back. (The ait.Module, an input.)"""
    model = ait.Module(inner, name, strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    x = torch.randn(2, 4)
    assert _close(model, inner, x) and model._ait_calls.cpp.attributes_clear()
    for global_name, value in (("SCALE", 3.0), ("USE_SHIFT", True)):
        monkeypatch.setattr(f"{__name__}.{global_name}", value)
        with caplog.at_level(logging.WARNING, logger="aitune"):
            assert _close(model, inner, x)  # eager's outputs, not the graph's
        assert f"{__name__}.{global_name}: " in caplog.text
        monkeypatch.undo()
        assert _close(model, inner, x) and model._ait_calls.cpp.attributes_clear()  # the graph serves again
    return model, x


def test_a_module_global_forward_reads_is_watched_like_an_attribute(monkeypatch, tmp_path, caplog):
    """``x * SCALE`` with SCALE a module global: reassigned after tuning, the graph kept
    computing with 2.0 (1.5x off eager), silently. Now the call runs eagerly, said once,
    until the value is back; a checkpoint expects the value its graphs hold."""
    inner = _GlobalReader().eval()
    model, x = _globals_changed_run_eagerly(inner, "global-reader", monkeypatch, caplog)
    ait.save(model, tmp_path / "ckpt")
    monkeypatch.setattr(f"{__name__}.SCALE", 0.5)
    other = _GlobalReader().eval()
    other.load_state_dict(inner.state_dict())
    loaded = ait.load(ait.Module(other, "global-reader"), tmp_path / "ckpt")
    assert _close(loaded, other, x) and not loaded._ait_calls.cpp.attributes_clear()


class _GlobalThroughAProperty(torch.nn.Module):
    """Reads the global through a property and a helper method of its own class."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    @property
    def scale(self):
        return SCALE

    def shifted(self, y):
        return y + 1.0 if USE_SHIFT else y

    def forward(self, x):
        return self.shifted(self.linear(x) * self.scale)


def test_a_module_global_read_by_a_property_or_helper_of_the_class_is_watched(monkeypatch, caplog):
    """``self.scale`` a property returning ``SCALE``, ``self.shifted(y)`` reading
    ``USE_SHIFT``: changed after tuning, the graph kept the old values, 2.0 off eager,
    silently (a session-36 probe). The methods and properties of the module's own class
    that forward reads through ``self`` are read for globals like forward."""
    _globals_changed_run_eagerly(_GlobalThroughAProperty().eval(), "global-property", monkeypatch, caplog)


class _GlobalThroughSuper(_GlobalReader):
    """Reads the globals only in its base class's forward, reached by ``super()``."""

    def forward(self, x):
        return super().forward(x) - 0.5


def test_a_module_global_read_by_a_base_forward_through_super_is_watched(monkeypatch, caplog):
    """``return super().forward(x) - 0.5``: the globals the base class's forward reads (in its
    own file, as often) were constants of the graph, unwatched, 1.88 off eager after a change
    (a session-37 probe; the same base as a submodule was watched)."""
    _globals_changed_run_eagerly(_GlobalThroughSuper().eval(), "global-super", monkeypatch, caplog)


CONFIG = {"scale": 2.0, "names": ["a"]}  # a config dict forward reads by item


class _Config:
    temperature = 1.0  # a class default the instance does not shadow


class _ValuesOfManyKinds(torch.nn.Module):
    """Reads a global dict's item, a config object's class default, and attributes of
    immutable types beyond numbers and strings."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.config = _Config()
        self.kept = frozenset({"b", "a", "c"})
        self.ratio = fractions.Fraction(1, 2)
        self.span = range(2)

    def forward(self, x):
        y = self.linear(x) * CONFIG["scale"] / self.config.temperature * float(self.ratio) + len(self.span)
        return y + 1.0 if "z" in self.kept else y


@pytest.mark.parametrize("change", ["global dict item", "config class default shadowed", "frozenset", "Fraction",
                                    "range"])
def test_values_of_other_kinds_the_graph_holds_are_watched(change, monkeypatch, caplog):
    """``CONFIG["scale"] = 3.0`` (a module global dict read by item), ``cfg.temperature = 0.1``
    over ``class Cfg: temperature = 1.0``, a ``frozenset`` / ``Fraction`` / ``range`` attribute
    reassigned: the graph kept the old constants, 0.48 to 1e4 off eager, silently (a session-37
    probe). Each now makes calls run eagerly, named."""
    torch.manual_seed(0)
    inner = _ValuesOfManyKinds().eval()
    model = ait.Module(inner, "many-kinds", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    x = torch.randn(2, 4)
    assert _close(model, inner, x) and model._ait_calls.cpp.attributes_clear()
    with torch.no_grad():
        before = inner(x)
    named = {"global dict item": "CONFIG['scale']", "config class default shadowed": "config.temperature",
             "frozenset": "kept", "Fraction": "ratio", "range": "span"}[change]
    if change == "global dict item":
        monkeypatch.setitem(CONFIG, "scale", 3.0)
    elif change == "config class default shadowed":
        inner.config.temperature = 0.1
    elif change == "frozenset":
        inner.kept = frozenset({"z"})
    elif change == "Fraction":
        inner.ratio = fractions.Fraction(3, 2)
    else:
        inner.span = range(5)
    with torch.no_grad():
        assert not torch.allclose(inner(x), before)  # the change matters
    with caplog.at_level(logging.WARNING, logger="aitune"):
        assert _close(model, inner, x)  # eager's outputs, not the graph's
    assert f"{named}: " in caplog.text


def test_a_frozenset_of_strings_is_named_in_one_order_in_every_process():
    """A frozenset of strings iterates in an order of the process's string hash: its repr
    differs between processes, and a checkpoint's value would read as changed at load."""
    from aitune.torch.baked_attributes import shown

    assert shown(frozenset({"b", "a", "c"})) == "frozenset({'a', 'b', 'c'})"


class _Outer(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.inner(x))


@pytest.mark.parametrize("inner_tuned", [False, True], ids=["inner-wrapped", "inner-tuned"])
def test_attributes_of_a_nested_ait_module_are_watched_by_the_outer_tune(inner_tuned, caplog):
    """An ait.Module inside a module tuned as a whole: the outer graph holds the nested
    wrapped module's attributes as constants, but the outer watched the wrapper's own dict
    (aitune's entries) and not the wrapped module's: ``inner.temperature = 2.0`` left the
    outer computing the old model (0.4 off, silently; a session-32 probe)."""
    torch.manual_seed(0)
    wrapped = Scaled().eval()
    inner = ait.Module(wrapped, "nested-inner", strategy=cpu_strategy(tune_provider_options=False))
    samples = [torch.randn(4) for _ in range(3)]
    if inner_tuned:
        ait.tune(inner, samples, batch_sizes=[2], progress=False, ignore_failing_modules=False)
    outer = ait.Module(_Outer(inner).eval(), "nested-outer", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(outer, samples, batch_sizes=[2], progress=False, ignore_failing_modules=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        before = outer(x)
        inner.temperature = 0.25  # lands on the wrapped module, as it would unwrapped
        expected = outer.ait_module.head(wrapped(x))
        with caplog.at_level(logging.INFO, logger="aitune"):
            actual = outer(x)
    assert not torch.allclose(expected, before, atol=1e-3)  # the change matters
    torch.testing.assert_close(actual, expected)


class _Helper(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def activation(self, y):
        return torch.relu(y)

    def forward(self, x):
        return self.activation(self.linear(x))


def test_a_method_forward_calls_replaced_on_the_instance_or_the_class_runs_eagerly(caplog):
    """``model.activation = ...`` (on the instance) or ``Class.activation = ...`` after
    tuning: the graph kept computing relu, 0.5-0.9 off eager, silently (a probe). Both run
    eagerly and say so; with the method back, or after an assignment on the class forward
    does not read, the graph serves again."""
    import types

    torch.manual_seed(0)
    inner = _Helper().eval()
    model = ait.Module(inner, "helper", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(3)], batch_sizes=[2], progress=False,
             ignore_failing_modules=False)
    x = torch.randn(2, 4)
    original = _Helper.activation
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="aitune"):
        served = model(x)
        torch.testing.assert_close(served, inner(x))
        model.activation = types.MethodType(lambda self, y: torch.tanh(y), inner)  # lands on the wrapped module
        torch.testing.assert_close(model(x), torch.tanh(inner.linear(x)))
        del model.activation
        try:
            _Helper.activation = lambda self, y: torch.sigmoid(y)
            torch.testing.assert_close(model(x), torch.sigmoid(inner.linear(x)))
        finally:
            _Helper.activation = original
        said = [r.getMessage() for r in caplog.records]
        assert any("differ from the values" in m and "activation: <function" in m for m in said), said
        assert any("replaced on modules' class" in m and "activation: <function" in m for m in said), said
        _Helper.unrelated = 1  # an assignment on the class forward does not read
        try:
            caplog.clear()
            torch.testing.assert_close(model(x), served)
            assert model._ait_calls.cpp.changed_submodules() == []  # checked once, then routed again
        finally:
            del _Helper.unrelated
    said = [r.getMessage() for r in caplog.records]
    assert not said, said


def _scale_from_environment() -> float:
    """A helper forward calls: its read counts as forward's."""
    return float(os.environ.get("AITUNE_TEST_SCALE", "1"))


class _EnvironmentReader(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x) * _scale_from_environment()
        return y + 1.0 if os.getenv("AITUNE_TEST_SHIFT") else y


def test_environment_variables_forward_reads_are_watched(monkeypatch, tmp_path, caplog):
    """``float(os.environ.get("SCALE", "1"))`` and ``if os.getenv("SHIFT")`` in forward: the
    export held 1.0 and the unshifted branch, so after ``os.environ["SCALE"] = "3"`` the graph
    kept computing the old model (3x off eager), silently. The variables read while ait.tune
    recorded are watched: a change runs the calls eagerly, said once, until it is undone; a
    checkpoint expects the values its graphs hold; torch's own reads are not watched."""
    monkeypatch.delenv("AITUNE_TEST_SCALE", raising=False)
    monkeypatch.delenv("AITUNE_TEST_SHIFT", raising=False)
    inner = _EnvironmentReader().eval()
    model = ait.Module(inner, "environment-reader", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    assert model._ait_environment_reads == ("AITUNE_TEST_SCALE", "AITUNE_TEST_SHIFT")
    x = torch.randn(2, 4)
    assert _close(model, inner, x) and model._ait_calls.cpp.attributes_clear()
    for name, value in (("AITUNE_TEST_SCALE", "3"), ("AITUNE_TEST_SHIFT", "1")):
        monkeypatch.setenv(name, value)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="aitune"):
            assert _close(model, inner, x)  # eager's outputs, not the graph's
        assert f"os.environ['{name}']: <unset> -> '{value}'" in caplog.text
        monkeypatch.delenv(name)
        assert _close(model, inner, x) and model._ait_calls.cpp.attributes_clear()  # the graph serves again
    monkeypatch.setenv("AITUNE_TEST_UNRELATED", "1")  # another variable: the graph still serves
    assert _close(model, inner, x) and model._ait_calls.cpp.attributes_clear()
    ait.save(model, tmp_path / "ckpt")
    monkeypatch.setenv("AITUNE_TEST_SCALE", "0.5")
    other = _EnvironmentReader().eval()
    other.load_state_dict(inner.state_dict())
    loaded = ait.load(ait.Module(other, "environment-reader"), tmp_path / "ckpt")
    assert _close(loaded, other, x) and not loaded._ait_calls.cpp.attributes_clear()
    monkeypatch.delenv("AITUNE_TEST_SCALE")
    assert _close(loaded, other, x) and loaded._ait_calls.cpp.attributes_clear()
