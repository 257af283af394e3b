"""Precision as a property of every candidate: the engine's names and limits, the
ONNXRuntimeBackendConfig.precision field that limits what tuning may choose, reports and
ait_backends that show it, the CLI's --precision."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import aitune
import aitune.torch as ait
from aitune import _core
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig
from aitune.torch.backend.onnx_runtime_backend import module_precision
from torch_models import MLP, cpu_backend

P = _core.Precision


def test_names_round_trip_and_strict_is_reported_as_fp32():
    for precision, name in [(P.STRICT, "fp32"), (P.TF32, "tf32"), (P.FP16, "fp16"), (P.BF16, "bf16")]:
        assert _core.precision_name(precision) == name
        assert _core.parse_precision(name) == precision
    assert _core.parse_precision("strict") == P.STRICT
    with pytest.raises(ValueError, match="'fp32', 'tf32', 'fp16', 'bf16'"):
        _core.parse_precision("fp8")


@pytest.mark.parametrize(
    "limit, allowed",
    [
        ("any", {P.STRICT, P.TF32, P.FP16, P.BF16}),
        ("fp32", {P.STRICT}),
        ("tf32", {P.STRICT, P.TF32}),
        ("fp16", {P.STRICT, P.TF32, P.FP16}),
        ("bf16", {P.STRICT, P.TF32, P.BF16}),
    ],
)
def test_a_limit_admits_itself_and_every_stricter_precision(limit, allowed):
    engine_limit = _core.parse_precision_limit(limit)  # the kwargs edge's one conversion
    assert (engine_limit is None) == (limit == "any")
    assert {p for p in (P.STRICT, P.TF32, P.FP16, P.BF16) if _core.precision_allowed(p, engine_limit)} == allowed


def test_bf16_has_a_looser_default_tolerance_than_fp16():
    fp16, bf16 = _core.default_tolerance("float32", P.FP16), _core.default_tolerance("float32", P.BF16)
    assert bf16.atol > fp16.atol and bf16.rtol > fp16.rtol
    assert _core.default_tolerance("int64", P.BF16) == _core.Tolerance(0, 0)


def test_config_validates_and_keys_the_precision():
    assert ONNXRuntimeBackendConfig().precision == "any"  # today's behaviour: every candidate competes
    assert ONNXRuntimeBackendConfig(precision="FP16").precision == "fp16"
    with pytest.raises(ValueError, match="precision must be one of 'any', 'fp32'"):
        ONNXRuntimeBackendConfig(precision="fp64")
    with pytest.raises(ValueError, match="precision"):
        ONNXRuntimeBackendConfig(precision=16)
    assert ONNXRuntimeBackendConfig(precision="fp32").key() != ONNXRuntimeBackendConfig().key()


def _cuda_variants(precision: str, module: torch.nn.Module):
    """The CUDA candidates a config plans (computed without a GPU: only the list): those on
    the exported model, and those on its fp16 copy."""
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda", precision=precision,
                                                          transformer_fusions=False))
    builder = _core.GraphSpecBuilder()
    builder.record([("x", "float32", [4, 16])], [("y", "float32", [4, 8])], 4)
    plan = backend.plan(builder.build(), module, torch.device("cuda", 0))
    return [c for c in plan if not c.model_transform], [c for c in plan if c.model_transform == "fp16"]


def test_the_limit_filters_cuda_candidates():
    everything, fp16 = _cuda_variants("any", MLP())
    assert {c.precision for c in everything} == {P.STRICT, P.TF32} and len(fp16) == 1
    strict, fp16 = _cuda_variants("fp32", MLP())
    assert strict and {c.precision for c in strict} == {P.STRICT} and fp16 == []
    assert all(c.config.provider_options["use_tf32"] == "0" for c in strict)
    tf32, fp16 = _cuda_variants("tf32", MLP())
    assert {c.precision for c in tf32} == {P.STRICT, P.TF32} and fp16 == []
    assert len(_cuda_variants("fp16", MLP())[1]) == 1


def test_an_fp16_module_computes_in_fp16_whatever_the_provider_options():
    half = MLP().half()
    assert module_precision(half) == P.FP16 and module_precision(MLP()) == P.STRICT
    assert module_precision(MLP().to(torch.bfloat16)) == P.BF16
    variants, fp16 = _cuda_variants("any", half)
    assert {c.precision for c in variants} == {P.FP16} and fp16 == []  # already fp16: no conversion
    assert _cuda_variants("tf32", half)[0] == []


def test_a_limit_no_candidate_meets_is_a_clear_error():
    model = ait.Module(MLP().half(), "half-fp32",
                       strategy=ait.OneBackendStrategy(cpu_backend(precision="fp32")))
    with pytest.raises(_core.InvalidArgumentError, match="precision='fp32'.*computes in fp16"):
        ait.tune(model, [torch.randn(16).half() for _ in range(2)], ignore_failing_modules=False,
                 disable_external_logging=True)


def test_reports_and_backends_show_each_candidates_precision():
    model = ait.Module(MLP().eval(), "mlp-fp32", strategy=ait.OneBackendStrategy(cpu_backend(precision="fp32")))
    ait.tune(model, [torch.randn(16) for _ in range(4)], disable_external_logging=True)
    (report,) = model.ait_reports.values()
    assert report.candidates and all(c.precision == P.STRICT for c in report.candidates)
    assert all(c.precision_name == "fp32" for c in report.candidates)
    data = json.loads(report.to_json())
    assert {c["precision"] for c in data["candidates"]} == {"fp32"}
    header = report.summary_table().splitlines()[1]
    assert header.split()[:3] == ["candidate", "precision", "status"]
    (described,) = model.ait_backends.values()
    assert described.endswith("(fp32)")


def _cli():
    """The console script of this environment (the one `make build` installed), else PATH's."""
    beside = Path(sys.executable).parent / "aitune"
    return str(beside) if beside.exists() else shutil.which("aitune")


