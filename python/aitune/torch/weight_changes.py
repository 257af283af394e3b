"""Whether a module's weights changed under its tuned graphs: a tuned graph that holds its
own copy of the weights (an ONNX model's initializers, a half-precision copy) computes the
old model once the module's weights change, so the module must know when they do
(``load_state_dict``, ``.to()`` / ``.half()`` and the like; ait.Module acts on it)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from aitune.torch.state_changes import class_state

_fused_steps_seen = False


def see_fused_optimizer_steps() -> None:
    """Makes a fused optimizer's step move its parameters' version counters, as every other
    optimizer's step does: ``torch.optim.SGD/Adam/AdamW(..., fused=True)`` update the weights
    in one kernel that leaves the counters alone, so a tuned module kept serving graphs that
    hold the weights from before fine-tuning (0.32-0.40 off in a probe, silently). One global
    step post-hook (torch.optim.optimizer.register_optimizer_step_post_hook), registered the
    first time a tuned graph holds a copy of the weights; it touches the fused groups alone, and
    moves their counters as a non-fused step would (torch.autograd.graph.increment_version)."""
    global _fused_steps_seen
    if _fused_steps_seen:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def after_step(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        for group in optimizer.param_groups:
            if group.get("fused"):
                torch.autograd.graph.increment_version([p for p in group["params"] if p is not None])

    register_optimizer_step_post_hook(after_step)
    _fused_steps_seen = True


def weights_fingerprint(module: torch.nn.Module) -> tuple:
    """What changes when ``_apply`` (``.to()``, ``.cuda()``, ``.half()``, ...) replaces or
    converts a parameter or buffer: its storage, dtype and device, by name."""
    return tuple(
        (name, tensor.data_ptr(), tensor.dtype, tensor.device)
        for name, tensor in (*module.named_parameters(), *module.named_buffers())
        if tensor is not None
    )


def tensor_attributes(module: torch.nn.Module, harmless: tuple[str, ...] = ()) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) of each tensor ``module`` or a submodule keeps as a plain attribute
    (``self.scale = torch.ones(8)``, not ``register_buffer``), in a tuple, list or dict
    attribute, in a plain object it holds, or that its forward reads as a module global
    (``held_attributes``): an export holds it as a constant like a buffer. Harmless ones
    (``ait.Module(..., harmless_attributes=)``) are left out."""
    # and the tensors its classes hold (``OFFSET = torch.zeros(4)`` in the class body, read as
    # ``self.OFFSET``): written in place after tuning, the graphs kept the old values
    # silently (a session-36 probe); a class value replaced is the call guard's (type version)
    return [(path, value) for path, value in _held_items(held_attributes(module, harmless))
            if isinstance(value, torch.Tensor)] + _class_tensors(module, harmless)


def _class_tensors(module: torch.nn.Module, harmless: tuple[str, ...]) -> list[tuple[str, torch.Tensor]]:
    """(path ``Class.NAME``, tensor) of each tensor the classes of ``module`` and its
    submodules hold, in a container too (``Class.TABLE[0]``)."""
    return [(path, value) for path, cls, key in class_state(module, harmless)
            for path, value in _tensors_in(path, vars(cls)[key]) if isinstance(value, torch.Tensor)]


def class_tensor_ids(module: torch.nn.Module, harmless: tuple[str, ...] = ()) -> dict[str, int]:
    """path -> id of each tensor the classes of ``module`` and its submodules hold."""
    return {path: id(value) for path, value in _class_tensors(module, harmless)}


def held_attributes(module: torch.nn.Module, harmless: tuple[str, ...] = ()) -> list[tuple[str, dict, str, object]]:
    """(path, dict, key, value) of each object other than a parameter or buffer whose tensors
    forward may read and an export holds as constants: a tensor or numeric array kept as a
    plain attribute; a tuple, list or dict attribute holding such values (``self.consts =
    (torch.ones(4),)``); such a value in a plain object a module holds (a SimpleNamespace, a
    dataclass config: ``self.cfg.scale``); and one a forward reads as a module global
    (``OFFSET = torch.zeros(4)`` beside the class). Until session 31 only the first kind was
    watched: a write into the others, or their reassignment, left the graphs computing the
    old values, silently (0.5-5 off in a probe)."""
    from aitune.torch.baked_attributes import attribute_values, forward_globals

    return [*attribute_values(module, harmless, keep=_holds_tensors, private=lambda value, name: True),
            *forward_globals(module, harmless, keep=_holds_tensors)]


