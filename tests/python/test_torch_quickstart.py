"""The spec's Python snippets (onnxruntime-backend-guide.txt), as written, on the CPU provider."""

from __future__ import annotations

import dataclasses

import torch
from torch_models import SmallCNN


def test_quick_start_verbatim_apart_from_the_provider():
    model = SmallCNN().eval()
    input_data = [torch.randn(3, 32, 32) for _ in range(4)]
    eager = model
    x = torch.randn(2, 3, 32, 32)
    expected = eager(x)

    # ---- the Quick Start of the AITune ONNX Runtime backend guide; only the provider differs (CUDA there, CPU here) ----
    from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig
    import aitune.torch as ait

    config = ONNXRuntimeBackendConfig(
        execution_provider=ONNXExecutionProvider.CPU,
    )
    backend = ONNXRuntimeBackend(config)

    strategy = ait.OneBackendStrategy(backend=backend)
    model = ait.Module(model, "my-model", strategy=strategy)
    ait.tune(model, input_data)
    # ---------------------------------------------------------------------------------

    assert model.ait_state is ait.ModuleState.TUNED
    torch.testing.assert_close(model(x), expected, atol=1e-4, rtol=1e-4)


def test_the_other_spec_snippets_construct():
    from aitune.torch.backend import BackendConfig, ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    config = ONNXRuntimeBackendConfig(
        execution_provider=ONNXExecutionProvider.TENSORRT,
    )
    backend = ONNXRuntimeBackend(config)
    assert backend.config.provider is ONNXExecutionProvider.TENSORRT

    config = ONNXRuntimeBackendConfig(use_dynamo=False)
    backend = ONNXRuntimeBackend(config)
    assert backend.config.use_dynamo is False

    # "Configuration": a BackendConfig dataclass with these fields and defaults, first and
    # in this order; aitune's additions come after them and all have defaults.
    assert issubclass(ONNXRuntimeBackendConfig, BackendConfig)
    fields = [(f.name, f.default) for f in dataclasses.fields(ONNXRuntimeBackendConfig)]
    assert fields[:3] == [("use_dynamo", True), ("execution_provider", None), ("opset_version", None)]
    assert fields[3:] == [("tune_provider_options", True), ("provider_options", None), ("precision", "any"),
                          ("transformer_fusions", True), ("allow_trace_warnings", False),
                          ("fp16_search_seconds", 120.0), ("in_place_outputs", False)]
