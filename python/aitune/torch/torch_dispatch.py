"""How torch tensors reach the engine on every tuned call: torch's current CUDA stream
as a raw handle, and the engine's C++ hot path (``_core.TorchDispatch``) bound to
torch's DLPack converters."""

from __future__ import annotations

import torch
from torch.nn.modules import module as _nn_module

from aitune import _core
from aitune.torch import context

# torch.cuda.current_stream(device).cuda_stream builds a Stream object per call (~9 us on
# the H200's host, measured by benchmarks/forward_overhead.py); torch's own compiled code
# reads the raw handle with this private call. Fall back where a torch build lacks it.
current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream
)

# The C-level converters: torch.utils.dlpack.from_dlpack is a Python function that
# probes for __dlpack__ before calling this one (~0.5 us per output on a small model).
_to_dlpack = torch._C._to_dlpack
_from_dlpack = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack


# A call may skip the Python path only where nn.Module.__call__ would go straight to
# forward (no hooks, no compiled call, no JIT tracing) and aitune's forward would dispatch
# (not recording for ait.tune, not inside run_eagerly()). torch fills the global hook
# dicts in place, so they are bound once; the module's own are read per call.
_GUARDS = dict(
    global_dicts=[
        _nn_module._global_forward_pre_hooks,
        _nn_module._global_forward_hooks,
        _nn_module._global_backward_pre_hooks,
        _nn_module._global_backward_hooks,
    ],
    context_vars=[context.session_var, context.eager_var],
    calls=[torch._C._get_tracing_state],
    attributes=["_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks", "_compiled_call_impl"],
)


def new_dispatch() -> _core.TorchDispatch:
    """An empty hot path for one ait.Module (its tuned graphs add routes); calls it does
    not serve go to nn.Module.__call__."""
    return _core.TorchDispatch(
        _to_dlpack, _from_dlpack, torch.Tensor, current_raw_stream, torch.nn.Module.__call__, **_GUARDS
    )
