"""Export of one recorded graph to ONNX with torch.onnx.export (dynamo or trace)."""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import linecache
import logging
import os
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import onnx
import torch

from aitune import _core
from aitune.torch import cache, shape_conditions
from aitune.torch.context import exporters_quiet, run_eagerly
from aitune.torch.graph import RecordedGraph
from aitune.torch.library_logs import routed_to_aitune
from aitune.torch.trace_values import ValueConversions

logger = logging.getLogger("aitune")


class ExportError(_core.AituneError):
    """torch.onnx.export or onnx.checker rejected a graph; the partial files are gone."""


class TraceWarningError(ExportError):
    """While tracing, the model turned a tensor computed from its input values into a
    Python value (control flow, ``int()``, ``.item()``): the graph would bake in what the
    example input gave. The tracer warns of it (``TracerWarning``) among warnings about
    shapes, which the check covers; this is raised only for the value-dependent ones."""


def _listed_sites(sites: dict[tuple[str, int], str], source_of_value: str) -> str:
    """The first five conversion sites as ``file:line: source  (<Tensor.conversion> of a value
    computed from <source_of_value>)`` lines, and how many more there are."""
    lines = []
    for (filename, lineno), conversion in list(sites.items())[:5]:
        source = (linecache.getline(filename, lineno) or "").strip()
        lines.append(f"  {filename}:{lineno}: {source}  "
                     f"({conversion} of a value computed from {source_of_value})")
    more = f"\n  ... and {len(sites) - 5} more" if len(sites) > 5 else ""
    return "\n".join(lines) + more


def _trace_refusal(graph: RecordedGraph, sites: dict[tuple[str, int], str]) -> str:
    return (
        f"trace export of {graph.module_name}/{graph.key}: these lines turn a tensor computed from the input values "
        "into a Python value, which the tracer cannot record; the graph would keep the branch (or number) the "
        "example input gave, for every input:\n" + _listed_sites(sites, "the inputs")
        + "\nHint: write the branch with torch.cond and export with use_dynamo=True, make it static (decided by "
        "shapes or constructor arguments), or accept the risk with "
        "ONNXRuntimeBackendConfig(use_dynamo=False, allow_trace_warnings=True) (shown in the tuning report)"
    )


def _trace_range_refusal(graph: RecordedGraph, sites: dict[tuple[str, int], str]) -> str:
    return (
        f"trace export of {graph.module_name}/{graph.key} over the ranges declared in dynamic_shapes "
        f"({graph.dynamic_shapes.describe()}): these lines turn a value computed from the input shapes into a Python "
        "value, so the graph keeps the branch (or number) of the example's shape for every shape of the range, "
        "and only the recorded shapes are checked:\n" + _listed_sites(sites, "the shapes")
        + "\nHint: export with ONNXRuntimeBackendConfig(use_dynamo=True), where torch.export proves the graph valid "
        "over the declared ranges or names the guard, or leave the axes undeclared; where each line decides alike "
        "over the whole range (a slice bound the tracer records, a branch never taken), accept it with "
        "ONNXRuntimeBackendConfig(use_dynamo=False, allow_trace_warnings=True), which logs the lines"
    )


def same_math_differs(module: torch.nn.Module) -> bool:
    """Whether ``module`` has layers whose eager fast path ``same_math_as_export`` turns off."""
    return any(isinstance(m, torch.nn.MultiheadAttention) for m in module.modules())


@contextlib.contextmanager
def same_math_as_export(module: torch.nn.Module) -> Iterator[None]:
    """PyTorch's multi-head-attention fast path (``nn.MultiheadAttention``,
    ``nn.TransformerEncoder`` in eval) turned off for the duration, restored afterwards,
    where ``module`` has such layers. With a padding mask that path returns zeros at padded
    positions (nested tensors), which the exported graph computes like any other position:
    the model's contract leaves them undefined, so the reference and the export both use
    the regular math."""
    if not same_math_differs(module):
        yield
        return
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


#: transformers' experts kernels (``config._experts_implementation``) with no ONNX form,
#: exported as ``batched_mm`` instead: the same products and weighted sum per token and
#: chosen expert, as plain gathers and batched matmuls. ``grouped_mm`` (the default of
#: transformers' mixture-of-experts models: Mixtral, Qwen2-MoE, OLMoE, GPT-OSS) runs the
#: custom op ``transformers::grouped_mm_fallback`` on the CPU and ``torch._grouped_mm`` on
#: CUDA, neither of which the exporters translate.
_UNEXPORTABLE_EXPERTS = ("grouped_mm",)


@contextlib.contextmanager
def exportable_experts(module: torch.nn.Module) -> Iterator[list[str]]:
    """Each transformers config in ``module`` whose experts implementation has no ONNX form
    (``_UNEXPORTABLE_EXPERTS``) set to ``batched_mm`` for the duration (the export), and
    restored afterwards; yields the switched configs' class names. The candidate is still
    judged against the module as the user runs it."""
    switched: list = []
    seen: set[int] = set()
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is None or id(config) in seen:
            continue
        seen.add(id(config))
        current = getattr(config, "_experts_implementation", None)
        if isinstance(current, str) and current in _UNEXPORTABLE_EXPERTS:
            switched.append((config, current))
    try:
        for config, _ in switched:
            config._experts_implementation = "batched_mm"
        yield [type(config).__name__ for config, _ in switched]
    finally:
        for config, current in reversed(switched):
            config._experts_implementation = current


