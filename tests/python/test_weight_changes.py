"""A tuned module whose weights change (load_state_dict, a parent's load_state_dict,
.to() / .double()) never computes the old weights silently: graphs holding a copy of the
weights (ONNX Runtime) stop serving, the module runs eagerly and says why; loading the
weights it already has changes nothing."""

from __future__ import annotations

import logging
import types

import pytest
import torch
import torch.nn.utils.prune
from torch_models import MLP, cpu_strategy

import aitune.torch as ait
from aitune.torch.backend import TorchCompileBackend, TorchCompileBackendConfig


def _tuned(tmp_path, monkeypatch, strategy=None):
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = ait.Module(MLP().eval(), "weights", strategy=strategy or cpu_strategy())
    x = torch.randn(4, 16)
    ait.tune(model, [x[i] for i in range(4)], batch_sizes=[4], progress=False)
    assert model.ait_state is ait.ModuleState.TUNED and model.ait_active
    return model, x


def _zeroed(model):
    return {k: torch.zeros_like(v) for k, v in model.state_dict().items()}


def test_load_state_dict_with_new_weights_stops_the_onnx_graphs(tmp_path, monkeypatch, caplog):
    model, x = _tuned(tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="aitune"):
        model.load_state_dict(_zeroed(model))
    assert not model.ait_active
    assert "weights were changed by load_state_dict" in caplog.text and "runs eagerly" in caplog.text
    # the new (all-zero) weights are what the module computes now, not the tuned copy's
    torch.testing.assert_close(model(x), model.ait_module(x))
    assert torch.count_nonzero(model(x)) == 0
    with pytest.raises(Exception, match="deactivat|activate|eager"):
        ait.save(model, tmp_path / "ckpt")


def test_loading_the_same_weights_keeps_the_tuned_graphs(tmp_path, monkeypatch, caplog):
    model, x = _tuned(tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="aitune"):
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
        model.to("cpu")  # already there: nothing moves
    assert model.ait_active and "after tuning" not in caplog.text


def test_a_parents_load_state_dict_is_seen(tmp_path, monkeypatch, caplog):
    model, x = _tuned(tmp_path, monkeypatch)
    parent = torch.nn.Sequential(model)
    state = {k: torch.full_like(v, 0.5) for k, v in parent.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="aitune"):
        parent.load_state_dict(state)
    assert not model.ait_active and "parent's load_state_dict" in caplog.text
    torch.testing.assert_close(parent(x), model.ait_module(x))


def test_converting_the_weights_is_seen(tmp_path, monkeypatch, caplog):
    model, x = _tuned(tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="aitune"):
        model.double()
    assert not model.ait_active and "moved or converted" in caplog.text
    assert model(x.double()).dtype == torch.float64


def test_graphs_that_read_the_module_weights_stay(tmp_path, monkeypatch, caplog):
    """torch.compile of the module itself reads its parameters on every call: new weights
    reach it, so nothing is deactivated."""
    backend = TorchCompileBackend(TorchCompileBackendConfig(mode="default", precisions=("fp32",)))
    model, x = _tuned(tmp_path, monkeypatch, ait.OneBackendStrategy(backend))
    with caplog.at_level(logging.WARNING, logger="aitune"):
        model.load_state_dict(_zeroed(model))
    assert model.ait_active and "after tuning" not in caplog.text
    assert torch.count_nonzero(model(x)) == 0


