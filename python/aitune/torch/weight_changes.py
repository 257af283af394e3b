"""Whether a module's weights changed under its tuned graphs: a tuned graph that holds its
own copy of the weights (an ONNX model's initializers, a half-precision copy) computes the
old model once the module's weights change, so the module must know when they do
(``load_state_dict``, ``.to()`` / ``.half()`` and the like; ait.Module acts on it)."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def weights_fingerprint(module: torch.nn.Module) -> tuple:
    """What changes when ``_apply`` (``.to()``, ``.cuda()``, ``.half()``, ...) replaces or
    converts a parameter or buffer: its storage, dtype and device, by name."""
    return tuple(
        (name, tensor.data_ptr(), tensor.dtype, tensor.device)
        for name, tensor in (*module.named_parameters(), *module.named_buffers())
        if tensor is not None
    )


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