class _FlatModule(torch.nn.Module):
    """The graph's module seen as ``forward(*tensors) -> tuple[tensors]``, so both exporters
    get plain tensor lists in recording order, named like the recording, whatever the
    nesting (dicts, dataclasses, ModelOutput) of the real inputs and outputs."""

    def __init__(self, graph: RecordedGraph):
        super().__init__()
        self.inner = graph.module
        object.__setattr__(self, "graph", graph)  # not a submodule
        self.training = graph.module.training  # do not flip the user's module into eval

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        conversions = getattr(self, "conversions", None)
        if conversions is not None:
            conversions.note_inputs(tensors)
        args, kwargs = self.graph.call_arguments(tensors)
        # forward, not __call__: the module's own hooks run around the graph (ait.Module
        # shares them), never inside it, or they would apply twice
        return tuple(self.graph.output_tensors(self.inner.forward(*args, **kwargs)))


def example_inputs(graph: RecordedGraph, spec: _core.GraphSpec) -> list[torch.Tensor]:
    """The recorded sample with the largest batch; when that batch is 1, its batch axes
    are repeated to 2 so dynamo does not specialise the batch dimension to 1."""
    sample = max(graph.samples, key=lambda s: (s.batch_size, sum(t.numel() for t in s.inputs)))
    return _batch_of_two(list(sample.inputs), spec)


def _dynamo_shapes(spec: _core.GraphSpec, declared: list | None = None) -> tuple:
    """``dynamic_shapes`` for ``forward(*tensors)``: one Dim shared by every batch axis,
    ``Dim.AUTO`` for the other axes that varied while recording, and for an axis the user
    declared a range of (``ait.Module(dynamic_shapes=...)``, ``declared``: (tensor name,
    DeclaredAxis) pairs) a Dim of that range, so torch.export proves the graph valid over
    all of it or refuses; axes declared with one ``torch.export.Dim`` share it."""
    from torch.export import Dim

    def bounded(name: str, axis) -> Dim:
        if axis.dim is not None:
            return axis.dim  # the user's own Dim, derived ones included
        return Dim(name, min=axis.min, max=None if axis.max < 0 else axis.max)

    ranges = {(name, axis.axis): axis for name, axis in declared or []}
    batch_axis = next((axis for (name, index), axis in ranges.items()
                       for t in spec.inputs if t.name == name and t.batch_axis == index), None)
    if batch_axis is not None:
        batch = bounded("batch", batch_axis)
    elif ranges:
        # Captured by torch.export.export (not refined): an undeclared batch keeps the recorded
        # range, which torch.onnx.export's refinement would narrow it to anyway (a guard on a
        # large batch, a UNet's `batch <= 63`, is no refusal of the declared axes).
        batch_specs = [t for t in spec.inputs if t.batch_axis is not None]
        top = max((t.max_shape[t.batch_axis] for t in batch_specs), default=-1)
        batch = Dim("batch", min=1, max=None if top < 0 else max(top, 2))
    else:
        batch = Dim("batch", min=1)
    shapes = []
    for tensor_spec in spec.inputs:
        axes = {axis: Dim.AUTO for axis in tensor_spec.dynamic_axes()}
        for (name, index), axis in ranges.items():
            if name == tensor_spec.name and index != tensor_spec.batch_axis and axis.min != axis.max:
                axes[index] = bounded(f"{name}_{index}", axis)
        if tensor_spec.batch_axis is not None:
            axes[tensor_spec.batch_axis] = batch
        shapes.append(axes or None)
    return (tuple(shapes),)


_VALUE_BRANCH_HINT = (
    "where the cause is control flow on a tensor's value (`if x.sum() > 0:`), write it with torch.cond "
    "or make the branch static (decided by shapes or constructor arguments); "
    "ONNXRuntimeBackendConfig(use_dynamo=False) uses the trace exporter instead, which records only the "
    "branch the example input takes (aitune refuses such traces unless allow_trace_warnings=True)"
)


_MUTATED_CONSTANT_HINT = (
    "forward writes in place a tensor that is neither a parameter nor a registered buffer (a module global, "
    "a tensor kept in a list or a plain object): an ONNX graph cannot write it back, and the trace exporter "
    "would drop the write silently. Keep the update out of forward, register the tensor as a buffer "
    "(register_buffer; its update is then refused as the module's state, naming it), or use "
    "TorchCompileBackend, which keeps the update"
)


_NO_ONNX_FUNCTION_HINT = (
    "the exporter has no ONNX translation for the operator named above (a custom op, or an op on complex "
    "numbers such as a rotary written with torch.view_as_complex, as Llama 4's); write that part with "
    "standard real-valued torch ops (transformers' mixture-of-experts models: aitune already exports "
    "grouped_mm experts as batched_mm; for another kernel load the model with experts_implementation="
    "'batched_mm'), or use TorchCompileBackend, which runs such ops"
)