def _tensors_in(path: str, value: object) -> list[tuple[str, object]]:
    """(path, value) of ``value`` where it is a tensor or numeric array, else of each one
    among the items of a tuple, list or dict ``value``, by index or key (``consts[0]``,
    ``table['a']``)."""
    if _held_attribute(value):
        return [(path, value)]
    if isinstance(value, torch.nn.Module):
        # a module kept where nn.Module does not register it (a plain list, a namespace): an
        # export holds its weights as constants, so they are watched like held tensors (a
        # write into them left the graphs computing the old ones, 0.6-6 off, a probe)
        return [(f"{path}.{name}", tensor) for name, tensor in (*value.named_parameters(), *value.named_buffers())]
    if isinstance(value, dict):
        return [found for key, item in value.items() if _held_attribute(item) or isinstance(item, torch.nn.Module)
                for found in _tensors_in(f"{path}[{key!r}]", item)]
    if isinstance(value, (tuple, list)):
        return [found for index, item in enumerate(value)
                if _held_attribute(item) or isinstance(item, torch.nn.Module)
                for found in _tensors_in(f"{path}[{index}]", item)]
    return []


def _holds_tensors(value: object) -> bool:
    """A tensor or numeric array, or a tuple, list or dict holding one."""
    return bool(_tensors_in("", value))


def _held_items(entries) -> list[tuple[str, object]]:
    """(path, value) of each tensor or array in ``held_attributes``' entries."""
    return [item for path, _, _, value in entries for item in _tensors_in(path, value)]


def weight_slots(module: torch.nn.Module, harmless: tuple[str, ...] = ()) -> list[tuple[str, dict, str, object]]:
    """(path, the owning module's ``_parameters``, ``_buffers`` or ``_modules`` dict, key,
    object there) of each parameter, buffer and submodule, and (path, instance dict, key,
    tensor) of each tensor kept as a plain attribute (``tensor_attributes``): a weight
    replaced by assignment (``fc.weight = nn.Parameter(w)``, ``register_buffer`` again,
    ``self.scale = other``) or with the submodule that holds it (``model.fc =
    nn.Linear(...)``, timm's ``reset_classifier``, transformers' ``resize_token_embeddings``),
    on the wrapped module or a submodule, is another object in that slot, which the
    dispatch's C++ half sees per call (``TorchDispatch.watch_attributes``)."""
    slots = []
    for prefix, sub in module.named_modules(remove_duplicate=True):
        for registry in (sub._parameters, sub._buffers, sub._modules):
            for key, value in registry.items():
                if value is not None:
                    slots.append((f"{prefix}.{key}" if prefix else key, registry, key, value))
    slots += held_attributes(module, harmless)
    return slots


def is_numeric_array(value: object) -> bool:
    """A numpy array of numbers or bools: forward's ``torch.from_numpy(self.table)`` is a
    constant to an export, as a tensor attribute is. Watched when reassigned (``weight_slots``)
    and digested at save (``held_tensors``); a change in place has no version counter to see."""
    return isinstance(value, np.ndarray) and value.dtype.kind in "biufc"


def _held_attribute(value: object) -> bool:
    """A plain attribute an export holds as a constant tensor: a tensor or a numeric array."""
    return isinstance(value, torch.Tensor) or is_numeric_array(value)


def registry_keys(module: torch.nn.Module) -> list[tuple[str, dict, frozenset]]:
    """(path prefix, dict, its keys) of each ``_parameters``, ``_buffers`` and ``_modules``
    dict of ``module`` and its submodules that holds anything (the dicts ``weight_slots``
    watches)."""
    found = []
    for prefix, sub in module.named_modules(remove_duplicate=True):
        for registry in (sub._parameters, sub._buffers, sub._modules):
            keys = frozenset(key for key, value in registry.items() if value is not None)
            if keys:
                found.append((f"{prefix}." if prefix else "", registry, keys))
    return found


def added_to_registries(registries: list[tuple[str, dict, frozenset]]) -> list[str]:
    """The paths of the parameters, buffers and submodules in ``registries``
    (``registry_keys``, as tuning left them) added since: a submodule appended to a
    Sequential or ModuleList (``append``, ``add_module``), a parameter registered. Forward
    may run it; the graphs were exported without it. (Plain attributes added to a module
    are not counted: forward did not read them when the graphs were exported.)"""
    return [prefix + key for prefix, registry, keys in registries
            for key, value in registry.items() if value is not None and key not in keys]


