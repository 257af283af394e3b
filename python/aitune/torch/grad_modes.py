"""Whether a module's forward computes otherwise under autograd's global modes.

A forward may branch on ``torch.is_grad_enabled()`` (a memory-saving path for training) or
``torch.is_inference_mode_enabled()``. A graph is exported with gradients off and inference
mode off, and computes that branch for every call: a user who calls the tuned module with
gradients on (the default, no ``torch.no_grad()``) would get the other branch's numbers.
The tune runs forward once in each mode on the first sample; where the outputs differ from
the reference, calls in that mode run eagerly (dispatch.py), said once."""

from __future__ import annotations

import contextlib

import torch

#: The modes a call may be in that the graphs were not computed in: "grad" (gradients
#: enabled) and "inference" (torch.inference_mode()).
GRAD = "grad"
INFERENCE = "inference"


@contextlib.contextmanager
def _without_parameter_grads(module: torch.nn.Module):
    """Gradients stay enabled, but no parameter asks for one: forward sees
    is_grad_enabled() true without autograd keeping its activations (a large model's
    memory)."""
    asking = [p for p in module.parameters() if p.requires_grad]
    for parameter in asking:
        _set_requires_grad(parameter, False)
    try:
        yield
    finally:
        for parameter in asking:
            _set_requires_grad(parameter, True)


def _set_requires_grad(parameter: torch.Tensor, flag: bool) -> None:
    # a parameter made under torch.inference_mode() (a model a server loaded there) takes
    # requires_grad=True back only inside it ("Setting requires_grad=True on inference tensor
    # outside InferenceMode is not allowed" failed the tune of such a model, a session-36 probe)
    with torch.inference_mode(parameter.is_inference()):
        parameter.requires_grad_(flag)


def modes_that_change_outputs(module: torch.nn.Module, differs) -> tuple[str, ...]:
    """The modes (``GRAD``, ``INFERENCE``) under which ``module``'s forward computes
    otherwise than the reference (computed with gradients off): ``differs(mode)`` runs eager
    on samples inside ``mode()`` and says how its outputs differ, or None."""
    found = []
    with _without_parameter_grads(module):
        for name, mode in ((GRAD, torch.enable_grad), (INFERENCE, torch.inference_mode)):
            try:
                if differs(mode) is not None:
                    found.append(name)
            except Exception:  # the module refuses the mode (an in-place op on an inference tensor)
                found.append(name)
    return tuple(found)


def mode_of_call(modes: tuple[str, ...]) -> str | None:
    """Which of ``modes`` this call is in, or None (the mode the graphs computed)."""
    if INFERENCE in modes and torch.is_inference_mode_enabled():
        return INFERENCE
    if GRAD in modes and torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
        return GRAD
    return None


def describe(mode: str) -> str:
    return {GRAD: "gradients enabled (no torch.no_grad())", INFERENCE: "torch.inference_mode()"}[mode]

