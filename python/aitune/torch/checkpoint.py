"""ait.save / ait.load: a tuned ait.Module as an aitune checkpoint directory.

The directory is the C++ engine's format (``aitune._core.Checkpoint``, docs/checkpoints.md):
a JSON manifest plus the ONNX models (and their external data, TensorRT caches), each
with its size and sha256, written atomically. This module adds, per graph, what the
PyTorch side needs to dispatch calls without the recorded samples: the graph's structure
as plain JSON (``checkpoint_structure``: tree specs, non-tensor values, tensor names),
the order the model takes the tensors in, and the tuning report. Loading imports nothing
and unpickles nothing.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from aitune import _core
from aitune.torch import cache
from aitune.torch.backend.base import TunedGraph
from aitune.torch.baked_attributes import describe_changes
from aitune.torch.checkpoint_sections import (
    LEGACY_SECTION_KEYS,
    REPORT_FILE,
    SECTIONS,
    LoadContext,
    SaveContext,
    section_of,
)
from aitune.torch.checkpoint_structure import (
    STRUCTURE_FORMAT_VERSION,
    class_name,
    corrupt,
    dict_differences,
    field,
    graph_structure,
    script_class_hint,
    shape_differences,
)
from aitune.torch.forward_code import code_differences, exported_hooks, forward_code_digest, hook_differences
from aitune.torch.graph import SavedGraph
from aitune.torch.module import Module, ModuleState
from aitune.torch.weight_changes import digest_differences, held_values_digest, weight_values_digest

logger = logging.getLogger("aitune")

#: Key of aitune.torch's entry in the manifest's ``metadata``.
METADATA_KEY = "aitune.torch"

DeviceLike = str | torch.device | None

#: The metadata format_version of a checkpoint with torch.compile graphs (version 2; version
#: 1 had ONNX Runtime and eager graphs only): an aitune that does not know them refuses it
#: rather than dropping those graphs.
COMPILED_GRAPHS_FORMAT_VERSION = STRUCTURE_FORMAT_VERSION + 1
#: The metadata format_version of a checkpoint whose JSON sections lived in the metadata
#: (every backend but ONNX Runtime, by section name).
SECTIONS_FORMAT_VERSION = COMPILED_GRAPHS_FORMAT_VERSION + 1
#: The metadata format_version written now: every graph in the C++ manifest's ``graphs``,
#: under its backend's section (checkpoint_sections.py). Versions 1 to 3 are still read.
MANIFEST_SECTIONS_FORMAT_VERSION = SECTIONS_FORMAT_VERSION + 1


class SavedReport:
    """A tuning report as saved in a checkpoint: the engine's TuneReport JSON."""

    def __init__(self, data: dict):
        self.data = data

    @property
    def decision(self) -> str:
        return str(self.data.get("decision", ""))

    @property
    def winner(self) -> str | None:
        return self.data.get("winner")

    @property
    def tuning_s(self) -> float:
        value = self.data.get("tuning_s")
        return float(value) if isinstance(value, (int, float)) else 0.0

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.data, indent=indent if indent >= 0 else None)

    def __repr__(self) -> str:
        return f"SavedReport(winner={self.winner!r})"


# -- helpers shared by save and load -----------------------------------------------------


def _check_module(module: Any, verb: str):
    if not isinstance(module, Module):
        raise TypeError(f"ait.{verb} takes an ait.Module, got {type(module).__name__}")
    return module


# -- save ---------------------------------------------------------------------------------


def _report_data(report) -> dict | None:
    if report is None:
        return None
    if isinstance(report, SavedReport):
        return report.data
    return json.loads(report.to_json(-1))


