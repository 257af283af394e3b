"""The code a tuned module's graphs were exported from, as a digest per class: a checkpoint
records it, and ``ait.load`` says when the module loaded into runs other code.

An export runs forward once and keeps what it computed; a class whose forward (or a method
it calls) was edited since computes another model eagerly, while the loaded graphs compute
the old one: calls that run eagerly (eager fallback, changed attributes) and the graphs
would be two models. Names, weights and shapes all match in that case (a forward changed
from relu to 2 * tanh loaded silently, 1.88 off eager). Each class of the module tree is
digested by its source (``inspect.getsource``: the same across Python versions), or by its
functions' bytecode where no source is at hand (a class made by ``exec``). torch's own
classes are left out: their code follows the torch version, which the checkpoint records.
"""

from __future__ import annotations

import hashlib
import inspect
import types

import torch

from aitune.torch.checkpoint_structure import class_name


def _code_bytes(code: types.CodeType) -> bytes:
    nested = b"".join(_code_bytes(c) for c in code.co_consts if isinstance(c, types.CodeType))
    constants = repr([c for c in code.co_consts if not isinstance(c, types.CodeType)]).encode()
    return code.co_code + constants + repr(code.co_names).encode() + nested


def _class_digest(cls: type) -> str:
    try:
        return "source:" + hashlib.sha256(inspect.getsource(cls).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        functions = [(name, value) for name, value in sorted(vars(cls).items()) if isinstance(value, types.FunctionType)]
        data = b"".join(name.encode() + _code_bytes(value.__code__) for name, value in functions)
        return "bytecode:" + hashlib.sha256(data).hexdigest()[:16]


def _function_digest(function: types.FunctionType) -> str:
    try:
        return "source:" + hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return "bytecode:" + hashlib.sha256(_code_bytes(function.__code__)).hexdigest()[:16]


def _helpers(cls: type) -> list[types.FunctionType]:
    """The module-level functions of ``cls``'s own file that its methods call (``act(x)``
    beside the class), and those they call in turn: forward's code as much as the class
    body is. Functions of other modules (a library's) are left out: their code follows the
    library's version."""
    from aitune.torch.baked_attributes import global_reads

    found: dict[int, types.FunctionType] = {}
    pending = [value for value in vars(cls).values() if isinstance(value, types.FunctionType)]
    while pending:
        function = pending.pop()
        for name in global_reads(function.__code__):
            value = function.__globals__.get(name)
            if (isinstance(value, types.FunctionType) and value.__module__ == cls.__module__
                    and id(value) not in found and len(found) < 64):
                found[id(value)] = value
                pending.append(value)
    return list(found.values())


def forward_code_digest(module: torch.nn.Module) -> dict[str, str]:
    """{class name: digest} of each class in ``module``'s tree but torch's own, and {module
    name.function name: digest} of the helper functions of their files that they call (since
    session 31: a helper edited between ait.save and ait.load, relu to tanh, loaded
    silently, 0.54 off eager)."""
    digests: dict[str, str] = {}
    for sub in module.modules():
        cls = type(sub)
        name = class_name(cls)
        if name not in digests and not cls.__module__.startswith("torch."):
            digests[name] = _class_digest(cls)
            for helper in _helpers(cls):
                digests.setdefault(f"{helper.__module__}.{helper.__qualname__}", _function_digest(helper))
    return digests


def code_differences(saved: object, now: dict[str, str]) -> list[str]:
    """The classes whose code differs from ``saved`` (a class digested both times the same
    way; one digested from source once and from bytecode the other time is not compared)."""
    if not isinstance(saved, dict):
        return []
    return [name for name, digest in now.items()
            if isinstance(saved.get(name), str) and saved[name].split(":")[0] == digest.split(":")[0]
            and saved[name] != digest]


def submodule_forward_hooks(module: torch.nn.Module) -> list[tuple[str, object]]:
    """(path, hook) of each forward (pre-)hook on a submodule of ``module`` (its own hooks
    run around a tuned graph), in ``named_modules`` order: an export runs them inside the
    graph. Hooks whose only effect is on output tensors (``effect_on_tensors_only``:
    transformers' output capturing, installed on first use) are left out."""
    from aitune.torch.dispatch import effect_on_tensors_only

    return [(path, hook) for path, sub in module.named_modules() if path
            for hook in (*sub._forward_pre_hooks.values(), *sub._forward_hooks.values())
            if not effect_on_tensors_only(hook)]


def exported_hooks(module: torch.nn.Module) -> dict[str, list[str]]:
    """{submodule path: the qualified names of its forward (pre-)hooks} of each submodule
    with hooks, and ``{"<root>.forward": [name]}`` where the wrapped module has an instance
    ``forward`` (``m.forward = ...``, as adapter libraries patch): an export runs them, so a
    graph keeps what they do, and a checkpoint records them (since session 31: a hook on a
    submodule at tuning, absent from the module loaded into in a fresh process, was still
    applied by the loaded graph, 1.57 off, silently). The hooks are those of
    ``submodule_forward_hooks``."""
    def named(hook) -> str:
        return f"{getattr(hook, '__module__', None) or type(hook).__module__}." \
               f"{getattr(hook, '__qualname__', None) or type(hook).__qualname__}"

    found: dict[str, list[str]] = {}
    for path, hook in submodule_forward_hooks(module):
        found.setdefault(path, []).append(named(hook))
    found = {path: sorted(names) for path, names in found.items()}
    if "forward" in vars(module):
        found["<root>.forward"] = [named(vars(module)["forward"])]
    return found


def hook_differences(saved: object, now: dict[str, list[str]]) -> list[str]:
    """'path: saved -> now' of each submodule whose hooks (or the instance forward) differ
    from ``saved`` (checkpoints written before the hooks were stored: none)."""
    if not isinstance(saved, dict):
        return []
    return [f"{path}: {', '.join(saved.get(path, [])) or 'none'} -> {', '.join(now.get(path, [])) or 'none'}"
            for path in sorted(set(saved) | set(now)) if list(saved.get(path, [])) != list(now.get(path, []))]
