"""Checkpoint sections: per backend, how ``ait.save`` stores a tuned graph and ``ait.load``
restores it, registered by name (``SECTIONS``). The checkpoint code asks the registry by
the tuned graph's ``checkpoint_section`` (save) and by the section name stored in the
checkpoint (load); it knows no backend.

Where a section lives in the checkpoint (metadata format_version 4): every graph is one of
the C++ manifest's ``graphs`` (one manifest schema, docs/checkpoints.md), whose
``backend`` field names its section and whose ``section`` holds the section's own fields;
``onnxruntime`` adds its model files and session configuration, the others (``eager``,
``torch_compile``) store no model, and the engine's loader refuses to create them
(``BackendUnavailableError``) rather than refusing the checkpoint. Each graph's report is
an artifact beside it (``tune_report.json``).
Version 3 stored the sections other than onnxruntime in
``metadata["aitune.torch"]["sections"][<name>]`` as JSON entries ``{"key", "structure",
"report", ...}`` plus the section's own fields; versions 1 and 2 stored eager graphs under
``eager_graphs`` and torch.compile graphs under ``compiled_graphs``
(``LEGACY_SECTION_KEYS``). Those checkpoints still load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Any, ClassVar

from aitune import _core
from aitune.torch.backend.base import TunedGraph
from aitune.torch.backend.onnx_runtime_backend import OnnxRuntimeTunedGraph, model_file_identity
from aitune.torch.backend.torch_compile_backend import TorchCompileTunedGraph, dtype_from_name
from aitune.torch.backend.torch_eager import EagerGraph
from aitune.torch.checkpoint_structure import corrupt, field, saved_graph

#: Each ONNX Runtime graph's tuning report, an artifact in its graph directory.
REPORT_FILE = "tune_report.json"


@dataclass
class SaveContext:
    """What a section's save adds to: the C++ manifest's graphs and files, and the report
    artifacts."""

    native_graphs: list = dataclass_field(default_factory=list)  # _core.CheckpointGraph
    files: dict = dataclass_field(default_factory=dict)  # relative path -> source file
    reports: dict = dataclass_field(default_factory=dict)  # relative path -> report JSON
    # relative path -> the sha256 its copy must have (CheckpointSaveOptions.expected_sha256)
    expected_sha256: dict = dataclass_field(default_factory=dict)


@dataclass
class LoadContext:
    """What a section's load reads from."""

    module: Any  # the ait.Module loaded into
    checkpoint: Any  # _core.Checkpoint
    where: str
    overrides: Any  # f(saved session config) -> _core.CheckpointBackendOverrides


class CheckpointSection:
    """One backend's part of a checkpoint. ``runs`` says whether its graphs compute
    something (a checkpoint of eager graphs only has nothing to save)."""

    name: ClassVar[str]
    label: ClassVar[str]  # for messages: "ONNX Runtime", "torch.compile", "eager"
    runs: ClassVar[bool] = True

    def save(self, graph, tuned: TunedGraph, structure: dict, report: dict | None, out: SaveContext) -> None:
        """One graph of the C++ manifest under this section's name, its own fields in
        ``section``, no model (the engine does not run it), its report beside it."""
        out.native_graphs.append(_core.CheckpointGraph(
            key=graph.key, graph_spec=_core.GraphSpec(), structure_json=json.dumps(structure), backend=self.name))
        out.native_graphs[-1].section_json = json.dumps(self.entry_fields(tuned))
        if report is not None:
            out.reports[f"{_core.Checkpoint.graph_directory(graph.key)}/{REPORT_FILE}"] = report

    def entry_fields(self, tuned: TunedGraph) -> dict:
        return {}

    def load_native(self, key: str, ctx: LoadContext):
        """(SavedGraph, TunedGraph, report) of the C++ manifest's graph ``key``: its
        section's fields, structure and report as one entry for ``load``."""
        where = f"{ctx.where}, {self.label} graph '{key}'"
        saved = ctx.checkpoint.graph(key)
        try:
            structure, fields = json.loads(saved.structure_json), json.loads(saved.section_json)
        except (ValueError, RecursionError) as error:
            raise corrupt(where, f"structure or section is not JSON: {error}") from None
        if not isinstance(fields, dict):
            raise corrupt(where, f"section is not a JSON object: {saved.section_json}")
        entry = {**fields, "key": key, "structure": structure, "report": read_report(ctx.checkpoint, saved, where)}
        return self.load(entry, ctx, where)

    def load(self, entry: Any, ctx: LoadContext, entry_where: str):
        """(SavedGraph, TunedGraph, report) from one entry: ``{"key", "structure",
        "report"}`` and the section's own fields (a manifest graph's, or a version-3
        metadata entry)."""
        raise NotImplementedError