def save(
    module,
    path: str | os.PathLike,
    *,
    overwrite: bool = True,
    on_file_written: Callable[[str, int], None] | None = None,
    eager_only: bool = False,
) -> Path:
    """Saves a TUNED ``ait.Module`` as a checkpoint directory at ``path``.

    Each graph running in ONNX Runtime is stored with its ONNX model (and external
    data, and TensorRT caches named by ``trt_engine_cache_path`` /
    ``trt_timing_cache_path``), graph spec, full session configuration (provider
    options included) and the JSON structure that dispatches calls to it; graphs kept
    eager are recorded as eager; the tuning reports are kept. Written atomically: on
    any failure a checkpoint already at ``path`` stays as it was.

    Args:
        module: a TUNED ait.Module with at least one graph in ONNX Runtime.
        path: the checkpoint directory (created; an aitune checkpoint there is replaced
            unless ``overwrite`` is False).
        on_file_written: ``f(relative_path, files_written)`` after each file is flushed
            (progress); an exception raised there aborts the save.
        eager_only: saves a module whose every graph runs eagerly too (a section of a
            pipeline checkpoint whose other modules run: ``pipeline_checkpoint.save``).

    Returns the checkpoint directory. Raises ``aitune.StateError`` for a module that is
    not tuned, ``CheckpointStructureError`` for inputs/outputs a checkpoint cannot
    describe, ``aitune.InvalidArgumentError`` / ``aitune.AituneIOError`` from the
    engine's save (see docs/checkpoints.md).
    """
    module = _check_module(module, "save")
    if module.ait_state is not ModuleState.TUNED:
        why = {
            ModuleState.PASSTHROUGH: f"its tuning failed ({tune_failure(module)}) and it runs eagerly",
            ModuleState.RECORDING: "it was recorded but not tuned",
        }.get(module.ait_state, "it was never tuned")
        raise _core.StateError(
            f"ait.save: ait.Module '{module.ait_name}' is {module.ait_state.value.upper()}: {why}; only a TUNED module "
            "can be saved (run ait.tune on it first)"
        )
    start = time.perf_counter()
    out = SaveContext()
    for graph, tuned in module._ait_tuned.values():
        section = section_of(tuned)
        if section is None:
            raise _core.InvalidArgumentError(
                f"ait.save: '{module.ait_name}' graph '{graph.key}' runs on {tuned.describe()}, which a checkpoint "
                f"cannot store ({', '.join(s.label for s in SECTIONS.values())} graphs only)"
            )
        section.save(graph, tuned, graph_structure(graph, module.ait_name), _report_data(tuned.report), out)
    if not eager_only and not any(SECTIONS[g.backend].runs for g in out.native_graphs):
        notes = [json.loads(g.section_json).get("note") for g in out.native_graphs]
        raise _core.InvalidArgumentError(
            f"ait.save: every graph of ait.Module '{module.ait_name}' runs eagerly "
            f"({'; '.join(n or 'TorchEagerBackend' for n in notes)}); a checkpoint needs at least one graph "
            "in ONNX Runtime or torch.compile, so there is nothing to save"
        )
    tuned_weights = _weights_tuned_with(module)
    tuned_held = _held_tuned_with(module)
    tuned_hooks = module.__dict__.get("_ait_tuned_hooks")  # (None: loaded from a checkpoint without them)
    _warn_if_hooks_differ(module, tuned_hooks, "its graphs were exported with, saved as they were exported")
    metadata = {
        METADATA_KEY: {
            "format_version": MANIFEST_SECTIONS_FORMAT_VERSION,
            "module_class": class_name(type(module.ait_module)),
            # the class of every submodule by its path: one without weights (an activation
            # chosen by a constructor argument) changes the model where no shape does
            "submodule_classes": _submodule_classes(module.ait_module),
            "torch_version": torch.__version__,
            "tuning_s": sum(SavedReport(r).tuning_s for r in out.reports.values()),
            # what ait.load compares the module loaded into with (weight_changes.digest_differences):
            # the weights the graphs were tuned with, not the module's now (changed since by a
            # write ait.Module does not see, `p.data.copy_(...)`, or after a knowing activate())
            "weights": tuned_weights,
            # the same of the tensors forward reads that the state dict leaves out
            # (non-persistent buffers, tensor attributes): a module built with other
            # constructor arguments holds other ones, the ONNX Runtime graphs the saved ones
            "held_tensors": tuned_held,
            # the code of the module's classes its graphs were exported from (forward_code.py)
            "forward_code": module.__dict__.get("_ait_tuned_code") or forward_code_digest(module.ait_module),
            # the submodules' forward hooks (and an instance forward) the export ran: the graphs keep their effect
            "exported_hooks": tuned_hooks if tuned_hooks is not None else exported_hooks(module.ait_module),
            # the plain Python values the ONNX Runtime graphs hold as constants, which
            # ait.load expects of the module loaded into (baked_attributes.py)
            **({"attributes": module._ait_calls.attributes.snapshot()}
               if module._ait_calls.attributes is not None else {}),
        }
    }
    graphs, files, reports = out.native_graphs, out.files, out.reports
    manifest = _core.CheckpointManifest(module_name=module.ait_name, metadata_json=json.dumps(metadata), graphs=graphs)
    options = _core.CheckpointSaveOptions(overwrite=overwrite, on_file_written=on_file_written,
                                          expected_sha256=out.expected_sha256)
    directory = Path(path)
    with cache.scratch_dir("aitune-save-") as scratch:
        for i, (relative, report) in enumerate(reports.items()):
            source = Path(scratch) / f"{i}-{REPORT_FILE}"
            source.write_text(json.dumps(report, indent=2))
            files[relative] = str(source)
        try:
            _core.Checkpoint.save(os.fspath(directory), manifest, files, options)
        except _core.StateError as error:  # a loaded graph's file changed under it (expected_sha256)
            raise _core.StateError(
                f"ait.save: ait.Module '{module.ait_name}': {error}; something else rewrote the checkpoint this "
                "module was loaded from (its sessions still run what they loaded, but a checkpoint needs the files): "
                "load the module again from a checkpoint that holds its graphs, or tune it again, then save"
            ) from None
    logger.info(
        "ait.save: '%s' (%s) saved to %s in %.3f s",
        module.ait_name,
        ", ".join(f"{sum(g.backend == s.name for g in out.native_graphs)} {s.label}" for s in SECTIONS.values()),
        directory, time.perf_counter() - start,
    )
    return directory