def test_weights_swapped_for_one_call_and_back_serve_the_graphs_again(caplog):
    """torch.func.functional_call swaps the parameters for one call and puts the very
    objects back: the call ran eagerly (right), but the module stayed deactivated for good,
    every later call eager, the warning asking to tune again."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    model = ait.Module(net, "swapped", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(16) for _ in range(3)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 16)
    doubled = {k: v * 2 for k, v in net.state_dict().items()}
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="aitune"):
        torch.testing.assert_close(torch.func.functional_call(model, doubled, (x,)),
                                   torch.func.functional_call(net, doubled, (x,)))
        assert not model.ait_active
        plain = type(net).forward
        net.forward = lambda *a, **k: pytest.fail("eager forward ran with the tuned weights back")
        torch.testing.assert_close(model(x), plain(net, x))
    assert model.ait_active
    assert any("are back as tuned" in r.getMessage() for r in caplog.records)
    # replaced for good: eager, and still eager after an in-place change of the originals put back
    del net.forward
    original = net[0].weight
    net[0].weight = torch.nn.Parameter(original.detach() * 3)
    with torch.no_grad():
        torch.testing.assert_close(model(x), net(x))
        assert not model.ait_active
        original.mul_(2)
        net[0].weight = original
        torch.testing.assert_close(model(x), net(x))
    assert not model.ait_active


def test_gradients_through_functional_call_of_a_tuned_module_are_eager_ones():
    """torch.func.grad over functional_call with the module's own values (the per-sample
    gradient recipe): the swapped-in weights were equal copies to the guard, so the graph
    served the call and every gradient was 0 (or, on the first call, a RuntimeError)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).eval()
    model = ait.Module(net, "per-sample-grads", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(32) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 32)
    params = {k: v.detach() for k, v in net.named_parameters()}
    for _ in range(2):  # first call, and after the graph served one
        tuned = torch.func.grad(lambda p: torch.func.functional_call(model, p, (x,)).sum())(params)
        eager = torch.func.grad(lambda p: torch.func.functional_call(net, p, (x,)).sum())(params)
        for name in eager:
            torch.testing.assert_close(tuned[name], eager[name])
        with torch.no_grad():
            model(x)
    assert model.ait_active


def test_pruning_made_permanent_is_not_taken_for_the_tuned_weights_back(caplog):
    """torch.nn.utils.prune.remove puts the very Parameter back in its slot with ``.data``
    replaced by the pruned values (no version counter moves): the tuned graphs served again,
    computing the unpruned weights, 0.06 off eager and silent."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    model = ait.Module(net, "pruned", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(16) for _ in range(3)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 16)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="aitune"):
        torch.nn.utils.prune.l1_unstructured(net[0], "weight", amount=0.5)
        torch.testing.assert_close(model(x), net(x))  # (eagerly: a forward pre-hook, a weight replaced)
        torch.nn.utils.prune.remove(net[0], "weight")
        assert torch.count_nonzero(net[0].weight) == net[0].weight.numel() // 2
        torch.testing.assert_close(model(x), net(x))
        assert not model.ait_active
    assert "had their data replaced (0.weight" in caplog.text


def test_a_tuned_module_converts_and_loads_under_the_swap_flag(tmp_path, monkeypatch, caplog):
    """torch.__future__.set_swap_module_params_on_conversion(True) (``.to()`` and
    ``load_state_dict`` by torch.utils.swap_tensors, which refuses a tensor with a weak
    reference): the export left torch's fake-tensor state alive (a module-level map and
    class attributes), whose weak references to the model's weights made ``.double()`` and
    ``load_state_dict`` of a tuned module raise "Couldn't swap Linear.weight"."""
    model, x = _tuned(tmp_path, monkeypatch)
    monkeypatch.setattr(torch.__future__, "_swap_module_params_on_conversion", True)
    assert torch.__future__.get_swap_module_params_on_conversion()
    with caplog.at_level(logging.WARNING, logger="aitune"):
        model.load_state_dict(_zeroed(model))
    assert not model.ait_active and "weights were changed by load_state_dict" in caplog.text
    assert torch.count_nonzero(model(x)) == 0
    model.double()
    assert model.ait_module.fc1.weight.dtype == torch.float64
    torch.testing.assert_close(model(x.double()), model.ait_module(x.double()))


OFFSET = torch.zeros(4)  # read by HeldInContainers.forward as a module global


class HeldInContainers(torch.nn.Module):
    """Tensors forward reads that are neither parameters, buffers nor plain tensor attributes."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.consts = (torch.ones(4),)
        self.table = {"shift": torch.zeros(4)}
        self.cfg = types.SimpleNamespace(scale=torch.ones(4), name="cfg")

    def forward(self, x):
        return self.fc(x) * self.consts[0] * self.cfg.scale + self.table["shift"] + OFFSET


