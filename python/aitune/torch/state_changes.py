"""What a recorded call changed of its module's state (buffers, parameters, plain Python
attributes): an export cannot carry it."""

from __future__ import annotations

import dataclasses
import dis
import functools
import inspect
import types
from collections.abc import Iterator

import torch
import torch.utils._pytree as pytree


class StateWatch:
    """Watches one call of ``module``. Every buffer and parameter is noted by tensor
    identity and version counter: an in-place update from Python (``self.calls += 1``)
    bumps the version, an assignment (``self.calls = self.calls + 1``) replaces the tensor.
    Native kernels that update a buffer inside (BatchNorm's running statistics) bump
    neither, so with ``compare_values`` the buffers' values are compared too; that costs a
    copy of the buffers, so the caller asks for it once per graph, on its first call.

    With ``watch_attributes``, the plain Python attributes of the module and its submodules
    (a call counter, a list appended to, a tensor kept outside the buffers) are watched too:
    an ONNX graph drops every Python side effect. The caller asks for it on the calls after
    a graph's first, so a memo set once on the first call (``if self.cache is None: ...``) is
    not state that keeps changing. ``harmless``: attributes the user declared harmless
    (``ait.Module(..., harmless_attributes=)``, ``is_harmless``): never watched."""

    def __init__(self, module: torch.nn.Module, compare_values: bool, watch_attributes: bool = False,
                 harmless: tuple[str, ...] = ()):
        self.module = module
        self.harmless = harmless
        self.versions = _versions(module)
        self.values = ({name: buffer.detach().clone() for name, buffer in module.named_buffers()}
                       if compare_values else {})
        self.attributes = _attributes(module, harmless) if watch_attributes else None

    def changed(self) -> list[str]:
        """Names of the buffers, parameters and (watched) attributes changed (or added) during the call."""
        changed = [name for name, version in _versions(self.module).items() if self.versions.get(name) != version]
        for name, buffer in self.module.named_buffers():
            before = self.values.get(name)
            if name not in changed and before is not None and not _same(before, buffer):
                changed.append(name)
        if self.attributes is not None:
            after = _attributes(self.module, self.harmless)
            changed += [name for name in sorted({*self.attributes, *after})
                        if self.attributes.get(name) != after.get(name) and name not in changed]
        return changed


#: What every ``torch.nn.Module`` keeps in its ``__dict__`` (parameters, hooks, ``training``):
#: not the user's attributes.
MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))


def is_harmless(path: str, harmless: tuple[str, ...]) -> bool:
    """Whether the attribute at ``path`` (``blocks.0.attn.cache``) is declared harmless: an
    entry with a dot names that one path, one without names the attribute of that name on
    the module and every submodule."""
    return any(path == entry or ("." not in entry and path.rpartition(".")[2] == entry) for entry in harmless)


def attribute_paths(module: torch.nn.Module) -> list[str]:
    """The paths of the plain Python attributes of ``module`` and its submodules, as
    ``StateWatch`` names them."""
    return list(_attributes(module, ()))


def check_harmless_attributes(value) -> tuple[str, ...]:
    """``ait.Module``'s ``harmless_attributes``: a list of attribute names or paths."""
    if isinstance(value, str) or not all(isinstance(entry, str) and entry and not entry.startswith(".")
                                         and not entry.endswith(".") for entry in value):
        raise TypeError(f"harmless_attributes must be a list of attribute names or paths (['calls', "
                        f"'blocks.0.attn.cache']), got {value!r}")
    return tuple(value)


def modules_and_wrapped(module: torch.nn.Module):
    """``named_modules``, and beside each nested ``ait.Module`` (same path) the module it
    wraps: the wrapper shares its parameters, buffers and submodules with it, so
    ``named_modules`` reaches the wrapped module's children but never the wrapped module,
    whose attributes, class and forward the wrapper's calls read (an outer tune's graph
    kept a nested wrapped module's ``scale`` when it was changed, silently)."""
    for prefix, sub in module.named_modules(remove_duplicate=True):
        yield prefix, sub
        wrapped = vars(sub).get("_ait_module")
        if isinstance(wrapped, torch.nn.Module):
            yield prefix, wrapped


