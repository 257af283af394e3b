"""No failing candidate takes the tuning process down: candidates tried in a child process
first (CUDA graphs by default, every one with AITUNE_ISOLATE_CANDIDATES=all), failures
recorded as failed while tuning goes on, and torch healthy afterwards (on CUDA too)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch_models import MLP, cpu_backend

import aitune.torch as ait
from aitune import _core
from aitune.torch import ModuleState, candidate_isolation
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig


def _report(model: ait.Module):
    (report,) = model.ait_reports.values()
    return report


def test_isolated_candidates_are_evaluated_in_a_child_and_then_here(monkeypatch):
    monkeypatch.setenv("AITUNE_ISOLATE_CANDIDATES", "all")
    children = []
    real = candidate_isolation.child_command
    monkeypatch.setattr(candidate_isolation, "child_command", lambda d: children.append(d) or real(d))
    inner = MLP().eval()
    model = ait.Module(inner, "isolated", strategy=ait.OneBackendStrategy(cpu_backend(use_dynamo=False)))
    ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False, progress=False)
    report = _report(model)
    assert len(children) == len(report.candidates) == 3  # the CPU variants, each tried in a child first
    assert report.winner is not None and all(c.status != "failed" for c in report.candidates), report.summary_table()
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), inner(x), atol=1e-4, rtol=1e-4)


def test_a_candidate_that_kills_its_child_is_failed_and_the_others_win(monkeypatch):
    monkeypatch.setenv("AITUNE_ISOLATE_CANDIDATES", "all")
    real = candidate_isolation.child_command
    calls = []

    def dying_first(job_dir):
        calls.append(job_dir)
        if len(calls) == 1:  # the first candidate's child aborts, as on a CUDA error in a kernel
            return [sys.executable, "-c", "import os; os.abort()"]
        return real(job_dir)

    monkeypatch.setattr(candidate_isolation, "child_command", dying_first)
    inner = MLP().eval()
    model = ait.Module(inner, "dying", strategy=ait.OneBackendStrategy(cpu_backend(use_dynamo=False)))
    ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False, progress=False)
    report = _report(model)
    first = report.candidates[0]
    assert first.status == "failed" and "killed by signal" in first.reason, report.summary_table()
    assert report.winner not in (None, 0)
    assert model.ait_state is ModuleState.TUNED


def test_an_exception_escaping_the_engine_fails_only_its_candidate(monkeypatch):
    monkeypatch.setenv("AITUNE_ISOLATE_CANDIDATES", "off")
    real = _core.GraphTuner.evaluate_onnx
    seen = []

    def flaky(self, path, candidate, *args):
        seen.append(candidate.name)
        if len(seen) == 2:
            raise MemoryError("out of memory while creating the session")
        return real(self, path, candidate, *args)

    monkeypatch.setattr(_core.GraphTuner, "evaluate_onnx", flaky)
    model = ait.Module(MLP().eval(), "flaky", strategy=ait.OneBackendStrategy(cpu_backend(use_dynamo=False)))
    ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False, progress=False)
    statuses = [c.status for c in _report(model).candidates]
    assert len(statuses) == 3 and statuses[1] == "failed" and statuses.count("failed") == 1
    assert "MemoryError: out of memory" in _report(model).candidates[1].reason
    assert model.ait_state is ModuleState.TUNED


def test_isolation_mode_is_validated(monkeypatch):
    monkeypatch.setenv("AITUNE_ISOLATE_CANDIDATES", "sometimes")
    with pytest.raises(ValueError, match="auto, all or off"):
        candidate_isolation.isolation_mode()


# -- CUDA (skipped without a GPU) ---------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _torch_is_healthy() -> None:
    a = torch.randn(512, 512, device="cuda")
    torch.testing.assert_close((a @ a).cpu(), a.cpu() @ a.cpu(), atol=1e-2, rtol=1e-2)
    torch.cuda.synchronize()


@cuda
def test_failing_cuda_candidates_leave_torch_usable():
    """Every candidate runs out of memory (a 1 MiB arena for 64 MB of weights): each is
    reported failed, the module stays eager, and torch's CUDA state is as before."""
    inner = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU()).eval().cuda()
    config = ONNXRuntimeBackendConfig(execution_provider="cuda", provider_options={"gpu_mem_limit": str(1 << 20)})
    model = ait.Module(inner, "oom", strategy=ait.OneBackendStrategy(ONNXRuntimeBackend(config)))
    ait.tune(model, [torch.randn(4096, device="cuda") for _ in range(2)], batch_sizes=[4], progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    _torch_is_healthy()
    x = torch.randn(4, 4096, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(model(x), inner(x))


@cuda
def test_cuda_graph_candidates_are_tried_in_a_child_first(monkeypatch):
    children = []
    real = candidate_isolation.child_command
    monkeypatch.setattr(candidate_isolation, "child_command", lambda d: children.append(d) or real(d))
    inner = MLP().eval().cuda()
    config = ONNXRuntimeBackendConfig(execution_provider="cuda")
    model = ait.Module(inner, "graphs", strategy=ait.OneBackendStrategy(ONNXRuntimeBackend(config)))
    ait.tune(model, [torch.randn(16, device="cuda") for _ in range(4)], batch_sizes=[4], progress=False,
             ignore_failing_modules=False)
    graph_candidates = [c for c in _report(model).candidates if "enable_cuda_graph=1" in c.name]
    assert graph_candidates and len(children) == len(graph_candidates)
    _torch_is_healthy()


class HalfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


def test_a_half_width_graph_on_the_cpu_provider_is_tried_in_a_child_first(monkeypatch):
    """ONNX Runtime 1.31.1 segfaults building the CPU session of an fp16 multi-head attention
    at optimization level all: tuning an fp16 module on the CPU provider killed the whole
    process with no message (a session-35 probe). Those candidates are tried in a child."""
    monkeypatch.delenv("AITUNE_ISOLATE_CANDIDATES", raising=False)
    children = []
    real = candidate_isolation.child_command
    monkeypatch.setattr(candidate_isolation, "child_command", lambda d: children.append(d) or real(d))
    torch.manual_seed(0)
    inner = HalfAttention().eval().half()
    model = ait.Module(inner, "half-attention", strategy=ait.OneBackendStrategy(cpu_backend()))
    ait.tune(model, [torch.randn(6, 16).half() for _ in range(3)], ignore_failing_modules=False, progress=False,
             performance_validation=False)
    report = _report(model)
    assert len(children) == len(report.candidates), report.summary_table()
    assert model.ait_state is ModuleState.TUNED and report.winner is not None, report.summary_table()
    x = torch.randn(2, 6, 16).half()
    with torch.no_grad():
        torch.testing.assert_close(model(x), inner(x), atol=2e-2, rtol=2e-2)


class _Bf16WithFloatLogits(torch.nn.Module):
    """bf16 weights; forward hands back float32, as generation code does (``logits.float()``)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16).to(torch.bfloat16)

    def forward(self, x):
        return (self.linear(x.to(torch.bfloat16)) * 2).float()


def test_an_unsupported_dtype_found_in_an_isolated_trial_keeps_its_kind(monkeypatch):
    """The same bf16 failure raised UnsupportedDTypeTuningError when the module returned bf16
    and plain TuningError when it returned float32: the bf16 graph was tried in a child, whose
    verdict came back as a reason alone, without its error code (a session-36 probe)."""
    monkeypatch.delenv("AITUNE_ISOLATE_CANDIDATES", raising=False)
    children = []
    real = candidate_isolation.child_command
    monkeypatch.setattr(candidate_isolation, "child_command", lambda d: children.append(d) or real(d))
    model = ait.Module(_Bf16WithFloatLogits().eval(), "bf16-float-logits", strategy=ait.OneBackendStrategy(cpu_backend()))
    with pytest.raises(ait.UnsupportedDTypeTuningError):
        ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False, progress=False,
                 performance_validation=False)
    assert children, "the bf16 graph was not tried in a child"
    assert {c.failure_code for c in _report(model).candidates} == {"unsupported_dtype"}