def state_dict_changes_weights(module: torch.nn.Module, incoming: Mapping, prefix: str = "") -> bool:
    """True when loading ``incoming`` (a state dict, its keys under ``prefix``) into
    ``module`` would change a value: a tensor of another shape, or other values once cast
    to the module's dtype as ``load_state_dict`` casts them. Loading the weights the module
    already has (a checkpoint round trip, ``m.load_state_dict(m.state_dict())``) is no change."""
    current = module.state_dict()
    for key, value in incoming.items():
        if not key.startswith(prefix) or not isinstance(value, torch.Tensor):
            continue
        mine = current.get(key[len(prefix):])
        if mine is None:
            continue  # not this module's: load_state_dict reports it (strict) or skips it
        if mine.shape != value.shape:
            return True
        if not torch.equal(mine, value.detach().to(device=mine.device, dtype=mine.dtype)):
            return True
    return False


#: Values per tensor the digest keeps, evenly spaced over its elements (so a permutation
#: or a re-initialisation that keeps the sums shows).
_DIGEST_SAMPLES = 16
#: Relative tolerance of the float64 sums: a module on another device (or another
#: torch) reduces in another order; any real change of a weight is far above it.
_DIGEST_RTOL = 1e-6
#: Relative tolerance of the order-weighted sums (``_order_sums``), against the sum of
#: absolute values: two rows swapped in a 32000 x 2048 embedding move them by ~1e-7 of it,
#: while float64 reductions in another order differ by ~1e-13.
_ORDER_RTOL = 1e-9
#: Rows (or elements, for 1-D tensors) weighted one by one in ``_order_sums``; beyond it a
#: tensor is weighed in rows of ``_ORDER_ROW`` elements, so its weights stay small.
_ORDER_MAX_ROWS = 1 << 20
_ORDER_ROW = 4096


def _close(a, b, scale_a, scale_b, rtol: float = _DIGEST_RTOL) -> bool:
    """Two digest sums equal within ``rtol`` of the larger scale; non-finite ones (strings)
    must match."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    scale = max(abs(scale_a) if not isinstance(scale_a, str) else 0.0,
                abs(scale_b) if not isinstance(scale_b, str) else 0.0, 1e-300)
    return abs(a - b) <= rtol * scale


def weight_values_digest(module: torch.nn.Module) -> dict[str, list]:
    """A small, comparable digest of the values of ``module``'s state dict: per tensor its
    dtype, shape, float64 sum, float64 sum of absolute values, a few of its values and two
    order-weighted sums (``_order_sums``)
    (``ait.save`` stores it, ``ait.load`` compares it with the module loaded into). One
    reduction per tensor on its own device, one transfer for them all."""
    return _values_digest(module.state_dict(keep_vars=False).items())


def held_tensors(module: torch.nn.Module, harmless: tuple[str, ...] = ()) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) of each tensor forward may read that the state dict leaves out: the
    non-persistent buffers (``register_buffer(..., persistent=False)``, a rotary embedding's
    ``inv_freq`` built from a constructor argument) and the tensors kept as plain
    attributes (``tensor_attributes``) or numpy arrays (``is_numeric_array``, as tensors). A
    load_state_dict does not set them, so a module built with other arguments holds other
    ones, while an export holds them as constants."""
    persistent = set(module.state_dict(keep_vars=True))
    found = [(name, buffer) for name, buffer in module.named_buffers() if name not in persistent]
    return found + [(path, value if isinstance(value, torch.Tensor) else torch.as_tensor(value))
                    for path, value in _held_items(held_attributes(module, harmless))]


def held_values_digest(module: torch.nn.Module, harmless: tuple[str, ...] = ()) -> dict[str, list]:
    """``weight_values_digest`` of ``held_tensors``: what ``ait.save`` records beside the
    weights, and ``ait.load`` compares with the module loaded into."""
    return _values_digest(held_tensors(module, harmless))


def _values_digest(named) -> dict[str, list]:
    names, dtypes, shapes, parts = [], [], [], []
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            continue
        t = tensor.detach()
        if t.is_complex():
            t = torch.view_as_real(t)
        flat = t.reshape(-1)
        n = flat.numel()
        picks = flat[_spread(n, flat.device)] if n else flat
        magnitude = flat.abs() if flat.dtype != torch.bool else flat
        parts.append(torch.cat([torch.sum(flat, dtype=torch.float64).reshape(1),
                                torch.sum(magnitude, dtype=torch.float64).reshape(1),
                                picks.to(torch.float64), _order_sums(t, flat)]).cpu())
        names.append(name)
        dtypes.append(str(tensor.dtype).removeprefix("torch."))
        shapes.append(list(tensor.shape))
    return {name: [dtype, shape, *map(_json_number, part.tolist())]
            for name, dtype, shape, part in zip(names, dtypes, shapes, parts)}


