"""Issue 27 item 4: output containers come back with the type and fields eager returns,
by a generic rule (no per-library code): an OrderedDict dataclass like diffusers'
BaseOutput, NamedTuples, nested dicts, lists and tuples."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import NamedTuple

import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState


class BaseOutputLike(OrderedDict):
    """What diffusers' BaseOutput is: a dataclass over an OrderedDict of its non-None fields."""

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                self[field.name] = value

    def __setattr__(self, name, value):
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())

    def __init_subclass__(cls) -> None:
        # As diffusers does: a pytree node without key paths (tree_flatten_with_path refuses it)
        torch.utils._pytree.register_pytree_node(
            cls,
            torch.utils._pytree._dict_flatten,
            lambda values, context: cls(**torch.utils._pytree._dict_unflatten(values, context)),
        )


@dataclasses.dataclass
class UNetLikeOutput(BaseOutputLike):
    sample: torch.Tensor = None
    extra: torch.Tensor | None = None


class Pair(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor


class Containers(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.kind = kind

    def forward(self, x):
        y = self.linear(x)
        if self.kind == "base-output":
            return UNetLikeOutput(sample=y)
        if self.kind == "namedtuple":
            return Pair(y, y * 2)
        return {"a": [y, (y + 1, {"b": y * 3})], "c": Pair(y - 1, y)}


def _same(actual, expected):
    assert type(actual) is type(expected)
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)
    elif isinstance(expected, dict):  # OrderedDict dataclasses included
        assert list(actual.keys()) == list(expected.keys())
        for key in expected:
            _same(actual[key], expected[key])
    else:
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _same(a, e)


@pytest.mark.parametrize("kind", ["base-output", "namedtuple", "nested"])
@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_output_container_round_trips(kind, use_dynamo):
    inner = Containers(kind).eval()
    model = ait.Module(inner, f"out-{kind}", strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, disable_external_logging=True)
    assert model.ait_state is ModuleState.TUNED
    x = torch.randn(2, 4)
    expected = inner(x)
    model.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a tuned module")
    actual = model(x)
    _same(actual, expected)
    if kind == "base-output":
        assert actual.extra is None and actual.sample is actual["sample"]
        assert len(actual.to_tuple()) == 1


class BatchCount(torch.nn.Module):
    """Returns the batch size as a Python int next to a tensor: a constant of the graph
    that differs between the batches of 1 and 2 ait.tune records."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return {"y": self.linear(x), "rows": x.shape[0]}


def test_outputs_whose_constants_differ_are_refused_naming_the_value():
    model = ait.Module(BatchCount().eval(), "batch-count", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ValueError, match=r"output \['rows'\]: int 1 in one call, int 2 in another") as error:
        ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    assert "TreeSpec" not in str(error.value)  # the two structures are the same: printing them said nothing
    assert model.ait_state is ModuleState.PASSTHROUGH


class ReturnsAnObject(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x), object()


def test_a_refused_output_is_named_once_however_many_calls_recorded_it():
    """Every recorded call fails the same way; the error says it once, not once per batch."""
    model = ait.Module(ReturnsAnObject().eval(), "returns-object", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ValueError, match=r"output\[1\] is a builtins.object object") as error:
        ait.tune(model, [torch.randn(4) for _ in range(4)], batch_sizes=[1, 2], ignore_failing_modules=False,
                 progress=False)
    assert str(error.value).count("builtins.object object") == 1, str(error.value)


@pytest.mark.parametrize("value", [
    (0, (1, 2), (3, 4)),                          # a decode step's (logits, keys, values)
    [0, (1, "constant", None), [[2], 3.5], 4],    # lists, constants, None, nesting
    ((0, 1), (), [2, (3,)]),                      # an empty tuple; consecutive tensors split by a node
    (None, 0),
    {"a": 0, "b": (1, 2)},                        # not tuples and lists only: pytree rebuilds it
    Pair(0, 1),                                   # a namedtuple: pytree too
])
def test_the_output_structure_is_rebuilt_as_pytree_rebuilds_it(value):
    """_Tree.fill's builder for outputs nested in tuples and lists (no spec walk per call)
    gives exactly what pytree.tree_unflatten gives, types included; other structures go
    through pytree itself."""
    import torch.utils._pytree as pytree

    from aitune.torch.graph import _Tree

    tensors = [torch.full((1,), float(i)) for i in range(5)]
    leaves, spec = pytree.tree_flatten(value)
    leaves = [tensors[v] if isinstance(v, int) and not isinstance(v, bool) else v for v in leaves]
    tree = _Tree(spec, leaves)
    given = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    expected = pytree.tree_unflatten(leaves, spec)
    rebuilt = tree.fill(given)

    def same(a, b) -> bool:
        if isinstance(a, torch.Tensor):
            return a is b
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (tuple, list)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return a == b

    assert same(rebuilt, expected), (rebuilt, expected)
    assert (tree._build is None) == (isinstance(value, dict) or type(value) is Pair)
    with pytest.raises(ValueError):
        tree.fill(given + [torch.zeros(1)])


class PassThrough(torch.nn.Module):
    """Returns its input itself and a view of it beside a computed output."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return x, x[:, :2], self.fc(x)


def test_an_output_that_is_an_input_is_said_once_and_keeps_its_values():
    """Eagerly output 0 is the input itself and output 1 a view of it; a graph returns new
    tensors, so the link between them is lost: said once per output at recording (the
    computed output is not named), and the values are eager's."""
    inner = PassThrough().eval()
    model = ait.Module(inner, "pass-through", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.warns(RuntimeWarning, match=r"eager output \S+ is input \S+ itself \(or a view of it\)") as caught:
        ait.tune(model, [torch.randn(4) for _ in range(4)], batch_sizes=[1, 2], performance_validation=False)
    aliased = [str(w.message) for w in caught if "is input" in str(w.message)]
    assert len(aliased) == 2, aliased  # outputs 0 and 1, once each
    assert model.ait_state is ModuleState.TUNED
    x = torch.randn(2, 4)
    with torch.no_grad():
        for got, expected in zip(model(x), inner(x), strict=True):
            torch.testing.assert_close(got, expected)


class ReturnsItsScale(torch.nn.Module):
    """Returns its buffer beside a computed output (a caller that scales it in place then
    changes the model, eagerly)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        return self.fc(x) * self.scale, self.scale


def test_an_output_that_is_a_weight_of_the_module_is_said():
    """Eagerly an output is the module's buffer itself; the graph returns a copy, so a
    caller's in-place change to it no longer reaches the model: nothing was said (1.08 off
    over a program's calls in a session-31 probe)."""
    model = ait.Module(ReturnsItsScale().eval(), "returns-scale", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.warns(RuntimeWarning, match=r"eager output \S+ is the module's scale itself \(or a view of it\)"):
        ait.tune(model, [torch.randn(4) for _ in range(2)], performance_validation=False)
    assert model.ait_state is ModuleState.TUNED


class SharedOutputs(torch.nn.Module):
    """Two outputs on one memory: a hidden state and a view of it, then the state again."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return {"hidden": h, "first_half": h[:, :4], "again": h, "alone": h * 2}


def test_outputs_that_share_memory_eagerly_are_said_once_each():
    """Eagerly "first_half" is a view of "hidden" and "again" is it: a caller's
    out["first_half"].clamp_(min=0) changes "hidden" too (0.65 apart in a probe), a tuned
    graph's outputs are tensors of their own. Only the input case was said before."""
    model = ait.Module(SharedOutputs().eval(), "shared-outputs", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.warns(RuntimeWarning, match=r"eager outputs \S+ and \S+ share memory") as caught:
        ait.tune(model, [torch.randn(8) for _ in range(4)], batch_sizes=[1, 2], performance_validation=False)
    shared = sorted(str(w.message).split("eager outputs ")[1].split(" share")[0]
                    for w in caught if "share memory" in str(w.message))
    assert len(shared) == 2, shared  # first_half and again, once each; "alone" is not named
    assert all("alone" not in pair for pair in shared)
