"""The C++ half of a tuned ait.Module's dispatch (``_core.TorchDispatch``): calls of plain
tensors that an earlier call resolved run in one C++ call; it gives what the general path
gives, and every call it does not serve (hooks, recording, eager, unusual tensors, a
keyword form not seen before) goes through nn.Module.__call__ to the general path, which
runs sessions through the same C++ half (``run``)."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from torch_models import MLP, cpu_strategy

import aitune
import aitune.torch as ait
from aitune import _core
from aitune.torch import context
from aitune.torch.dispatch import ModuleDispatch, new_dispatch


class TwoOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x, y):
        return {"out": self.fc(x) + y, "x_sum": x.sum(-1)}


class Counted(MLP):
    """An MLP that counts its eager forwards."""

    calls = 0

    def forward(self, x):
        type(self).calls += 1
        return super().forward(x)


def _tuned(module, name, samples, **kwargs):
    if isinstance(module, Counted):  # its class counter is the test's instrument, not the model's state
        kwargs.setdefault("harmless_attributes", ["calls"])
    model = ait.Module(module, name, strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False), **kwargs)
    ait.tune(model, samples)
    return model


@pytest.fixture
def python_path_calls(monkeypatch):
    """Counts the calls that reach the module's general path (Python)."""
    calls = []
    original = ModuleDispatch.call

    def counting(self, args, kwargs):
        if self.measuring:  # not the module's: ait.tune measuring a candidate the module's way
            return original(self, args, kwargs)
        calls.append((args, kwargs))
        return original(self, args, kwargs)

    monkeypatch.setattr(ModuleDispatch, "call", counting)
    return calls


