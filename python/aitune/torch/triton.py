"""ait.export_triton: a tuned ait.Module as a Triton Inference Server model repository.

The module is saved to a temporary checkpoint (``ait.save``: the ONNX model that won,
its graph spec and full session configuration) and the C++ engine writes the repository
from it (``aitune._core.export_triton``, docs/deploying-triton.md): per graph a
``config.pbtxt``, ``1/model.onnx`` and a README.md listing what Triton cannot express.
"""

from __future__ import annotations

import os
from pathlib import Path

from aitune import _core
from aitune.torch import cache
from aitune.torch.checkpoint import save
from aitune.torch.module import Module, ModuleState


def export_triton(
    module,
    repository_dir: str | os.PathLike,
    model_name: str | None = None,
    max_batch_size: int | None = None,
    instances: int = 1,
    overwrite: bool = False,
) -> _core.TritonExportResult:
    """Writes the tuned graphs of ``module`` into the Triton model repository ``repository_dir``.

    Args:
        module: a TUNED ``ait.Module`` (tuned, or loaded with ``ait.load``).
        repository_dir: the repository (created if missing; other models in it are left alone).
        model_name: the model's name; default ``module.ait_name``. With several graphs each
            graph's model is ``<model_name>_<graph key>``.
        max_batch_size: Triton's ``max_batch_size``; default the largest batch recorded on
            the batch axis (0 without one); 0 turns batching off.
        instances: the ``instance_group`` count.
        overwrite: replace existing models of the same names.

    Returns the engine's ``TritonExportResult`` (``models``, each with ``name``,
    ``directory``, ``max_batch_size`` and ``not_expressed``; ``ensemble``; ``notes``).
    Raises ``aitune.StateError`` for a module that is not tuned,
    ``aitune.InvalidArgumentError`` for a bad name, an existing entry without
    ``overwrite``, a ``max_batch_size`` the graphs cannot take; nothing is written then.
    """
    if not isinstance(module, Module):
        raise TypeError(f"ait.export_triton takes an ait.Module, got {type(module).__name__}")
    if module.ait_state is not ModuleState.TUNED:
        raise _core.StateError(
            f"ait.export_triton: ait.Module '{module.ait_name}' is {module.ait_state.value.upper()}, not TUNED; "
            "only tuned graphs can be exported to Triton (run ait.tune on it, or ait.load a checkpoint, first)"
        )
    options = _core.TritonExportOptions(
        model_name=model_name if model_name is not None else "",  # "": the checkpoint's module name
        max_batch_size=max_batch_size,
        instances=instances,
        overwrite=overwrite,
    )
    # the README names the module exported, not the scratch checkpoint deleted after the export
    options.source = f"ait.Module '{module.ait_name}' (ait.export_triton)"
    with cache.scratch_dir("aitune-triton-") as scratch:
        checkpoint_dir = Path(scratch) / "checkpoint"
        save(module, checkpoint_dir)
        checkpoint = _core.Checkpoint.load(os.fspath(checkpoint_dir))
        return _core.export_triton(checkpoint, os.fspath(repository_dir), options)
