"""ait.save / ait.load: a tuned ait.Module as an aitune checkpoint directory.

The directory is the C++ engine's format (``aitune._core.Checkpoint``, docs/checkpoints.md):
a JSON manifest plus the ONNX models (and their external data, TensorRT caches), each
with its size and sha256, written atomically. This module adds what the PyTorch side
needs to dispatch calls without the recorded samples, as JSON: per graph the input and
output tree specs (torch's pytree JSON, never pickle), the non-tensor values, the
tensor names and the order the model takes them in. Loading imports nothing and
unpickles nothing: node types of a tree spec are looked up among the modules already
imported, and only plain JSON values are accepted as graph constants.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from aitune import _core
from aitune.torch import flatten
from aitune.torch.backend.base import TunedGraph
from aitune.torch.backend.onnx_runtime_backend import OnnxRuntimeTunedGraph, model_file_identity
from aitune.torch.backend.torch_eager import EagerGraph
from aitune.torch.graph import SavedGraph, _Tree

logger = logging.getLogger("aitune")

#: Key of aitune.torch's entry in the manifest's ``metadata``.
METADATA_KEY = "aitune.torch"
#: Each ONNX Runtime graph's tuning report, an artifact in its graph directory.
REPORT_FILE = "tune_report.json"
#: Version of the JSON aitune.torch writes into ``metadata`` and each graph's ``structure``.
STRUCTURE_FORMAT_VERSION = 1

DeviceLike = str | torch.device | None


class CheckpointStructureError(_core.InvalidArgumentError):
    """A tuned module's inputs or outputs hold something a checkpoint cannot describe
    without pickle (a non-JSON constant, a pytree node type without a serialisable
    name); raised by ``ait.save`` before anything is written."""


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
    from aitune.torch.module import Module

    if not isinstance(module, Module):
        raise TypeError(f"ait.{verb} takes an ait.Module, got {type(module).__name__}")
    return module


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _corrupt(where: str, message: str) -> _core.CheckpointCorruptError:
    return _core.CheckpointCorruptError(f"{where}: {message}")


def _field(data: Any, name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(data, dict) or name not in data:
        raise _corrupt(where, f"field '{name}' is missing")
    value = data[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        names = " or ".join(k.__name__ for k in _as_tuple(kind))
        raise _corrupt(where, f"field '{name}' must be {names}, not {type(value).__name__}")
    return value


def _as_tuple(kind) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


# -- constants: the non-tensor leaves of a graph ------------------------------------------

_CONSTANT_KINDS = "None, bool, int, float, str, torch.dtype, torch.device"


def _encode_constant(value: Any, where: str) -> dict:
    kind = type(value)
    if value is None:
        return {"type": "none"}
    if kind in (bool, int, str):
        return {"type": kind.__name__, "value": value}
    if kind is float:
        return {"type": "float", "value": value if math.isfinite(value) else repr(value)}
    if isinstance(value, torch.dtype):
        return {"type": "torch.dtype", "value": flatten.dtype_name(value)}
    if isinstance(value, torch.device):
        return {"type": "torch.device", "value": str(value)}
    raise CheckpointStructureError(
        f"{where}: a non-tensor value of type {kind.__qualname__} ({value!r:.80}) cannot be saved in a checkpoint "
        f"(supported: {_CONSTANT_KINDS})"
    )


def _decode_constant(data: Any, where: str) -> Any:
    kind = _field(data, "type", str, where)
    if kind == "none":
        return None
    value = data.get("value")
    if kind == "bool" and type(value) is bool:
        return value
    if kind == "int" and type(value) is int:
        return value
    if kind == "str" and type(value) is str:
        return value
    if kind == "float":
        if type(value) in (int, float):
            return float(value)
        if value in ("nan", "inf", "-inf"):
            return float(value)
    if kind == "torch.dtype" and isinstance(value, str):
        dtype = getattr(torch, value, None)
        if isinstance(dtype, torch.dtype):
            return dtype
    if kind == "torch.device" and isinstance(value, str):
        try:
            return torch.device(value)
        except (RuntimeError, ValueError):
            pass
    raise _corrupt(where, f"invalid constant {data!r:.120} (supported types: {_CONSTANT_KINDS})")


def _dtype(name: Any, where: str) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise _corrupt(where, f"unknown dtype {name!r}")
    return dtype


# -- tree specs: torch's pytree JSON, read without importing anything ---------------------

# Node types pytree itself serialises with a plain JSON context (or none).
_BUILTIN_NODES = {"builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict", "collections.deque"}
_NAMEDTUPLE = "collections.namedtuple"
_DEFAULTDICT = "collections.defaultdict"
_DEFAULT_FACTORIES = {"list", "dict", "set", "int", "float", "str", "tuple"}


def _type_entry(cls: type, kind: str, where: str) -> dict:
    if "<locals>" in cls.__qualname__:
        raise CheckpointStructureError(
            f"{where}: {cls.__qualname__} is defined inside a function; define it at module level so that a "
            "checkpoint can name it"
        )
    return {"module": cls.__module__, "qualname": cls.__qualname__, "kind": kind}


def _describe_types(spec: pytree.TreeSpec, types: dict[str, dict], where: str) -> None:
    """Checks that every node type of ``spec`` can be saved and read back without
    running code, registering namedtuples under a serialised name; records each
    non-builtin type in ``types`` (serialised name -> module, qualname, kind)."""
    if spec.is_leaf():
        return
    node = spec.type
    if node in (tuple, list, dict, collections.OrderedDict, collections.deque):
        pass
    elif node is collections.defaultdict:
        factory = spec.context[0]
        if getattr(factory, "__module__", None) != "builtins" or getattr(factory, "__qualname__", None) not in (
            _DEFAULT_FACTORIES
        ):
            raise CheckpointStructureError(
                f"{where}: a defaultdict whose default_factory is {factory!r} cannot be saved (only builtin "
                f"factories: {', '.join(sorted(_DEFAULT_FACTORIES))})"
            )
    elif node is collections.namedtuple:
        cls = spec.context
        name = flatten.serialized_type_name(cls)
        entry = _type_entry(cls, "namedtuple", where)
        registered = pytree.SUPPORTED_SERIALIZED_TYPES.get(cls)
        if registered is None:
            pytree._register_namedtuple(cls, serialized_type_name=name)
        else:
            name = registered.serialized_type_name
        types[name] = entry
    else:
        registered = pytree.SUPPORTED_SERIALIZED_TYPES.get(node)
        label = getattr(node, "__qualname__", repr(node))
        if registered is None or registered.serialized_type_name == pytree.NO_SERIALIZED_TYPE_NAME_FOUND:
            raise CheckpointStructureError(
                f"{where}: the pytree node type {label} was registered without a serialized_type_name, so a "
                "checkpoint cannot name it; register it with torch.utils._pytree.register_dataclass(cls, "
                "serialized_type_name=...) (or register_pytree_node) before tuning"
            )
        if registered.from_dumpable_context is not None:
            raise CheckpointStructureError(
                f"{where}: the pytree node type {label} has a custom context serialiser; a checkpoint keeps only "
                "plain JSON contexts (dataclasses, namedtuples, dicts, lists, tuples)"
            )
        kind = "dataclass" if dataclasses.is_dataclass(node) else "node"
        types[registered.serialized_type_name] = _type_entry(node, kind, where)
    for child in spec.children():
        _describe_types(child, types, where)


def _lookup(module_name: str, qualname: str) -> Any:
    """The object named ``module.qualname`` among the modules already imported, by
    dictionary look-ups only (no import, no ``__getattr__``)."""
    obj = sys.modules.get(module_name)
    if obj is None:
        return None
    for part in qualname.split("."):
        namespace = getattr(obj, "__dict__", None)
        if not isinstance(namespace, Mapping) or part not in namespace:
            return None
        obj = namespace[part]
    return obj


def _resolve_type(name: str, types: dict, where: str) -> type:
    """The node type serialised as ``name``, registering a dataclass or namedtuple with
    pytree when this process has not yet. Never imports a module."""
    known = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name)
    if known is not None and name != pytree.NO_SERIALIZED_TYPE_NAME_FOUND:
        return known
    entry = types.get(name)
    if not isinstance(entry, dict):
        raise _corrupt(where, f"pytree node type '{name}' is neither registered in this process nor described")
    module_name, qualname, kind = entry.get("module"), entry.get("qualname"), entry.get("kind")
    if not all(isinstance(v, str) for v in (module_name, qualname, kind)):
        raise _corrupt(where, f"the description of pytree node type '{name}' is invalid: {entry!r:.200}")
    cls = _lookup(module_name, qualname)
    if not isinstance(cls, type):
        raise _core.InvalidArgumentError(
            f"{where}: the type {qualname} of module '{module_name}' is not available: ait.load never imports "
            f"code, so import '{module_name}' (the module defining the model's input/output types) first"
        )
    if kind == "dataclass" and dataclasses.is_dataclass(cls):
        if cls not in pytree.SUPPORTED_NODES:
            pytree.register_dataclass(cls, serialized_type_name=name)
    elif kind == "namedtuple" and pytree.is_namedtuple_class(cls):
        if cls not in pytree.SUPPORTED_SERIALIZED_TYPES:
            pytree._register_namedtuple(cls, serialized_type_name=name)
    else:
        raise _core.InvalidArgumentError(
            f"{where}: {module_name}.{qualname} is a {type(cls).__name__} that is not registered with torch's pytree "
            f"as '{name}' ({kind}); import the module that registers it first"
        )
    if pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name) is not cls:
        raise _corrupt(where, f"pytree node type '{name}' is registered in this process as another type")
    return cls


def _has_enum(value: Any) -> bool:
    if isinstance(value, dict):
        return "__enum__" in value or any(_has_enum(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_enum(v) for v in value)
    return False


def _check_schema(schema: Any, types: dict, where: str, depth: int = 0) -> None:
    """Validates one node of pytree's JSON schema so that treespec_loads cannot import
    or run anything: known node types only, contexts plain JSON (no enum objects, whose
    decoder imports their module), defaultdict factories from builtins."""
    if depth > 200:
        raise _corrupt(where, "the tree spec nests too deeply")
    if not isinstance(schema, dict) or set(schema) != {"type", "context", "children_spec"}:
        raise _corrupt(where, f"invalid tree spec node {schema!r:.120}")
    name, context, children = schema["type"], schema["context"], schema["children_spec"]
    if not isinstance(children, list):
        raise _corrupt(where, "tree spec children_spec must be a list")
    if name is None:
        if context is not None or children:
            raise _corrupt(where, "a tree spec leaf has a context or children")
        return
    if not isinstance(name, str):
        raise _corrupt(where, f"tree spec node type must be a string, not {name!r:.60}")
    if name == _NAMEDTUPLE:
        if not isinstance(context, str):
            raise _corrupt(where, "a namedtuple node's context must name its type")
        if not pytree.is_namedtuple_class(_resolve_type(context, types, where)):
            raise _corrupt(where, f"'{context}' is not a namedtuple type")
    elif name == _DEFAULTDICT:
        if not (
            isinstance(context, dict)
            and set(context) == {"default_factory_module", "default_factory_name", "dict_context"}
            and context["default_factory_module"] == "builtins"
            and context["default_factory_name"] in _DEFAULT_FACTORIES
            and isinstance(context["dict_context"], list)
            and not _has_enum(context["dict_context"])
        ):
            raise _corrupt(where, f"invalid defaultdict context {context!r:.120} (only builtin factories load)")
    else:
        if name not in _BUILTIN_NODES:
            cls = _resolve_type(name, types, where)
            if pytree.SUPPORTED_SERIALIZED_TYPES[cls].from_dumpable_context is not None:
                raise _corrupt(
                    where, f"pytree node type '{name}' has a custom context deserialiser, which never runs on load"
                )
        if not isinstance(context, str):
            raise _corrupt(where, f"the context of a '{name}' node must be JSON text")
        try:
            parsed = json.loads(context)
        except ValueError as error:
            raise _corrupt(where, f"the context of a '{name}' node is not JSON: {error}") from None
        if _has_enum(parsed):
            raise _corrupt(where, f"the context of a '{name}' node holds an enum object, which ait.load refuses")
    for child in children:
        _check_schema(child, types, where, depth + 1)


def _dump_spec(spec: pytree.TreeSpec, types: dict, where: str) -> Any:
    _describe_types(spec, types, where)
    try:
        text = pytree.treespec_dumps(spec)
    except (NotImplementedError, TypeError, ValueError) as error:
        raise CheckpointStructureError(f"{where}: the tree spec cannot be serialised: {error}") from error
    data = json.loads(text)
    try:
        back = _load_spec(data, types, where)
    except _core.AituneError as error:
        raise CheckpointStructureError(f"{where}: the tree spec would not load back: {error}") from error
    if back != spec:  # e.g. dict keys that JSON turns into strings
        raise CheckpointStructureError(
            f"{where}: the tree spec does not survive JSON (dict keys must be str, int or bool; no tuple keys): {spec}"
        )
    return data


def _load_spec(data: Any, types: dict, where: str) -> pytree.TreeSpec:
    if not (isinstance(data, list) and len(data) == 2 and data[0] == 1):
        raise _corrupt(where, f"a tree spec must be [1, {{...}}] (pytree protocol 1), got {data!r:.80}")
    _check_schema(data[1], types, where)
    try:
        return pytree.treespec_loads(json.dumps(data))
    except Exception as error:  # pytree raises AssertionError, NotImplementedError, TypeError...
        raise _corrupt(where, f"the tree spec does not load: {type(error).__name__}: {error}") from None


# -- the structure of one graph ------------------------------------------------------------


def _structure(graph, module_name: str) -> dict:
    """JSON describing how to dispatch a call to ``graph`` and rebuild its outputs."""
    where = f"ait.save: '{module_name}' graph '{graph.key}'"
    types: dict[str, dict] = {}
    descriptors = graph.identity[1]
    in_tree, out_tree = graph._inputs, graph._outputs
    tensors = iter(zip(graph.input_names, [d for d in descriptors if d and d[0] == "tensor"], strict=True))
    in_leaves = []
    for position, value in enumerate(in_tree.template):
        if position in in_tree.tensor_positions:
            name, (_, dtype, rank) = next(tensors)
            in_leaves.append({"tensor": name, "dtype": flatten.dtype_name(dtype), "rank": rank})
        else:
            in_leaves.append(_encode_constant(value, f"{where}, input leaf {position}"))
    outputs = iter(graph.output_names)
    out_leaves = []
    for position, value in enumerate(out_tree.template):
        if position in out_tree.tensor_positions:
            out_leaves.append({"tensor": next(outputs)})
        else:
            out_leaves.append(_encode_constant(value, f"{where}, output leaf {position}"))
    return {
        "format_version": STRUCTURE_FORMAT_VERSION,
        "key": graph.key,
        "inputs": {"treespec": _dump_spec(in_tree.spec, types, f"{where}, inputs"), "leaves": in_leaves},
        "outputs": {"treespec": _dump_spec(out_tree.spec, types, f"{where}, outputs"), "leaves": out_leaves},
        "types": types,
        "recorded": graph.describe(),
    }


def _saved_graph(module, structure: Any, key: str, where: str, spec: _core.GraphSpec | None) -> SavedGraph:
    if not isinstance(structure, dict):
        raise _corrupt(where, "the graph's structure is missing (a checkpoint written by ait.save has one)")
    version = _field(structure, "format_version", int, where)
    if version > STRUCTURE_FORMAT_VERSION or version < 1:
        raise _corrupt(
            where,
            f"structure format_version {version} is not supported (this aitune reads 1..{STRUCTURE_FORMAT_VERSION})",
        )
    if _field(structure, "key", str, where) != key:
        raise _corrupt(where, f"the structure belongs to graph '{structure['key']}', not '{key}'")
    types = _field(structure, "types", dict, where)
    trees = {}
    for side in ("inputs", "outputs"):
        part = _field(structure, side, dict, where)
        tree_where = f"{where}, {side}"
        tree_spec = _load_spec(part.get("treespec"), types, tree_where)
        leaves = _field(part, "leaves", list, tree_where)
        if len(leaves) != tree_spec.num_leaves:
            raise _corrupt(tree_where, f"{len(leaves)} leaves listed, the tree spec has {tree_spec.num_leaves}")
        template, positions, names, descriptors = [], [], [], []
        for i, leaf in enumerate(leaves):
            leaf_where = f"{tree_where}, leaf {i}"
            if isinstance(leaf, dict) and "tensor" in leaf:
                names.append(_field(leaf, "tensor", str, leaf_where))
                positions.append(i)
                template.append(None)
                if side == "inputs":
                    rank = _field(leaf, "rank", int, leaf_where)
                    descriptors.append(flatten.tensor_descriptor(_dtype(leaf.get("dtype"), leaf_where), rank))
            else:
                value = _decode_constant(leaf, leaf_where)
                template.append(value)
                descriptors.append(flatten.leaf_descriptor(value))
        if not names:
            raise _corrupt(tree_where, "no tensor leaves")
        if len(set(names)) != len(names):
            raise _corrupt(tree_where, f"tensor names repeat: {names}")
        trees[side] = (tree_spec, _Tree.restore(tree_spec, template, positions), names, descriptors)
    in_spec, inputs, input_names, in_descriptors = trees["inputs"]
    _, outputs, output_names, _ = trees["outputs"]
    _check_signature(module, in_spec, where)
    recorded = structure.get("recorded")
    return SavedGraph(
        module.ait_name,
        module.ait_module,
        module._ait_signature,
        key,
        (in_spec, tuple(in_descriptors)),
        inputs,
        outputs,
        input_names,
        output_names,
        recorded if isinstance(recorded, str) else "(saved graph)",
        spec,
    )


def _check_signature(module, in_spec: pytree.TreeSpec, where: str) -> None:
    """A call is bound to the forward signature, so the top of the input tree is a dict
    of every forward parameter: they must be this module's parameters."""
    parameters = list(module._ait_signature.parameters)
    saved = list(in_spec.context) if in_spec.type is dict else None
    if saved != parameters:
        raise _core.InvalidArgumentError(
            f"{where}: the checkpoint was saved for forward({', '.join(map(str, saved or []))}), but "
            f"{type(module.ait_module).__qualname__}.forward takes ({', '.join(parameters)})"
        )


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

    Returns the checkpoint directory. Raises ``aitune.StateError`` for a module that is
    not tuned, ``CheckpointStructureError`` for inputs/outputs a checkpoint cannot
    describe, ``aitune.InvalidArgumentError`` / ``aitune.AituneIOError`` from the
    engine's save (see docs/checkpoints.md).
    """
    from aitune.torch.module import ModuleState

    module = _check_module(module, "save")
    if module.ait_state is not ModuleState.TUNED:
        why = {
            ModuleState.PASSTHROUGH: "its tuning failed and it runs eagerly",
            ModuleState.RECORDING: "it was recorded but not tuned",
        }.get(module.ait_state, "it was never tuned")
        raise _core.StateError(
            f"ait.save: ait.Module '{module.ait_name}' is {module.ait_state.value.upper()}: {why}; only a TUNED module "
            "can be saved (run ait.tune on it first)"
        )
    start = time.perf_counter()
    graphs, files, eager, reports = [], {}, [], {}
    for graph, tuned in module._ait_tuned.values():
        structure = _structure(graph, module.ait_name)
        report = _report_data(tuned.report)
        if isinstance(tuned, OnnxRuntimeTunedGraph):
            graphs.append(_graph_entry(graph, tuned, structure, files))
            if report is not None:  # an artifact beside the model, not a wall of JSON in the manifest
                reports[f"{_core.Checkpoint.graph_directory(graph.key)}/{REPORT_FILE}"] = report
        elif isinstance(tuned, EagerGraph):
            eager.append({"key": graph.key, "note": tuned.note, "structure": structure, "report": report})
        else:
            raise _core.InvalidArgumentError(
                f"ait.save: '{module.ait_name}' graph '{graph.key}' runs on {tuned.describe()}, which a checkpoint "
                "cannot store (ONNX Runtime and eager graphs only)"
            )
    if not graphs:
        raise _core.InvalidArgumentError(
            f"ait.save: every graph of ait.Module '{module.ait_name}' runs eagerly "
            f"({'; '.join(e['note'] or 'TorchEagerBackend' for e in eager)}); a checkpoint needs at least one graph "
            "in ONNX Runtime, so there is nothing to save"
        )
    metadata = {
        METADATA_KEY: {
            "format_version": STRUCTURE_FORMAT_VERSION,
            "module_class": _class_name(type(module.ait_module)),
            "torch_version": torch.__version__,
            "eager_graphs": eager,
            "tuning_s": sum(SavedReport(r).tuning_s for r in [*reports.values(), *(e["report"] or {} for e in eager)]),
        }
    }
    manifest = _core.CheckpointManifest(module_name=module.ait_name, metadata_json=json.dumps(metadata), graphs=graphs)
    options = _core.CheckpointSaveOptions(overwrite=overwrite, on_file_written=on_file_written)
    directory = Path(path)
    with tempfile.TemporaryDirectory(prefix="aitune-save-") as scratch:
        for i, (relative, report) in enumerate(reports.items()):
            source = Path(scratch) / f"{i}-{REPORT_FILE}"
            source.write_text(json.dumps(report, indent=2))
            files[relative] = str(source)
        _core.Checkpoint.save(os.fspath(directory), manifest, files, options)
    logger.info(
        "ait.save: '%s' (%d graphs in ONNX Runtime, %d eager) saved to %s in %.3f s",
        module.ait_name, len(graphs), len(eager), directory, time.perf_counter() - start,
    )
    return directory


_CACHE_OPTIONS = (("trt_engine_cache_path", "trt_engine_cache"), ("trt_timing_cache_path", "trt_timing_cache"))


def _graph_entry(graph, tuned: OnnxRuntimeTunedGraph, structure: dict, files: dict) -> _core.CheckpointGraph:
    session = tuned.session
    now = model_file_identity(session.model_path)
    if now is None or now != tuned.model_file:
        why = "no longer exists" if now is None else "was replaced since the session was created"
        raise _core.StateError(
            f"ait.save: the ONNX model of graph '{graph.key}', {session.model_path}, {why} (another ait.tune of a "
            f"module named '{graph.module_name}' rewrites its cache directory, and saving a loaded module over or "
            "after removing the checkpoint it came from loses its files); tune or load the module again, then save"
        )
    structure["order"] = list(tuned._order)
    structure["backend"] = tuned.describe()
    directory = _core.Checkpoint.graph_directory(graph.key)
    model_path = Path(session.model_path).resolve()
    model = f"{directory}/{model_path.name}"
    files[model] = str(model_path)
    config = session.config
    sources = {}
    for option, name in _CACHE_OPTIONS:  # TensorRT caches travel, so engines need no rebuild
        value = config.provider_options.get(option)
        if value and Path(value).exists():
            source = str(Path(value).resolve())
            if source not in sources:
                sources[source] = f"{directory}/{name}"
                files[sources[source]] = source
    return _core.CheckpointGraph(
        key=graph.key,
        graph_spec=session.graph_spec,
        backend_config=config,
        structure_json=json.dumps(structure),
        model=model,
    )


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


def _overrides(saved: _core.OnnxRuntimeBackendConfig, device: torch.device | None) -> _core.CheckpointBackendOverrides:
    overrides = _core.CheckpointBackendOverrides()
    provider, device_id, options = saved.provider, saved.device_id, dict(saved.provider_options)
    if device is not None and device.type == "cpu":
        if provider != _core.ExecutionProvider.CPU:
            overrides.provider = provider = _core.ExecutionProvider.CPU
            options = {}
    elif device is not None:  # cuda:N
        overrides.device_id = device_id = device.index
        if provider == _core.ExecutionProvider.CPU:
            # Strict fp32, as the CPU provider computed and the checks compared it.
            overrides.provider = provider = _core.ExecutionProvider.CUDA
            overrides.provider_options = options = {"use_tf32": "0"}
    if provider == _core.ExecutionProvider.CUDA and torch.cuda.is_available() and device_id >= torch.cuda.device_count():
        raise _core.InvalidArgumentError(
            f"ait.load: cuda:{device_id} does not exist here ({torch.cuda.device_count()} CUDA devices); "
            "pass device_map='cuda:N' for one that does"
        )
    return overrides


def _metadata(manifest, where: str) -> dict:
    try:
        metadata = json.loads(manifest.metadata_json)
    except ValueError as error:
        raise _corrupt(where, f"metadata is not JSON: {error}") from None
    ours = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    if not isinstance(ours, dict):
        raise _corrupt(
            where,
            f"the manifest's metadata has no '{METADATA_KEY}' entry: the checkpoint was not written by ait.save "
            "(a C++ checkpoint runs with `aitune run` or aitune::Checkpoint, not into an ait.Module)",
        )
    version = _field(ours, "format_version", int, where + ", metadata")
    if version > STRUCTURE_FORMAT_VERSION or version < 1:
        raise _corrupt(
            where,
            f"metadata format_version {version} is not supported (this aitune reads 1..{STRUCTURE_FORMAT_VERSION}); "
            "it was written by a newer aitune",
        )
    return ours


def _read_report(checkpoint, saved, where: str) -> dict | None:
    """The graph's tuning report artifact (already verified by Checkpoint.load), if saved."""
    relative = f"{_core.Checkpoint.graph_directory(saved.key)}/{REPORT_FILE}"
    if not any(a.path == relative for a in saved.artifacts):
        return None
    try:
        return json.loads(Path(checkpoint.artifact_path(relative)).read_text())
    except (OSError, ValueError) as error:
        raise _corrupt(where, f"{relative} cannot be read as JSON: {error}") from None


