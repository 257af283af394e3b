"""A tuned graph's Python structure as plain JSON, for checkpoints: the input and output
tree specs (torch's pytree JSON, never pickle), the non-tensor values of a call, the
tensor names, dtypes and ranks. Reading it back imports nothing and unpickles nothing:
node types of a tree spec are looked up among the modules already imported, and only
plain JSON values are accepted as constants. ``checkpoint`` (ait.save / ait.load) writes
and reads it as each graph's ``structure``.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import math
import sys
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from aitune import _core
from aitune.torch import flatten
from aitune.torch.grad_modes import GRAD, INFERENCE
from aitune.torch.graph import CallForm, SavedGraph, _Tree

#: Version of the JSON aitune.torch writes into ``metadata`` and each graph's ``structure``.
STRUCTURE_FORMAT_VERSION = 1


class CheckpointStructureError(_core.InvalidArgumentError):
    """A tuned module's inputs or outputs hold something a checkpoint cannot describe
    without pickle (a non-JSON constant, a pytree node type without a serialisable
    name); raised by ``ait.save`` before anything is written."""


# -- field checks shared by the structure and the checkpoint's metadata -------------------


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def script_class_hint(saved: str, now: str) -> str:
    """'' unless one of two class names that differ is a script's (``__main__.X``) and the
    other names the same class in a module: then why they differ, and what to do."""
    for script, other in ((saved, now), (now, saved)):
        if script.startswith("__main__.") and other.endswith(script.removeprefix("__main__")):
            return ("; a class defined in the script that ran ait.save (or runs ait.load) is named __main__."
                    f"{script.removeprefix('__main__.')} there, another name than in a module: define the model in a "
                    "module that both the tuning and the loading script import, and tune again")
    return ""


def dict_differences(saved: dict[str, Any], now: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """The names whose value in ``now`` differs from ``saved``, those of ``saved`` missing from
    ``now`` and those new in ``now``, each in the dicts' order: what a checkpoint recorded of a
    module against the module loaded into."""
    changed = [name for name, value in saved.items() if name in now and now[name] != value]
    return changed, [name for name in saved if name not in now], [name for name in now if name not in saved]


def shape_differences(saved: dict[str, list[int]], now: dict[str, list[int]]) -> str:
    """'' when ``now`` has the tensor names and shapes of ``saved`` (name -> shape); else the
    first three differences, named, in the dicts' order (a module built with another config
    differs here, not in its class)."""
    changed, missing, new = dict_differences(saved, now)
    differences = [f"'{name}' was {saved[name]}, is {now[name]}" for name in changed]
    differences += [f"'{name}' is missing" for name in missing] + [f"'{name}' is new" for name in new]
    more = f" and {len(differences) - 3} more" if len(differences) > 3 else ""
    return ", ".join(differences[:3]) + more


def corrupt(where: str, message: str) -> _core.CheckpointCorruptError:
    return _core.CheckpointCorruptError(f"{where}: {message}")


def field(data: Any, name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(data, dict) or name not in data:
        raise corrupt(where, f"field '{name}' is missing")
    value = data[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        names = " or ".join(k.__name__ for k in _as_tuple(kind))
        raise corrupt(where, f"field '{name}' must be {names}, not {type(value).__name__}")
    return value


def _as_tuple(kind) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


# -- constants: the non-tensor leaves of a graph ------------------------------------------

_CONSTANT_KINDS = "None, bool, int, float, str, torch.dtype, torch.device, an Enum member of an importable module"


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
    if isinstance(value, enum.Enum):
        # by its class (module, qualname) and member name; ait.load finds the class among the
        # modules imported, so it must be importable (not __main__, not inside a function)
        module_name, qualname = kind.__module__, kind.__qualname__
        if module_name == "__main__" or "<locals>" in qualname or _lookup(module_name, qualname) is not kind:
            raise CheckpointStructureError(
                f"{where}: the Enum member {value!r:.80} cannot be saved: its class {qualname} is defined "
                f"{'in __main__' if module_name == '__main__' else 'where ait.load cannot name it'}; define the "
                "Enum at module level in an importable module (a checkpoint names it by module, class and member)"
            )
        return {"type": "enum", "module": module_name, "qualname": qualname, "value": value.name}
    raise CheckpointStructureError(
        f"{where}: a non-tensor value of type {kind.__qualname__} ({value!r:.80}) cannot be saved in a checkpoint "
        f"(supported: {_CONSTANT_KINDS})"
    )


def _decode_constant(data: Any, where: str) -> Any:
    kind = field(data, "type", str, where)
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
    if kind == "enum" and isinstance(value, str) and set(data) == {"type", "module", "qualname", "value"} \
            and isinstance(data["module"], str) and isinstance(data["qualname"], str):
        cls = _lookup(data["module"], data["qualname"])
        if cls is None:
            raise _core.InvalidArgumentError(
                f"{where}: the Enum {data['qualname']} of module '{data['module']}' is not available: ait.load "
                f"never imports code, so import '{data['module']}' (the module defining it) first"
            )
        if isinstance(cls, type) and issubclass(cls, enum.Enum) and value in cls.__members__:
            return cls.__members__[value]
    raise corrupt(where, f"invalid constant {data!r:.120} (supported types: {_CONSTANT_KINDS})")


def _dtype(name: Any, where: str) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise corrupt(where, f"unknown dtype {name!r}")
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
        raise corrupt(where, f"pytree node type '{name}' is neither registered in this process nor described")
    module_name, qualname, kind = entry.get("module"), entry.get("qualname"), entry.get("kind")
    if not all(isinstance(v, str) for v in (module_name, qualname, kind)):
        raise corrupt(where, f"the description of pytree node type '{name}' is invalid: {entry!r:.200}")
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
        raise corrupt(where, f"pytree node type '{name}' is registered in this process as another type")
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
        raise corrupt(where, "the tree spec nests too deeply")
    if not isinstance(schema, dict) or set(schema) != {"type", "context", "children_spec"}:
        raise corrupt(where, f"invalid tree spec node {schema!r:.120}")
    name, context, children = schema["type"], schema["context"], schema["children_spec"]
    if not isinstance(children, list):
        raise corrupt(where, "tree spec children_spec must be a list")
    if name is None:
        if context is not None or children:
            raise corrupt(where, "a tree spec leaf has a context or children")
        return
    if not isinstance(name, str):
        raise corrupt(where, f"tree spec node type must be a string, not {name!r:.60}")
    if name == _NAMEDTUPLE:
        if not isinstance(context, str):
            raise corrupt(where, "a namedtuple node's context must name its type")
        if not pytree.is_namedtuple_class(_resolve_type(context, types, where)):
            raise corrupt(where, f"'{context}' is not a namedtuple type")
    elif name == _DEFAULTDICT:
        if not (
            isinstance(context, dict)
            and set(context) == {"default_factory_module", "default_factory_name", "dict_context"}
            and context["default_factory_module"] == "builtins"
            and context["default_factory_name"] in _DEFAULT_FACTORIES
            and isinstance(context["dict_context"], list)
            and not _has_enum(context["dict_context"])
        ):
            raise corrupt(where, f"invalid defaultdict context {context!r:.120} (only builtin factories load)")
    else:
        if name not in _BUILTIN_NODES:
            cls = _resolve_type(name, types, where)
            if pytree.SUPPORTED_SERIALIZED_TYPES[cls].from_dumpable_context is not None:
                raise corrupt(
                    where, f"pytree node type '{name}' has a custom context deserialiser, which never runs on load"
                )
        if not isinstance(context, str):
            raise corrupt(where, f"the context of a '{name}' node must be JSON text")
        try:
            parsed = json.loads(context)
        except ValueError as error:
            raise corrupt(where, f"the context of a '{name}' node is not JSON: {error}") from None
        if _has_enum(parsed):
            raise corrupt(where, f"the context of a '{name}' node holds an enum object, which ait.load refuses")
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
        raise corrupt(where, f"a tree spec must be [1, {{...}}] (pytree protocol 1), got {data!r:.80}")
    _check_schema(data[1], types, where)
    try:
        return pytree.treespec_loads(json.dumps(data))
    except Exception as error:  # pytree raises AssertionError, NotImplementedError, TypeError...
        raise corrupt(where, f"the tree spec does not load: {type(error).__name__}: {error}") from None


# -- the structure of one graph ------------------------------------------------------------


def graph_structure(graph, module_name: str) -> dict:
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
        # How the user called it, so a graph run eagerly after ait.load replays that call.
        "call": graph.call_form.to_json() if graph.call_form is not None else None,
        # The module's mode when recorded (train() / eval()): calls in the other mode run eagerly.
        "training": graph.training,
        # Whether torch.autocast was on when recorded: calls in the other state run eagerly.
        "autocast": getattr(graph, "autocast", None),
        # The autograd modes forward computes otherwise in (grad_modes.py): calls in them run eagerly.
        "grad_modes": list(getattr(graph, "grad_modes", ())),
    }


def saved_graph(module, structure: Any, key: str, where: str, spec: _core.GraphSpec | None) -> SavedGraph:
    if not isinstance(structure, dict):
        raise corrupt(where, "the graph's structure is missing (a checkpoint written by ait.save has one)")
    version = field(structure, "format_version", int, where)
    if version > STRUCTURE_FORMAT_VERSION or version < 1:
        raise corrupt(
            where,
            f"structure format_version {version} is not supported (this aitune reads 1..{STRUCTURE_FORMAT_VERSION})",
        )
    if field(structure, "key", str, where) != key:
        raise corrupt(where, f"the structure belongs to graph '{structure['key']}', not '{key}'")
    types = field(structure, "types", dict, where)
    trees = {}
    for side in ("inputs", "outputs"):
        part = field(structure, side, dict, where)
        tree_where = f"{where}, {side}"
        tree_spec = _load_spec(part.get("treespec"), types, tree_where)
        leaves = field(part, "leaves", list, tree_where)
        if len(leaves) != tree_spec.num_leaves:
            raise corrupt(tree_where, f"{len(leaves)} leaves listed, the tree spec has {tree_spec.num_leaves}")
        template, positions, names, descriptors = [], [], [], []
        by_name = {t.name: t for t in spec.inputs} if spec is not None else {}
        for i, leaf in enumerate(leaves):
            leaf_where = f"{tree_where}, leaf {i}"
            if isinstance(leaf, dict) and "tensor" in leaf:
                names.append(field(leaf, "tensor", str, leaf_where))
                positions.append(i)
                template.append(None)
                if side == "inputs":
                    rank = field(leaf, "rank", int, leaf_where)
                    dtype = _dtype(leaf.get("dtype"), leaf_where)
                    descriptors.append(flatten.tensor_descriptor(dtype, rank))
                    # The call's identity must be what the graph takes: a structure edited to
                    # another dtype or rank matched calls the session then refused.
                    if (model := by_name.get(names[-1])) is not None and \
                            (str(model.dtype), len(model.min_shape)) != (flatten.dtype_name(dtype), rank):
                        raise corrupt(leaf_where, f"tensor '{names[-1]}' is {flatten.dtype_name(dtype)} rank {rank}, "
                                                  f"but the graph spec takes {model.dtype} rank {len(model.min_shape)}")
            else:
                value = _decode_constant(leaf, leaf_where)
                template.append(value)
                descriptors.append(flatten.leaf_descriptor(value))
        if not names:
            raise corrupt(tree_where, "no tensor leaves")
        if len(set(names)) != len(names):
            raise corrupt(tree_where, f"tensor names repeat: {names}")
        trees[side] = (tree_spec, _Tree.restore(tree_spec, template, positions), names, descriptors)
    in_spec, inputs, input_names, in_descriptors = trees["inputs"]
    _, outputs, output_names, _ = trees["outputs"]
    _check_signature(module, in_spec, where)
    call_form = None
    if structure.get("call") is not None:  # absent from checkpoints written before call forms were kept
        try:
            call_form = CallForm.from_json(structure["call"], module._ait_signature)
        except ValueError as error:
            raise corrupt(where, f"field 'call': {error}") from None
    recorded = structure.get("recorded")
    training = structure.get("training")  # absent from checkpoints written before the mode was kept
    if training is not None and not isinstance(training, bool):
        raise corrupt(where, f"field 'training' must be true, false or null, got {training!r:.40}")
    autocast = structure.get("autocast")  # absent from checkpoints written before the state was kept
    if autocast is not None and not isinstance(autocast, bool):
        raise corrupt(where, f"field 'autocast' must be true, false or null, got {autocast!r:.40}")
    grad_modes = structure.get("grad_modes", [])  # absent from checkpoints written before they were kept
    if not isinstance(grad_modes, list) or not set(grad_modes) <= {GRAD, INFERENCE}:
        raise corrupt(where, f"field 'grad_modes' must be a list of {GRAD!r} and {INFERENCE!r}, got {grad_modes!r:.60}")
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
        call_form,
        training,
        autocast,
        tuple(grad_modes),
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
