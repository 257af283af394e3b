"""Eager PyTorch at a reduced precision (TF32, fp16 / bf16 autocast) on the recorded
samples: the yardstick of the engine's calibrated acceptance (calibration.hpp), which
judges a candidate at precision P against the error eager itself makes at P."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from aitune import _core
from aitune.torch.graph import RecordedGraph

_AUTOCAST = {_core.Precision.FP16: torch.float16, _core.Precision.BF16: torch.bfloat16}


@contextlib.contextmanager
def allow_tf32(enabled: bool) -> Iterator[None]:
    """TF32 for CUDA matmuls and convolutions on or off (``torch.backends.cuda.matmul`` /
    ``torch.backends.cudnn.allow_tf32``) for the block, the user's settings restored
    after. The one place aitune sets these flags: eager at TF32 here, the exact float32
    reference (``graph_tuning.exact_float32``), a torch.compile candidate's fp32 / tf32."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def _precision_context(device_type: str, precision: _core.Precision):
    """The context eager runs at ``precision`` in, or a str saying why it cannot here."""
    if precision == _core.Precision.TF32:
        if device_type != "cuda":
            return f"TF32 is a CUDA setting; on {device_type} eager computes float32 exactly"
        return allow_tf32(True)
    dtype = _AUTOCAST.get(precision)
    if dtype is None:
        return f"no eager counterpart of {_core.precision_name(precision)}"
    if not torch.amp.is_autocast_available(device_type):
        return f"torch {torch.__version__} has no autocast on {device_type}"
    return torch.autocast(device_type, dtype=dtype)


def eager_outputs_at(graph: RecordedGraph, precision: _core.Precision) -> list[list[torch.Tensor]] | str:
    """Per sample, eager's outputs at ``precision`` in host memory, cast to the reference's
    dtypes (what the engine compares); or a str saying why eager cannot run at it here."""
    context = _precision_context(graph.device.type, precision)
    if isinstance(context, str):
        return context
    name = _core.precision_name(precision)
    outputs = []
    try:
        with torch.no_grad(), context:
            for sample in graph.samples:
                got = graph.run_eager(sample.inputs)
                outputs.append([t.detach().to(ref.dtype).cpu().contiguous() for t, ref in zip(got, sample.outputs, strict=True)])
    except Exception as error:  # the module refuses this precision (an op without a kernel at it)
        return f"eager at {name} raised {type(error).__name__}: {error}"
    return outputs
