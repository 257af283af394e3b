"""The plain Python values a tuned ONNX Runtime graph holds as constants, watched after
tuning: a tuned module never computes another model than its forward without saying so.

An export runs forward's Python once: ``x / self.temperature`` becomes a division by the
constant 1.0, ``if self.config.output_hidden_states`` a graph without hidden states. Once
the user reassigns such an attribute (``model.temperature = 0.1``), eager PyTorch computes
another model than the graph. The values watched are the plain ones (None, bool, int,
float, complex, str, bytes, enum members, torch dtypes and devices, numpy scalars, slices,
ranges, Decimals, Fractions, functions called through an attribute such as ``self.act =
torch.relu``, tuples and frozensets of them) that
the wrapped module and each submodule keep in their instance dicts, and the public ones of
plain objects they hold (a transformers config, shared by many modules, watched once), with
the private ones behind a public property (transformers 5 keeps ``output_attentions`` in
``config._output_attentions``).
The environment variables forward read while ait.tune recorded (``os.environ.get("SCALE")``)
are watched beside them, named ``os.environ['SCALE']`` (environment_reads.py).
Lists, dicts and other objects are left out: they change in place, unseen by identity.
Module globals a ``forward`` reads by name (``x * SCALE``, ``if USE_FAST:``, a function it
calls such as ``act = torch.relu`` at module level) are baked the same way and watched the
same way (``forward_globals``), named ``module.NAME``; those the code also assigns
(``global CALLS; CALLS += 1``), names read by the functions forward calls, and values
captured in a closure are not. The plain items of a global dict forward reads (a config dict,
``CONFIG["scale"]``) are watched in the dict, and a plain object's class defaults it does not
shadow (``class Cfg: temperature = 1.0``) as a module's are.

The C++ half of the dispatch (``TorchDispatch.watch_attributes``) compares each by
identity per routed call; a call where one is another object comes to the Python path,
where ``AttributeWatch.changed`` compares their ``repr`` (exact for these types, and NaN
equal to NaN; a function by identity alone, named by its qualified name): an equal value
assigned again is taken as seen; a different one makes the call run eagerly (dispatch.py)
until the value is back or the module is tuned again.
A checkpoint stores the values (``snapshot``), and ``ait.load`` expects those, so a module
loaded with other values runs such calls eagerly too, and is told so.
"""

from __future__ import annotations

import decimal
import enum
import fractions
import functools
import inspect
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aitune.torch.environment_reads import environment_key, environment_path, environment_slot, shown_value
from aitune.torch.state_changes import (code_instructions, forward_attribute_reads, forward_codes, is_harmless,
                                        modules_and_wrapped, user_attributes)

_PLAIN = (type(None), bool, int, float, complex, str, bytes, enum.Enum, torch.dtype, torch.device, slice, np.generic,
          range, decimal.Decimal, fractions.Fraction)
#: Functions a forward calls through an attribute (``self.act = torch.relu``): the graph holds
#: the one called at export. Compared by identity only: two lambdas of one line share a name.
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial)
#: Objects held by a module that are not "plain objects" whose values are watched.
_NOT_PLAIN_OBJECTS = (torch.nn.Module, torch.Tensor, type, types.ModuleType, types.FunctionType,
                      types.MethodType, types.BuiltinFunctionType)
#: Stands for "the value expected is not this module's" (a checkpoint's other value, or an
#: attribute the module no longer has): never the object found, so such calls come to Python.
_OTHER = object()


def is_plain_value(value: Any) -> bool:
    """A value an export keeps as a constant and that cannot change in place (a function a
    forward calls through an attribute too: the graph holds what it computed at export)."""
    if isinstance(value, (tuple, frozenset)):  # torch.Size and named tuples too
        return all(is_plain_value(item) for item in value)
    return isinstance(value, _PLAIN) or _is_function(value)


def _is_function(value: Any) -> bool:
    return isinstance(value, _FUNCTIONS)