def load(module, path: str | os.PathLike, device_map: DeviceLike | Mapping[str, DeviceLike] = None):
    """Loads a checkpoint written by ``ait.save`` into ``module`` and makes it TUNED.

    ``module`` wraps a module of the class that was saved (its weights do not matter:
    the tuned graphs carry their own). The checkpoint is verified first (manifest,
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
    checkpoint = _core.Checkpoint.load(os.fspath(path))
    where = f"ait.load: checkpoint '{checkpoint.directory}'"
    manifest = checkpoint.manifest
    meta = _metadata(manifest, where)
    saved_class = _field(meta, "module_class", str, where + ", metadata")
    if saved_class != _class_name(type(module.ait_module)):
        raise _core.InvalidArgumentError(
            f"{where} was saved from a {saved_class}, but ait.Module '{module.ait_name}' wraps a "
            f"{_class_name(type(module.ait_module))}"
        )
    restored: dict[Any, tuple[SavedGraph, TunedGraph]] = {}

    def add(graph: SavedGraph, tuned: TunedGraph, report: Any, graph_where: str) -> None:
        if graph.identity in restored:
            raise _corrupt(graph_where, f"the same call structure as graph '{restored[graph.identity][0].key}'")
        tuned.report = SavedReport(report) if isinstance(report, dict) else None
        restored[graph.identity] = (graph, tuned)

    for key in checkpoint.graph_keys():
        graph_where = f"{where}, graph '{key}'"
        saved = checkpoint.graph(key)
        if saved.backend != _core.ONNX_RUNTIME_BACKEND_NAME:
            raise _corrupt(graph_where, f"backend '{saved.backend}' is not one ait.load runs")
        try:
            structure = json.loads(saved.structure_json)
        except ValueError as error:
            raise _corrupt(graph_where, f"structure is not JSON: {error}") from None
        spec = saved.graph_spec
        graph = _saved_graph(module, structure, key, graph_where, spec)
        order = _field(structure, "order", list, graph_where)
        if not all(type(i) is int and 0 <= i < len(graph.input_names) for i in order):
            raise _corrupt(graph_where, f"order {order} does not index the {len(graph.input_names)} tensor inputs")
        model_inputs = [graph.input_names[i] for i in order]
        if [t.name for t in spec.inputs] != model_inputs or [t.name for t in spec.outputs] != graph.output_names:
            raise _corrupt(
                graph_where,
                f"the graph spec's tensors ({[t.name for t in spec.inputs]} -> {[t.name for t in spec.outputs]}) "
                f"are not the structure's ({model_inputs} -> {graph.output_names})",
            )
        session = checkpoint.create_backend(key, _overrides(saved.backend_config, device))
        describe = structure.get("backend")
        tuned = OnnxRuntimeTunedGraph(
            session, order, graph.input_names, describe if isinstance(describe, str) else "ONNXRuntimeBackend"
        )
        add(graph, tuned, _read_report(checkpoint, saved, graph_where), graph_where)

    for i, entry in enumerate(_field(meta, "eager_graphs", list, where + ", metadata")):
        entry_where = f"{where}, eager graph {i}"
        key = _field(entry, "key", str, entry_where)
        note = entry.get("note")
        graph = _saved_graph(module, entry.get("structure"), key, f"{where}, eager graph '{key}'", None)
        add(graph, EagerGraph(graph, note=note if isinstance(note, str) else None), entry.get("report"), entry_where)

    module._ait_restore(restored)
    elapsed = time.perf_counter() - start
    tuning_s = meta.get("tuning_s")
    versus = f"; tuning took {tuning_s:.2f} s" if isinstance(tuning_s, (int, float)) and tuning_s > 0 else ""
    logger.info(
        "ait.load: '%s' loaded %d graphs from %s in %.3f s%s",
        module.ait_name, len(restored), checkpoint.directory, elapsed, versus,
    )
    return module
