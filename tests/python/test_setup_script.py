"""scripts/setup.sh's machine detection, run with a fake nvidia-smi on PATH and
`--print-plan` (which installs nothing): a GPU machine gets the CUDA wheel of ONNX Runtime
and the CUDA torch index, any other machine the CPU wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"


def _plan(tmp_path: Path, nvidia_smi: str | None, **env: str) -> dict[str, str]:
    """setup.sh --print-plan with PATH = a folder holding `nvidia-smi` (a script with body
    `nvidia_smi`; none when None) followed by the folders of bash and coreutils only."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    if nvidia_smi is not None:
        tool = fake / "nvidia-smi"
        tool.write_text("#!/bin/sh\n" + nvidia_smi + "\n")
        tool.chmod(0o755)
    system = [str(Path(shutil.which(t)).parent) for t in ("bash", "grep", "dirname")]
    path = os.pathsep.join([str(fake), *dict.fromkeys(system)])
    if nvidia_smi is None and shutil.which("nvidia-smi", path=path):
        pytest.skip("a real nvidia-smi sits beside bash here")
    base = {k: v for k, v in os.environ.items() if k not in ("AITUNE_GPU", "AITUNE_TORCH_CUDA_INDEX")}
    out = subprocess.run(["bash", str(SETUP), "--print-plan"], env={**base, "PATH": path, **env},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


def test_setup_script_parses():
    subprocess.run(["bash", "-n", str(SETUP)], check=True)


def test_a_gpu_listed_by_nvidia_smi_gets_the_cuda_wheels(tmp_path):
    plan = _plan(tmp_path, 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0f3c)"; exit 0')
    assert plan["gpu"] == "1"
    assert (plan["ort_dist"], plan["other_dist"]) == ("onnxruntime-gpu", "onnxruntime")
    assert "onnxruntime-gpu[cuda,cudnn]==1.31.1" in plan["python_pins"].split()
    assert "onnxruntime==1.31.1" not in plan["python_pins"].split()
    assert "torch==2.13.0" in plan["python_pins"].split()
    assert plan["pip_index"] == "--extra-index-url https://download.pytorch.org/whl/cu130"


@pytest.mark.parametrize("body", [
    'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver" >&2; exit 9',
    "exit 0",  # succeeds but lists no GPU
])
def test_a_failing_or_empty_nvidia_smi_means_the_cpu_wheels(tmp_path, body):
    plan = _plan(tmp_path, body)
    assert plan["gpu"] == "0"
    assert (plan["ort_dist"], plan["other_dist"]) == ("onnxruntime", "onnxruntime-gpu")
    assert "onnxruntime==1.31.1" in plan["python_pins"].split()
    assert plan["pip_index"] == ""
    # The serving extra is part of the set-up, so a fresh clone's CI runs tests/python/test_serve.py.
    assert "ray[serve]==2.60.0" in plan["python_pins"].split()


def test_no_nvidia_smi_means_the_cpu_wheels(tmp_path):
    assert _plan(tmp_path, None)["gpu"] == "0"


def test_aitune_gpu_overrides_detection_and_the_torch_index_can_be_chosen(tmp_path):
    assert _plan(tmp_path, 'echo "GPU 0: NVIDIA H200"', AITUNE_GPU="0")["gpu"] == "0"
    plan = _plan(tmp_path, "exit 9", AITUNE_GPU="1", AITUNE_TORCH_CUDA_INDEX="https://example.invalid/cu130")
    assert plan["gpu"] == "1" and plan["pip_index"] == "--extra-index-url https://example.invalid/cu130"
    bad = subprocess.run(["bash", str(SETUP), "--print-plan"], env={**os.environ, "AITUNE_GPU": "yes"},
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "AITUNE_GPU must be 0 or 1" in bad.stderr