def test_positional_tensor_calls_run_in_cpp_after_the_first(python_path_calls):
    inner = TwoOutputs().eval()
    model = _tuned(inner, "two-out", [(torch.randn(16), torch.randn(8)) for _ in range(2)])
    x, y = torch.randn(2, 16), torch.randn(2, 8)
    with torch.no_grad():
        assert model._ait_calls.direct is None
        first = model(x, y)
        assert len(python_path_calls) == 1 and len(model._ait_calls.direct) == 1
        for _ in range(3):
            again = model(x, y)
            assert again.keys() == first.keys()
            for key in first:
                assert torch.equal(again[key], first[key]) and again[key].dtype == first[key].dtype
        assert len(python_path_calls) == 1  # served in C++
        x2 = torch.randn(2, 16)
        other = model(x2, y)  # other values, same kinds: the same route
        assert len(python_path_calls) == 1
        torch.testing.assert_close(other["out"], inner(x2, y)["out"], atol=1e-4, rtol=1e-4)
        expected = inner(x, y)
    torch.testing.assert_close(first["out"], expected["out"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(first["x_sum"], expected["x_sum"], atol=1e-4, rtol=1e-4)


def test_outputs_are_fresh_tensors_that_outlive_the_module():
    model = _tuned(MLP().eval(), "mlp", torch.randn(16))
    x = torch.randn(2, 16)
    with torch.no_grad():
        model(x)
        a, b = model(x), model(x)
    assert a.data_ptr() != b.data_ptr()
    a.add_(1.0)  # the caller owns its outputs: writing one leaves the next call alone
    torch.testing.assert_close(a - 1.0, b)
    expected = b.clone()
    del model
    gc.collect()
    torch.testing.assert_close(b, expected)  # the ORT value lives as long as the tensor


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_hooks_and_tracing_take_the_module_path(python_path_calls):
    model = _tuned(MLP().eval(), "mlp", torch.randn(16))
    x = torch.randn(2, 16)
    with torch.no_grad():
        plain = model(x)
        handle = model.register_forward_hook(lambda module, args, output: output * 2)
        torch.testing.assert_close(model(x), plain * 2)
        handle.remove()
        pre = model.register_forward_pre_hook(lambda module, args: (args[0] * 0,))
        torch.testing.assert_close(model(x), model._ait_module(x * 0), atol=1e-4, rtol=1e-4)
        pre.remove()
        seen = []
        global_hook = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: seen.append(type(m)))
        try:
            model(x)
        finally:
            global_hook.remove()
        assert ait.Module in seen
        calls = len(python_path_calls)
        torch.testing.assert_close(model(x), plain)
        assert len(python_path_calls) == calls  # hooks gone: C++ again
    class Parent(torch.nn.Module):  # what a user traces: a model holding the tuned module
        def __init__(self):
            super().__init__()
            self.tuned = model

        def forward(self, t):
            return self.tuned(t) + 0

    traced = torch.jit.trace(Parent(), (x,), check_trace=False)  # under tracing: the module path, eagerly
    assert len(python_path_calls) == calls + 1
    other = torch.randn(2, 16)
    with torch.no_grad():  # the trace recorded the module's ops, not the graph's outputs as constants
        torch.testing.assert_close(traced(other), model._ait_module(other))


def test_keyword_calls_run_in_cpp_after_the_first_of_their_form(python_path_calls):
    inner = TwoOutputs().eval()
    model = _tuned(inner, "two-out-kw", [(torch.randn(16), torch.randn(8)) for _ in range(2)])
    x, y = torch.randn(2, 16), torch.randn(2, 8)
    with torch.no_grad():
        expected = inner(x, y)
        # Only the first call of a form takes the Python path. The order of the keywords
        # does not make a form: y=, x= is served by the route of x=, y=.
        forms = [(lambda: model(x, y=y), 1), (lambda: model(x=x, y=y), 1), (lambda: model(y=y, x=x), 0)]
        for form, python_calls in forms:
            calls = len(python_path_calls)
            for _ in range(3):
                out = form()
                assert out.keys() == expected.keys()
                for key in expected:
                    torch.testing.assert_close(out[key], expected[key])
            assert len(python_path_calls) == calls + python_calls
        assert len(model._ait_calls.direct) == 2
        served = model._ait_calls.direct.serve((x,), {"y": y})
        torch.testing.assert_close(served["out"], expected["out"])
        assert model._ait_calls.direct.serve((x,), {"z": y}) is NotImplemented
        assert model._ait_calls.direct.serve((), {"x": x, "y": y, "z": y}) is NotImplemented
        assert model._ait_calls.direct.serve((x, y)) is NotImplemented  # never called positionally
        calls = len(python_path_calls)
        with pytest.raises(TypeError, match="z"):
            model(x, y=y, z=y)  # the general path gives the binding error
        assert len(python_path_calls) == calls + 1


def test_eager_and_recording_are_not_served(python_path_calls):
    Counted.calls = 0
    inner = Counted().eval()
    model = _tuned(inner, "counted", torch.randn(16))
    x = torch.randn(2, 16)
    with torch.no_grad():
        model(x)
        eager = Counted.calls
        with context.run_eagerly():
            torch.testing.assert_close(model(x), inner(x))
        assert Counted.calls == eager + 2  # the module and the reference both ran eagerly
    ait.tune(model, torch.randn(3, 16))  # recording calls the (tuned) module: it must record
    assert model.ait_state is ait.ModuleState.TUNED
    assert [g.describe() for g in model.ait_graphs] and model._ait_calls.direct is None  # routes dropped with the graphs


def test_unusual_tensors_fall_back_and_give_equal_outputs(python_path_calls):
    model = _tuned(MLP().eval(), "mlp", torch.randn(16))
    x = torch.randn(16, 2)
    with torch.no_grad():
        expected = model(x.t().contiguous())
        calls = len(python_path_calls)
        assert torch.equal(model(x.t()), expected)  # strided view
        assert torch.equal(model(torch.nn.Parameter(x.t().contiguous())), expected)  # subclass
        assert len(python_path_calls) == calls + 2
    leaf = x.t().contiguous().requires_grad_()
    calls = len(python_path_calls)
    with torch.no_grad():  # requires grad: never served in C++; the Python path detaches it
        assert torch.equal(model(leaf), expected)
    assert len(python_path_calls) == calls + 1
    out = model(leaf)  # gradients on: run eagerly with autograd intact (issue 17)
    assert out.requires_grad
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(ait.GraphNotRecordedError, match="float64"):
        model(x.t().double())
    with pytest.raises(aitune.ShapeMismatchError) as info:
        model(torch.randn(2, 17))  # the route matches, the session refuses: the general path raises
    assert any("recorded for this graph" in note for note in info.value.__notes__)


def test_shape_errors_of_served_calls_fall_back_eagerly_when_asked():
    inner = MLP().eval()
    model = _tuned(inner, "mlp", torch.randn(16), eager_fallback=True)  # batch sizes 1..2
    with torch.no_grad():
        model(torch.randn(2, 16))
        big = torch.randn(5, 16)
        with pytest.warns(RuntimeWarning, match="running eagerly"):
            assert torch.equal(model(big), inner(big))


def test_threads_share_one_module():
    model = _tuned(MLP().eval(), "mlp", torch.randn(16))
    inputs = [torch.randn(2, 16) for _ in range(4)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    errors = []

    def work(i):
        try:
            with torch.no_grad():
                for _ in range(50):
                    assert torch.equal(model(inputs[i]), expected[i])
        except Exception as error:  # reported below: a failed assert in a thread is silent
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_dispatch_rejects_what_it_cannot_serve():
    model = _tuned(MLP().eval(), "mlp", torch.randn(16))
    ((_, tuned),) = model._ait_tuned.values()
    dispatch = new_dispatch(model.ait_module, training=False)
    x = torch.randn(2, 16)
    with pytest.raises(aitune.InvalidArgumentError, match="session must be an OnnxSession, got <class 'str'>"):
        dispatch.add_graph("session", [0], 1, None)
    with pytest.raises(aitune.InvalidArgumentError, match="order has 2 entries, the session takes 1 inputs"):
        dispatch.add_graph(tuned.session, [0, 0], 1, None)
    with pytest.raises(aitune.InvalidArgumentError, match="order names tensor 3 of a call of 1"):
        dispatch.add_graph(tuned.session, [3], 1, None)
    with pytest.raises(aitune.InvalidArgumentError, match="no graph 0 \\(0 registered\\)"):
        dispatch.add_route([x], 0)
    with pytest.raises(aitune.InvalidArgumentError, match="tensor_type must be a type"):
        _core.TorchDispatch(len, len, "Tensor", len, len, [], [], [], [])
    with pytest.raises(aitune.InvalidArgumentError, match="global_dicts must be dicts"):
        _core.TorchDispatch(len, len, torch.Tensor, len, len, [[]], [], [], [])
    with pytest.raises(aitune.InvalidArgumentError, match="context_vars must be ContextVars"):
        _core.TorchDispatch(len, len, torch.Tensor, len, len, [], [None], [], [])
    with pytest.raises(aitune.InvalidArgumentError, match="attributes must be str"):
        _core.TorchDispatch(len, len, torch.Tensor, len, len, [], [], [], [1])
    assert dispatch.graph_count == 0 and len(dispatch) == 0
    index = dispatch.add_graph(tuned.session, [0], 1, None)
    assert index == 0 and dispatch.graph_count == 1
    with pytest.raises(aitune.InvalidArgumentError, match="value 0 is not a <class 'torch.Tensor'> nor a tuple"):
        dispatch.add_route([x.numpy()], index)
    with pytest.raises(aitune.InvalidArgumentError, match="value 0 is not a <class 'torch.Tensor'> nor a tuple"):
        dispatch.add_route([(x, (x,))], index)  # nested containers: no route form
    with pytest.raises(aitune.InvalidArgumentError, match="a call of 2 tensors for graph 0, which takes 1"):
        dispatch.add_route([(x, x)], index)  # a tuple's tensors count one by one
    with pytest.raises(aitune.InvalidArgumentError, match="a call of 2 tensors for graph 0, which takes 1"):
        dispatch.add_route([x, x], index)
    with pytest.raises(aitune.InvalidArgumentError, match="2 tensors for graph 0, which takes 1"):
        dispatch.run(index, [x, x])
    with pytest.raises(aitune.InvalidArgumentError, match="input 'input_x': expected a torch.Tensor, got <class 'str'>"):
        dispatch.run(index, ["x"])
    assert dispatch.serve((x,)) is NotImplemented  # no route
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(dispatch.run(index, [x]), expected)  # the general path's way in, no route needed
    torch.testing.assert_close(dispatch.run(index, [x.t().contiguous().t()]), expected)  # a view: copied
    assert dispatch.add_route([x], index) is True
    assert dispatch.add_route([torch.randn(1, 16)], index) is False  # the same kinds: the same route
    torch.testing.assert_close(dispatch.serve((x,)), expected)
    assert dispatch.serve((x, x)) is NotImplemented  # arity
    assert dispatch.serve((x.double(),)) is NotImplemented  # dtype
    assert dispatch.serve((x[None],)) is NotImplemented  # rank
    assert dispatch.serve((x.numpy(),)) is NotImplemented  # not a tensor


def test_the_general_path_runs_sessions_through_the_cpp_half(monkeypatch):
    """Calls no route serves (non-tensor values, nested inputs, hooks) still reach the
    session only through ``TorchDispatch.run``: there is no other way in."""
    model = _tuned(MLP().eval(), "mlp", torch.randn(16))
    runs = []
    dispatch = model._ait_calls.cpp
    original = type(dispatch).run

    class Counting:
        def __getattr__(self, name):
            return getattr(dispatch, name)

        def run(self, index, tensors):
            runs.append(index)
            return original(dispatch, index, tensors)

    monkeypatch.setattr(model._ait_calls, "cpp", Counting())
    x = torch.randn(2, 16)
    handle = model.register_forward_hook(lambda module, args, output: output)  # no route serves it
    with torch.no_grad():
        torch.testing.assert_close(model(x), model._ait_module(x), atol=1e-4, rtol=1e-4)
    handle.remove()
    assert runs == [0]


def test_a_graph_run_in_python_is_served_by_the_cpp_route_after_the_first_call(python_path_calls, monkeypatch):
    """Issue 28: a graph that runs in Python (torch.compile; eager here, the same path)
    gets a route like a session's graph: after the first call, calls of plain tensors,
    keywords included, go from the C++ half straight to the graph's infer (no
    nn.Module.__call__, forward, binding or flattening), and come back in the module's
    output structure."""
    from aitune.torch.backend import TorchEagerBackend
    from aitune.torch.backend.torch_eager import EagerGraph

    infers = []
    original = EagerGraph.infer
    monkeypatch.setattr(EagerGraph, "infer", lambda self, inputs: infers.append(len(inputs)) or original(self, inputs))
    inner = TwoOutputs().eval()
    model = ait.Module(inner, "eager-two-out", strategy=ait.OneBackendStrategy(TorchEagerBackend()))
    ait.tune(model, [{"x": torch.randn(16), "y": torch.randn(8)} for _ in range(2)])
    x, y = torch.randn(2, 16), torch.randn(2, 8)
    with torch.no_grad():
        for _ in range(3):
            out, expected = model(x=x, y=y), inner(x=x, y=y)
            assert out.keys() == expected.keys() and all(torch.equal(out[k], expected[k]) for k in out)
    assert len(python_path_calls) == 1  # the first call resolved it; the route served the others
    assert len(model._ait_calls.direct) == 1 and infers == [2, 2, 2]
    from aitune.torch.dispatch import GraphNotRecordedError

    with torch.no_grad(), pytest.raises(GraphNotRecordedError):
        model(x=x, y=y.to(torch.float64))  # another dtype: no route; the general path names the graphs
    assert len(python_path_calls) == 2


def test_a_module_in_a_cycle_through_its_dispatch_is_collected():
    """The C++ half holds the graph's rebuild, which reaches the wrapped module; a module
    that refers back to its ait.Module (or a script's globals holding both) makes a cycle
    the collector must see through TorchDispatch, or the sessions leak."""
    import weakref

    model = _tuned(TwoOutputs().eval(), "two-out-cycle", [(torch.randn(16), torch.randn(8)) for _ in range(2)])
    with torch.no_grad():
        model(torch.randn(2, 16), torch.randn(2, 8))
    assert len(model._ait_calls.direct) == 1
    model.owner = model  # lands on the wrapped module: wrapped -> ait.Module -> dispatch -> rebuild -> wrapped
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_a_python_graph_is_registered_with_a_callable_and_never_run_as_a_session():
    dispatch = new_dispatch(MLP(), None)
    with pytest.raises(_core.InvalidArgumentError, match="run must be callable"):
        dispatch.add_python_graph(42, 1)
    index = dispatch.add_python_graph(lambda tensors: tensors[0] * 2, 1)
    x = torch.randn(2, 16)
    assert dispatch.add_route([x], index, [])
    torch.testing.assert_close(dispatch.serve((x,)), x * 2)
    assert dispatch.serve((x.double(),)) is NotImplemented  # another dtype: no route
    with pytest.raises(_core.InvalidArgumentError, match="runs in Python"):
        dispatch.run(index, [x])


class CacheStep(torch.nn.Module):
    """A decode step's call form (aitune.torch.decode_step.DecodeStep): plain tensors
    beside a tuple of tensors per cache, returned as tuples."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, keys, values):
        h = self.fc(x)
        return h, tuple(k + h for k in keys), tuple(v * 2 for v in values)


def test_calls_with_tuples_of_tensors_get_a_route(python_path_calls):
    """A decode step passes its cache as a tuple of tensors per cache (one per layer).
    Such calls got no route: every call of the tuned module took the general path
    (nn.Module.__call__, binding, pytree flattening and identity, the replay), the host
    time a torch.compile decode step paid per call beyond bare torch.compile. A tuple or
    list of plain tensors is now part of a route's form (its kind and length); a call of
    another container kind or length is not served by it."""
    inner = CacheStep().eval()
    sample = {"x": torch.randn(8), "keys": (torch.randn(8), torch.randn(8)), "values": (torch.randn(8),)}
    model = _tuned(inner, "cache-step", [sample for _ in range(2)])
    x, keys, values = torch.randn(2, 8), (torch.randn(2, 8), torch.randn(2, 8)), (torch.randn(2, 8),)
    with torch.no_grad():
        expected = inner(x, keys=keys, values=values)
        for _ in range(3):
            out = model(x, keys=keys, values=values)
            assert type(out) is tuple and [type(o) for o in out] == [torch.Tensor, tuple, tuple]
            torch.testing.assert_close(list(pytree_leaves(out)), list(pytree_leaves(expected)))
        assert len(python_path_calls) == 1 and len(model._ait_calls.direct) == 1  # the route served the rest
        # other tensors of the same kinds: the same route
        model(torch.randn(2, 8), keys=(torch.randn(2, 8), torch.randn(2, 8)), values=(torch.randn(2, 8),))
        assert len(python_path_calls) == 1
        # a list where the route has a tuple, or another length: not this route's form
        assert model._ait_calls.direct.serve((x,), {"keys": list(keys), "values": values}) is NotImplemented
        assert model._ait_calls.direct.serve((x,), {"keys": keys[:1], "values": values}) is NotImplemented
        assert model._ait_calls.direct.serve((x,), {"keys": (keys[0], 1.0), "values": values}) is NotImplemented
        assert model._ait_calls.direct.serve((x,), {"keys": (keys[0], keys[1].double()), "values": values}) \
            is NotImplemented
        from aitune.torch.dispatch import GraphNotRecordedError

        with pytest.raises(GraphNotRecordedError):
            model(x, keys=keys[:1], values=values)  # the general path names the recorded graph
        assert len(python_path_calls) == 2


def pytree_leaves(value):
    import torch.utils._pytree as pytree

    return pytree.tree_leaves(value)


def test_a_routed_call_with_tuples_of_tensors_replays_without_pytree(monkeypatch):
    """The routed call of a graph run in Python (torch.compile; eager here, the same path)
    replays the user's call form for the graph: tuples of tensors were rebuilt through
    pytree on every call (``_replay``); they are now planned like plain tensors, and come
    back as the same kind of container (a list stays a list)."""
    from aitune.torch.backend import TorchEagerBackend
    from aitune.torch.graph import RecordedGraph

    class ListStep(CacheStep):
        def forward(self, x, keys, values):
            assert type(keys) is tuple and type(values) is list
            return super().forward(x, keys, values)

    inner = ListStep().eval()
    model = ait.Module(inner, "eager-cache-step", strategy=ait.OneBackendStrategy(TorchEagerBackend()))
    ait.tune(model, [{"x": torch.randn(8), "keys": (torch.randn(8), torch.randn(8)), "values": [torch.randn(8)]}
                     for _ in range(2)])
    replays = []
    original = RecordedGraph._replay
    monkeypatch.setattr(RecordedGraph, "_replay", lambda self, tensors: replays.append(1) or original(self, tensors))
    x, keys, values = torch.randn(2, 8), (torch.randn(2, 8), torch.randn(2, 8)), [torch.randn(2, 8)]
    with torch.no_grad():
        expected = inner(x, keys, values)
        for _ in range(3):
            torch.testing.assert_close(pytree_leaves(model(x, keys, values)), pytree_leaves(expected))
    assert len(model._ait_calls.direct) == 1
    assert replays == []  # planned once (at tuning), never replayed through pytree per call


class CacheWrite(torch.nn.Module):
    """Writes this step's state at ``pos`` into each layer's cache of a tuple (index_put:
    one ScatterND of the cache input, which in_place_outputs runs in the cache's buffer)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, pos, keys):
        h = self.fc(x)
        rows = torch.arange(h.shape[0])[:, None]
        return h, tuple(k.index_put((rows, pos), h[:, None, :]) for k in keys)


def test_a_routed_tuple_of_caches_updated_in_place_matches_eager_and_refuses_aliases(python_path_calls):
    """A tuple-of-caches call served by the route with in_place_outputs: each step's caches
    are eager's values and the tensors passed (updated in place, as the general path does),
    steps chained on the returned caches stay equal to eager, and one tensor passed for two
    caches (both written in place: each write would clobber the other) is refused by the
    route as by the general path, naming both inputs, never a silently different cache."""
    inner = CacheWrite().eval()
    strategy = cpu_strategy(use_dynamo=False, tune_provider_options=False, in_place_outputs=True)
    strategy.enable_performance_validation(False)
    model = ait.Module(inner, "cache-write", strategy=strategy)
    ait.tune(model, [{"x": torch.randn(8), "pos": torch.tensor([1]), "keys": (torch.randn(4, 8), torch.randn(4, 8))}
                     for _ in range(2)])
    x, pos = torch.randn(2, 8), torch.tensor([[0], [1]])
    keys = (torch.randn(2, 4, 8), torch.randn(2, 4, 8))
    expected_keys = keys
    with torch.no_grad():
        for step in range(3):
            _, expected_keys = inner(x, pos + step, expected_keys)
            passed = keys
            _, keys = model(x, pos + step, keys=keys)
            assert all(k is p for k, p in zip(keys, passed))  # updated in place, returned
            torch.testing.assert_close(keys, expected_keys)
        assert len(python_path_calls) == 1  # the route served the later steps
        one = torch.randn(2, 4, 8)
        with pytest.raises(aitune.InvalidArgumentError, match="'input_keys_0' is updated in place .* shares memory "
                                                              "with input 'input_keys_1'"):
            model(x, pos, keys=(one, one))
        assert len(python_path_calls) == 1  # refused by the route itself
