"""The fp16-model candidate of the CUDA provider: conversion (inputs and outputs keep
their dtypes), which configurations offer it, and that a failed conversion writes nothing.
The candidate itself is measured on a GPU (test_torch_cuda.py)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from aitune import _core
from aitune.torch import export
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig


def _mlp_onnx(path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    torch.onnx.export(model, (torch.randn(2, 16),), str(path), dynamo=False, input_names=["x"], output_names=["y"])
    return model


def test_conversion_keeps_io_dtypes_and_halves_the_weights(tmp_path):
    model = _mlp_onnx(tmp_path / "m.onnx")
    out = export.convert_to_fp16(tmp_path / "m.onnx", tmp_path / "m16.onnx")
    converted = onnx.load(str(out))
    onnx.checker.check_model(converted)
    float_type = onnx.TensorProto.FLOAT
    assert [i.type.tensor_type.elem_type for i in converted.graph.input] == [float_type]
    assert [o.type.tensor_type.elem_type for o in converted.graph.output] == [float_type]
    assert {init.data_type for init in converted.graph.initializer} == {onnx.TensorProto.FLOAT16}
    assert not (tmp_path / "m16.onnx.partial").exists()
    # It still computes the model, within fp16's tolerance (the CPU provider runs it).
    session = _core.OnnxSession.create(
        str(out), _core.OnnxSessionConfig(provider=_core.ExecutionProvider.CPU))
    x = torch.randn(2, 16)  # the export's static shape
    (y,) = session.infer([x])
    np.testing.assert_allclose(y.numpy(), model(x).detach().numpy(), atol=1e-2, rtol=1e-2)


def test_a_failed_conversion_leaves_no_file(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(Exception):
        export.convert_to_fp16(tmp_path / "bad.onnx", tmp_path / "bad16.onnx")
    assert not (tmp_path / "bad16.onnx").exists() and not (tmp_path / "bad16.onnx.partial").exists()


def _spec(static: bool):
    builder = _core.GraphSpecBuilder()
    for batch in ([4] if static else [1, 4]):
        builder.record([("x", "float32", [batch, 16])], [("y", "float32", [batch, 8])], batch)
    return builder.build()


@pytest.mark.parametrize("static", [True, False])
def test_only_cuda_with_provider_tuning_offers_the_fp16_model(static):
    spec = _spec(static)
    cuda_device = torch.device("cuda", 0)

    def fp16_models(config: ONNXRuntimeBackendConfig, module, device=cuda_device):
        plan = ONNXRuntimeBackend(config).plan(spec, module, device)
        return [c for c in plan if c.model_transform == "fp16"]

    cuda = ONNXRuntimeBackendConfig(execution_provider="cuda")
    linear, conv = torch.nn.Linear(16, 8), torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    [candidate] = fp16_models(cuda, linear)
    assert candidate.precision == _core.Precision.FP16 and candidate.name.endswith("fp16 model")
    assert candidate.needs_front_end
    assert ("enable_cuda_graph" in candidate.config.provider_options) == static
    # Convolutions add the NHWC variants (cuDNN's fp16 tensor-core layout), without and with
    # the bias fused into the convolution; same base otherwise.
    plain, nhwc, fused = fp16_models(cuda, conv)
    assert "prefer_nhwc" not in plain.config.provider_options
    assert nhwc.config.provider_options["prefer_nhwc"] == "1" and nhwc.precision == _core.Precision.FP16
    assert "fuse_conv_bias" not in nhwc.config.provider_options
    assert fused.config.provider_options["prefer_nhwc"] == "1" and fused.config.provider_options["fuse_conv_bias"] == "1"
    assert fused.precision == _core.Precision.FP16
    # An fp16 module is already an fp16 model: nothing to convert.
    assert fp16_models(cuda, linear.half()) == []
    assert fp16_models(ONNXRuntimeBackendConfig(execution_provider="cuda", tune_provider_options=False), linear) == []
    assert fp16_models(ONNXRuntimeBackendConfig(execution_provider="cuda", precision="tf32"), linear) == []
    assert fp16_models(ONNXRuntimeBackendConfig(execution_provider="cpu"), linear, torch.device("cpu")) == []
