"""A tuned module whose weights change (load_state_dict, a parent's load_state_dict,
.to() / .double()) never computes the old weights silently: graphs holding a copy of the
weights (ONNX Runtime) stop serving, the module runs eagerly and says why; loading the
weights it already has changes nothing."""

from __future__ import annotations

import logging

import pytest
import torch
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
