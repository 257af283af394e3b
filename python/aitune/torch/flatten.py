"""Nested call inputs and outputs as flat leaves, through torch's pytree: names and identity."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import re
import types
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from aitune.torch.state_changes import MODULE_INTERNALS


def register_dataclasses(tree: Any) -> None:
    """Registers with pytree each dataclass type in ``tree`` that pytree does not know yet.

    Unregistered dataclasses would be opaque leaves hiding their tensors. Hugging Face's
    ModelOutput registers itself when transformers is imported; this covers plain
    dataclasses (and ModelOutput of transformers versions that do not register it).
    Repeats because fields of a newly registered dataclass may be dataclasses too.
    Each is registered under its ``serialized_type_name`` (``module.QualName``) so that
    tree specs holding it can be saved in a checkpoint (``aitune.torch.checkpoint``).
    """
    _add_missing_keys(tree)
    while True:
        unknown = {
            type(leaf)
            for leaf in pytree.tree_leaves(tree)
            if dataclasses.is_dataclass(leaf) and not isinstance(leaf, type) and type(leaf) not in pytree.SUPPORTED_NODES
        }
        if not unknown:
            return
        for cls in unknown:
            pytree.register_dataclass(cls, serialized_type_name=serialized_type_name(cls))


def _add_missing_keys(tree: Any) -> None:
    """Gives key paths to the node types in ``tree`` registered without them.

    Libraries register their output classes with pytree's plain ``register_pytree_node``
    (diffusers' ``BaseOutput``, an OrderedDict dataclass, does so for every subclass), which
    flattens but names no keys, so ``tree_flatten_with_path`` (how graphs name their
    outputs) refuses them. Such a type is registered again with the same functions plus
    keys read from its flatten context: the context's keys where the node is a mapping
    (``output_sample``), else the children's positions."""
    pending = [pytree.tree_flatten(tree)[1]]
    while pending:
        spec = pending.pop()
        pending.extend(spec.children())
        node = pytree.SUPPORTED_NODES.get(spec.type)
        if node is None or node.flatten_with_keys_fn is not None:
            continue
        name = pytree.SUPPORTED_SERIALIZED_TYPES.get(spec.type)
        pytree._deregister_pytree_node(spec.type)  # no public way to add keys to a registration
        pytree.register_pytree_node(
            spec.type, node.flatten_fn, node.unflatten_fn,
            serialized_type_name=name.serialized_type_name if name is not None else serialized_type_name(spec.type),
            flatten_with_keys_fn=_keys_from_context(node.flatten_fn),
        )


def _keys_from_context(flatten_fn):
    def flatten_with_keys(node: Any) -> tuple[list, Any]:
        children, context = flatten_fn(node)
        if isinstance(node, Mapping) and isinstance(context, (list, tuple)) and len(context) == len(children):
            keys = [pytree.MappingKey(key) for key in context]
        else:
            keys = [pytree.SequenceKey(i) for i in range(len(children))]
        return list(zip(keys, children)), context

    return flatten_with_keys


def serialized_type_name(cls: type) -> str:
    """``module.QualName``: how a checkpoint names a pytree node type."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _key_text(key: Any) -> str:
    if isinstance(key, pytree.MappingKey):
        return str(key.key)
    if isinstance(key, pytree.SequenceKey):
        return str(key.idx)
    if isinstance(key, pytree.GetAttrKey):
        return key.name
    return str(key)


def leaf_names(prefix: str, paths: list[tuple], empty: str = "0") -> list[str]:
    """``<prefix>_<path>`` for each key path, non-alphanumerics turned into ``_``.

    ``empty`` stands for the empty path (a bare tensor output becomes ``output_0``).
    Names that collide after sanitising get ``_1``, ``_2``, ... so every tensor keeps
    a distinct ONNX name.
    """
    names: list[str] = []
    taken: set[str] = set()
    for path in paths:
        text = "_".join(_key_text(k) for k in path) or empty
        base = re.sub(r"[^0-9A-Za-z]", "_", f"{prefix}_{text}")
        name, n = base, 0
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        names.append(name)
    return names


def leaf_descriptor(leaf: Any) -> tuple:
    """What of a leaf makes a graph: a tensor's dtype and rank; any other value itself.

    Shapes are left out on purpose: they vary within one graph (dynamic axes). Types
    are kept beside values because ``1 == True == 1.0`` in Python.
    """
    if isinstance(leaf, torch.Tensor):
        return tensor_descriptor(leaf.dtype, leaf.dim())
    if type(leaf) is float:  # -0.0 == 0.0 (and hashes alike), but 1 / -0.0 and atan2 tell them apart
        return (float, leaf, math.copysign(1.0, leaf))
    if isinstance(leaf, np.ndarray):  # by its bytes: repr summarises above 1000 elements
        return _array_state(leaf)
    if isinstance(leaf, torch.nn.Module):  # its weights are the graph's constants
        return (type(leaf), id(leaf), _module_state(leaf))
    try:
        hash(leaf)
    except TypeError:
        return (type(leaf), repr(leaf))
    if _compared_by_identity(leaf):
        # An object compared by identity (no __eq__ of its own, a config object of the
        # user's, a callable object with settings): the graph holds its attributes as
        # constants, so the key is what they are now; changed in place, the same object is
        # another call.
        return (type(leaf), id(leaf), _object_state(leaf, 3))
    return (type(leaf), leaf)


def _array_state(array: np.ndarray) -> tuple:
    digest = hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=16).digest()
    return (np.ndarray, array.dtype.str, array.shape, digest)


def _module_state(module: torch.nn.Module) -> tuple:
    """An nn.Module passed as an argument: each parameter and buffer by its storage and
    version counter (written in place or replaced, it is another call), and of it and each
    submodule its mode, its hooks and its plain values (``act.negative_slope = 0.9``,
    ``drop.train()``, a hook registered: the graph holds what they were, and each was served
    the old graph silently, a session-37 probe)."""
    weights = tuple((t.data_ptr(), t._version) if not t.is_inference() else (t.data_ptr(), 0)
                    for t in (*module.parameters(), *module.buffers()))
    settings = tuple(
        (sub.training, tuple(sub._forward_hooks), tuple(sub._forward_pre_hooks),
         tuple((key, _object_state(value, 0)) for key, value in vars(sub).items()
               if key not in MODULE_INTERNALS and _is_scalar(value)))
        for sub in module.modules())
    return weights, settings



#: More attributes than this, an object passed as an argument is keyed by identity alone.
_MAX_STATE_ITEMS = 64


#: Callables keyed by identity alone: their behaviour is their code, not settings they hold.
_PLAIN_CALLABLES = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.BuiltinMethodType,
                    functools.partial)


@functools.lru_cache(maxsize=1024)
def slot_names(cls: type) -> tuple[str, ...]:
    """The attribute names the ``__slots__`` of ``cls`` and its bases declare."""
    names: list[str] = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if isinstance(name, str) and name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return tuple(names)


def _attributes(value: Any) -> dict[str, Any]:
    """An object's attributes: its instance dict, and what its ``__slots__`` hold (a slotted
    config object changed in place was keyed by identity alone and served the old graph, a
    session-37 probe)."""
    held = dict(vars(value)) if hasattr(value, "__dict__") else {}
    for name in slot_names(type(value)):
        try:
            held[name] = getattr(value, name)
        except AttributeError:  # a slot never set
            continue
    return held


def _compared_by_identity(value: Any) -> bool:
    kind = type(value)
    return (kind.__eq__ is object.__eq__ and kind.__hash__ is object.__hash__
            and (hasattr(value, "__dict__") or bool(slot_names(kind)))
            and not isinstance(value, (torch.nn.Module, type, *_PLAIN_CALLABLES)))


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, bytes))


def _object_state(value: Any, depth: int) -> Any:
    """What an argument object holds, as a comparable value: its attributes' plain values,
    a tensor by its storage and version counter (changed in place, its version moves), a
    NumPy array by its bytes, an nn.Module by its weights' storages and versions, a list of
    plain numbers whole, objects and namespaces inside it three levels deep; identity beyond
    that."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.data_ptr(), value._version)
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return value
    if type(value) is float:
        return (value, math.copysign(1.0, value))
    if isinstance(value, np.ndarray):
        return _array_state(value)
    if isinstance(value, torch.nn.Module):
        return (type(value), id(value), _module_state(value))
    if isinstance(value, (list, tuple)) and all(map(_is_scalar, value)):
        return (type(value), tuple(_object_state(item, 0) for item in value))  # a table of numbers, whole
    if depth > 0 and isinstance(value, (list, tuple)) and len(value) <= _MAX_STATE_ITEMS:
        return (type(value), tuple(_object_state(item, depth - 1) for item in value))
    if depth > 0 and isinstance(value, dict) and len(value) <= _MAX_STATE_ITEMS:
        return (dict, tuple((repr(k), _object_state(v, depth - 1)) for k, v in value.items()))
    if (depth > 0 and (_compared_by_identity(value) or isinstance(value, types.SimpleNamespace))
            and len(held := _attributes(value)) <= _MAX_STATE_ITEMS):
        return (type(value), id(value), tuple((k, _object_state(v, depth - 1)) for k, v in held.items()))
    try:
        hash(value)
        return (type(value), value)
    except TypeError:
        return (type(value), id(value))


