"""What a user sees from a plain script (issue 31, item 9): tuning a tiny HF BERT and a
second module on the CPU, then exiting, prints neither onnxscript's constant-folder
messages ("Evaluation failed: cannot reshape array ...", through Python's last-resort
logging handler), nor torch's exporter's "torchvision is not installed" notes, nor nanobind's "leaked N instances!" at interpreter shutdown: run with
AITUNE_LEAK_WARNINGS=1, so that a reference the tune itself keeps past exit shows. Without
it (a user's run) the report is off: a script that loads a checkpoint whose outputs are a
dataclass of its own __main__ keeps aitune's objects until after the bindings are torn
down, through torch's pytree registry, and exits quietly too."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import aitune.torch as ait
    from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig
    sys.path.insert(0, sys.argv[1])
    from test_fusions import TinyBert
    from torch_models import MLP

    cpu = lambda: ait.OneBackendStrategy(backend=ONNXRuntimeBackend(ONNXRuntimeBackendConfig(
        execution_provider="cpu", tune_provider_options=False, transformer_fusions=False)))  # dynamo export: the folder runs
    bert = ait.Module(TinyBert().eval(), "bert", strategy=cpu())
    mlp = ait.Module(MLP().eval(), "mlp", strategy=cpu())
    ait.tune(bert, [torch.randint(0, 100, (16,)) for _ in range(2)])
    ait.tune(mlp, [torch.randn(16)])
    print("tuned", bert.ait_state.name, mlp.ait_state.name)
""")


def test_a_script_that_tunes_two_modules_exits_quietly(tmp_path):
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(Path(__file__).resolve().parent)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "AITUNE_LEAK_WARNINGS": "1"})
    assert done.returncode == 0, done.stderr
    assert "tuned TUNED TUNED" in done.stdout
    assert "Evaluation failed" not in done.stderr, done.stderr
    assert "leaked" not in done.stderr, done.stderr
    if importlib.util.find_spec("torchvision") is None:  # the exporter's note where it is missing
        assert "torchvision is not installed" not in done.stderr, done.stderr


class LogOfPositions(torch.nn.Module):
    """log(0) in a constant the exporter's folder pre-computes (T5's relative position
    buckets do the same): its evaluator's numpy warns 'divide by zero encountered in log'."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        positions = torch.arange(x.shape[-1], device=x.device).float()
        return self.fc(x) + torch.log(positions).clamp(min=-5.0)


def test_the_constant_folders_numpy_warnings_are_not_the_users():
    import warnings

    import aitune.torch as ait
    from torch_models import cpu_strategy

    inner = LogOfPositions().eval()
    model = ait.Module(inner, "log-positions", strategy=cpu_strategy(tune_provider_options=False))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ait.tune(model, [torch.randn(4) for _ in range(2)], ignore_failing_modules=False)
    assert [str(w.message) for w in caught if "onnx" in w.filename and "reference" in w.filename] == []
    x = torch.randn(2, 4)
    torch.testing.assert_close(model(x), inner(x))


_DATACLASS_MODULE = textwrap.dedent("""
    import sys
    from dataclasses import dataclass
    import torch
    import aitune.torch as ait
    from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    @dataclass
    class Out:
        a: torch.Tensor
        b: torch.Tensor

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return Out(y, y + 1)

    torch.manual_seed(0)
    if sys.argv[1] == "save":
        module = ait.Module(Model().eval(), "dc", strategy=ait.OneBackendStrategy(ONNXRuntimeBackend(
            ONNXRuntimeBackendConfig(execution_provider="cpu", tune_provider_options=False))))
        ait.tune(module, [torch.randn(4)], performance_validation=False, progress=False)
        ait.save(module, sys.argv[2])
    else:
        module = ait.load(Model(), sys.argv[2])
        print("loaded", module(torch.randn(2, 4)).a.shape)
""")


def test_a_script_that_loads_a_checkpoint_with_its_own_dataclass_outputs_exits_quietly(tmp_path):
    """It printed 'nanobind: leaked 1 instances!' at exit after ait.load of a checkpoint
    whose outputs are a dataclass of the loading script's __main__."""
    checkpoint = str(tmp_path / "dc.ait")
    env = {key: value for key, value in os.environ.items() if key != "AITUNE_LEAK_WARNINGS"}
    for step in ("save", "load"):
        done = subprocess.run([sys.executable, "-c", _DATACLASS_MODULE, step, checkpoint], capture_output=True,
                              text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr
        assert "leaked" not in done.stderr, done.stderr
    assert "loaded torch.Size([2, 4])" in done.stdout
