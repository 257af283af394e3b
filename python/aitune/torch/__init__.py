"""aitune.torch: tune PyTorch modules for inference with ONNX Runtime.

    import aitune.torch as ait
    model = ait.Module(model, "my-model", strategy=ait.OneBackendStrategy(backend))
    ait.tune(model, samples)
    ait.save(model, "my-model.ait")        # later, in another process:
    ait.load(ait.Module(MyModel(), "my-model"), "my-model.ait")

Pipelines (docs/pipelines.md): ``ait.inspect`` times the modules a pipeline calls,
``ait.wrap`` wraps the chosen ones in place, ``ait.tune`` drives the pipeline, and
``ait.save`` / ``ait.load`` take the whole pipeline.
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
from aitune.torch.checkpoint_structure import CheckpointStructureError
from aitune.torch.dataloader_factory import DataLoaderFactory
from aitune.torch.dispatch import GraphNotRecordedError
from aitune.torch.export import ExportError
from aitune.torch.graph import RecordedGraph
from aitune.torch.graph_tuning import (GlobalHooksTuningError, NondeterministicModuleError, TuningError,
                                       UnsupportedDTypeTuningError)
from aitune.torch.inspection import InspectedModulesInfo, ModuleInfo, inspect
from aitune.torch.module import Module, ModuleState
from aitune.torch.module_registry import MODULE_REGISTRY
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
from aitune.torch.pipeline_checkpoint import PipelineStructureError, load, save
from aitune.torch.triton import export_triton
from aitune.torch.tuning import tune
from aitune.torch.wrap import wrap

__all__ = [
    "Backend",
    "BackendConfig",
    "CheckpointStructureError",
    "DataLoaderFactory",
    "ExportError",
    "FirstWinsStrategy",
    "GraphNotRecordedError",
    "InspectedModulesInfo",
    "LatencyBudgetStrategy",
    "MODULE_REGISTRY",
    "MaxThroughputStrategy",
    "MinLatencyStrategy",
    "Module",
    "ModuleInfo",
    "ModuleState",
    "NondeterministicModuleError",
    "NumericMismatchError",
    "ONNXExecutionProvider",
    "ONNXRuntimeBackend",
    "ONNXRuntimeBackendConfig",
    "OneBackendStrategy",
    "PipelineStructureError",
    "RecordedGraph",
    "TorchCompileBackend",
    "TorchCompileBackendConfig",
    "TorchEagerBackend",
    "TuneOptions",
    "TuneStrategy",
    "TuningError",
    "GlobalHooksTuningError",
    "UnsupportedDTypeTuningError",
    "cache_root",
    "enable_find_max_batch_size",
    "enable_performance_validation",
    "export_triton",
    "find_max_batch_size_enabled",
    "inspect",
    "load",
    "performance_validation_enabled",
    "save",
    "tune",
    "wrap",
]
