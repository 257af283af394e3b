"""Keeps a failing candidate from taking the tuning process down: risky candidates are
tried first in a child process, every candidate's failure is recorded as failed, and
torch's CUDA state is checked after each one.

Why a child process: a CUDA error inside a kernel (an illegal address while a CUDA graph
is captured or replayed) is sticky. It poisons the CUDA context of the whole process, so
every later CUDA call fails, torch's included, and nothing in the process can recover it.
Such a failure can only be contained where it happens in a process of its own. CUDA-graph
candidates are the class known to do this (issue 13: a Gather node of a dynamo export under
capture with the ORT 1.29 build), so each is evaluated first by the engine in a child
(`python -m aitune.candidate_trial DIR`, which imports no torch); if the child fails or dies, the
candidate is reported failed with the child's reason and never runs in this process.
Candidates that pass there are evaluated here as usual (the child's session, timings and
outputs are discarded: only whether it survives counts).

``AITUNE_ISOLATE_CANDIDATES``: ``auto`` (default: CUDA-graph candidates, and fp16 / bf16 graphs
on the CPU provider, see ``needs_isolation``), ``all`` (every
candidate, e.g. to bisect a crash), ``off``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from aitune import _core
from aitune.torch import cache

logger = logging.getLogger("aitune")

#: Seconds a child may take (session creation, a TensorRT-free CUDA graph capture, a few runs).
PROBE_TIMEOUT_S = 300
_PROBE_SAMPLES = 2  # CUDA-graph candidates have static shapes: the first samples are representative


class CudaContextLostError(RuntimeError):
    """A candidate left this process's CUDA context unusable (a sticky CUDA error): no
    later CUDA call of the process, torch's included, can succeed. Restart the process,
    and exclude the candidate (its name is in the message)."""


def isolation_mode() -> str:
    mode = os.environ.get("AITUNE_ISOLATE_CANDIDATES", "auto").strip().lower()
    if mode not in ("auto", "all", "off"):
        raise ValueError(f"AITUNE_ISOLATE_CANDIDATES must be auto, all or off, got {mode!r}")
    return mode


#: Half-width tensors, which ONNX Runtime's CPU provider computes in few kernels of its own.
_HALF_WIDTH = (torch.float16, torch.bfloat16)


def needs_isolation(candidate: _core.OnnxCandidate, graph=None) -> bool:
    """Whether ``candidate`` is tried in a child first: CUDA-graph candidates, and graphs
    computing in fp16 / bf16 on the CPU provider (``graph``'s samples tell), where ONNX
    Runtime 1.31.1 itself segfaults building the session of an fp16 multi-head attention at
    optimization level all (a session-35 probe: the whole tune died, exit 139, no message)."""
    mode = isolation_mode()
    if mode == "off":
        return False
    if mode == "all":
        return True
    options = candidate.config.provider_options
    if options.get("enable_cuda_graph") == "1" or options.get("trt_cuda_graph_enable") == "1":
        return True
    return (_core.execution_provider_name(candidate.config.provider) == "cpu" and graph is not None
            and (candidate.precision in (_core.Precision.FP16, _core.Precision.BF16)
                 or any(t.dtype in _HALF_WIDTH for s in graph.samples[:1] for t in (*s.inputs, *s.outputs))))


def _host_array(tensor: torch.Tensor) -> np.ndarray | None:
    if tensor.dtype == torch.bfloat16:  # .npy has no bfloat16
        return None
    return tensor.detach().cpu().contiguous().numpy()


def child_command(job_dir: Path) -> list[str]:
    """The child process's command line (a function so tests can substitute one that dies)."""
    return [sys.executable, "-m", "aitune.candidate_trial", str(job_dir)]


def probe(model_path: str, candidate: _core.OnnxCandidate, graph,
          model_inputs: list[int]) -> tuple[str, str] | None:
    """Evaluates ``candidate`` on ``model_path`` in a child process; returns why it failed
    there and the failure's error code name ('' where none is known), or None when its
    session was created and ran, correct or not."""
    samples = graph.samples[:_PROBE_SAMPLES]
    with cache.scratch_dir("aitune-probe-") as scratch:
        root = Path(scratch)
        for s, sample in enumerate(samples):
            for kind, tensors in (("input", sample.inputs), ("expected", sample.outputs)):
                for i, tensor in enumerate(tensors):
                    array = _host_array(tensor)
                    if array is None:
                        return None  # cannot be handed over; evaluated in this process as before
                    np.save(root / f"{s}_{kind}_{i}.npy", array)
        (root / "job.json").write_text(
            json.dumps(
                {
                    "model_path": str(model_path),
                    "name": candidate.name,
                    "config": candidate.config.to_json(-1),
                    "precision": _core.precision_name(candidate.precision),
                    "spec": graph.graph_spec().to_json(-1),
                    "model_inputs": list(model_inputs),
                    "samples": [
                        {"inputs": len(s.inputs), "expected": len(s.outputs), "batch_size": max(s.batch_size, 1)}
                        for s in samples
                    ],
                }
            )
        )
        try:
            done = subprocess.run(
                child_command(root),
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return f"an isolated trial of this candidate did not finish within {PROBE_TIMEOUT_S} s", ""
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
            how = f"was killed by signal {-done.returncode}" if done.returncode < 0 else f"exited with {done.returncode}"
            return f"an isolated trial of this candidate {how} (it would have broken this process): {tail}", ""
        result = json.loads(lines[-1])
        if result["status"] == "failed":
            return f"in an isolated trial: {result['reason']}", result.get("code", "")
        return None


def evaluate(tuner, model_path: str, candidate: _core.OnnxCandidate, backend: str, group: int,
             model_inputs: list[int], graph, module_call=None) -> None:
    """``tuner.evaluate_onnx`` with the containment described above: the candidate is
    tried in a child first where it is risky, any exception is recorded as its failure,
    and on CUDA torch's state is checked afterwards (``CudaContextLostError`` when a
    candidate broke it anyway). ``module_call(session) -> call``: what the engine times
    (the module's own dispatch over the candidate's session); None: the session alone."""
    cuda = graph.device.type == "cuda"
    if needs_isolation(candidate, graph):
        refused = probe(model_path, candidate, graph, model_inputs)
        if refused is not None:
            reason, code = refused
            logger.warning("%s: %s", candidate.name, reason)
            # the trial's error code with it: an unsupported dtype found there made a plain
            # TuningError where the same failure in this process is UnsupportedDTypeTuningError
            tuner.add_failed(candidate.name, backend, group, reason, candidate.precision, code)
            return
    if cuda:
        torch.cuda.empty_cache()  # memory torch cached but does not use is ONNX Runtime's to take
    try:
        tuner.evaluate_onnx(model_path, candidate, backend, group, model_inputs, module_call)
    except Exception as error:  # the engine reports failures itself; this is anything that escaped it
        tuner.add_failed(candidate.name, backend, group, f"{type(error).__name__}: {error}", candidate.precision)
    if cuda:
        check_cuda_health(graph.device, candidate.name)


def check_cuda_health(device: torch.device, after: str) -> None:
    """Raises ``CudaContextLostError`` when torch can no longer use ``device``."""
    try:
        torch.cuda.synchronize(device)
        probe_value = (torch.ones(4, device=device) * 2).sum().item()
    except Exception as error:  # a sticky CUDA error surfaces as RuntimeError / AcceleratorError
        raise CudaContextLostError(
            f"candidate '{after}' left the CUDA context of this process unusable ({type(error).__name__}: {error}); "
            "restart the process and exclude this candidate (e.g. provider_options or tune_provider_options=False)"
        ) from error
    if probe_value != 8.0:
        raise CudaContextLostError(f"candidate '{after}': torch computes wrong results on {device} afterwards")
