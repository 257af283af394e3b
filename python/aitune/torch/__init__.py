"""aitune.torch: tune PyTorch modules for inference with ONNX Runtime.

    import aitune.torch as ait
    model = ait.Module(model, "my-model", strategy=ait.OneBackendStrategy(backend))
    ait.tune(model, samples)
"""

from aitune.torch.backend import (
    Backend,
    BackendConfig,
    NumericMismatchError,
    ONNXExecutionProvider,
    ONNXRuntimeBackend,
    ONNXRuntimeBackendConfig,
    TorchEagerBackend,
)
from aitune.torch.cache import cache_root
from aitune.torch.export import ExportError
from aitune.torch.graph import RecordedGraph
from aitune.torch.module import GraphNotRecordedError, Module, ModuleState
from aitune.torch.strategy import FirstWinsStrategy, OneBackendStrategy, TuneStrategy, TuningError
from aitune.torch.tuning import tune

__all__ = [
    "Backend",
    "BackendConfig",
    "ExportError",
    "FirstWinsStrategy",
    "GraphNotRecordedError",
    "Module",
    "ModuleState",
    "NumericMismatchError",
    "ONNXExecutionProvider",
    "ONNXRuntimeBackend",
    "ONNXRuntimeBackendConfig",
    "OneBackendStrategy",
    "RecordedGraph",
    "TorchEagerBackend",
    "TuneStrategy",
    "TuningError",
    "cache_root",
    "tune",
]