def user_attributes(module: torch.nn.Module, harmless: tuple[str, ...]):
    """(path, instance dict, key, value) of each plain Python attribute of ``module`` and its
    submodules (``inner.calls``): not nn.Module's own (parameters, hooks, ``training``), not
    aitune's (``_ait…``, a nested ``ait.Module``'s), not submodules, not those declared
    harmless; a nested ``ait.Module``'s wrapped module's are. Modules in ``named_modules``
    order (``modules_and_wrapped``), each one's in its dict's order."""
    for prefix, sub in modules_and_wrapped(module):
        held = vars(sub)
        for key, value in held.items():
            if key in MODULE_INTERNALS or key.startswith("_ait") or isinstance(value, torch.nn.Module):
                continue
            path = f"{prefix}.{key}" if prefix else key
            if not is_harmless(path, harmless):
                yield path, held, key, value


def _attributes(module: torch.nn.Module, harmless: tuple[str, ...]) -> dict[str, tuple]:
    """A token per plain Python attribute of ``module`` and its submodules, by path
    (``inner.calls``), that differs when the attribute is reassigned or, for a list, tuple,
    dict or set, when an item is replaced, added or removed, or for a tensor when it is
    changed in place. aitune's own attributes (``_ait…``, a nested ``ait.Module``'s) are left out."""
    tokens = {path: _token(value) for path, _, _, value in user_attributes(module, harmless)}
    # the module globals forward reads or assigns (``global CALLS; CALLS += 1``, a tensor total
    # written in place): a graph drops those writes as it does an attribute's (a session-35 probe)
    tokens.update((path, _token(names.get(name))) for path, names, name in global_state(module, harmless))
    # and the values their classes hold (``type(self).calls += 1``, a class-level list appended
    # to): shared by every instance, dropped by a graph alike (a session-36 probe)
    tokens.update((path, _token(vars(cls)[key])) for path, cls, key in class_state(module, harmless))
    return tokens


def class_state(module: torch.nn.Module, harmless: tuple[str, ...]) -> list[tuple[str, type, str]]:
    """(path ``Class.NAME``, the class, name) of each value that can hold state (a number, string,
    tensor, container) in the class dicts of ``module``'s and its submodules' classes and
    their bases below ``torch.nn.Module``; dunder names, methods and descriptors are not."""
    found, seen = [], set()
    for _, sub in modules_and_wrapped(module):
        for cls in type(sub).__mro__:
            if cls is torch.nn.Module or not issubclass(cls, torch.nn.Module):
                break
            if cls in seen:
                continue
            seen.add(cls)
            for key, value in vars(cls).items():
                path = f"{cls.__qualname__}.{key}"
                if key.startswith("__") or not _mutable_state(value) or is_harmless(path, harmless):
                    continue
                found.append((path, cls, key))
    return found


def forward_codes(module: torch.nn.Module) -> Iterator[tuple[types.CodeType, dict]]:
    """(code, globals dict) of the ``forward`` of ``module`` and of each submodule (wrapped
    ones included) that is a Python function, and of the methods and properties of their
    classes that ``forward`` reads through ``self`` (``self.scale`` a property returning a
    global, ``self.helper(x)``: a global read there was a constant of the graph as one read
    in forward, unwatched, a session-36 probe): what the global watches read."""
    for _, sub in modules_and_wrapped(module):
        cls = type(sub)
        functions = [*_forwards_through_super(cls)]
        for name in forward_attribute_reads(cls):
            # defined by the module's own classes, not nn.Module's machinery (__call__'s hooks)
            owner = next((klass for klass in cls.__mro__ if name in vars(klass)), None)
            if owner is None or owner is torch.nn.Module or not issubclass(owner, torch.nn.Module):
                continue
            member = vars(owner)[name]
            if isinstance(member, property):
                member = member.fget
            elif isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, types.FunctionType) and not name.startswith("__") and name != "forward":
                functions.append(inspect.unwrap(member))
        for function in functions:
            code, names = getattr(function, "__code__", None), getattr(function, "__globals__", None)
            if isinstance(code, types.CodeType) and isinstance(names, dict):
                yield code, names