def tensor_descriptor(dtype: torch.dtype, rank: int) -> tuple:
    """``leaf_descriptor`` of a tensor of this dtype and rank."""
    return ("tensor", dtype, rank)


def identity(spec: pytree.TreeSpec, leaves: list) -> tuple:
    """Hashable identity of a call: its structure plus each leaf's descriptor."""
    return (spec, tuple(leaf_descriptor(leaf) for leaf in leaves))


def stable_digest(spec: pytree.TreeSpec, leaves: list) -> str:
    """12 hex digits naming a graph on disk; the same call structure gives the same
    name in every process (unlike ``hash``)."""
    text = f"{spec}|" + "|".join(
        f"tensor:{str(leaf.dtype).removeprefix('torch.')}:{leaf.dim()}"
        if isinstance(leaf, torch.Tensor)
        else f"{type(leaf).__qualname__}:{leaf!r}"
        for leaf in leaves
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=256)
def _flat_dict_spec(keys: tuple) -> pytree.TreeSpec:
    return pytree.tree_flatten(dict.fromkeys(keys, torch.empty(0)))[1]


def flatten_arguments(arguments: dict[str, Any]) -> tuple[list, pytree.TreeSpec]:
    """``pytree.tree_flatten(arguments)``, with a cached spec when every argument is a
    plain tensor (most calls; this runs on every tuned call)."""
    values = list(arguments.values())
    if all(type(v) is torch.Tensor for v in values):
        return values, _flat_dict_spec(tuple(arguments))
    return pytree.tree_flatten(arguments)


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> "float32": the spelling ``aitune._core`` takes."""
    return str(dtype).removeprefix("torch.")
