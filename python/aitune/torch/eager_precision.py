"""Eager PyTorch at a reduced precision (TF32, fp16 / bf16 autocast) on the recorded
samples: the yardstick of the engine's calibrated acceptance (calibration.hpp), which
judges a candidate at precision P against the error eager itself makes at P."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from aitune import _core
from aitune.torch.context import run_eagerly
from aitune.torch.flatten import dtype_name
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


def _as_recorded(got, recorded) -> list[torch.Tensor]:
    """Eager's outputs in host memory at the recorded outputs' dtypes (what the engine compares)."""
    return [t.detach().to(ref.dtype).cpu().contiguous() for t, ref in zip(got, recorded, strict=True)]


def eager_outputs_at(graph: RecordedGraph, precision: _core.Precision) -> list[list[torch.Tensor]] | str:
    """Per sample, eager's outputs at ``precision`` in host memory, cast to the reference's
    dtypes (what the engine compares); or a str saying why eager cannot run at it here.

    A module that already computes in fp16 / bf16 (``model.half()``, an LLM loaded with
    ``torch_dtype=float16``) is its own reference at that precision (and at TF32, which
    does not touch fp16 matmuls): autocast there gives the reference back, an error of 0,
    and a calibrated bound of 0 that rejects every candidate, even torch.compile of the
    same module (seen on the H200 with a Llama decode step in fp16). What that precision
    costs this network is then measured against the module run in float32 (its floating
    parameters, buffers and inputs upcast for the run, TF32 off): the candidates are judged
    against the error fp16 itself brings to it, as for a float32 module."""
    own = module_float_dtype(graph.module)
    if precision == _core.Precision.STRICT:
        return _wider_outputs(graph, own)
    if own in _AUTOCAST.values() and (precision == _core.Precision.TF32 or _AUTOCAST.get(precision) == own):
        return _upcast_outputs(graph, own)
    context = _precision_context(graph.device.type, precision)
    if isinstance(context, str):
        return context
    name = _core.precision_name(precision)
    outputs = []
    try:
        with torch.no_grad(), context:
            for sample in graph.samples:
                got = graph.run_eager(sample.inputs)
                outputs.append(_as_recorded(got, sample.outputs))
    except Exception as error:  # the module refuses this precision (an op without a kernel at it)
        return f"eager at {name} raised {type(error).__name__}: {error}"
    return outputs


def eager_outputs_for(graph: RecordedGraph, capsules) -> list[torch.Tensor] | str:
    """Eager's outputs for inputs the engine made (DLPack capsules of host tensors, graph
    input order; the batch search's sample tiled to a wider batch), moved to where the
    recorded inputs live, in host memory at the recorded outputs' dtypes; or a str saying
    why eager could not run them (out of memory at that batch), or why the batch range must
    not widen: forward's outputs that are no tensors (a flag ``x.shape[0] > 2``) differ from
    the recorded calls' at that batch or at the smallest batch the range would widen to,
    and a graph returns the recorded ones at every batch it takes."""
    first = graph.samples[0]
    try:
        inputs = [torch.from_dlpack(capsule).to(device=recorded.device, copy=True)
                  for capsule, recorded in zip(capsules, first.inputs, strict=True)]
        axes = [tensor.batch_axis for tensor in graph.graph_spec().inputs]
        with torch.no_grad():
            got = _output_tensors_or_why(graph, inputs, axes)
            # the smallest widened batch too (cropped on the batch axes): a value that alternates
            # with the batch (x.shape[0] % 2 == 0) can be the recorded one at the widest
            smallest = max(s.batch_size for s in graph.samples) + 1
            if not isinstance(got, str) and smallest < _batch_of(inputs, axes):
                cropped = [t if axis is None else t.narrow(axis, 0, smallest)
                           for t, axis in zip(inputs, axes, strict=True)]
                if isinstance(why := _output_tensors_or_why(graph, cropped, axes), str):
                    return why
        return got if isinstance(got, str) else _as_recorded(got, first.outputs)
    except Exception as error:
        return f"eager raised {type(error).__name__}: {error}"


def _output_tensors_or_why(graph: RecordedGraph, inputs: list[torch.Tensor],
                           axes: list[int | None]) -> list[torch.Tensor] | str:
    """Eager's output tensors on ``inputs``, or a str where its other outputs (numbers,
    flags, structure) differ from the recorded calls' (the tensors alone do not show it)."""
    args, kwargs = graph.call_arguments(inputs)
    with run_eagerly():
        outputs = graph.module.forward(*args, **kwargs)
    if difference := graph.other_outputs(outputs):
        return (f"at batch {_batch_of(inputs, axes)} forward returns outputs other than the recorded calls' "
                f"({difference}), and a graph returns the recorded values of outputs that are no tensors at every "
                "batch it takes")
    return graph.output_tensors(outputs)