def _data_dependent(error: BaseException) -> bool:
    """Whether torch.export stopped at a guard on a tensor's value (``if x.max() > 0``,
    transformers' dynamic rotary ``torch.max(position_ids) + 1 > max_seq_len_cached``),
    which no range of shapes decides."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    seen = error
    while seen is not None:
        if isinstance(seen, GuardOnDataDependentSymNode):
            return True
        seen = seen.__cause__
    return False


def _program_over_declared_ranges(graph: RecordedGraph, flat: torch.nn.Module, inputs: tuple, shapes: tuple,
                                  batch_ours: bool = True):
    """torch.export's program of the graph over the declared ranges, captured here rather
    than by ``torch.onnx.export``: its fallback capture (draft export) turns a guard the
    code puts on a declared axis (``if x.shape[1] > 32``) into a specialisation and goes
    on, and the graph would then be silently wrong over part of the range it accepts.
    A guard is refused, naming the ranges and torch.export's reason. Axes declared apart
    with equal ranges that the code requires equal (the ids and mask of one sequence:
    torch.export's suggested fix ``mask_1 = ids_1``) share one Dim and the capture is
    retried; any other fix (a narrower range) is the user's decision, not taken here."""
    deferred = False  # the guards on aitune's own batch Dim kept as asserts (shape conditions)
    for _ in range(8):  # one retry per pair of axes merged, at most
        try:
            # as torch.onnx.export captures: a batch or axis of 1 is not specialised
            with torch.fx.experimental._config.patch(backed_size_oblivious=True):
                return torch.export.export(flat, inputs, dynamic_shapes=shapes, strict=False,
                                           prefer_deferred_runtime_asserts_over_guards=deferred)
        except Exception as error:
            merged = _with_equal_dims_merged(str(error), shapes)
            # A batch range from 1 is captured from 2 where torch.export's only refusal is its
            # `batch != 1` guard (a matmul decomposed another way at batch 1: a prefill with
            # per-row position_ids): aitune's own batch Dim (the recorded range), or a declared
            # one (a Dim the user named "batch") where a recorded sample has batch 1, so the
            # graph is checked there against eager like every sample; without one the refusal
            # stands and says to record one.
            batch_one_checked = batch_ours or any(s.batch_size == 1 for s in graph.samples)
            if merged is None and batch_one_checked:
                merged = _with_batch_above_one(str(error), shapes)
            if merged is None and not deferred and batch_ours and _only_batch_guards(str(error)):
                # The code decides on the batch, which the user did not declare (`if x.shape[0]
                # == 3`): like an export without declared ranges, the decision becomes a shape
                # condition of the graph, not a refusal of the ranges the user did declare.
                deferred, merged = True, shapes
            if merged is None and _data_dependent(error):  # the values decide, not the declared ranges
                raise ExportError(
                    f"ONNX export of {graph.module_name}/{graph.key} refused: the model's code decides on a "
                    f"tensor's value, which no graph over the declared ranges ({graph.dynamic_shapes.describe()}) "
                    f"can: {_summary(error)}\nHint: {_VALUE_BRANCH_HINT}."
                ) from error
            if merged is None:
                batch_one = ("record a sample of batch 1 (ait.tune(..., batch_sizes=[1, ...])): a declared batch "
                             "from 1 is then captured from 2 and checked at 1 against eager, or "
                             if not batch_one_checked and _with_batch_above_one(str(error), shapes) is not None
                             else "")
                raise ExportError(
                    f"ONNX export of {graph.module_name}/{graph.key} refused: the model's code is not valid as one "
                    f"graph over the ranges declared in dynamic_shapes ({graph.dynamic_shapes.describe()}): "
                    f"{_summary(error, limit=10)}\nHint: {batch_one}narrow the declared ranges to the extents the code treats "
                    "alike, or declare an axis the code needs a multiple of as one (`2 * Dim('h', min=4, max=64)` "
                    "for the `% 2 == 0` guard torch.export names), or leave the axis undeclared: the graph then "
                    "accepts the recorded range only."
                ) from error
            shapes = merged
    raise ExportError(f"ONNX export of {graph.module_name}/{graph.key}: torch.export kept asking to merge the "
                      "declared dynamic_shapes axes")


def _program_with_deferred_guards(graph: RecordedGraph, flat: torch.nn.Module, inputs: tuple, shapes: tuple):
    """torch.export's program of the graph over the recorded ranges (no range declared),
    with every decision the model's code takes on a size kept as a runtime assert
    (``prefer_deferred_runtime_asserts_over_guards``) rather than refused or specialised, so
    that shape_conditions reads them all and the sessions refuse the sizes where the graph
    computes another branch (``if x.shape[0] == 3`` exported at a batch of 4). None where
    torch.export cannot capture the graph in one piece (a decision on a tensor's value):
    torch.onnx.export's own capture then goes on as before, its fallback (draft export)
    recording the path the example took, and that is said in the log."""
    try:
        # as torch.onnx.export captures: a batch or axis of 1 is not specialised
        with torch.fx.experimental._config.patch(backed_size_oblivious=True):
            return torch.export.export(flat, inputs, dynamic_shapes=shapes, strict=False,
                                       prefer_deferred_runtime_asserts_over_guards=True)
    except Exception as error:
        logger.warning("%s/%s: torch.export cannot capture the graph in one piece (%s); torch.onnx.export's "
                       "fallback capture records the path the example input takes, which is checked at the "
                       "recorded samples only", graph.module_name, graph.key, _summary(error, limit=2))
        return None


def _conditions_over_other_sides(graph: RecordedGraph, flat: torch.nn.Module, spec: _core.GraphSpec, shapes: tuple,
                                 program, found: list) -> list:
    """``found`` (the conditions the graph was captured under at its example) widened where
    a sample on their other side gives the same graph: ``if 6 <= len <= 7`` exported at 8
    holds where ``len >= 8``, and the sample at 4 violates that, so the engine would leave
    the condition out and 6 and 7 would run the graph, unchecked; captured again at 4 (the
    same graph, under ``len <= 5``) the graph holds where ``len >= 8 or len <= 5``. A sample
    whose capture is another graph (the code took another branch there) leaves ``found`` as
    it is: the engine then leaves out what that sample violates, and the check against eager
    at that sample judges the graph there. At most three more captures."""
    if not found:
        return found
    mine = shape_conditions.fingerprint(program)
    sides = [found]
    for _ in range(3):
        holds = _core.ShapeCondition.from_json(_or_of(sides))
        other = next((s for s in graph.samples if not holds.holds(spec, [list(x.shape) for x in s.inputs])), None)
        if other is None:
            break
        try:
            with torch.fx.experimental._config.patch(backed_size_oblivious=True):
                theirs = torch.export.export(flat, tuple(_batch_of_two(list(other.inputs), spec)), dynamic_shapes=shapes,
                                             strict=False, prefer_deferred_runtime_asserts_over_guards=True)
        except Exception as error:
            logger.info("%s/%s: no second capture at a sample across the export's conditions (%s)",
                        graph.module_name, graph.key, _summary(error, limit=1))
            break
        if shape_conditions.fingerprint(theirs) != mine:
            break  # another branch there: the check at that sample judges the graph
        side, _ = shape_conditions.from_program(theirs, spec)
        sides.append(side)
    if len(sides) == 1:
        return found
    return [_core.ShapeCondition.from_json(_or_of(sides))]


def _or_of(sides: list[list]) -> str:
    """The JSON of ``or`` over ``sides``, each the ``and`` of its conditions."""
    import json

    def conjunction(side: list) -> object:
        trees = [json.loads(c.to_json()) for c in side]
        return trees[0] if len(trees) == 1 else ["and", *trees] if trees else True

    return json.dumps(conjunction(sides[0]) if len(sides) == 1 else ["or", *(conjunction(side) for side in sides)])


def _batch_of_two(tensors: list[torch.Tensor], spec: _core.GraphSpec) -> list[torch.Tensor]:
    """``tensors`` with batch axes of 1 repeated to 2, so dynamo does not specialise the
    batch dimension to 1."""
    for i, tensor_spec in enumerate(spec.inputs):
        axis = tensor_spec.batch_axis
        if axis is not None and tensors[i].shape[axis] < 2:
            tensors[i] = torch.cat([tensors[i]] * 2, dim=axis)
    return tensors


def _only_batch_guards(message: str) -> bool:
    """Whether every range torch.export says the code violates is the batch's (aitune's own
    Dim "batch")."""
    violations = re.findall(r"Not all values of (\w+) = ", message)
    return bool(violations) and all(name == "batch" for name in violations)


def _with_batch_above_one(message: str, shapes: tuple) -> tuple | None:
    """``shapes`` with the undeclared batch Dim from 2 where torch.export's only refusal is
    its guard ``batch != 1`` (torch's matmul decomposition takes another path at batch 1:
    a DecodeStep's rotary over per-row positions), or None. torch.onnx.export's own capture
    of an undeclared batch skips that guard the same way; the recorded batch-1 samples are
    checked against eager as every sample is."""
    from torch.export import Dim

    violations = re.findall(r"Not all values of (\w+) = .*? satisfy the generated guard (.*?)\.?$", message, re.M)
    if not violations or any(name != "batch" or not guard.endswith("!= 1") for name, guard in violations):
        return None
    old = next((d for axes in shapes[0] if axes for d in axes.values() if isinstance(d, Dim) and d.__name__ == "batch"),
               None)
    if old is None or int(old.min) >= 2:
        return None
    # (a Dim's max exceeds its min: a recorded batch of at most 2 is captured over 2..3)
    batch = Dim("batch", min=2, max=None if old.max is None or bool(old.max >= 2**62) else max(int(old.max), 3))
    return (tuple(None if axes is None else {k: batch if v is old else v for k, v in axes.items()}
                  for axes in shapes[0]),)


def _with_equal_dims_merged(message: str, shapes: tuple) -> tuple | None:
    """``shapes`` with the Dims torch.export's suggested fixes declare equal (``a = b``, both
    Dims of ``shapes`` of one range) made one, or None where a fix is anything else."""
    from torch.export import Dim

    dims = {d.__name__: d for axes in shapes[0] if axes for d in axes.values() if isinstance(d, Dim)}
    if "Suggested fixes:" not in message:
        return None
    fixes = []
    for line in message.split("Suggested fixes:", 1)[1].splitlines():
        if not line.strip():
            continue
        match = re.fullmatch(r"\s*(\w+) = (\w+)\s*", line)
        if match is None:
            if re.match(r"\s*\w+ = ", line):
                return None  # a fix other than an equality: a narrower range, a derived dim
            break
        fixes.append(match.groups())
    replace = {}
    for name, other in fixes:
        a, b = dims.get(name), dims.get(other)
        if a is None or b is None or (a.min, a.max) != (b.min, b.max):
            return None
        replace[name] = b
    if not replace:
        return None
    return (tuple(None if axes is None else {axis: replace.get(getattr(d, "__name__", None), d)
                                             for axis, d in axes.items()} for axes in shapes[0]),)


def _trace_axes(spec: _core.GraphSpec) -> dict[str, dict[int, str]]:
    """``dynamic_axes`` for the trace exporter, outputs included (it would fix them)."""
    axes: dict[str, dict[int, str]] = {}
    for tensor_spec in [*spec.inputs, *spec.outputs]:
        named = {axis: f"{tensor_spec.name}_dim{axis}" for axis in tensor_spec.dynamic_axes()}
        if tensor_spec.batch_axis is not None:
            named[tensor_spec.batch_axis] = "batch"
        if named:
            axes[tensor_spec.name] = named
    return axes


@contextlib.contextmanager
def _exporter_output() -> Iterator[None]:
    """While ``exporters_quiet()``: what the exporters print is swallowed, from Python and
    from C++ alike (the trace exporter writes its TorchScript graph, often hundreds of
    kilobytes, straight to file descriptor 1 when it fails). Either way, the ONNX log flag
    of the trace exporter is restored afterwards: torch's ``setup_onnx_logging`` turns it
    on for every export and never back off, so later failures would print their graphs."""
    log_enabled = torch._C._jit_is_onnx_log_enabled()
    try:
        if not exporters_quiet():
            yield
            return
        with _own_records_held(), _native_output_swallowed(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        torch._C._jit_set_onnx_log_enabled(log_enabled)


class _HeldRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _own_records_held() -> Iterator[None]:
    """aitune's own log records of the export (a dropped check, a condition it cannot read)
    held back while the output is swallowed and handed on afterwards: a handler writing to
    the terminal writes to descriptor 2, which points to the scratch file meanwhile, so
    they were lost with the exporters' noise (a session-35 probe)."""
    own = logging.getLogger("aitune")
    held = _HeldRecords()
    handlers, propagate = own.handlers[:], own.propagate
    own.handlers, own.propagate = [held], False
    try:
        yield
    finally:
        own.handlers, own.propagate = handlers, propagate
        for record in held.records:
            own.handle(record)


@contextlib.contextmanager
def _native_output_swallowed() -> Iterator[None]:
    """File descriptors 1 and 2 point to a scratch file for the duration (C++ writes)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with tempfile.TemporaryFile() as sink:
        saved: list[tuple[int, int]] = []
        try:
            for fd in (1, 2):
                copy = os.dup(fd)
                saved.append((fd, copy))
                os.dup2(sink.fileno(), fd)
        except OSError:  # no such descriptor here: nothing to swallow there
            _restore(saved)
            saved = []
        try:
            yield
        finally:
            _restore(saved)


def _restore(saved: list[tuple[int, int]]) -> None:
    for fd, copy in reversed(saved):
        os.dup2(copy, fd)
        os.close(copy)


@contextlib.contextmanager
def _imports_undone_on_interrupt() -> Iterator[None]:
    """The exporters import much on first use (sympy, onnxscript, torch._dynamo's parts).
    Ctrl-C in the middle of such an import leaves half-initialised packages in
    ``sys.modules``: Python drops the package whose ``__init__`` was cut, but keeps the
    submodules it had finished, which are then never bound to the package imported again
    (``module 'sympy' has no attribute 'core'`` on every later export). So on an interrupt
    the modules first imported during the export that are orphaned (an enclosing package
    no longer in ``sys.modules``) or still initialising are forgotten, and the next export
    imports them afresh. Modules imported in full stay: importing one again would run it
    twice, and torch's own refuse that (a ``TORCH_LIBRARY`` namespace registers once)."""
    before = set(sys.modules)
    try:
        yield
    except BaseException as error:
        if not isinstance(error, Exception):
            for name in set(sys.modules) - before:
                if _half_imported(name):
                    sys.modules.pop(name, None)
        raise


def _half_imported(name: str) -> bool:
    """Whether ``sys.modules[name]`` is left over from an import that did not finish: one
    of its enclosing packages is gone from ``sys.modules``, or it is still marked as
    initialising."""
    parts = name.split(".")
    if any(".".join(parts[:i]) not in sys.modules for i in range(1, len(parts))):
        return True
    spec = getattr(sys.modules.get(name), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def export_onnx(
    graph: RecordedGraph,
    spec: _core.GraphSpec,
    path: Path,
    *,
    use_dynamo: bool = True,
    opset_version: int | None = None,
    allow_trace_warnings: bool = False,
    conditions: list | None = None,
) -> Path:
    """Writes ``path`` (plus any external data file beside it) and checks it with
    ``onnx.checker``. The export runs in a scratch directory next to ``path`` and only a
    checked model is moved in, so a failure leaves no partial files behind.

    Refused (``ExportError``): a graph whose forward changed the module's buffers or
    parameters while recording (an ONNX graph cannot write them back), and a trace export
    during which the model's code turned a tensor computed from the input values into a
    Python value (control flow on it: ``TraceWarningError``, see ``trace_values``), unless
    ``allow_trace_warnings``.

    ``conditions``, where given, receives the ShapeConditions the graph was exported under
    (shape_conditions.py): sizes where the model's code takes another branch than the graph
    holds."""
    if graph.mutated_state:
        raise ExportError(
            f"ONNX export of {graph.module_name}/{graph.key} refused: forward changes the module's state "
            f"({', '.join(graph.mutated_state)}), which an ONNX graph cannot write back; the tuned module would "
            "silently stop updating it.\nHint: keep the update out of forward (or out of the module tuned), "
            "tune it in eval() when the update is training-only (BatchNorm statistics), or use "
            "TorchCompileBackend, which keeps the update. A plain Python attribute whose change cannot alter the "
            "outputs (a call counter for logging, a memo of values computed from the weights) can be declared "
            "with ait.Module(..., harmless_attributes=[...]); it then stops changing on tuned calls."
        )
    with cache.writing(f"the ONNX export of {graph.module_name}/{graph.key}", path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".export-", dir=path.parent))
    target = scratch / path.name
    flat = _FlatModule(graph)
    inputs = tuple(example_inputs(graph, spec))
    conversions = ValueConversions()
    object.__setattr__(flat, "conversions", conversions)
    try:
        with torch.no_grad(), run_eagerly(), same_math_as_export(graph.module), warnings.catch_warnings(), \
                _exporter_output(), routed_to_aitune(), _imports_undone_on_interrupt(), \
                exportable_experts(graph.module) as switched_experts:
            if switched_experts:
                logger.info("%s/%s: transformers' experts (%s) exported as batched_mm: their grouped_mm kernel has no "
                            "ONNX form (the same math; the candidate is checked against the module as it runs)",
                            graph.module_name, graph.key, ", ".join(switched_experts))
            # Noise from inside torch about its own internals, not about the model.
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            warnings.filterwarnings("ignore", message=r".*axis name: .* will not be used.*", category=UserWarning)
            # exact_lowerings loads onnxscript's torchlib, as the dynamo export does: imported
            # here, for the exports alone
            from aitune.torch import exact_lowerings

            common = dict(input_names=graph.input_names, output_names=graph.output_names,
                          opset_version=opset_version)
            if use_dynamo:
                declared = graph.dynamic_shapes.for_inputs([t.name for t in spec.inputs])
                shapes = _dynamo_shapes(spec, declared)
                batch_declared = any(t.name == name and t.batch_axis == axis.axis
                                     for name, axis in declared for t in spec.inputs)
                batch_ours = not batch_declared and any(t.batch_axis is not None for t in spec.inputs)
                program = (_program_over_declared_ranges(graph, flat, inputs, shapes, batch_ours)
                           if declared else _program_with_deferred_guards(graph, flat, inputs, shapes))
                if program is not None:
                    checked = [{t.name: list(x.shape) for t, x in zip(spec.inputs, sample.inputs)}
                               for sample in graph.samples]
                    try:
                        found, unreadable = shape_conditions.from_program(program, spec, checked)
                        if not declared:
                            found = _conditions_over_other_sides(graph, flat, spec, shapes, program, found)
                    except Exception as error:  # torch's internals moved: said, never a failed export
                        found, unreadable = [], []
                        logger.warning("%s/%s: the conditions on sizes the export holds under could not be read "
                                       "(%s: %s); the graph is checked at the recorded samples and a crop only",
                                       graph.module_name, graph.key, type(error).__name__, error)
                    if conditions is not None:
                        conditions.extend(found)
                    for text in unreadable:
                        logger.warning("%s/%s: the export holds under `%s`, which aitune cannot evaluate per call; "
                                       "the axes it reads take the sizes of the samples checked against eager alone",
                                       graph.module_name, graph.key, text)
                    if (dropped := _value_assertions(program)):
                        _warn_dropped_assertions(graph, dropped)
                # (the program's dims renamed after the shapes' own: "batch", as a direct export names it)
                # (aten ops whose torchlib translation computes other numbers, and the optimizer's
                # no-op rules made exact: exact_lowerings.py)
                with exact_lowerings.exact_identity_constants():
                    torch.onnx.export(flat if program is None else program, inputs, str(target), dynamo=True,
                                      dynamic_shapes=None if declared else shapes, verbose=False,
                                      custom_translation_table=exact_lowerings.translation_table(), **common)
            else:
                if graph.dynamic_shapes:
                    logger.warning("%s/%s: the trace exporter (use_dynamo=False) cannot prove the graph valid over "
                                   "the dynamic_shapes ranges (%s); a line deciding on a shape is refused; the graph is checked at the recorded shapes and a crop",
                                   graph.module_name, graph.key, graph.dynamic_shapes.describe())
                with warnings.catch_warnings(), conversions, exact_lowerings.exact_trace_symbolics():
                    # (the trace exporter is chosen on purpose here)
                    warnings.simplefilter("ignore", DeprecationWarning)
                    # The tracer's "Converting a tensor to a Python boolean might cause the trace
                    # to be incorrect": `conversions` tells the conversions of input values (refused,
                    # or logged where allowed) from those of shapes (the samples' check covers them).
                    warnings.simplefilter("ignore", torch.jit.TracerWarning)
                    torch.onnx.export(flat, inputs, str(target), dynamo=False, dynamic_axes=_trace_axes(spec),
                                      **common)
                if conversions.assertions:
                    _warn_dropped_assertions(graph, [f"{file}:{line}: {(linecache.getline(file, line) or '').strip()}"
                                                     for file, line in conversions.assertions])
                if conversions.sites and not allow_trace_warnings:
                    raise TraceWarningError(_trace_refusal(graph, conversions.sites))
                declared = graph.dynamic_shapes.for_inputs([t.name for t in spec.inputs])
                if declared and conversions.shape_sites:
                    if not allow_trace_warnings:
                        raise TraceWarningError(_trace_range_refusal(graph, conversions.shape_sites))
                    logger.warning("%s (allowed: allow_trace_warnings=True)",
                                   _trace_range_refusal(graph, conversions.shape_sites).split("\nHint:")[0])
        onnx.checker.check_model(str(target))
        for old in path.parent.glob(f"{path.name}*"):  # stale model and external data
            old.unlink()
        for produced in scratch.iterdir():
            os.replace(produced, path.parent / produced.name)
    except (TraceWarningError, ExportError):
        raise
    except Exception as error:
        if (refusal := cache.file_system_error(error, cache.WRITE_REFUSALS)) is not None:  # where, not the model
            raise cache.io_error(f"the ONNX export of {graph.module_name}/{graph.key}", path.parent, refusal) \
                from error
        missing = cache.file_system_error(error, frozenset({errno.ENOENT}))
        if missing is not None and os.fsdecode(missing.filename or "").startswith(os.fspath(path.parent)):
            # A file of the export's own directory gone: the cache was removed under the tune
            # (not the model's control flow, which the hint below would blame).
            raise cache.io_error(f"the ONNX export of {graph.module_name}/{graph.key} (its directory was removed "
                                 "while it was written)", path.parent, missing) from error
        summary = _summary(error)
        if "No ONNX function found for" in summary:  # not a value branch: an operator the exporter lacks
            hint = _NO_ONNX_FUNCTION_HINT
        elif "is mutated in the forward method" in summary:  # torch.export: a constant written in place
            hint = _MUTATED_CONSTANT_HINT
        elif use_dynamo:
            hint = _VALUE_BRANCH_HINT
        else:
            hint = "try ONNXRuntimeBackendConfig(use_dynamo=True) for the torch.export-based exporter"
        exporter = "dynamo" if use_dynamo else "trace"
        raise ExportError(
            f"ONNX export ({exporter}) of {graph.module_name}/{graph.key} failed: {summary}\nHint: {hint}."
        ) from error
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if conversions.sites:  # allowed: said in the log (the report names allow_trace_warnings=True in the backend)
        logger.warning("%s; exported anyway (allow_trace_warnings=True)", _trace_refusal(graph, conversions.sites))
    return path


def release_capture_state() -> None:
    """Lets go of what torch's capture leaves behind after an export: its map from fake
    tensors to graph nodes (module-level, cleared only by the next capture) and the rng
    decomposition's state tracker (class attributes) keep the capture's FakeTensorMode alive,
    whose converter holds weak references to the model's weights. torch.utils.swap_tensors
    refuses a tensor with a weak reference, so under
    ``torch.__future__.set_swap_module_params_on_conversion(True)`` a tuned module's
    ``.to()`` and ``load_state_dict`` raised "Couldn't swap Linear.weight". Private names of
    torch, looked up defensively: where they moved, nothing is done (the flag's users alone
    are affected). Called once at the end of ait.tune, when no frame of the tune holds a
    captured program any more."""
    try:
        from torch.fx.experimental import proxy_tensor

        leftover = getattr(proxy_tensor, "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT", None)
        if isinstance(leftover, dict):
            leftover.clear()
        from torch._decomp.decompositions_for_rng import PhiloxStateTracker

        PhiloxStateTracker.reset()
    except (ImportError, AttributeError):
        return
    gc.collect()  # the fake mode sits in reference cycles: freed (with its weak references) now


#: torch.export's runtime assertions; the ONNX exporter drops them (ONNX has no assertion op).
_ASSERTIONS = ("aten._assert_scalar.default", "aten._assert_async.msg", "aten._assert_async.default")
#: Where a value of the input becomes a Python number: an assertion on it checks values, not shapes.
_SCALAR_READS = ("aten.item.default", "aten._local_scalar_dense.default")


def _warn_dropped_assertions(graph: RecordedGraph, lines: list[str]) -> None:
    logger.warning("%s/%s: the ONNX graph drops %d check(s) of input values that forward makes (ONNX has no "
                   "assertion): where eager raises for an input that fails one, the tuned module computes a result "
                   "instead; inputs that pass them compute the same:\n%s",
                   graph.module_name, graph.key, len(lines), "\n".join(f"  {line}" for line in lines))


def _value_assertions(program) -> list[str]:
    """The model's own source lines of each runtime assertion on input values in ``program``
    (``torch._check(ids.min().item() >= 0)``, ``torch._assert_async(ids.max() < n)``), which
    the ONNX graph does not keep. Assertions on sizes are left out: the graph's shape
    conditions and the input spec check those per call."""
    lines: list[str] = []
    for node in program.graph.nodes:
        if node.op != "call_function" or str(node.target) not in _ASSERTIONS:
            continue
        if str(node.target) == "aten._assert_scalar.default" and not _reads_a_value(node):
            continue
        trace = (node.meta.get("stack_trace") or "").strip().splitlines()
        where = f"{trace[-2].strip()}: {trace[-1].strip()}" if len(trace) >= 2 else str(node.args[-1])
        if where not in lines:
            lines.append(where)
    return lines


def _reads_a_value(node) -> bool:
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if str(current.target) in _SCALAR_READS:
            return True
        pending.extend(current.all_input_nodes)
    return False


def _summary(error: BaseException, limit: int = 6) -> str:
    """The root cause of an exporter error in a few lines, and the model's line where torch
    names it ("The following call raised this error"): torch wraps the real reason (e.g. a
    data-dependent guard) in pages of generic advice and colour codes."""
    root = error
    while root.__cause__ is not None:
        root = root.__cause__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(root)).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    kept = lines[:limit]
    # torch.export names the model's line after pages of generic advice: keep it
    for index, line in enumerate(lines[limit:-1], start=limit):
        if line.strip().startswith("The following call raised this error"):
            kept += lines[index:index + 2]
            break
    lines = kept
    prefix = f"{type(error).__name__}: " if root is not error else ""
    return f"{prefix}{type(root).__name__}: " + "\n".join(lines)


def onnx_io_names(path: Path) -> tuple[list[str], list[str]]:
    """Input names (initializers excluded) and output names of an ONNX file, read
    without loading external weights."""
    model = onnx.load(str(path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers], [o.name for o in model.graph.output]


def separate_consumed_outputs(model: onnx.ModelProto) -> int:
    """Gives every graph output that other nodes also read a producer of its own: the
    node's result is renamed (``<name>_inner``, read by those nodes) and an Identity makes
    the output from it. Returns how many outputs it separated.

    Why: fp16 converters keeping the I/O types (``keep_io_types``) put a Cast to float32
    between an output's fp16 producer and the output, but leave the nodes that read the
    output reading that float32 name while typing their own results fp16: a BERT's pooler
    Gathers row 0 of ``last_hidden_state``, an output, and the converted model is refused
    at load (``Type (tensor(float16)) of output arg (select) of node (node_select) does
    not match expected type (tensor(float))``, issue 28). Separated, the Cast feeds only
    the output and the nodes read the fp16 tensor."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    read = {name for node in graph.node for name in node.input} & outputs
    separated = 0
    taken = {name for node in graph.node for name in (*node.input, *node.output)}
    for node in list(graph.node):
        for k, name in enumerate(node.output):
            if name not in read:
                continue
            inner = f"{name}_inner"
            while inner in taken:
                inner += "_"
            taken.add(inner)
            node.output[k] = inner
            for consumer in graph.node:
                for j, value in enumerate(consumer.input):
                    if value == name:
                        consumer.input[j] = inner
            for info in graph.value_info:
                if info.name == name:
                    info.name = inner
            graph.node.append(onnx.helper.make_node("Identity", [inner], [name], name=f"{inner}_to_output"))
            separated += 1
    return separated


def _drop_duplicate_nodes(model: onnx.ModelProto) -> int:
    """Removes nodes identical to an earlier one (same name, operator, inputs, outputs and
    attributes) and returns how many. Why: onnxruntime.transformers' converter adds one
    ``<weight>_cast_to_fp32_node`` per blocked consumer of a weight that other nodes read in
    fp16 (a LayerNorm weight also read by a Mul: GPT-2, DistilBERT), and ONNX Runtime
    refuses the model ("two nodes with same node name"); the copies compute the same value."""
    seen: set[bytes] = set()
    kept = []
    for node in model.graph.node:
        key = node.SerializeToString(deterministic=True)
        if key not in seen:
            seen.add(key)
            kept.append(node)
    dropped = len(model.graph.node) - len(kept)
    if dropped:
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return dropped


def _drop_fp16_round_trips(model: onnx.ModelProto) -> int:
    """The converter casts every value between two nodes kept in fp32 to fp16 and back
    (Cast to fp16, Cast to fp32): the value is rounded to fp16 although both nodes compute
    in fp32. Consumers of such a round trip read the original fp32 value instead (the
    unused Casts are left for ONNX Runtime to drop); so does the Cast making a graph output
    (keep_io_types) from a node kept in fp32. So a model keeping every node in fp32 computes
    exactly what the fp32 model does. Returns the round trips bypassed."""
    to = {n.output[0]: n for n in model.graph.node if n.op_type == "Cast" and n.output}

    def cast_to(node) -> int | None:
        return next((a.i for a in node.attribute if a.name == "to"), None)

    outputs = {o.name for o in model.graph.output}
    bypass = {}
    for name, node in to.items():
        source = to.get(node.input[0])
        if cast_to(node) == onnx.TensorProto.FLOAT and source is not None \
                and cast_to(source) == onnx.TensorProto.FLOAT16:
            if name in outputs:
                # The output's own Cast reads the fp32 value (a Cast to float of a float):
                # an output computed in fp32 (a kept LM head) is not rounded to fp16 on the way out.
                node.input[0] = source.input[0]
            bypass[name] = source.input[0]
    for node in model.graph.node:
        for i, value in enumerate(node.input):
            if value in bypass:
                node.input[i] = bypass[value]
    return len(bypass)


def convert_to_fp16(source: Path, target: Path, *, op_block_list: list[str] | None = None,
                    node_block_list: list[str] | None = None) -> Path:
    """An fp16 copy of an exported model for the CUDA provider's fp16 candidate: weights
    and arithmetic in fp16, inputs and outputs kept in their original dtypes (Casts at
    the edges), so callers and the correctness check see the same interface. Uses
    onnxconverter-common's converter; ImportError when it is not installed. Written to a
    temporary sibling first, so a failed conversion leaves no half-written model.
    ``op_block_list`` / ``node_block_list``: operator types / node names kept in fp32
    (None: the converter's default operator list, no node). With block lists the
    conversion is onnxruntime.transformers' fork of the same converter (same arguments):
    onnxconverter-common 1.16's leaves a blocked node's input Cast out where blocked nodes
    are adjacent (a model that names a value nothing produces)."""
    model = onnx.load(str(source))
    separate_consumed_outputs(model)
    if op_block_list is None and node_block_list is None:
        from onnxconverter_common import float16

        converted = float16.convert_float_to_float16(model, keep_io_types=True)
    else:
        converted = convert_keeping(model, op_block_list or [], node_block_list or [])
    return save_converted(converted, target)


def convert_keeping(model: onnx.ModelProto, op_block_list: list[str], node_block_list: list[str], *,
                    shapes_inferred: bool = False) -> onnx.ModelProto:
    """The fp16 conversion keeping operator types / node names in fp32 (onnxruntime.transformers'
    converter, keep_io_types), cleaned of the converter's duplicated Casts and fp16 round
    trips between kept nodes. ``model`` has had ``separate_consumed_outputs``. The converter
    first infers shapes on a copy (a serialisation round trip, the costliest part of a
    conversion); ``shapes_inferred=True`` says ``model`` already went through
    ``onnx.shape_inference.infer_shapes``, and then ``model`` itself is converted (pass a
    copy where it is needed again)."""
    from onnxruntime.transformers import float16

    converted = float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=op_block_list,
                                                 node_block_list=node_block_list, disable_shape_infer=shapes_inferred)
    _drop_duplicate_nodes(converted)
    _drop_fp16_round_trips(converted)
    return converted


def save_converted(converted: onnx.ModelProto, target: Path) -> Path:
    """Writes a converted model to ``target`` through a temporary sibling, so a failed save
    leaves no half-written model; weights go to a side file past protobuf's 2 GB limit."""
    scratch = target.with_name(target.name + ".partial")
    # One serialisation both measures the model and is what is written: ByteSize() costs
    # as much as serialising (0.55 s of a 2.8 s search step on a 440 MB Llama).
    try:
        data = converted.SerializeToString()
    except Exception:  # past protobuf's 2 GB limit (onnx.save below raises anything else again)
        data = None
    if data is None or len(data) > 1_800_000_000:  # protobuf's 2 GB limit: weights go to a side file
        onnx.save(converted, str(scratch), save_as_external_data=True, location=target.name + ".data")
    else:
        scratch.write_bytes(data)
    os.replace(scratch, target)
    return target