class EagerSection(CheckpointSection):
    name, label, runs = _core.EAGER_BACKEND_NAME, "eager", False

    def entry_fields(self, tuned: EagerGraph) -> dict:
        return {"note": tuned.note}

    def load(self, entry, ctx, entry_where):
        key = field(entry, "key", str, entry_where)
        note = entry.get("note")
        graph = saved_graph(ctx.module, entry.get("structure"), key, f"{ctx.where}, eager graph '{key}'", None)
        return graph, EagerGraph(graph, note=note if isinstance(note, str) else None), entry.get("report")


class TorchCompileSection(CheckpointSection):
    """The decision and its configuration, not compiled code: ait.load compiles again
    (lazily, on the first call) from the saved precision and mode, with the weights of the
    module loaded into."""

    name, label = _core.TORCH_COMPILE_BACKEND_NAME, "torch.compile"

    def entry_fields(self, tuned: TorchCompileTunedGraph) -> dict:
        return {"config": tuned.config()}

    def load(self, entry, ctx, entry_where):
        key = field(entry, "key", str, entry_where)
        config = field(entry, "config", dict, entry_where)
        graph = saved_graph(ctx.module, entry.get("structure"), key, f"{ctx.where}, torch.compile graph '{key}'", None)
        try:
            dtypes = [dtype_from_name(d) for d in field(config, "output_dtypes", list, entry_where)]
            tuned = TorchCompileTunedGraph(graph, field(config, "precision", str, entry_where),
                                           field(config, "mode", str, entry_where), dtypes, config.get("dynamic"),
                                           weights=config.get("weights", "module"),
                                           output_dtype=config.get("output_dtype", "module"),
                                           in_place=config.get("in_place", False))
        except (ValueError, TypeError) as error:
            raise corrupt(entry_where, f"configuration {config} is not one TorchCompileBackend runs: {error}") from None
        return graph, tuned, entry.get("report")


_CACHE_OPTIONS = (("trt_engine_cache_path", "trt_engine_cache"), ("trt_timing_cache_path", "trt_timing_cache"))


class OnnxRuntimeSection(CheckpointSection):
    """A graph in the C++ manifest: its model (and external data, TensorRT caches named by
    trt_engine_cache_path / trt_timing_cache_path), spec, session configuration, and the
    structure that dispatches calls to it; its report an artifact beside the model."""

    name, label = _core.ONNX_RUNTIME_BACKEND_NAME, "ONNX Runtime"

    def save(self, graph, tuned: OnnxRuntimeTunedGraph, structure, report, out):
        session = tuned.session
        now = model_file_identity(session.model_path)
        # A graph loaded from a checkpoint knows its files by content (the manifest's
        # sha256): a save over that checkpoint replaces them with equal copies, which the
        # next save reads, and the engine compares what it copies with these digests. A
        # tuned graph's model is its own tune's cache file, known by identity.
        loaded_from = getattr(tuned, "files_sha256", None)
        if now is None or (now != tuned.model_file and not loaded_from):
            why = ("no longer exists (or its external data)" if now is None
                   else "or its external data (the weights) was replaced or written since the session was created")
            raise _core.StateError(
                f"ait.save: the ONNX model of graph '{graph.key}', {session.model_path}, {why} (each tune has a "
                f"directory of its own in the cache, held until its process exits, and a loaded module reads the "
                "checkpoint it came from, so something else removed or changed it: the session holds the model, but "
                "a checkpoint needs its files); tune or load the module again, then save"
            )
        structure["order"] = list(tuned.order)
        structure["backend"] = tuned.backend_description  # the session says what it updates in place, on load too
        directory = _core.Checkpoint.graph_directory(graph.key)
        model_path = Path(session.model_path).resolve()
        model = f"{directory}/{model_path.name}"
        out.files[model] = str(model_path)
        for name, sha256 in (loaded_from or {}).items():  # the model and its external data, beside it
            out.expected_sha256[f"{directory}/{name}"] = sha256
        config = session.config
        sources = {}
        for option, name in _CACHE_OPTIONS:  # TensorRT caches travel, so engines need no rebuild
            value = config.provider_options.get(option)
            if value and Path(value).exists():
                source = str(Path(value).resolve())
                if source not in sources:
                    sources[source] = f"{directory}/{name}"
                    out.files[sources[source]] = source
        out.native_graphs.append(_core.CheckpointGraph(
            key=graph.key, graph_spec=session.graph_spec, backend_config=config,
            structure_json=json.dumps(structure), model=model,
        ))
        if report is not None:  # an artifact beside the model, not a wall of JSON in the manifest
            out.reports[f"{directory}/{REPORT_FILE}"] = report

    def load_native(self, key: str, ctx: LoadContext):
        """(SavedGraph, TunedGraph, report) of the C++ manifest's graph ``key``."""
        graph_where = f"{ctx.where}, graph '{key}'"
        saved = ctx.checkpoint.graph(key)
        try:
            structure = json.loads(saved.structure_json)
        except (ValueError, RecursionError) as error:
            raise corrupt(graph_where, f"structure is not JSON: {error}") from None
        spec = saved.graph_spec
        graph = saved_graph(ctx.module, structure, key, graph_where, spec)
        order = field(structure, "order", list, graph_where)
        if not all(type(i) is int and 0 <= i < len(graph.input_names) for i in order):
            raise corrupt(graph_where, f"order {order} does not index the {len(graph.input_names)} tensor inputs")
        model_inputs = [graph.input_names[i] for i in order]
        if [t.name for t in spec.inputs] != model_inputs or [t.name for t in spec.outputs] != graph.output_names:
            raise corrupt(
                graph_where,
                f"the graph spec's tensors ({[t.name for t in spec.inputs]} -> {[t.name for t in spec.outputs]}) "
                f"are not the structure's ({model_inputs} -> {graph.output_names})",
            )
        session = ctx.checkpoint.create_session(key, ctx.overrides(saved.backend_config))
        describe = structure.get("backend")
        # (checkpoints written before session 30 kept the session's in-place note in it too)
        describe = describe.split(", updates in place: ")[0] if isinstance(describe, str) else "ONNXRuntimeBackend"
        tuned = OnnxRuntimeTunedGraph(session, order, graph.input_names, describe)
        tuned.files_sha256 = model_files_sha256(ctx.checkpoint, saved)
        return graph, tuned, read_report(ctx.checkpoint, saved, graph_where)


