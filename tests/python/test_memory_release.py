"""Tune + save + load cycles release what they made (issue 17, item 8): every ONNX Runtime
session the engine created is gone once the modules are dropped, and aitune's own Python
objects do not pile up from cycle to cycle. (The RSS growth that remains over such cycles
is torch.onnx's dynamo exporter's: docs/tuning.md, "Memory over repeated tuning".)"""

from __future__ import annotations

import gc
import weakref
from collections import Counter

import torch
from torch_models import MLP, cpu_strategy

import aitune.torch as ait
from aitune import _core


def _aitune_objects() -> Counter:
    """Live objects of aitune's own Python classes, by class."""
    gc.collect()
    counts: Counter = Counter()
    for o in gc.get_objects():
        module = getattr(type(o), "__module__", None)
        if isinstance(module, str) and module.startswith("aitune"):
            counts[type(o).__qualname__] += 1
    return counts


def _cycle(tmp_path, i: int, x: torch.Tensor) -> tuple[list[weakref.ref], int]:
    """One tune + save + load + call; weak references to what it made, and the live
    session count while the tuned and the loaded module were both alive."""
    samples = [torch.randn(16) for _ in range(2)]
    # The trace exporter keeps each cycle quick; the dynamo exporter's own growth is torch's.
    model = ait.Module(MLP().eval(), "mlp", strategy=cpu_strategy(use_dynamo=False))
    ait.tune(model, samples, disable_external_logging=True, ignore_failing_modules=False)
    path = tmp_path / f"ckpt{i % 2}"
    ait.save(model, path, overwrite=True)
    loaded = ait.load(ait.Module(MLP().eval(), "mlp"), path)
    with torch.no_grad():
        y = loaded(x)
    assert y.shape == (2, 8)
    alive = _core.OrtRuntime.live_sessions()
    return [weakref.ref(model), weakref.ref(loaded)], alive


def test_tune_save_load_cycles_release_sessions_and_objects(tmp_path):
    x = torch.randn(2, 16)
    gc.collect()
    baseline = _core.OrtRuntime.live_sessions()
    refs, alive = _cycle(tmp_path, 0, x)
    # The counter sees the sessions: the tuned and the loaded module each hold one.
    assert alive >= baseline + 2, (baseline, alive)
    gc.collect()
    assert _core.OrtRuntime.live_sessions() == baseline
    assert [r() for r in refs] == [None, None], "a tuned or loaded ait.Module outlived its cycle"
    after_first = _aitune_objects()
    for i in range(1, 4):
        refs, _ = _cycle(tmp_path, i, x)
        gc.collect()
        assert _core.OrtRuntime.live_sessions() == baseline, f"cycle {i} left sessions alive"
        assert [r() for r in refs] == [None, None], f"cycle {i}: a module outlived its cycle"
    grown = _aitune_objects() - after_first
    assert not grown, f"aitune objects accumulate over cycles: {dict(grown)}"


def test_a_session_lives_while_its_backend_or_an_output_does(tmp_path):
    """Zero-copy outputs keep their session; once both are gone the session is released."""
    from onnx_models import mlp

    model_path, _ = mlp(tmp_path / "mlp.onnx")
    gc.collect()
    baseline = _core.OrtRuntime.live_sessions()
    backend = _core.OnnxSession.create(str(model_path),
                                              _core.OnnxSessionConfig(provider=_core.ExecutionProvider.CPU))
    assert _core.OrtRuntime.live_sessions() == baseline + 1
    (y,) = backend.infer([torch.randn(2, 16)])
    del backend
    gc.collect()
    assert _core.OrtRuntime.live_sessions() == baseline + 1, "the output still needs its session"
    del y
    gc.collect()
    assert _core.OrtRuntime.live_sessions() == baseline