def _order_sums(t: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Two sums that move when values change places: the row sums weighted by a
    pseudo-random weight per row, and the same of the column sums (rows: the leading
    axis, columns: the others flattened). The plain sums keep a permutation and the
    sampled values miss one that spares them (two rows of an embedding swapped, a
    vocabulary remapped). Computed from the row and column sums, so no tensor the size of
    ``t`` is made."""
    n = flat.numel()
    if n == 0:
        return torch.zeros(2, dtype=torch.float64, device=flat.device)
    rows = t.shape[0] if t.dim() >= 2 else n
    if rows <= _ORDER_MAX_ROWS:
        return _weighted_line_sums(flat.reshape(rows, -1), 0)
    # Too many rows to weigh one by one: rows of _ORDER_ROW elements in flat order, the
    # tail (fewer elements) weighed as the rows after them.
    head = n - n % _ORDER_ROW
    sums = _weighted_line_sums(flat[:head].reshape(-1, _ORDER_ROW), 0)
    if head < n:
        sums = sums + _weighted_line_sums(flat[head:].reshape(1, -1), head // _ORDER_ROW)
    return sums


def _weighted_line_sums(matrix: torch.Tensor, first_row: int) -> torch.Tensor:
    """[sum_r w(first_row + r) * rowsum_r, sum_c w(c) * colsum_c] in float64, with w(i) the
    fractional part of i times the golden ratio (distinct, in [0, 1), no period)."""
    def weights(count: int, start: int) -> torch.Tensor:
        index = torch.arange(start, start + count, dtype=torch.float64, device=matrix.device)
        return torch.frac(index * 0.6180339887498949)

    row_sums = torch.sum(matrix, dim=1, dtype=torch.float64)
    column_sums = torch.sum(matrix, dim=0, dtype=torch.float64)
    return torch.stack([torch.sum(row_sums * weights(matrix.shape[0], first_row)),
                        torch.sum(column_sums * weights(matrix.shape[1], 0))])


def _spread(n: int, device) -> torch.Tensor:
    """Up to ``_DIGEST_SAMPLES`` indices evenly spaced over 0..n-1, first and last included,
    in integers: a float32 linspace rounds n - 1 up to n above 2**24 elements (a 32000 x
    2048 embedding), an index out of bounds (a device-side assert on CUDA)."""
    k = min(n, _DIGEST_SAMPLES)
    return torch.arange(k, device=device, dtype=torch.int64) * (n - 1) // max(k - 1, 1)


def _json_number(value: float) -> float | str:
    """``value`` as strict JSON holds it: non-finite values (an attention mask's -inf) as
    the strings "inf", "-inf", "nan" (the manifest's JSON has no Infinity / NaN)."""
    return value if math.isfinite(value) else str(value)


def digest_differences(saved: dict, current: dict) -> list[str]:
    """The names of the tensors whose digests differ between ``saved`` and ``current``
    (``weight_values_digest``), those present in one only included; sorted."""
    differ = []
    for name in sorted(set(saved) | set(current)):
        a, b = saved.get(name), current.get(name)
        if a is None or b is None or a[:2] != b[:2]:
            differ.append(name)
            continue
        (sum_a, abs_a, *picks_a, order_a), (sum_b, abs_b, *picks_b, order_b) = _entry(a), _entry(b)
        if picks_a != picks_b or not (_close(sum_a, sum_b, abs_a, abs_b) and _close(abs_a, abs_b, abs_a, abs_b)):
            differ.append(name)
        elif order_a and order_b and not all(_close(x, y, abs_a, abs_b, _ORDER_RTOL) for x, y in zip(order_a, order_b)):
            differ.append(name)
    return differ


def _entry(entry: list) -> list:
    """[sum, abs sum, *picks, order sums] of a digest entry; order sums [] where it was
    written before they were (an older checkpoint): its length tells, as its shape gives
    the number of picks."""
    numel = math.prod(entry[1]) if isinstance(entry[1], list) else 0
    values = entry[2:]
    picks = min(numel, _DIGEST_SAMPLES)
    if len(values) == 2 + picks + 2:
        return [*values[:-2], values[-2:]]
    return [*values, []]