def tune_failure(module) -> str:
    """Why the last ait.tune of a PASSTHROUGH ``module`` failed, for a save's refusal."""
    return module.__dict__.get("_ait_failure") or "ait.tune logged why"


def runs_a_graph(module) -> bool:
    """Whether a TUNED ``module`` runs at least one graph other than eagerly (ONNX Runtime,
    torch.compile): what a checkpoint of it alone needs to be worth saving."""
    return any((section := section_of(tuned)) is not None and section.runs for _, tuned in module._ait_tuned.values())


# -- load ---------------------------------------------------------------------------------


def _target_device(module, device_map: Any) -> torch.device | None:
    """The device ``device_map`` gives this module: None keeps what was saved."""
    value = device_map
    if isinstance(device_map, Mapping):
        if module.ait_name not in device_map:
            raise _core.InvalidArgumentError(
                f"ait.load: device_map has no entry for ait.Module '{module.ait_name}' (its keys: "
                f"{', '.join(map(repr, device_map)) or 'none'})"
            )
        value = device_map[module.ait_name]
    if value is None:
        return None
    if not isinstance(value, (str, torch.device)):
        raise TypeError(
            "ait.load: device_map must be None, a device ('cpu', 'cuda:0', torch.device) or a dict of module name "
            f"to device, got {type(value).__name__}"
        )
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError) as error:
        raise _core.InvalidArgumentError(f"ait.load: device_map: {value!r} is not a device: {error}") from None
    if device.type not in ("cpu", "cuda"):
        raise _core.InvalidArgumentError(
            f"ait.load: device_map: ONNX Runtime sessions run on 'cpu' or 'cuda[:N]', not '{device}'"
        )
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    return device


def _overrides(saved: _core.OnnxSessionConfig, device: torch.device | None) -> _core.CheckpointBackendOverrides:
    overrides = _core.CheckpointBackendOverrides()
    provider, device_id = saved.provider, saved.device_id
    if device is not None and device.type == "cpu":
        if provider != _core.ExecutionProvider.CPU:
            overrides.provider = provider = _core.ExecutionProvider.CPU
    elif device is not None:  # cuda:N
        overrides.device_id = device_id = device.index
        if provider == _core.ExecutionProvider.CPU:
            # Strict fp32, as the CPU provider computed and the checks compared it.
            overrides.provider = provider = _core.ExecutionProvider.CUDA
            overrides.provider_options = {"use_tf32": "0"}
    if provider == _core.ExecutionProvider.CUDA and torch.cuda.is_available() and device_id >= torch.cuda.device_count():
        raise _core.InvalidArgumentError(
            f"ait.load: cuda:{device_id} does not exist here ({torch.cuda.device_count()} CUDA devices); "
            "pass device_map='cuda:N' for one that does"
        )
    return overrides


def _metadata(manifest, where: str) -> dict:
    try:
        metadata = json.loads(manifest.metadata_json)
    except (ValueError, RecursionError) as error:
        raise corrupt(where, f"metadata is not JSON: {error}") from None
    ours = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    if not isinstance(ours, dict):
        raise corrupt(
            where,
            f"the manifest's metadata has no '{METADATA_KEY}' entry: the checkpoint was not written by ait.save "
            "(a C++ checkpoint runs with `aitune run` or aitune::Checkpoint, not into an ait.Module)",
        )
    version = field(ours, "format_version", int, where + ", metadata")
    if version > MANIFEST_SECTIONS_FORMAT_VERSION or version < 1:
        raise corrupt(
            where,
            f"metadata format_version {version} is not supported (this aitune reads "
            f"1..{MANIFEST_SECTIONS_FORMAT_VERSION}); "
            "it was written by a newer aitune",
        )
    return ours


