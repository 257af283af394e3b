"""The engine's provider registry as Python sees it: the providers by name, their
capabilities, the handle (equality, hashing, pickling), and the backend config that
accepts any registered provider."""

from __future__ import annotations

import pickle

import pytest

from aitune import _core
from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackendConfig


def test_the_builtin_providers_are_registered_first():
    names = [p.name for p in _core.registered_execution_providers()]
    assert names[:3] == ["cpu", "cuda", "tensorrt"]
    assert _core.ExecutionProvider.CUDA.ort_name == "CUDAExecutionProvider"


def test_capabilities_come_from_the_registry():
    cpu = _core.provider_capabilities(_core.ExecutionProvider.CPU)
    cuda = _core.provider_capabilities(_core.ExecutionProvider.CUDA)
    trt = _core.provider_capabilities(_core.ExecutionProvider.TENSORRT)
    assert (cpu["device_memory"], cuda["device_memory"], trt["device_memory"]) == (False, True, True)
    assert (cuda["cuda_graph"], trt["cuda_graph"]) == (True, False)
    assert (cuda["contrib_operators"], trt["contrib_operators"]) == (True, False)


def test_the_handle_compares_hashes_and_pickles_by_name():
    cuda = _core.parse_execution_provider("CUDAExecutionProvider")
    assert cuda == _core.ExecutionProvider.CUDA and cuda != _core.ExecutionProvider.CPU
    assert cuda != "cuda"  # a handle, not a string
    assert {cuda: 1}[_core.ExecutionProvider.CUDA] == 1
    assert pickle.loads(pickle.dumps(cuda)) == cuda
    assert str(cuda) == "cuda" and repr(cuda) == "ExecutionProvider('cuda')"
    config = _core.OnnxSessionConfig()
    config.provider = cuda
    assert _core.OnnxSessionConfig.from_json(config.to_json()).provider == cuda


def test_the_backend_config_takes_registered_names_and_lists_them_when_wrong():
    assert ONNXRuntimeBackendConfig(execution_provider="TensorrtExecutionProvider").provider is ONNXExecutionProvider.TENSORRT
    assert ONNXRuntimeBackendConfig(execution_provider=_core.ExecutionProvider.CPU).provider_name == "cpu"
    with pytest.raises(ValueError, match="'cuda', 'tensorrt', 'cpu'.*got 'rocm'"):
        ONNXRuntimeBackendConfig(execution_provider="rocm")