@functools.lru_cache(maxsize=1024)
def _forwards_through_super(cls: type) -> tuple:
    """``cls.forward``, and the forward of each base class it reaches by ``super()`` (a
    subclass's ``return super().forward(x) + 1``: a global the base's forward reads, in its own
    file, was a constant of the graph, unwatched; a session-37 probe)."""
    forwards, owners = [], [klass for klass in cls.__mro__ if "forward" in vars(klass)
                             and klass is not torch.nn.Module and issubclass(klass, torch.nn.Module)]
    for klass in owners:
        function = inspect.unwrap(vars(klass)["forward"])
        forwards.append(function)
        code = getattr(function, "__code__", None)
        if not isinstance(code, types.CodeType) or "super" not in global_names(code):
            break
    return tuple(forwards) or (inspect.unwrap(cls.forward),)


@functools.lru_cache(maxsize=1024)
def forward_attribute_reads(cls: type) -> frozenset[str]:
    """The attribute names ``cls.forward`` (and the lambdas and comprehensions inside it)
    reads (``self.activation``): the methods a patch on the instance would replace there."""
    code = getattr(inspect.unwrap(getattr(cls, "forward", None)), "__code__", None)
    if not isinstance(code, types.CodeType):
        return frozenset()
    return frozenset(i.argval for i in code_instructions(code) if i.opname in ("LOAD_ATTR", "LOAD_METHOD"))


def code_instructions(code: types.CodeType) -> Iterator[dis.Instruction]:
    """The instructions of ``code`` and of the comprehensions and lambdas inside it."""
    stack = [code]
    while stack:
        current = stack.pop()
        yield from dis.get_instructions(current)
        stack.extend(const for const in current.co_consts if isinstance(const, types.CodeType))


def global_state(module: torch.nn.Module, harmless: tuple[str, ...]) -> list[tuple[str, dict, str]]:
    """(path ``module.NAME``, the globals dict, name) of each module global the ``forward`` of
    ``module`` or a submodule reads or assigns that can hold state: a number or string (rebound
    by ``global``), a tensor, a container. Functions, classes and imported modules are not."""
    found, seen = [], set()
    for code, names in forward_codes(module):
        for name in global_names(code):
            path = f"{names.get('__name__', '?')}.{name}"
            if (id(names), name) in seen or is_harmless(path, harmless):
                continue
            seen.add((id(names), name))
            if name not in names or _mutable_state(names[name]):  # (a global forward creates)
                found.append((path, names, name))
    return found


@functools.lru_cache(maxsize=4096)
def global_names(code: types.CodeType) -> tuple[str, ...]:
    """The global names ``code`` (and the comprehensions and lambdas inside it) reads or
    assigns, in order of first use; asked on every recorded call for every submodule, so
    kept per code object."""
    return tuple(dict.fromkeys(i.argval for i in code_instructions(code) if i.opname in ("LOAD_GLOBAL", "STORE_GLOBAL")))


def _mutable_state(value) -> bool:
    return (value is None or isinstance(value, (bool, int, float, complex, str, bytes, torch.Tensor, list, dict, set,
                                                types.SimpleNamespace)))


#: How deep ``_token`` follows plain containers and namespaces inside one another.
_NESTING = 4


def _token(value, depth: int = 0) -> tuple:
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return ("value", type(value), value)
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), tensor_version(value))
    if depth < _NESTING:
        # Plain holders of state are followed inside (a counter in a SimpleNamespace, a
        # list appended to inside a dict: ``self.hist["norms"].append(n)``). Only these: an
        # object of another class may change inside on every call without it being the
        # model's state (a logger's cache), and it stays watched by identity.
        if isinstance(value, (list, tuple)):
            return ("items", id(value), tuple(_token(item, depth + 1) for item in value))
        if isinstance(value, dict):
            return ("items", id(value), tuple((key, _token(item, depth + 1)) for key, item in value.items()))
        if isinstance(value, (set, frozenset)):
            return ("items", id(value), frozenset(_item(item) for item in value))
        if (fields := _plain_fields(value)) is not None:
            return ("fields", id(value), tuple((key, _token(item, depth + 1)) for key, item in fields.items()))
    return ("object", id(value))


def _plain_fields(value) -> dict | None:
    """The fields of a SimpleNamespace or a dataclass instance (with a ``__dict__``); None
    for anything else."""
    plain = isinstance(value, types.SimpleNamespace) or (dataclasses.is_dataclass(value) and not isinstance(value, type))
    return getattr(value, "__dict__", None) if plain else None