def _sections(meta: dict, where: str) -> list[tuple[str, list]]:
    """(section name, entries) of the metadata: none from version 4 on (every graph is in
    the manifest's graphs), version 3's ``sections``, or the keys versions 1 and 2 stored
    eager and torch.compile graphs under."""
    if meta["format_version"] >= MANIFEST_SECTIONS_FORMAT_VERSION:
        return []
    if meta["format_version"] >= SECTIONS_FORMAT_VERSION:
        sections = field(meta, "sections", dict, where + ", metadata")
        return [(name, field(sections, name, list, where + ", metadata sections")) for name in sections]
    return [(name, field(meta, key, list, where + ", metadata") if key == "eager_graphs" else meta.get(key, []))
            for key, name in LEGACY_SECTION_KEYS.items()]



#: How many times a load starts again when a concurrent save replaced the checkpoint
#: under it (this module's and the pipeline checkpoint's loads).
LOAD_ATTEMPTS = 10


def _tuned_with(module, attribute: str, current: dict, what: str, tail: str) -> dict:
    """The digest (``weight_changes``) ``module``'s graphs were tuned (or, loaded, saved) with,
    kept in ``attribute``; ``current``: the module's now. A warning naming ``what`` changed
    where they differ: the checkpoint records the graphs'."""
    tuned = module.__dict__.get(attribute)
    if not isinstance(tuned, dict):
        return current  # graphs restored from a checkpoint written before the digest was stored
    if differ := digest_differences(tuned, current):
        logger.warning("ait.save: %s of ait.Module '%s' changed since its graphs were tuned (%d of %d tensors: %s)%s",
                       what, module.ait_name, len(differ), len(tuned), _names(differ), tail)
    return tuned


def _weights_tuned_with(module) -> dict:
    """The digest of the weights ``module``'s graphs were tuned with (``_tuned_with``)."""
    current = weight_values_digest(module.ait_module)
    if module.__dict__.get("_ait_weights_at_load") == current:
        # loaded into other weights (ait.load warned) and not written since: no write to blame
        # (a probe's saves each blamed "a write it does not watch" that never happened)
        tail = (", as they did when it was loaded (ait.load warned then); the checkpoint records the weights the "
                "graphs were tuned with, not the module's. Load those into the module, or tune it again to save "
                "graphs of its own weights.")
    else:
        tail = (", by a write it does not watch (p.data) or after activate(); the checkpoint records the weights the "
                "graphs were tuned with, so ait.load warns a module holding the current ones. Tune it again to save "
                "graphs of the current weights.")
    return _tuned_with(module, "_ait_tuned_weights", current, "the weights", tail)


def _held_tuned_with(module) -> dict:
    """``held_values_digest`` of the tensors ``module``'s graphs were tuned with, outside the
    state dict (non-persistent buffers, tensor attributes; ``_tuned_with``)."""
    return _tuned_with(
        module, "_ait_tuned_held", held_values_digest(module.ait_module, _harmless(module)),
        "the tensors held outside the state dict (non-persistent buffers, tensor attributes)",
        "; the checkpoint records those the graphs were tuned with. Tune it again to save graphs of the current ones.")


def _harmless(module) -> tuple[str, ...]:
    return module.__dict__.get("_ait_harmless_attributes", ())


def _names(differ: list[str]) -> str:
    return ", ".join(differ[:5]) + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")


def _warn_if_held_differ(module, meta: dict, directory) -> None:
    """Tells the user when the module loaded into holds other tensors outside its state
    dict than the module the checkpoint was tuned from (a rotary ``inv_freq`` of another
    base, ``self.scale = torch.ones(4)`` built from another argument): a load_state_dict does
    not set them, and the ONNX Runtime graphs hold the saved ones as constants. Checkpoints
    written before they were stored are not checked."""
    saved = meta.get("held_tensors")
    if not isinstance(saved, dict):
        return
    current = held_values_digest(module.ait_module, _harmless(module))
    # (an item of a container attribute absent now is a cache not filled yet, timm LeViT's
    # attention_bias_cache in a fresh model: refilled from the weights, no other model)
    differ = [name for name in digest_differences(saved, current)
              if not (name.endswith("]") and "[" in name and name not in current)]
    if differ:
        logger.warning(
            "ait.load: ait.Module '%s' holds other tensors outside its state dict (non-persistent buffers, tensor "
            "attributes) than the module checkpoint '%s' was tuned from (%s): a load_state_dict does not set them, "
            "and the checkpoint's ONNX Runtime graphs hold the saved ones as constants, so the loaded module may "
            "compute another model. Build the module with the arguments it was tuned with, or tune it again.",
            module.ait_name, directory, _names(differ))


