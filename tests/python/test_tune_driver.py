"""The one tuning driver (``_core.drive_tune``, src/core/tuning/tune_driver.cpp) as the
front end uses it: the candidates a tune reports over ONNX Runtime (CPU) and torch.compile
are those the Python-sequenced driver reported before the move (names recorded from
main), first wins stops early, eager is the fallback, a backend's failure is recorded, or
propagated with its type where the strategy says so."""

from __future__ import annotations

import pytest
import torch

import aitune
import aitune.torch as ait
from aitune import _core
from aitune.torch.backend import TorchCompileBackend, TorchCompileBackendConfig, TorchEagerBackend
from aitune.torch.backend.base import Backend
from aitune.torch.backend.onnx_runtime_backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig
from aitune.torch.candidate_isolation import CudaContextLostError
from torch_models import MLP, SmallCNN, cpu_backend

# What main reported before the driver moved into C++ (same models, same strategy).
BEFORE = ["cpu", "cpu[intra_op_threads=1]", "cpu[graph_optimization_level=extended]",
          "torch.compile[mode=default] fp32"]
ORT_CPU = "ONNXRuntimeBackend[ONNXRuntimeBackendConfig(execution_provider='cpu')]"
COMPILE = "TorchCompileBackend[TorchCompileBackendConfig(mode='default')]"


def _tune(module, name, samples, strategy):
    model = ait.Module(module.eval(), name, strategy=strategy)
    ait.tune(model, samples, batch_sizes=[2], ignore_failing_modules=False, disable_external_logging=True)
    (report,) = model.ait_reports.values()
    return model, report


def _cuda_provider_missing() -> bool:
    return not _core.OrtRuntime.load().provider_status(_core.ExecutionProvider.CUDA).available


def _unavailable_backend():
    return ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda"))


@pytest.mark.parametrize("make, name, sample", [
    (MLP, "driver-mlp", lambda: torch.randn(16)),
    (SmallCNN, "driver-cnn", lambda: torch.randn(3, 8, 8)),
])
def test_max_throughput_over_ort_cpu_and_compile_reports_the_same_candidates(make, name, sample):
    strategy = ait.MaxThroughputStrategy([cpu_backend(), TorchCompileBackend(TorchCompileBackendConfig(mode="default"))])
    model, report = _tune(make(), name, [sample() for _ in range(4)], strategy)
    table = report.summary_table()
    assert [c.name for c in report.candidates] == BEFORE, table
    assert [(c.group, c.backend) for c in report.candidates] == [(0, ORT_CPU)] * 3 + [(1, COMPILE)], table
    statuses = [c.status for c in report.candidates]
    assert sorted(statuses) == ["not chosen"] * 3 + ["selected"], table
    assert report.candidates[report.winner].status == "selected"
    assert report.decision.startswith("highest throughput"), report.decision
    x = sample().unsqueeze(0).repeat(2, *([1] * sample().dim()))
    torch.testing.assert_close(model(x), model.ait_module(x), atol=1e-4, rtol=1e-4)


@pytest.mark.skipif("not _cuda_provider_missing()", reason="needs a machine without the CUDA provider")
def test_first_wins_records_a_failed_backend_and_stops_at_the_first_success(caplog):
    strategy = ait.FirstWinsStrategy([_unavailable_backend(), cpu_backend(tune_provider_options=False),
                                      TorchCompileBackend()])
    with caplog.at_level("WARNING", logger="aitune"):
        model, report = _tune(MLP(), "driver-first", [torch.randn(16)], strategy)
    failed, cpu = report.candidates  # the compile backend was never asked: no candidate of it
    assert (failed.status, failed.group, failed.backend) == ("failed", 0, "ONNXRuntimeBackend")
    assert failed.name == _unavailable_backend().describe()
    assert failed.reason.startswith("ProviderUnavailableError: CUDA execution provider unavailable")
    assert (cpu.name, cpu.group, cpu.status) == ("cpu", 1, "selected")
    assert report.decision.startswith("first backend with a correct candidate")
    assert f"{_unavailable_backend().describe()}: ProviderUnavailableError" in caplog.text


@pytest.mark.skipif("not _cuda_provider_missing()", reason="needs a machine without the CUDA provider")
def test_eager_is_the_fallback_when_every_backend_before_it_fails():
    model, report = _tune(MLP(), "driver-fallback", [torch.randn(16)],
                          ait.FirstWinsStrategy([_unavailable_backend(), TorchEagerBackend()]))
    assert [c.status for c in report.candidates] == ["failed"]
    assert list(model.ait_backends.values()) == ["TorchEagerBackend"]

    model = ait.Module(MLP().eval(), "driver-no-fallback", strategy=ait.FirstWinsStrategy([_unavailable_backend()]))
    with pytest.raises(ait.TuningError, match=r"(?s)no backend could build .*ONNXRuntimeBackend\): failed: "
                                              r"ProviderUnavailableError"):
        ait.tune(model, torch.randn(16), ignore_failing_modules=False, disable_external_logging=True)


@pytest.mark.skipif("not _cuda_provider_missing()", reason="needs a machine without the CUDA provider")
def test_one_backend_propagates_its_error_with_its_type_and_a_note():
    model = ait.Module(MLP().eval(), "driver-one", strategy=ait.OneBackendStrategy(_unavailable_backend()))
    with pytest.raises(aitune.ProviderUnavailableError, match="CUDA") as caught:
        ait.tune(model, torch.randn(16), ignore_failing_modules=False, disable_external_logging=True)
    assert any(note.startswith("while building driver-one/") and "ONNXRuntimeBackend" in note
               for note in caught.value.__notes__)


class _Raising(Backend):
    """A backend that cannot make any candidate: its add_candidates raises ``error``."""

    def __init__(self, error: BaseException):
        super().__init__()
        self.error = error

    def add_candidates(self, graph, tuner, group, advance, module_call=None):
        raise self.error


def test_a_backends_exception_is_recorded_by_type_and_a_fatal_one_stops_the_tune():
    strategy = ait.FirstWinsStrategy([_Raising(RuntimeError("no export today")), cpu_backend(tune_provider_options=False)])
    _, report = _tune(MLP(), "driver-recorded", [torch.randn(16)], strategy)
    failed, cpu = report.candidates
    assert (failed.name, failed.backend, failed.status) == ("_Raising", "_Raising", "failed")
    assert failed.reason == "RuntimeError: no export today"
    assert cpu.status == "selected"

    # Nothing can run after a lost CUDA context: it reaches the user whatever the strategy,
    # as itself, and no later backend is asked.
    later = _Raising(AssertionError("never asked"))
    strategy = ait.FirstWinsStrategy([_Raising(CudaContextLostError("context gone")), later, TorchEagerBackend()])
    model = ait.Module(MLP().eval(), "driver-fatal", strategy=strategy)
    with pytest.raises(CudaContextLostError, match="context gone") as caught:
        ait.tune(model, torch.randn(16), ignore_failing_modules=False, disable_external_logging=True)
    assert not getattr(caught.value, "__notes__", [])
