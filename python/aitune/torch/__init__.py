"""aitune.torch: tune PyTorch modules for inference with ONNX Runtime.

    import aitune.torch as ait
    model = ait.Module(model, "my-model", strategy=ait.OneBackendStrategy(backend))
    ait.tune(model, samples)
    ait.save(model, "my-model.ait")        # later, in another process:
    ait.load(ait.Module(MyModel(), "my-model"), "my-model.ait")
"""

from aitune.torch.backend import (
    Backend,
    BackendConfig,
    NumericMismatchError,
    ONNXExecutionProvider,
    ONNXRuntimeBackend,
    ONNXRuntimeBackendConfig,
    TorchCompileBackend,
    TorchCompileBackendConfig,
    TorchEagerBackend,
)
from aitune.torch.cache import cache_root
from aitune.torch.checkpoint import load, save
from aitune.torch.checkpoint_structure import CheckpointStructureError
from aitune.torch.dispatch import GraphNotRecordedError
from aitune.torch.export import ExportError
from aitune.torch.graph import RecordedGraph
from aitune.torch.graph_tuning import TuningError
from aitune.torch.module import Module, ModuleState
from aitune.torch.options import (
    TuneOptions,
    enable_find_max_batch_size,
    enable_performance_validation,
    find_max_batch_size_enabled,
    performance_validation_enabled,
)
from aitune.torch.strategy import (
    FirstWinsStrategy,
    LatencyBudgetStrategy,
    MaxThroughputStrategy,
    MinLatencyStrategy,
    OneBackendStrategy,
    TuneStrategy,
)
from aitune.torch.triton import export_triton
from aitune.torch.tuning import tune

__all__ = [
    "Backend",
    "BackendConfig",
    "CheckpointStructureError",
    "ExportError",
    "FirstWinsStrategy",
    "GraphNotRecordedError",
    "LatencyBudgetStrategy",
    "MaxThroughputStrategy",
    "MinLatencyStrategy",
    "Module",
    "ModuleState",
    "NumericMismatchError",
    "ONNXExecutionProvider",
    "ONNXRuntimeBackend",
    "ONNXRuntimeBackendConfig",
    "OneBackendStrategy",
    "RecordedGraph",
    "TorchCompileBackend",
    "TorchCompileBackendConfig",
    "TorchEagerBackend",
    "TuneOptions",
    "TuneStrategy",
    "TuningError",
    "cache_root",
    "enable_find_max_batch_size",
    "enable_performance_validation",
    "export_triton",
    "find_max_batch_size_enabled",
    "load",
    "performance_validation_enabled",
    "save",
    "tune",
]