def _warn_if_code_differs(module, meta: dict, directory) -> None:
    """Tells the user when classes of the module loaded into run other code than those the
    checkpoint's graphs were exported from (forward_code.py). Checkpoints written before
    the digests were stored are not checked."""
    if differ := code_differences(meta.get("forward_code"), forward_code_digest(module.ait_module)):
        logger.warning(
            "ait.load: the code of %s differs from the code checkpoint '%s' was exported from (ait.Module '%s'): "
            "its graphs compute the forward as it was then, while calls that run eagerly run the code as it is "
            "now, so the loaded module may be two models. Tune it again with the code as it is.",
            _names(differ), directory, module.ait_name)


def _warn_if_hooks_differ(module, saved: object, source: str) -> None:
    """Tells the user when the forward hooks on submodules (or the wrapped module's instance
    forward) differ from those the graphs were exported with: the graphs keep what those
    hooks did (``forward_code.exported_hooks``)."""
    if differ := hook_differences(saved, exported_hooks(module.ait_module)):
        logger.warning(
            "ait.Module '%s': the forward hooks on submodules (or its instance forward) differ from those %s (%s): "
            "its graphs keep what the hooks then did, and run no hook now. Register them as they were, or tune it "
            "again with the hooks as they are.", module.ait_name, source, "; ".join(differ[:5]))


def _warn_if_weights_differ(module, meta: dict, directory) -> None:
    """Tells the user when the module loaded into holds other weights than the module the
    checkpoint was tuned from: its ONNX Runtime graphs compute with the checkpoint's
    weights, but torch.compile and eager graphs, and calls outside the recorded graphs
    (eager fallback), run the module's own, so the loaded module would be two models.
    Without ONNX Runtime graphs it is one model, the module's own, whose graphs were chosen
    and checked with other weights: said so instead. Checkpoints written before the digest
    was stored are not checked."""
    saved = meta.get("weights")
    if not isinstance(saved, dict):
        return
    current = weight_values_digest(module.ait_module)
    differ = digest_differences(saved, current)
    if not differ:
        return
    module.__dict__["_ait_weights_at_load"] = current  # a later save tells this apart from a write
    sections = [section_of(tuned) for _, tuned in module._ait_tuned.values()]
    own = sorted({s.label for s in sections if s is not None and s.name != _core.ONNX_RUNTIME_BACKEND_NAME})
    dtypes = _dtype_difference(saved, current, differ)
    if not any(s is not None and s.name == _core.ONNX_RUNTIME_BACKEND_NAME for s in sections):
        # No graph holds the checkpoint's weights: the loaded module is one model, the
        # module's own, but the tune chose and checked its graphs with other weights.
        logger.warning(
            "ait.load: the weights of ait.Module '%s' differ from those checkpoint '%s' was tuned with (%d of %d "
            "tensors: %s%s). Its graphs (%s) run the module's own weights, but the tune chose them and checked their "
            "accuracy with the others: tune it again to check them with these.%s",
            module.ait_name, directory, len(differ), len(set(saved) | set(current)),
            ", ".join(differ[:5]), ", ..." if len(differ) > 5 else "", ", ".join(own) or "eager", dtypes)
        return
    logger.warning(
        "ait.load: the weights of ait.Module '%s' differ from those checkpoint '%s' was tuned with (%d of %d "
        "tensors: %s%s). Its ONNX Runtime graphs compute with the checkpoint's weights, while %scalls outside "
        "the recorded graphs run the module's own: the loaded module is not one model. Load the weights it was "
        "tuned with into the module before ait.load (load_state_dict), or tune it again.%s",
        module.ait_name, directory, len(differ), len(set(saved) | set(current)),
        ", ".join(differ[:5]), ", ..." if len(differ) > 5 else "",
        "".join(f"its {label} graphs and " for label in own), dtypes)


def _dtype_difference(saved: dict, current: dict, differ: list[str]) -> str:
    """A sentence for the weights that differ in dtype (a float32 checkpoint loaded into a
    module made ``.half()``), or ''. Their values may be the same: load_state_dict would not
    help, converting the module would (a session-35 probe found the advice misleading)."""
    pairs = sorted({(saved[name][0], current[name][0]) for name in differ if name in saved and name in current
                    and isinstance(saved[name], list) and isinstance(current[name], list) and saved[name]
                    and current[name] and saved[name][0] != current[name][0]})
    if not pairs:
        return ""
    count = sum(1 for name in differ if name in saved and name in current and saved[name][0] != current[name][0])
    shown = ", ".join(f"{theirs} in the checkpoint, {mine} here" for theirs, mine in pairs)
    target = pairs[0][0]
    return (f" {count} of them differ in dtype ({shown}): the graphs were tuned for {target} weights and take "
            f"{target} inputs; convert the module (module.to(torch.{target})) before ait.load, or tune it "
            f"again in its own dtype.")


