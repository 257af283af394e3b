"""Backends that run recorded graphs, and their configurations."""

from aitune.torch.backend.base import Backend, BackendConfig, TunedGraph
from aitune.torch.backend.onnx_runtime_backend import (
    NumericMismatchError,
    ONNXExecutionProvider,
    ONNXRuntimeBackend,
    ONNXRuntimeBackendConfig,
)
from aitune.torch.backend.torch_compile_backend import TorchCompileBackend, TorchCompileBackendConfig
from aitune.torch.backend.torch_eager import TorchEagerBackend

__all__ = [
    "Backend",
    "BackendConfig",
    "NumericMismatchError",
    "ONNXExecutionProvider",
    "ONNXRuntimeBackend",
    "ONNXRuntimeBackendConfig",
    "TorchCompileBackend",
    "TorchCompileBackendConfig",
    "TorchEagerBackend",
    "TunedGraph",
]