_CONTAINER_CHANGES = {
    "tuple item in place": lambda m: m.consts[0].mul_(3),
    "tuple reassigned": lambda m: setattr(m, "consts", (torch.full((4,), 5.0),)),
    "dict item in place": lambda m: m.table["shift"].add_(1),
    "object field in place": lambda m: m.cfg.scale.mul_(2),
    "object field reassigned": lambda m: setattr(m.cfg, "scale", torch.full((4,), 5.0)),
    "global in place": lambda m: OFFSET.add_(1),
    "global reassigned": lambda m: globals().__setitem__("OFFSET", torch.full((4,), 2.0)),
}


@pytest.mark.parametrize("change", _CONTAINER_CHANGES.values(), ids=_CONTAINER_CHANGES.keys())
def test_tensors_in_containers_objects_and_globals_are_watched(change, caplog, monkeypatch):
    """A tensor in a tuple or dict attribute, in a plain object (a SimpleNamespace config) or
    read as a module global was held by the graphs as a constant but not watched: written in
    place or reassigned after tuning, the module computed the old values, 0.5-5 off, silently
    (a new-user probe, session 31)."""
    monkeypatch.setitem(globals(), "OFFSET", torch.zeros(4))
    torch.manual_seed(0)
    inner = HeldInContainers().eval()
    model = ait.Module(inner, "containers", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 4)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="aitune"):
        torch.testing.assert_close(model(x), inner(x))
        change(inner)
        torch.testing.assert_close(model(x), inner(x))
    assert not model.ait_active and "runs eagerly" in caplog.text


class ClearsItsCacheOnTrain(torch.nn.Module):
    """timm LeViT's pattern: a dict of tensors computed from a parameter, emptied by train()
    and refilled by the next eval-mode forward."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.bias = torch.nn.Parameter(torch.randn(4))
        self.cache = {"bias": self.bias.detach() * 2}

    def train(self, mode: bool = True):
        super().train(mode)
        if mode:
            self.cache = {}
        return self

    def forward(self, x):
        if "bias" not in self.cache:
            self.cache["bias"] = self.bias.detach() * 2
        return self.fc(x) + self.cache["bias"]


def test_a_cache_emptied_and_refilled_from_the_weights_keeps_the_graphs(caplog):
    """Watching the tensors of dict attributes (above) deactivated LeViT for good after a
    train()/eval() round trip, which empties its attention-bias cache: an emptied container
    leaves the graphs right (a session-31 probe)."""
    torch.manual_seed(0)
    inner = ClearsItsCacheOnTrain().eval()
    model = ait.Module(inner, "cache", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 4)
    expected = inner(x).detach()
    model.train()
    model.eval()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="aitune"):
        torch.testing.assert_close(model(x), expected)
    assert model.ait_active and "replaced" not in caplog.text
    with torch.no_grad():
        inner.cache = {"bias": torch.full((4,), 7.0)}  # other values: a change
        torch.testing.assert_close(model(x), inner(x))
    assert not model.ait_active


@pytest.mark.parametrize("tuned_in", ["inference-mode", "plain"])
def test_weights_made_under_inference_mode_are_said_to_be_unwatched(caplog, tuned_in):
    """Tensors made under torch.inference_mode() have no version counter: a write into them
    after tuning (a LoRA merge) left the tuned graph 2.08 off eager, silently (a session-36
    probe). It cannot be seen per call, so tuning says so, once, naming the weights. Tuned
    outside inference mode, such a model failed: "Setting requires_grad=True on inference
    tensor outside InferenceMode is not allowed" (the grad-mode check's restore)."""
    with torch.inference_mode():
        inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    model = ait.Module(inner, f"inference-mode-weights-{tuned_in}", strategy=cpu_strategy(tune_provider_options=False))
    with caplog.at_level(logging.WARNING, logger="aitune"), torch.inference_mode(tuned_in == "inference-mode"):
        ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False, progress=False)
        with torch.no_grad():
            model(torch.randn(2, 4))
    assert model.ait_state is ait.ModuleState.TUNED
    said = [r.getMessage() for r in caplog.records if "no version counter" in r.getMessage()]
    assert len(said) == 1, said
    assert "0.weight, 0.bias" in said[0]