def _warn_if_attributes_differ(module, directory) -> None:
    """Tells the user at load when plain Python values of the module loaded into (a
    temperature, a config flag) differ from those the checkpoint's ONNX Runtime graphs
    hold as constants: its calls then run eagerly until they match (dispatch.py)."""
    watch = module._ait_calls.attributes
    changed = watch.changed() if watch is not None else []
    if changed:
        module._ait_calls.attributes_logged.add(tuple(changed))  # said here: not again on the first call
        logger.warning(
            "ait.load: plain Python attributes of ait.Module '%s' differ from the values the ONNX Runtime graphs of "
            "checkpoint '%s' were exported with and hold as constants (%s); its calls run eagerly in PyTorch until "
            "they match, or it is tuned again.", module.ait_name, directory, describe_changes(changed))


def _weights_shape_differences(saved: Any, module: torch.nn.Module) -> str:
    """'' when ``module``'s state dict has the tensor names and shapes of the saved weights
    digest (``weight_values_digest``: [dtype, shape, ...] per name); else the first
    differences, named. A checkpoint written before the digest was stored is not checked."""
    if not isinstance(saved, dict):
        return ""
    now = {name: list(tensor.shape) for name, tensor in sorted(module.state_dict(keep_vars=True).items())
           if isinstance(tensor, torch.Tensor)}
    was = {name: entry[1] for name, entry in sorted(saved.items()) if isinstance(entry, list) and len(entry) > 1}
    return shape_differences(was, now)


def _submodule_classes(module: torch.nn.Module) -> dict[str, str]:
    """The class of each submodule of ``module`` by its path (the module itself left out)."""
    return {path: class_name(type(sub)) for path, sub in module.named_modules() if path}


def _submodule_class_differences(saved: Any, module: torch.nn.Module, shown: int = 4) -> str:
    """How the submodules of ``module`` differ from those a checkpoint was saved with
    (a path whose class differs, one added or missing), or "" (also for a checkpoint saved
    before the classes were kept)."""
    if not isinstance(saved, dict):
        return ""
    now = _submodule_classes(module)
    changed, missing, new = dict_differences(saved, now)
    lines = [f"{path}: {saved[path]} saved, {now[path]} here" for path in changed]
    lines += [f"{path}: {saved[path]} saved, none here" for path in missing]
    lines += [f"{path}: none saved, {now[path]} here" for path in new]
    more = f" (and {len(lines) - shown} more)" if len(lines) > shown else ""
    return "; ".join(lines[:shown]) + more


class LoadSnapshot:
    """What a load may change on an ait.Module (its ``_ait_*`` state: the graphs, the dispatch,
    the digests the checkpoint's metadata set; the training flags of what it wraps), to put back
    when the load fails after the module took the graphs over, or another section of a
    pipeline checkpoint fails."""

    def __init__(self, module: Module):
        self.module = module
        self.state = {key: value for key, value in module.__dict__.items() if key.startswith("_ait_")}
        self.training = [(m, m.training) for m in module.ait_module.modules()]
        self.proxy_training = module.training

    def restore(self) -> None:
        for key in [key for key in self.module.__dict__ if key.startswith("_ait_") and key not in self.state]:
            del self.module.__dict__[key]
        self.module.__dict__.update(self.state)
        for m, training in self.training:
            m.training = training
        self.module.training = self.proxy_training


#: The metadata fields ait.load compares the module loaded into with, or keeps for its next
#: save: each an object of names to values of this type (lists of strings for the hooks). A
#: checkpoint written before a field was stored lacks it, which is not checked.
_COMPARED_FIELDS = {"weights": list, "held_tensors": list, "forward_code": str, "exported_hooks": list,
                    "submodule_classes": str, "attributes": str}


def _check_compared_fields(meta: dict, where: str) -> None:
    """Refuses, as corrupt, a compared field of another shape: it raised a bare TypeError after
    the module had taken the graphs over (``exported_hooks: {"fc1": 5}``), or turned its check
    off without a word (``weights: "x"``)."""
    for key, kind in _COMPARED_FIELDS.items():
        if key not in meta:
            continue
        value = meta[key]
        well_formed = isinstance(value, dict) and all(
            isinstance(name, str) and isinstance(item, kind)
            and (key != "exported_hooks" or all(isinstance(hook, str) for hook in item))
            for name, item in value.items())
        if not well_formed:
            shape = "lists of names" if key == "exported_hooks" else f"{kind.__name__}s"
            raise corrupt(where, f"metadata field '{key}' must be an object of {shape} by name, not "
                                 f"{json.dumps(value)[:120]}")