def _keeper(value, depth: int = 0):
    """A function that puts ``value``'s items (or fields) back as they are now, in place,
    and those of the plain holders inside it, as deep as ``_token`` looks."""
    if depth >= _NESTING:
        return lambda: None
    if isinstance(value, (list, dict)) or _plain_fields(value) is not None:
        held = value if isinstance(value, (list, dict)) else _plain_fields(value)
        items = list(held) if isinstance(held, list) else dict(held)
        inner = [_keeper(item, depth + 1) for item in (items if isinstance(items, list) else items.values())]

        def back() -> None:
            if isinstance(held, list):
                held[:] = items
            else:
                held.clear()
                held.update(items)
            for keep in inner:
                keep()

        return back
    if isinstance(value, set):
        kept = set(value)
        return lambda: (value.clear(), value.update(kept))
    return lambda: None


def _item(item):
    """An item of a set: scalars by value, others by identity."""
    if item is None or isinstance(item, (bool, int, float, str, bytes)):
        return (type(item), item)
    return id(item)


def tensor_version(tensor: torch.Tensor) -> int:
    """``tensor._version``; 0 for an inference-mode tensor, which has no version counter."""
    try:
        return tensor._version
    except RuntimeError:
        return 0


def changed_inputs(arguments: dict, versions: list[int]) -> list[str]:
    """The tensors of a call's ``arguments`` changed in place since ``versions`` (their
    ``tensor_version`` before the call, in pytree order), by their path (``['x']``); none
    when forward added or removed tensors of a container it was given (``feats.append(y)``):
    the tensors no longer line up with ``versions``, and ``changed_containers`` names that."""
    paths_leaves = [(path, leaf) for path, leaf in pytree.tree_flatten_with_path(arguments)[0]
                    if isinstance(leaf, torch.Tensor)]
    if len(paths_leaves) != len(versions):
        return []
    return [pytree.keystr(path) for (path, leaf), version in zip(paths_leaves, versions, strict=True)
            if tensor_version(leaf) != version]


def changed_containers(arguments: dict, leaves: list, spec: pytree.TreeSpec) -> list[str]:
    """The arguments whose containers forward changed (an item of a list or dict it was
    given replaced, added or removed: a cache kept in the caller's list), by name
    (``['cache']``); ``leaves`` and ``spec``: the arguments' pytree flattening before the
    call. A graph returns outputs only: the tuned module would leave such a container as it
    was (silently not what eager does)."""
    after_leaves, after_spec = pytree.tree_flatten(arguments)
    if after_spec == spec and all(a is b for a, b in zip(after_leaves, leaves, strict=True)):
        return []
    changed, before_at, after_at = [], 0, 0
    for name, before_spec, after_spec_n in zip(arguments, spec.children(), after_spec.children(), strict=True):
        before_n, after_n = before_spec.num_leaves, after_spec_n.num_leaves
        old, new = leaves[before_at:before_at + before_n], after_leaves[after_at:after_at + after_n]
        before_at, after_at = before_at + before_n, after_at + after_n
        if before_spec != after_spec_n or not all(_same_leaf(a, b) for a, b in zip(old, new, strict=True)):
            changed.append(f"[{name!r}]")
    return changed


def argument_objects(leaves: list) -> dict[int, tuple]:
    """A token (``_token``) per argument leaf that holds Python state in its attributes: a
    SimpleNamespace, a dataclass instance, an object of a class compared by identity (a
    caller's stats or cache object), by its index among ``leaves``."""
    return {i: _object_token(leaf) for i, leaf in enumerate(leaves) if _holds_attributes(leaf)}


def changed_objects(arguments: dict, leaves: list, tokens: dict[int, tuple]) -> list[str]:
    """The paths (``['stats']``) of the argument objects whose attributes forward changed
    (``stats.calls += 1``): a graph returns outputs only, so the tuned module would leave
    them as they were, and tuning's own calls (an export with fake tensors) would write into
    the caller's object."""
    changed = [i for i, token in tokens.items() if _object_token(leaves[i]) != token]
    if not changed:
        return []
    paths = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(arguments)[0]]
    return [paths[i] for i in changed if i < len(paths)]


def _holds_attributes(value) -> bool:
    if _plain_fields(value) is not None:
        return True
    kind = type(value)
    return (kind.__module__ != "builtins" and kind.__eq__ is object.__eq__ and isinstance(getattr(value, "__dict__", None), dict)
            and not isinstance(value, (torch.nn.Module, torch.Tensor, type, types.FunctionType, types.MethodType,
                                       functools.partial)))