def _batch_of(inputs: list[torch.Tensor], axes: list[int | None]) -> int:
    return next((int(t.shape[axis]) for t, axis in zip(inputs, axes, strict=True) if axis is not None), 0)


def module_float_dtype(module: torch.nn.Module) -> torch.dtype | None:
    """The floating dtype holding most of ``module``'s parameter elements (None: none)."""
    counts: dict[torch.dtype, int] = {}
    for parameter in module.parameters():
        if parameter.is_floating_point():
            counts[parameter.dtype] = counts.get(parameter.dtype, 0) + parameter.numel()
    return max(counts, key=counts.get) if counts else None


#: The largest float64 copy of a module's float32 tensors made to measure eager's own
#: error (``_wider_outputs``): beyond it the strict table decides alone.
WIDER_COPY_LIMIT_BYTES = 4 << 30


def _wider_outputs(graph: RecordedGraph, own: torch.dtype | None) -> list[list[torch.Tensor]] | str:
    """The strict yardstick (calibration_yardstick): the module run one width wider than it
    computes (float32 -> float64, fp16 / bf16 -> float32), whose distance from the reference
    is eager's own rounding error; asked only where a strict candidate fails the table."""
    if own is None:  # no floating parameters (a distance, a normalisation): its floating inputs' dtype
        own = next((t.dtype for t in graph.samples[0].inputs
                    if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
        if own is None:
            return "the module has no floating parameters or inputs to run wider"
    wider = torch.float64 if own == torch.float32 else torch.float32 if own in _AUTOCAST.values() else None
    if wider is None:
        return f"no wider dtype than {dtype_name(own)}"
    size = sum(t.numel() for t in (*graph.module.parameters(), *graph.module.buffers()) if t.dtype == own)
    if size * wider.itemsize > WIDER_COPY_LIMIT_BYTES:
        return (f"a {dtype_name(wider)} copy of the module's {size} "
                f"{dtype_name(own)} elements would take {size * wider.itemsize / 2**30:.1f} GiB, "
                f"above {WIDER_COPY_LIMIT_BYTES / 2**30:.0f} GiB")
    return _upcast_outputs(graph, own, wider, whole=True)


@contextlib.contextmanager
def _constants_of(dtype: torch.dtype, wider: torch.dtype) -> Iterator[None]:
    """While the module runs in ``wider``, ``torch.finfo(wider)`` answers ``dtype``'s limits:
    the run is the module's own computation, only rounded less. Code that reads its dtype's
    limits (``log(p.clamp_min(torch.finfo(p.dtype).tiny))``, ``probs_to_logits``'s eps, a
    mask of ``finfo(dtype).min``) otherwise computed other numbers wider: log(tiny) is -708
    in float64 against -87 in float32, a 621 "error" of eager's own that let a graph off by 5
    pass as within 4x of it (a session-35 probe). Every such limit is exact in ``wider``.
    torch's own modules that keep ``torch.finfo`` as a type when first imported are imported
    before: dynamo's guard types (``common_constant_types``), first imported by a model's
    ``torch.compiler.is_compiling()`` inside this context, kept the function, and every later
    ``torch.compile`` in the process failed ("isinstance() arg 2 must be a type")."""
    import torch._dynamo.utils  # noqa: F401 - (above)

    real = torch.finfo

    def finfo(type=None):  # noqa: A002 - torch.finfo's own parameter name
        if type is None:
            return real()
        return real(dtype if type == wider else type)

    torch.finfo = finfo
    try:
        yield
    finally:
        torch.finfo = real


class _NoNarrowing(TorchDispatchMode):
    """While the module runs wider, a floating dtype narrower than ``wider`` that an op is asked
    for (``h.half()``, ``.to(torch.bfloat16)``, ``.float()`` in a float64 run, autocast's
    casts, ``torch.zeros(..., dtype=torch.float32)``) is ``wider`` instead: a float32 module
    that rounds through fp16 inside its forward computes at fp16 there, and the run that
    measures eager's own error must not round where the module does (it raised "mat1 and mat2
    must have the same dtype" on the ``.float()`` after it, so the candidates were judged by
    the strict table alone and every one was rejected for fp16's rounding, eager's own)."""

    def __init__(self, wider: torch.dtype):
        super().__init__()
        self.wider = wider

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dtype = kwargs.get("dtype")
        if isinstance(dtype, torch.dtype) and _narrower(dtype, self.wider):
            kwargs = {**kwargs, "dtype": self.wider}
        return func(*args, **kwargs)


def _narrower(dtype: torch.dtype, wider: torch.dtype) -> bool:
    """A floating dtype narrower than ``wider``: what the wider run holds in ``wider``."""
    return dtype.is_floating_point and dtype.itemsize < wider.itemsize


def _widened(tensor: torch.Tensor, dtype: torch.dtype, wider: torch.dtype) -> bool:
    """Whether the wider run holds ``tensor`` in ``wider``: the module's own ``dtype``, or a
    floating dtype narrower than ``wider``."""
    return tensor.dtype == dtype or _narrower(tensor.dtype, wider)


def _upcast_outputs(graph: RecordedGraph, dtype: torch.dtype, wider: torch.dtype = torch.float32,
                    whole: bool = False) -> list[list[torch.Tensor]] | str:
    """Per sample, the outputs of ``graph``'s module with its ``dtype`` parameters, buffers
    and inputs in ``wider`` (exact: TF32 off), cast to the reference's dtypes. The module's
    tensors are swapped for ``wider`` copies for the run and put back after, as they were.
    ``whole``: every floating output must come back in ``wider``; one that does not was cast
    back inside ``forward`` (``.float()``), so the run was not wider throughout, and its
    distance from the reference would understate eager's error (a ratio 37x too high, a
    session-34 probe): refused, with the output named."""
    # the module's own dtype and any narrower floating one (an fp16 layer in a float32 module,
    # ``Linear(...).half()`` fed ``h.half()``: with the casts kept wide, its fp16 weights met a
    # float64 input and the run raised, so the table alone rejected a graph more exact than eager)
    swapped = [(t, t.data) for t in (*graph.module.parameters(), *graph.module.buffers()) if _widened(t, dtype, wider)]
    outputs = []
    try:
        for tensor, data in swapped:
            tensor.data = data.to(wider)
        with torch.no_grad(), allow_tf32(False), _constants_of(dtype, wider):
            for sample in graph.samples:
                inputs = [t.to(wider) if isinstance(t, torch.Tensor) and _widened(t, dtype, wider) else t
                          for t in sample.inputs]
                with _NoNarrowing(wider):
                    got = graph.run_eager(inputs)
                if whole and (narrow := next((i for i, (t, ref) in enumerate(zip(got, sample.outputs, strict=True))
                                              if ref.dtype == dtype and t.dtype != wider), None)) is not None:
                    return (f"output {narrow} came back in {dtype_name(got[narrow].dtype)} from the "
                            f"module run in {dtype_name(wider)}: forward casts to a dtype of its own "
                            "inside, so that run is not wider throughout")
                outputs.append(_as_recorded(got, sample.outputs))
    except Exception as error:  # an op without a kernel at that width, a dtype fixed inside, or out of memory
        return (f"the module computes in {dtype_name(dtype)}; running it in "
                f"{dtype_name(wider)} to measure what that costs raised {type(error).__name__}: {error}")
    finally:
        for tensor, data in swapped:
            tensor.data = data
    return outputs