def _meta_tensors(module: torch.nn.Module) -> list[str]:
    """The parameters and buffers of ``module`` on the meta device (no data)."""
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return [name for name, tensor in named if tensor is not None and tensor.is_meta]


def _restore_graphs(module, path, device, seen: list):
    """The checkpoint (appended to ``seen`` as soon as it is verified), its aitune.torch
    metadata and the graphs restored from it, sessions created; the module untouched."""
    checkpoint = _core.Checkpoint.load(os.fspath(path))
    seen.append(checkpoint)
    where = f"ait.load: checkpoint '{checkpoint.directory}'"
    manifest = checkpoint.manifest
    meta = _metadata(manifest, where)
    _check_compared_fields(meta, where)
    saved_class = field(meta, "module_class", str, where + ", metadata")
    wrapped_class = class_name(type(module.ait_module))
    if saved_class != wrapped_class:
        raise _core.InvalidArgumentError(
            f"{where} was saved from a {saved_class}, but ait.Module '{module.ait_name}' wraps a {wrapped_class}"
            f"{script_class_hint(saved_class, wrapped_class)}"
        )
    if on_meta := _meta_tensors(module.ait_module):
        # (accelerate's init_empty_weights): no weights to compare with the checkpoint's, and
        # none for a call outside the recorded graphs
        raise _core.InvalidArgumentError(
            f"{where}: ait.Module '{module.ait_name}' holds tensors on the meta device, with no data "
            f"({', '.join(on_meta[:5])}{', ...' if len(on_meta) > 5 else ''}); load its weights first "
            "(load_state_dict(..., assign=True), from_pretrained), then ait.load")
    if other_shapes := _weights_shape_differences(meta.get("weights"), module.ait_module):
        raise _core.InvalidArgumentError(
            f"{where} was saved from a {saved_class} with other parameter or buffer shapes (built with another "
            f"config): {other_shapes}; ait.Module '{module.ait_name}' wraps one its graphs do not compute (build "
            "the module with the config it was tuned with)"
        )
    if other_classes := _submodule_class_differences(meta.get("submodule_classes"), module.ait_module):
        raise _core.InvalidArgumentError(
            f"{where} was saved from a {saved_class} with other submodules (built with another config): "
            f"{other_classes}; ait.Module '{module.ait_name}' wraps one its graphs do not compute (build the module "
            "with the config it was tuned with)"
        )
    restored: dict[Any, tuple[SavedGraph, TunedGraph]] = {}

    def add(graph: SavedGraph, tuned: TunedGraph, report: Any, graph_where: str) -> None:
        if graph.identity in restored:
            raise corrupt(graph_where, f"the same call structure as graph '{restored[graph.identity][0].key}'")
        tuned.report = SavedReport(report) if isinstance(report, dict) else None
        restored[graph.identity] = (graph, tuned)

    ctx = LoadContext(module, checkpoint, where, lambda saved: _overrides(saved, device))
    # The C++ manifest's graphs: each names its section (the backend) in `backend`.
    for key in checkpoint.graph_keys():
        graph_where = f"{where}, graph '{key}'"
        section = SECTIONS.get(checkpoint.graph(key).backend)
        if section is None:
            raise corrupt(graph_where, f"backend '{checkpoint.graph(key).backend}' is not one ait.load runs")
        add(*section.load_native(key, ctx), graph_where)
    # The JSON sections of the metadata, by name.
    for name, entries in _sections(meta, where):
        section = SECTIONS.get(name)
        if section is None or name == _core.ONNX_RUNTIME_BACKEND_NAME:
            raise corrupt(where, f"metadata section '{name}' is not one this aitune reads "
                                 f"(it reads {', '.join(s for s in SECTIONS if s != _core.ONNX_RUNTIME_BACKEND_NAME)})")
        for i, entry in enumerate(entries):
            entry_where = f"{where}, {section.label} graph {i}"
            if not isinstance(entry, dict):
                raise corrupt(entry_where, f"is not a JSON object: {entry!r}")
            add(*section.load(entry, ctx, entry_where), entry_where)

    if not restored:
        raise corrupt(where, 'a checkpoint needs at least one graph; "graphs" is empty and the metadata '
                             "lists no eager or torch.compile graph")
    return checkpoint, meta, restored