def _object_token(value) -> tuple:
    return ("fields", id(value), tuple((key, _token(item, 1)) for key, item in vars(value).items()))


def _same_leaf(before, after) -> bool:
    if before is after:
        return True
    if isinstance(before, torch.Tensor) or isinstance(after, torch.Tensor) or type(before) is not type(after):
        return False
    try:
        return bool(before == after)
    except Exception:  # a value that cannot be compared: another object, so changed
        return False


def _versions(module: torch.nn.Module) -> dict[str, tuple[int, int]]:
    versions = {}
    for name, tensor in [*module.named_buffers(), *module.named_parameters()]:
        try:
            versions[name] = (id(tensor), tensor._version)
        except RuntimeError:  # an inference-mode tensor has no version counter
            versions[name] = (id(tensor), 0)
    return versions


def _same(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Equal shape, dtype and values, NaN equal to NaN (a buffer holding NaN is unchanged)."""
    if before.shape != after.shape or before.dtype != after.dtype or before.layout != after.layout:
        return False
    if before.layout != torch.strided:  # sparse: no elementwise eq kernel (a raw NotImplementedError, a probe)
        try:
            before, after = before.to_dense(), after.to_dense()
        except (RuntimeError, NotImplementedError):
            return before is after
    if before.is_floating_point() or before.is_complex():
        return torch.allclose(before, after, rtol=0, atol=0, equal_nan=True)
    return torch.equal(before, after)


class StateSnapshot:
    """The values of ``names`` (buffers or parameters of ``module`` that its recorded calls
    changed), kept so that ``restore`` can put them back: tuning calls the module many
    more times than the user's samples did (export, the eager reference at each precision,
    profiling, torch.compile candidates), and those calls must not leave their updates in
    the user's module (a counter, running statistics). After ``ait.tune`` the state is what
    the recorded calls, the user's own, left it."""

    def __init__(self, module: torch.nn.Module, names: list[str]):
        self.module = module
        tensors = {**dict(module.named_buffers()), **dict(module.named_parameters())}
        self.saved = {name: (tensors[name], tensors[name].detach().clone()) for name in names if name in tensors}
        # plain Python attributes: the object, and a shallow copy of a container's items
        self.attributes = {}
        globals_at = {path: (held, key) for path, held, key in global_state(module, ())}
        classes_at = {path: (cls, key) for path, cls, key in class_state(module, ())}
        for name in names:
            if name in classes_at:  # a value its class holds: set on the class again
                cls, key = classes_at[name]
                value = vars(cls)[key]
                self.attributes[name] = (cls, key, value, _keeper(value))
                continue
            if name in globals_at:  # a module global: put back in its module's dict
                held, key = globals_at[name]
                if key in held:
                    value = held[key]
                    self.attributes[name] = (held, key, value, _keeper(value))
                continue
            owner_name, _, attr = name.rpartition(".")
            owner = module.get_submodule(owner_name)
            if name not in tensors and attr in vars(owner):
                value = vars(owner)[attr]
                # whoever holds a container or namespace sees its items back, nested ones too
                self.attributes[name] = (owner, attr, value, _keeper(value))
        self.global_values = {name: entry[2].detach().clone() for name, entry in self.attributes.items()
                              if name in globals_at and isinstance(entry[2], torch.Tensor)}

    def restore(self) -> None:
        for name, (owner, attr, value, keeper) in self.attributes.items():
            keeper()
            if isinstance(owner, dict):
                owner[attr] = value
                if name in self.global_values:  # a global tensor written in place
                    with torch.no_grad():
                        value.copy_(self.global_values[name])
            else:
                setattr(owner, attr, value)
        tensors = {**dict(self.module.named_buffers()), **dict(self.module.named_parameters())}
        for name, (original, value) in self.saved.items():
            with torch.no_grad():
                if original.shape == value.shape and original.dtype == value.dtype:
                    original.copy_(value)  # whoever holds the tensor sees the value back
                else:  # resized in place
                    original.data = value
            if tensors.get(name) is not original:  # forward assigned a new tensor (``self.calls = self.calls + 1``)
                owner_name, _, attr = name.rpartition(".")
                owner = self.module.get_submodule(owner_name)
                if isinstance(original, torch.nn.Parameter):
                    setattr(owner, attr, original)
                else:
                    owner.register_buffer(attr, original, persistent=attr not in owner._non_persistent_buffers_set)