def shown(value: Any) -> str:
    """How a value is named in messages and checkpoints: its ``repr``, a function by its
    module and qualified name (a repr's address differs from process to process)."""
    if isinstance(value, frozenset):  # in sorted order: a set of strings iterates by a per-process hash
        return f"frozenset({{{', '.join(sorted(shown(item) for item in value))}}})" if value else "frozenset()"
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        inner = ", ".join(shown(item) for item in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if _is_function(value):
        target = value.func if isinstance(value, functools.partial) else value
        name = f"{getattr(target, '__module__', None) or ''}.{getattr(target, '__qualname__', type(target).__name__)}"
        return f"<function {name.lstrip('.')}>" if not isinstance(value, functools.partial) else f"<partial {name}>"
    return repr(value)


def _has_function(value: Any) -> bool:
    return _is_function(value) or (isinstance(value, (tuple, frozenset)) and any(_has_function(item) for item in value))


#: Stands for "nothing expected in the instance dict": a class attribute forward reads
#: through the instance (``temperature = 1.0`` in the class body), which a value assigned to
#: the instance (``model.temperature = 0.1``) would shadow.
_ABSENT = object()


@dataclass
class BakedAttribute:
    path: str  # 'blocks.0.attn.scale', 'config.output_hidden_states'
    owner: dict  # the instance dict holding it
    key: str | bytes  # bytes: an environment variable in os.environ._data
    expected: Any  # the object expected there (_OTHER: not the one the module holds; _ABSENT: none)
    shown: str  # repr of the value the graphs hold
    default_of: type | None = None  # for a class attribute: the class it is read through
    environment: bool = False  # an environment variable forward read (environment_reads.py)


def plain_object(value: Any) -> bool:
    """An object whose instance dict holds values forward reads (a SimpleNamespace, a
    dataclass or transformers config): not a module, tensor, class, module or function."""
    return (hasattr(value, "__dict__") and not isinstance(value, _NOT_PLAIN_OBJECTS) and not callable(value)
            and type(value).__module__ != "builtins")


def _behind_property(value: Any, name: str) -> bool:
    """Whether the private ``_name`` holds what a property of its class reads: the public
    ``name`` (transformers 5's ``config.output_attentions`` over ``config._output_attentions``)
    or, for ``_name_internal``, ``_name`` or ``name`` (transformers 5's
    ``config._attn_implementation`` over ``config._attn_implementation_internal``, which
    ``model.set_attn_implementation("eager")`` changes: eager attention soft-caps Gemma2's
    scores where the sdpa graph did not)."""
    if not name.startswith("_") or name.startswith("__"):
        return False
    readers = [name[1:]]
    if name.endswith("_internal"):
        readers += [name[: -len("_internal")], name[1: -len("_internal")]]
    return any(isinstance(getattr(type(value), reader, None), property) for reader in readers)


def attribute_values(module: torch.nn.Module, harmless: tuple[str, ...], keep: Callable[[Any], bool] = is_plain_value,
                     private: Callable[[Any, str], bool] = _behind_property) -> Iterator[tuple[str, dict, str, Any]]:
    """(path, instance dict, key, value) of each value ``keep`` takes (a plain value;
    weight_changes: a tensor or a container of them) among the attributes of the module
    tree, and one level into the plain objects they hold (a config), in a fixed order; a name
    there starting with ``_`` only where ``private(object, name)``."""
    seen_objects: set[int] = set()
    for path, held, key, value in user_attributes(module, harmless):
        if keep(value):
            yield path, held, key, value
        elif plain_object(value) and id(value) not in seen_objects:
            seen_objects.add(id(value))
            inner = vars(value)
            for name in sorted(inner):
                if (not name.startswith("_") or private(value, name)) and keep(inner[name]):
                    inner_path = f"{path}.{name}"
                    if not is_harmless(inner_path, harmless):
                        yield inner_path, inner, name, inner[name]


def _class_defaults(module: torch.nn.Module, harmless: tuple[str, ...]) -> Iterator[tuple[str, dict, str, Any, type]]:
    """(path, instance dict, key, value, class) of each public plain value a module's class
    (or a base below ``torch.nn.Module``) defines and its instance does not shadow: forward
    reads it through ``self`` like an instance attribute, and a value assigned to the
    instance after tuning shadows it."""
    for prefix, sub in modules_and_wrapped(module):
        held = vars(sub)
        seen: set[str] = set()
        methods_read = forward_attribute_reads(type(sub))
        for cls in type(sub).__mro__:
            if cls is torch.nn.Module or not issubclass(cls, torch.nn.Module):
                break
            for key, value in vars(cls).items():
                if key in seen or key in held or (key.startswith("_") and key not in methods_read):
                    continue
                seen.add(key)
                # a function in a class body is a method, not a value forward calls through;
                # one forward calls (``self.activation(y)``) is what the graph computed, which a
                # method assigned to the instance after tuning would replace (silently, before)
                if (is_plain_value(value) and not _has_function(value)) or (
                        isinstance(value, types.FunctionType) and key in methods_read and key != "forward"):
                    path = f"{prefix}.{key}" if prefix else key
                    if not is_harmless(path, harmless):
                        yield path, held, key, value, type(sub)


def _plain_object_class_defaults(module: torch.nn.Module,
                                 harmless: tuple[str, ...]) -> Iterator[tuple[str, dict, str, Any, type]]:
    """(path, instance dict, key, value, class) of each public plain value the class of a plain
    object the modules hold defines (``class Cfg: temperature = 1.0``) and the object does not
    shadow: forward reads it through the object, and ``cfg.temperature = 0.1`` assigned after
    tuning shadows it (unseen before, a session-37 probe)."""
    seen_objects: set[int] = set()
    for path, _, _, value in user_attributes(module, harmless):
        if not plain_object(value) or id(value) in seen_objects:
            continue
        seen_objects.add(id(value))
        held, seen = vars(value), set()
        for cls in type(value).__mro__:
            if cls is object or cls.__module__ == "builtins":
                break
            for key, default in vars(cls).items():
                if key in seen or key in held or key.startswith("_"):
                    continue
                seen.add(key)
                inner_path = f"{path}.{key}"
                if is_plain_value(default) and not _has_function(default) and not is_harmless(inner_path, harmless):
                    yield inner_path, held, key, default, type(value)


@functools.lru_cache(maxsize=4096)
def global_reads(code: types.CodeType) -> tuple[str, ...]:
    """The global names ``code`` (and the comprehensions and lambdas inside it) reads and
    never assigns."""
    reads, writes = [], set()
    for instruction in code_instructions(code):
        if instruction.opname == "LOAD_GLOBAL":
            reads.append(instruction.argval)
        elif instruction.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            writes.add(instruction.argval)
    return tuple(dict.fromkeys(name for name in reads if name not in writes))


#: The most items of a global dict whose plain items are watched (a config dict, not a vocabulary).
_DICT_ITEMS = 64


def forward_globals(module: torch.nn.Module, harmless: tuple[str, ...],
                    keep: Callable[[Any], bool] = is_plain_value) -> Iterator[tuple[str, dict, str, Any]]:
    """(path ``module.NAME``, the globals dict, name, value) of each value ``keep`` takes (a
    plain value; weight_changes: a tensor or array) that the ``forward`` of the module or of
    a submodule reads as a module global: an export keeps it as a constant, as it does an
    attribute."""
    seen: set[tuple[int, str]] = set()
    for code, names in forward_codes(module):
        for name in global_reads(code):
            if (id(names), name) in seen or name not in names:
                continue  # a builtin (len, range) or a name bound later
            seen.add((id(names), name))
            value = names[name]
            path = f"{names.get('__name__', '?')}.{name}"
            if keep(value):
                if not is_harmless(path, harmless):
                    yield path, names, name, value
            elif isinstance(value, dict) and len(value) <= _DICT_ITEMS:
                # a config dict read by item (``CONFIG["scale"]``): the graph holds the item's
                # value, which an assignment to the item changes (unseen before, a session-37
                # probe); each such item is watched in the dict itself
                for key, item in value.items():
                    item_path = f"{path}[{key!r}]"
                    if isinstance(key, str) and keep(item) and not is_harmless(item_path, harmless):
                        yield item_path, value, key, item


class AttributeWatch:
    """The watched values of ``module`` (harmless ones left out), expected as they are now
    or, from a checkpoint, as ``saved`` (path -> repr) says the graphs hold them."""

    def __init__(self, module: torch.nn.Module, harmless: tuple[str, ...] = (), saved: dict[str, str] | None = None,
                 environment: tuple[str, ...] = ()):
        self.module = module
        self.entries = [BakedAttribute(path, owner, key, value, shown(value))
                        for path, owner, key, value in [*attribute_values(module, harmless), *forward_globals(module, harmless)]]
        self.entries += [BakedAttribute(path, owner, key, _ABSENT, shown(value), cls)
                         for path, owner, key, value, cls in [*_class_defaults(module, harmless),
                                                              *_plain_object_class_defaults(module, harmless)]]
        self.entries += [_environment_entry(name) for name in environment
                         if not is_harmless(environment_path(name), harmless)]
        if saved is not None:
            self._expect(saved)

    def _expect(self, saved: dict[str, str]) -> None:
        """Expect the checkpoint's values: those that differ, and those the module lacks,
        make calls come to Python (which then finds them changed)."""
        for entry in self.entries:
            shown = saved.get(entry.path)
            if shown is not None and shown != entry.shown:
                entry.expected, entry.shown = _OTHER, shown
        have = {entry.path for entry in self.entries}
        for path, shown in saved.items():
            if path not in have and (name := environment_key(path)) is not None:
                entry = _environment_entry(name)
                if entry.shown != shown:
                    entry.expected, entry.shown = _OTHER, shown
                self.entries.append(entry)
            elif path not in have:
                owner, key = self._owner(path)
                if owner is not None:
                    self.entries.append(BakedAttribute(path, owner, key, _OTHER, shown))

    def _owner(self, path: str) -> tuple[dict | None, str]:
        """The instance dict that would hold ``path`` (a module's or a plain object's), or None."""
        parent, _, key = path.rpartition(".")
        for prefix, sub in modules_and_wrapped(self.module):
            if prefix == parent and "_ait_module" not in vars(sub):  # a wrapper's values are its wrapped module's
                return vars(sub), key
            held = vars(sub)
            head, _, name = parent.rpartition(".")
            if head == prefix and plain_object(held.get(name)):
                return vars(held[name]), key
        return None, key

    def watched(self) -> list[tuple[dict, str, Any]]:
        """What the C++ half compares per call."""
        return [(entry.owner, entry.key, None, True) if entry.expected is _ABSENT
                else (entry.owner, entry.key, entry.expected) for entry in self.entries]

    def changed(self) -> list[tuple[str, str, str]]:
        """(path, value the graphs hold, value now or '<deleted>') of each value that differs;
        an equal one assigned again is taken as expected from now on."""
        found = []
        for entry in self.entries:
            now = entry.owner.get(entry.key, _OTHER)
            if entry.environment:
                said = shown_value(None if now is _OTHER else now)
                if said == entry.shown:  # set again to the same string, or unset as it was
                    entry.expected = _ABSENT if now is _OTHER else now
                else:
                    found.append((entry.path, entry.shown, said))
                continue
            if now is _OTHER and entry.default_of is not None:
                # none on the instance: the class's value is read (changed on the class, or
                # another class default than the checkpoint's graphs hold)
                now = getattr(entry.default_of, entry.key, _OTHER)
                if now is not _OTHER and shown(now) == entry.shown:
                    entry.expected = _ABSENT
                    continue
            elif now is entry.expected:
                continue
            said = shown(now) if now is not _OTHER else "<deleted>"
            # an equal value assigned again is the same constant; a function only by identity
            if now is not _OTHER and is_plain_value(now) and said == entry.shown and not _has_function(now):
                entry.expected = now
            else:
                found.append((entry.path, entry.shown, said))
        return found

    def snapshot(self) -> dict[str, str]:
        """path -> repr of each value the graphs hold (what a checkpoint stores)."""
        return {entry.path: entry.shown for entry in self.entries}


def _environment_entry(name: str) -> BakedAttribute:
    """The watch of environment variable ``name`` as it is now (set or unset)."""
    owner, key = environment_slot(name)
    value = owner.get(key)
    return BakedAttribute(environment_path(name), owner, key, _ABSENT if value is None else value, shown_value(value),
                          environment=True)


def describe_changes(changed: list[tuple[str, str, str]], most: int = 5) -> str:
    """'temperature: 1.0 -> 0.1, ...' for a message."""
    said = ", ".join(f"{path}: {was} -> {now}" for path, was, now in changed[:most])
    return said + (f" and {len(changed) - most} more" if len(changed) > most else "")