def load(module, path: str | os.PathLike, device_map: DeviceLike | Mapping[str, DeviceLike] = None):
    """Loads a checkpoint written by ``ait.save`` into ``module`` and makes it TUNED.

    ``module`` wraps a module of the class that was saved, holding the weights it was
    tuned with: the ONNX Runtime graphs carry their own copy, but torch.compile and eager
    graphs and calls outside the recorded graphs run the module's, so a module with other
    weights gets a warning naming the tensors that differ (the checkpoint stores a digest
    of the weights). The checkpoint is verified first (manifest,
    paths, sizes, sha256; see docs/checkpoints.md), then each graph's ONNX Runtime
    session is created from the saved model and configuration, and only when all of
    that succeeded does the module take the graphs over: on any error it is unchanged.
    Nothing is exported or tuned, nothing is unpickled or imported.

    Args:
        module: an ait.Module.
        path: a checkpoint directory written by ``ait.save``.
        device_map: where the sessions run. None: as saved. ``"cpu"``: the CPU provider.
            ``"cuda:N"`` (or a torch.device): device N with the saved GPU provider and
            options; a graph saved with the CPU provider gets the CUDA provider in strict
            fp32 (``use_tf32=0``). A dict maps module names (``ait_name``) to such
            values. Graphs kept eager run wherever the wrapped module lives.

    Returns ``module``. Raises ``aitune.CheckpointCorruptError`` (damaged, incomplete or
    newer checkpoint), ``aitune.AituneIOError`` (missing), ``aitune.InvalidArgumentError``
    (another module class or signature, a bad device_map), ``aitune.ProviderUnavailableError``.
    """
    start = time.perf_counter()
    module = _check_module(module, "load")
    device = _target_device(module, device_map)
    for attempt in range(1, LOAD_ATTEMPTS + 1):
        seen: list = []
        try:
            checkpoint, meta, restored = _restore_graphs(module, path, device, seen)
            if checkpoint.is_current():
                break
        except _core.AituneError:
            # Files read after a concurrent save replaced the checkpoint may belong to
            # the next version: only a failure of the version verified is the checkpoint's.
            if not seen or seen[0].is_current():
                raise
        if attempt == LOAD_ATTEMPTS:
            raise _core.AituneIOError(
                f"ait.load: checkpoint '{os.fspath(path)}' was replaced by concurrent saves {attempt} times while "
                "it was being loaded; load it when the saves are done"
            )
        logger.info("ait.load: '%s' was replaced by another save while loading; loading it again", os.fspath(path))
    snapshot = LoadSnapshot(module)
    try:
        _take_over(module, checkpoint, meta, restored)
    except BaseException:  # nothing half loaded: the module as it was
        snapshot.restore()
        raise
    elapsed = time.perf_counter() - start
    tuning_s = meta.get("tuning_s")
    versus = f"; tuning took {tuning_s:.2f} s" if isinstance(tuning_s, (int, float)) and tuning_s > 0 else ""
    logger.info(
        "ait.load: '%s' loaded %d graphs from %s in %.3f s%s",
        module.ait_name, len(restored), checkpoint.directory, elapsed, versus,
    )
    return module


def _take_over(module, checkpoint, meta: dict, restored: dict) -> None:
    """The module takes the restored graphs over, keeps what the metadata says they were tuned
    with, and the user is told what differs from the module loaded into."""
    saved_attributes = meta.get("attributes")
    module._ait_restore(restored, saved_attributes if isinstance(saved_attributes, dict) else None)
    if isinstance(meta.get("weights"), dict):
        module._ait_tuned_weights = meta["weights"]  # a save of the loaded module records them again
    if isinstance(meta.get("held_tensors"), dict):
        module._ait_tuned_held = meta["held_tensors"]
    if isinstance(meta.get("forward_code"), dict):
        module._ait_tuned_code = meta["forward_code"]
    if isinstance(meta.get("exported_hooks"), dict):
        module._ait_tuned_hooks = meta["exported_hooks"]
    _warn_if_weights_differ(module, meta, checkpoint.directory)
    _warn_if_held_differ(module, meta, checkpoint.directory)
    _warn_if_code_differs(module, meta, checkpoint.directory)
    _warn_if_hooks_differ(module, meta.get("exported_hooks"), f"checkpoint '{checkpoint.directory}' was exported with")
    _warn_if_attributes_differ(module, checkpoint.directory)
    tuned_mode = module._ait_calls.training
    if tuned_mode is not None and module.training is not tuned_mode:
        # A freshly built module is in train() mode; the graphs serve the mode they were
        # tuned in (eval() for inference), so the module is put back in that mode, as it was.
        logger.info("ait.load: '%s' put in %s mode, the mode it was tuned in", module.ait_name,
                    "train" if tuned_mode else "eval")
        module.train(tuned_mode)