def model_files_sha256(checkpoint, saved) -> dict[str, str]:
    """The verified sha256 of a loaded graph's model and the files it references beside it
    (external data), by their names relative to the model's directory: what a save of the
    loaded module must copy (``CheckpointSaveOptions.expected_sha256``)."""
    model_dir = Path(saved.model).parent.as_posix()
    names = [Path(saved.model).name, *_core.onnx_external_data_locations(checkpoint.artifact_path(saved.model))]
    digests = {a.path: a.sha256 for a in saved.artifacts}
    return {name: digests[f"{model_dir}/{name}"] for name in names if f"{model_dir}/{name}" in digests}


def read_report(checkpoint, saved, where: str) -> dict | None:
    """The graph's tuning report artifact (already verified by Checkpoint.load), if saved."""
    relative = f"{_core.Checkpoint.graph_directory(saved.key)}/{REPORT_FILE}"
    if not any(a.path == relative for a in saved.artifacts):
        return None
    try:
        return json.loads(Path(checkpoint.artifact_path(relative)).read_text())
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: JSON nested too deep
        raise corrupt(where, f"{relative} cannot be read as JSON: {error}") from None


#: The sections by name. A new backend registers its section here and names it in its
#: tuned graph's ``checkpoint_section``.
SECTIONS: dict[str, CheckpointSection] = {}


def register_section(section: CheckpointSection, tuned_type: type[TunedGraph]) -> None:
    """Registers ``section`` and makes ``tuned_type``'s graphs use it."""
    if section.name in SECTIONS:
        raise ValueError(f"checkpoint section '{section.name}' is registered already")
    SECTIONS[section.name] = section
    tuned_type.checkpoint_section = section.name


register_section(OnnxRuntimeSection(), OnnxRuntimeTunedGraph)
register_section(TorchCompileSection(), TorchCompileTunedGraph)
register_section(EagerSection(), EagerGraph)

#: Format versions 1 and 2: the metadata key each JSON section was stored under.
LEGACY_SECTION_KEYS = {"eager_graphs": EagerSection.name, "compiled_graphs": TorchCompileSection.name}


def section_of(tuned: TunedGraph) -> CheckpointSection | None:
    """The section that stores ``tuned``, or None when its backend has none."""
    return SECTIONS.get(getattr(type(tuned), "checkpoint_section", None) or "")
