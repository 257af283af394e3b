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


def forward_code_digest(module: torch.nn.Module) -> dict[str, str]:
    """{class name: digest} of each class in ``module``'s tree but torch's own."""
    digests: dict[str, str] = {}
    for sub in module.modules():
        cls = type(sub)
        name = class_name(cls)
        if name not in digests and not cls.__module__.startswith("torch."):
            digests[name] = _class_digest(cls)
    return digests


def code_differences(saved: object, now: dict[str, str]) -> list[str]:
    """The classes whose code differs from ``saved`` (a class digested both times the same
    way; one digested from source once and from bytecode the other time is not compared)."""
    if not isinstance(saved, dict):
        return []
    return [name for name, digest in now.items()
            if isinstance(saved.get(name), str) and saved[name].split(":")[0] == digest.split(":")[0]
            and saved[name] != digest]
