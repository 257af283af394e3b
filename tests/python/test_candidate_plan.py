"""One candidate plan for both drivers: `aitune tune --list-candidates` prints exactly the
candidates ONNXRuntimeBackend plans (and ait.tune evaluates) for the same model, provider
and precision, and marks those whose model only the Python front end can make."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import aitune.torch as ait
from aitune import _core
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig
from torch_models import MLP, SmallCNN

NEEDS_FRONT_END = "needs ait.tune (Python front end)"


def _cli():
    """The console script of this environment (the one `make build` installed), else PATH's."""
    beside = Path(sys.executable).parent / "aitune"
    return str(beside) if beside.exists() else shutil.which("aitune")


pytestmark = pytest.mark.skipif(_cli() is None, reason="the aitune CLI is not installed in this environment")


def _export(module: torch.nn.Module, example: torch.Tensor, path: Path, dynamic: bool) -> Path:
    axes = {"x": {0: "batch"}, "y": {0: "batch"}} if dynamic else None
    torch.onnx.export(module, (example,), str(path), dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes=axes)
    return path


def _samples(batches: list[torch.Tensor], root: Path) -> Path:
    """The samples as `aitune tune --samples` reads them: one subdirectory each."""
    for i, x in enumerate(batches):
        (root / f"{i}").mkdir(parents=True)
        np.save(root / f"{i}" / "x.npy", x.numpy())
    return root


def _listing(model: Path, samples: Path, *args: str) -> list[tuple[str, str, str, bool]]:
    done = subprocess.run([_cli(), "tune", str(model), "--samples", str(samples), "--list-candidates", *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = []
    for line in done.stdout.splitlines():
        if "\t" not in line:
            continue  # e.g. "provider: cpu (auto)"
        name, precision, model_transform, *note = line.split("\t")
        rows.append((name, precision, "" if model_transform == "exported" else model_transform,
                     bool(note) and note[0].startswith(NEEDS_FRONT_END)))
    return rows


def _plan(config: ONNXRuntimeBackendConfig, spec, module, device) -> list[tuple[str, str, str, bool]]:
    return [(c.name, _core.precision_name(c.precision), c.model_transform, c.needs_front_end)
            for c in ONNXRuntimeBackend(config).plan(spec, module, device)]


def _recorded_spec(module: torch.nn.Module, batches) -> _core.GraphSpec:
    """The graph spec the front end records from these calls."""
    builder = _core.GraphSpecBuilder()
    for x in batches:
        y = module(x)
        builder.record([("x", str(x.dtype).removeprefix("torch."), list(x.shape))],
                       [("y", str(y.dtype).removeprefix("torch."), list(y.shape))], x.shape[0])
    return builder.build()


CASES = [
    # provider, ONNXRuntimeBackendConfig fields, model, dynamic batch axis
    ("cpu", {}, "mlp", True),
    ("cpu", {"precision": "fp32", "transformer_fusions": False}, "mlp", True),
    ("cuda", {}, "cnn", False),  # static shapes: CUDA graphs; convolutions: the NHWC fp16 model
    ("cuda", {}, "mlp", True),
    ("cuda", {"precision": "tf32", "use_dynamo": False}, "cnn", True),
    ("cuda", {"tune_provider_options": False}, "mlp", False),
    ("tensorrt", {"precision": "fp16"}, "mlp", True),
    ("cuda", {}, "mlp-half", True),  # an fp16 module: every candidate computes in fp16, no conversion
]


@pytest.mark.parametrize("provider, options, model_name, dynamic", CASES)
def test_cli_lists_the_candidates_the_front_end_plans(tmp_path, provider, options, model_name, dynamic):
    torch.manual_seed(0)
    if model_name == "cnn":
        module, shape = SmallCNN().eval(), (3, 8, 8)
    else:
        module, shape = MLP().eval(), (16,)
    if model_name == "mlp-half":
        module = module.half()
    dtype = torch.float16 if model_name == "mlp-half" else torch.float32
    batches = [torch.randn(b, *shape).to(dtype) for b in ([1, 4] if dynamic else [2])]
    model = _export(module, batches[0], tmp_path / "model.onnx", dynamic)
    samples = _samples(batches, tmp_path / "samples")
    with torch.no_grad():
        spec = _recorded_spec(module, batches)
    config = ONNXRuntimeBackendConfig(execution_provider=provider, **options)

    args = ["--provider", provider, "--precision", config.precision,
            "--exporter", "dynamo" if config.use_dynamo else "trace"]
    if not config.tune_provider_options:
        args.append("--no-variants")
    if not config.transformer_fusions:
        args.append("--no-transformer-fusions")
    listed = _listing(model, samples, *args)
    device = torch.device("cpu") if provider == "cpu" else torch.device("cuda", 0)
    planned = _plan(config, spec, module, device)
    assert listed == planned
    assert listed and all(front_end == bool(transform) for _, _, transform, front_end in listed)
    if provider == "cuda" and model_name == "cnn" and not dynamic:
        names = [name for name, *_ in listed]
        assert "cuda[enable_cuda_graph=1,use_tf32=1]" in names
        assert "cuda[enable_cuda_graph=1,use_tf32=1] fp16 model" in names
        assert "cuda[enable_cuda_graph=1,prefer_nhwc=1,use_tf32=1] fp16 model" in names
        assert "cuda[enable_cuda_graph=1,fuse_conv_bias=1,prefer_nhwc=1,use_tf32=1] fp16 model" in names
        assert "cuda[enable_cuda_graph=1,use_tf32=1] + ort_fusions fp16" in names
        assert "cuda[enable_cuda_graph=1,sdpa_kernel=8,use_tf32=1] + ort_fusions fp16" in names  # cuDNN flash attention
    if model_name == "mlp-half":
        assert {precision for _, precision, _, _ in listed} == {"fp16"}
        assert not any(transform == "fp16" for _, _, transform, _ in listed)


def test_ait_tune_evaluates_the_listed_candidates(tmp_path):
    """On the CPU: the report of ait.tune has every listed candidate on the exported model,
    and the fused one exactly where its fusion applies; the CLI's own tune evaluates the
    exported-model candidates and says which it left to the front end."""
    torch.manual_seed(0)
    module = MLP().eval()
    batches = [torch.randn(b, 16) for b in (1, 4)]
    model = _export(module, batches[0], tmp_path / "model.onnx", dynamic=True)
    samples = _samples(batches, tmp_path / "samples")
    listed = _listing(model, samples, "--provider", "cpu", "--exporter", "trace")
    tuned = ait.Module(module, "plan-mlp", strategy=ait.OneBackendStrategy(
        ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu", use_dynamo=False))))
    ait.tune(tuned, [x[0] for x in batches], disable_external_logging=True)
    (report,) = tuned.ait_reports.values()
    evaluated = [c.name for c in report.candidates]
    exported = [name for name, _, transform, _ in listed if not transform]
    assert evaluated[: len(exported)] == exported
    assert set(evaluated[len(exported):]) <= {name for name, _, transform, _ in listed if transform}

    done = subprocess.run([_cli(), "tune", str(model), "--samples", str(samples), "--provider", "cpu",
                           "--exporter", "trace", "--time-cap", "0.2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    fused = [name for name, _, transform, _ in listed if transform]
    assert fused and f"not evaluated here, {NEEDS_FRONT_END}: {'; '.join(fused)}" in done.stdout
    for name in fused:
        assert f"{name}: skipped: {NEEDS_FRONT_END}" in done.stderr