@pytest.mark.skipif(_cli() is None, reason="the aitune CLI is not installed in this environment")
def test_cli_precision_flag(tmp_path):
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(MLP().eval(), (torch.randn(2, 16),), str(path), dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    report = tmp_path / "report.json"
    ok = subprocess.run([_cli(), "tune", str(path), "--provider", "cpu", "--precision", "fp32", "--time-cap", "0.5",
                         "--quiet", "--report", str(report)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "precision" in ok.stdout and {c["precision"] for c in json.loads(report.read_text())["candidates"]} == {
        "fp32"}
    bad = subprocess.run([_cli(), "tune", str(path), "--provider", "cpu", "--precision", "fp8", "--quiet"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "precision must be one of 'any'" in bad.stderr


def test_a_bf16_module_on_the_cpu_provider_fails_naming_bf16_the_operator_and_what_to_do():
    """ONNX Runtime's CPU provider has no bfloat16 Gemm: every candidate's session failed
    with ORT's bare "Could not find an implementation for Gemm(13) node with name ..." and
    the tune with a plain TuningError, neither naming bfloat16 nor a way out. The engine
    reads the node's dtype from the model: the reason and the typed error say both."""
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    model = ait.Module(inner.to(torch.bfloat16).eval(), "bf16_mlp_on_cpu",
                       strategy=ait.OneBackendStrategy(cpu_backend()))
    with pytest.raises(ait.UnsupportedDTypeTuningError) as failed:
        ait.tune(model, [torch.randn(16, dtype=torch.bfloat16) for _ in range(2)], disable_external_logging=True,
                 ignore_failing_modules=False)
    assert isinstance(failed.value, ait.TuningError) and isinstance(failed.value, aitune.UnsupportedDTypeError)
    message = str(failed.value)
    assert "no kernel at the model's dtype" in message
    # the error lists each candidate's reason (the report's, as the summary table shows it)
    reasons = [line for line in message.splitlines() if line.startswith("  - cpu")]
    assert len(reasons) >= 2, message
    for reason in reasons:
        assert "failed: " in reason and "CPUExecutionProvider has no bfloat16 kernel for Gemm" in reason, reason
        assert "float32" in reason and "float16 on the CUDA provider" in reason and "TorchCompileBackend" in reason
    # the float32 module tunes on the same provider: the refusal is the dtype's, not the model's
    fp32 = ait.Module(inner.float().eval(), "fp32_mlp_on_cpu", strategy=ait.OneBackendStrategy(cpu_backend()))
    ait.tune(fp32, [torch.randn(16) for _ in range(2)], disable_external_logging=True, ignore_failing_modules=False,
             performance_validation=False)
    assert fp32.ait_state is ait.ModuleState.TUNED and list(fp32.ait_backends.values()) != ["TorchEagerBackend"]


class _CastsToBf16(torch.nn.Module):
    """A float32 model whose own code computes one product in bfloat16 (as Falcon's ALiBi
    does: ``slopes.bfloat16() * positions``)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.linear(x) + (x[:, :8].bfloat16() * x[:, 8:].bfloat16()).float()


def test_a_float32_model_that_casts_to_bf16_itself_is_not_told_to_call_float():
    """A float32 model whose code casts to bfloat16 (Falcon with ALiBi) failed on the CPU
    provider with "the model computes in bfloat16 ... tune the module in float32
    (module.float())": advice that changes nothing. The reason now says the model's code
    casts to bfloat16 at that node and names the ways that do help."""
    torch.manual_seed(0)
    model = ait.Module(_CastsToBf16().eval(), "fp32_casting_to_bf16", strategy=ait.OneBackendStrategy(cpu_backend()))
    with pytest.raises(ait.UnsupportedDTypeTuningError) as failed:
        ait.tune(model, [torch.randn(16) for _ in range(2)], disable_external_logging=True,
                 ignore_failing_modules=False)
    reasons = [line for line in str(failed.value).splitlines() if line.startswith("  - cpu")]
    assert reasons, str(failed.value)
    for reason in reasons:
        assert "no bfloat16 kernel for Mul" in reason and "the model's code casts to bfloat16" in reason, reason
        assert "module.float()) " not in reason and "TorchCompileBackend" in reason, reason


def test_a_float64_module_on_the_cpu_provider_fails_naming_float64_the_operator_and_what_to_do():
    """ONNX Runtime's CPU provider has no float64 Erf: a float64 GELU failed every candidate
    with ORT's bare "Could not find an implementation for Erf(13) node" and the tune with a
    plain TuningError, where bfloat16 got the typed error and the ways out."""
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU()).to(torch.float64).eval()
    model = ait.Module(inner, "f64_gelu_on_cpu", strategy=ait.OneBackendStrategy(cpu_backend()))
    with pytest.raises(ait.UnsupportedDTypeTuningError) as failed:
        ait.tune(model, [torch.randn(16, dtype=torch.float64) for _ in range(2)], disable_external_logging=True,
                 ignore_failing_modules=False)
    reasons = [line for line in str(failed.value).splitlines() if line.startswith("  - cpu")]
    assert reasons, str(failed.value)
    for reason in reasons:
        assert "CPUExecutionProvider has no float64 kernel for Erf" in reason, reason
        assert "module.float()" in reason and "TorchCompileBackend" in reason, reason


def test_a_bfloat16_conv_on_the_cpu_provider_fails_with_the_typed_error_and_the_ways_out():
    """ONNX's Conv takes no bfloat16, which ONNX Runtime says at load as a type error of the
    graph ("Type Error: Type (tensor(bfloat16)) of input parameter ... of operator (Conv)"),
    not as a missing kernel: a bfloat16 Conv2d failed with a plain TuningError and ORT's
    message, where a bfloat16 Linear got the typed error and the ways out."""
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten()).to(torch.bfloat16).eval()
    model = ait.Module(inner, "bf16_conv_on_cpu", strategy=ait.OneBackendStrategy(cpu_backend()))
    with pytest.raises(ait.UnsupportedDTypeTuningError) as failed:
        ait.tune(model, [torch.randn(3, 8, 8, dtype=torch.bfloat16) for _ in range(2)], disable_external_logging=True,
                 ignore_failing_modules=False)
    reasons = [line for line in str(failed.value).splitlines() if line.startswith("  - cpu")]
    assert reasons, str(failed.value)
    for reason in reasons:
        assert "CPUExecutionProvider has no bfloat16 kernel for Conv" in reason, reason
        assert "module.float()" in reason and "TorchCompileBackend" in reason, reason
