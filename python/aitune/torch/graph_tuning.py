"""The front end's side of tuning one recorded graph: the engine's one driver
(``_core.drive_tune``, src/core/tuning/tune_driver.cpp) sequences the tune a strategy
(plain data, strategy.py) describes; this hands it the samples, the eager reference and
each backend's candidates (``_FrontEnd``), turns its outcome into a TunedGraph or an
exception, writes the JSON report and logs the summary table."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from aitune import _core
from aitune.torch import cache
from aitune.torch.backend.base import TunedGraph, TuningError
from aitune.torch.backend.onnx_runtime_backend import NumericMismatchError
from aitune.torch.backend.torch_eager import EagerGraph, TorchEagerBackend
from aitune.torch.candidate_isolation import CudaContextLostError
from aitune.torch.context import eager_var
from aitune.torch.eager_precision import allow_tf32, eager_outputs_at, eager_outputs_for
from aitune.torch.grad_modes import describe as describe_mode
from aitune.torch.grad_modes import modes_that_change_outputs
from aitune.torch.evaluation import labelled_metric, metric_number
from aitune.torch.divergence import trace_failed_candidates
from aitune.torch.export import same_math_as_export, same_math_differs
from aitune.torch.graph import RecordedGraph, autocast_enabled
from aitune.torch.interior_shapes import add_interior_sample, probe_indices
from aitune.torch.options import TuneOptions
from aitune.torch.strategy import TuneStrategy
from aitune.torch.valid_positions import ValidPositionsOption
from aitune.torch.valid_positions import batch_first_of
from aitune.torch.valid_positions import mask_like_inputs
from aitune.torch.valid_positions import masks_for as valid_position_masks

logger = logging.getLogger("aitune")

REPORT_FILE = "tune_report.json"
REPORT_PAGE = "tune_report.html"


class NondeterministicModuleError(TuningError):
    """Eager PyTorch gave different outputs for the same inputs on two calls (dropout in
    training mode, torch.rand in forward): it cannot be the reference, so nothing is tuned.
    The message names the modules in training mode, where there are."""


class GlobalHooksTuningError(TuningError):
    """Hooks for every module's forward were registered when ``ait.tune`` was called
    (``torch.nn.modules.module.register_module_forward_hook`` / ``_pre_hook``, a profiler's
    module tracker): the export would run them on every submodule and the graphs keep their
    effect after they are removed. Remove them (``handle.remove()``) and tune again."""


class UnsupportedDTypeTuningError(TuningError, _core.UnsupportedDTypeError):
    """No candidate could be built because the execution provider has no kernel for an
    operator at the model's dtype (a bfloat16 module on ONNX Runtime's CPU provider); each
    candidate's reason names the operator and the dtype and what to do (tune in float32,
    float16 on CUDA, or the torch.compile backend)."""


def _modules_in_training(module: torch.nn.Module) -> list[str]:
    """The modules in training mode, random ones (dropout, RReLU) first, as 'name (Class)'."""
    random = (torch.nn.modules.dropout._DropoutNd, torch.nn.RReLU)  # noqa: SLF001
    named = [(name or "<root>", m) for name, m in module.named_modules() if m.training]
    named.sort(key=lambda item: not isinstance(item[1], random))
    return [f"{name} ({type(m).__name__})" for name, m in named]


def _eager_again_differs(graph: RecordedGraph, expected: list[torch.Tensor],
                         tuner_options: _core.TunerOptions | None, mode=torch.no_grad, sample: int = 0) -> str | None:
    """Runs eager once more on sample ``sample`` (the first by default) inside ``mode()``
    (gradients off, as the reference was computed, unless another mode is asked), the random
    generators put back after the call, and says how its outputs differ from ``expected``
    (that sample's reference, ``eager_nondeterminism``), or None."""
    devices = [graph.device] if graph.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), mode(), exact_float32(), same_math_as_export(graph.module):
        again = [t.detach().cpu().contiguous() for t in graph.run_eager(graph.samples[sample].inputs)]
    names = [o.name for o in graph.graph_spec().outputs]
    # the user's tolerances hold as in the check: a deviation declared acceptable is no refusal
    overrides = {} if tuner_options is None else dict(tolerance=tuner_options.tolerance,
                                                      output_tolerances=tuner_options.output_tolerances)
    return _core.eager_nondeterminism(names, expected, again, _modules_in_training(graph.module), **overrides)


def check_eager_repeatable(graph: RecordedGraph, name: str, expected: list[torch.Tensor],
                           tuner_options: _core.TunerOptions | None = None) -> None:
    """Runs eager once more on the first sample, as the reference was computed, and raises
    ``NondeterministicModuleError`` where the engine finds its outputs differ
    (``eager_nondeterminism``). The random generators are put back after the call."""
    why = _eager_again_differs(graph, expected, tuner_options)
    if why is not None:
        if graph.mutated_state:  # what the outputs may read: named, as the export's refusal would
            why += (f"; the recorded calls changed the module's state ({', '.join(graph.mutated_state)}), which a "
                    "later call reads: keep the update out of forward, or pass that state in and return it")
        raise NondeterministicModuleError(f"{name}: {why}")


#: The most samples the autograd modes are tried on (note_grad_modes).
_GRAD_MODE_SAMPLES = 4


def _refuse_empty_tensors(graph: RecordedGraph, name: str) -> None:
    """A recorded call with an input of 0 elements (a KV cache that starts empty, concatenated
    onto per step) cannot run in any graph, which the engine refused per candidate after an
    export ("aitune runs no tensor of 0 elements"), naming no remedy (a session-37 probe)."""
    for i, sample in enumerate(graph.samples):
        for input_name, tensor in zip(graph.input_names, sample.inputs, strict=False):
            if tensor.numel() == 0:
                count = sum(any(t.numel() == 0 for t in s.inputs) for s in graph.samples)
                raise TuningError(
                    f"{name}: {count} of the {len(graph.samples)} recorded calls give an empty tensor ('{input_name}' "
                    f"{list(tensor.shape)} in call {i}), which no graph runs (aitune runs no tensor of 0 elements); a "
                    "cache that starts empty? Pass None for it on the first step (that call then gets a graph of "
                    "its own, and the steps with a cache this one), or leave such calls out of the data")


def note_grad_modes(graph: RecordedGraph, name: str, references: list[list[torch.Tensor]],
                    tuner_options: _core.TunerOptions | None = None) -> None:
    """Sets ``graph.grad_modes``: the modes (gradients enabled, inference mode) under which
    forward computes otherwise than the reference (grad_modes.py); calls in them run
    eagerly. Said in the log where there are any. Tried on the first sample of each batch size
    and the last sample (at most _GRAD_MODE_SAMPLES; ``references``: every sample's reference):
    on the first alone, a branch that differs only on larger values or batches (a clamp where
    gradients are on, never reached by a small first sample) was served the graph, 3.1 off eager,
    silently (a session-37 probe)."""
    first_of_batch: dict[int, int] = {}
    for i, sample in enumerate(graph.samples):
        first_of_batch.setdefault(sample.batch_size, i)
    tried = list(dict.fromkeys([*first_of_batch.values(), len(graph.samples) - 1]))[:_GRAD_MODE_SAMPLES]

    def differs(mode) -> str | None:
        for i in tried:
            if (why := _eager_again_differs(graph, references[i], tuner_options, mode, i)) is not None:
                return why
        return None

    graph.grad_modes = modes_that_change_outputs(graph.module, differs)
    if graph.grad_modes:
        logger.warning("%s: forward computes otherwise with %s than with gradients off, as the graphs are exported; "
                       "calls made so run eagerly in PyTorch", name,
                       " or ".join(describe_mode(mode) for mode in graph.grad_modes))


def _progress_bar(total: int, description: str, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience; the log has the same steps
        return contextlib.nullcontext(None)
    # disable=None: no bar unless stderr is a terminal.
    return tqdm(total=total, desc=description, unit="candidate", leave=False, disable=None if enabled else True)


def _write_report(graph: RecordedGraph, report: _core.TuneReport) -> Path:
    """``<cache>/<module>/<graph>/tune_report.json`` and, beside it, the same report as a
    page (``tune_report.html``), each replaced atomically. Both are written first in a
    run directory of this process (``cache.staging_dir``), where another process's
    ``clear_cache`` or ``aitune cache clean`` leaves them, and a kill leaves them for the
    next sweep."""
    directory = cache.module_dir(graph.module_name) / graph.key
    path = directory / REPORT_FILE
    with cache.writing("the tuning report", directory), cache.staging_dir(directory) as staging:
        # Both written before either is put in place: a disk that fills on the second left
        # the page of a failed tune, claiming its winner, with no report beside it. Then the
        # page first: a report file never names a page older than itself.
        written = ((REPORT_PAGE, report.to_html()), (REPORT_FILE, report.to_json()))
        for name, text in written:
            (staging / name).write_text(text)
        for name, _ in written:
            os.replace(staging / name, directory / name)
    return path


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """float32 matmuls and convolutions of eager PyTorch in full fp32 (TF32 off) on CUDA,
    the settings restored afterwards. On a GPU torch computes convolutions in TF32 by
    default (``torch.backends.cudnn.allow_tf32``), matmuls too where the user allowed it;
    the correctness reference must be the most exact output the machine gives instead."""
    with allow_tf32(False):
        yield


def reference_outputs(graph: RecordedGraph) -> list[list[torch.Tensor]]:
    """Per sample, the outputs every candidate is compared with, in host memory. On CUDA
    the module runs again on each sample with TF32 off (``exact_float32``): the outputs
    recorded while the user's code ran were computed with the user's (TF32) settings. On
    the host they are the recorded outputs (no TF32 there), except for modules with
    multi-head attention: they run again without PyTorch's fast path, whose outputs at
    padded positions differ from the regular math an export captures (``same_math_as_export``)."""
    recomputed = same_math_differs(graph.module)
    if graph.device.type != "cuda" and not recomputed:
        return [[t.detach().cpu().contiguous() for t in s.outputs] for s in graph.samples]
    outputs = []
    with torch.no_grad(), exact_float32(), same_math_as_export(graph.module):
        for sample in graph.samples:
            outputs.append([t.detach().cpu().contiguous() for t in graph.run_eager(sample.inputs)])
    return outputs


def _samples(graph: RecordedGraph, valid_positions: ValidPositionsOption = None) -> list[tuple]:
    """Inputs on the module's device, reference outputs in host memory (the engine compares
    there), and where a sample has positions its outputs leave undefined (padding), the
    masks the engine's check leaves them out by (``valid_positions``)."""
    graph.check_unchanged()
    samples = []
    batch_first = batch_first_of(graph.module)
    unmasked: set[int] | None = None  # outputs the padded tokens do not reach (found once)
    for i, (s, expected) in enumerate(zip(graph.samples, reference_outputs(graph), strict=True)):
        sample = ([t.detach().contiguous() for t in s.inputs], expected, max(s.batch_size, 1))
        found = valid_position_masks(valid_positions, graph._inputs.fill(s.inputs), s.outputs,  # noqa: SLF001
                                     f"{graph.module_name}/{graph.key} sample {i}", graph.output_names,
                                     batch_first)
        if found is not None and valid_positions in (None, True):
            masks, source = found
            if unmasked is None:
                unmasked = _outputs_padding_does_not_reach(graph, s, masks)
            masks = [None if o in unmasked else m for o, m in enumerate(masks)]
            found = None if all(m is None for m in masks) else (masks, source)
        samples.append(sample if found is None else (*sample, *found))
    return samples


def _outputs_padding_does_not_reach(graph: RecordedGraph, sample, masks: list) -> set[int]:
    """The outputs a derived mask (``attention_mask`` found by its name) matches by shape
    that the padded positions' tokens do not reach: eager run once with the tokens at the
    padded positions replaced leaves them unchanged, so their positions are defined by
    other inputs. A CLIP's vision tokens matched the text mask's [batch, 5] by shape alone
    and were left out at the text's padding: a graph wrong on them passed (a session-35
    probe). Found on the first sample with padding; empty where that cannot be told (no
    ``input_ids`` and no floating input laid out as the mask, no padded position, or eager
    fails on the replaced values). Without ``input_ids`` the floating input whose leading axes
    are the mask's is changed at the padded positions (``forward(x, attention_mask)`` returning
    ``fc(x) * mask``: zeros there whatever x holds, which eager defines, and a graph ignoring
    the mask passed, 0.71 off there, a session-37 probe)."""
    name = "input_input_ids"
    laid_out = [m for m in masks if m is not None]
    if name in graph.input_names:
        index = graph.input_names.index(name)
        ids = sample.inputs[index]
        mask = next((m for m in laid_out if tuple(m.shape) == tuple(ids.shape)), None)
        if mask is None or ids.dtype not in (torch.int32, torch.int64):
            return set()
    else:
        found = next(((i, m) for i, t in enumerate(sample.inputs) if t.is_floating_point()
                      for m in laid_out if t.dim() >= m.dim() and tuple(t.shape[:m.dim()]) == tuple(m.shape)), None)
        if found is None:
            return set()
        index, mask = found
        ids = sample.inputs[index]
    if bool(mask.bool().all()):
        return set()
    padded = ~mask.bool().to(ids.device)
    replaced = ids.clone()
    if ids.is_floating_point():
        replaced[padded] = replaced[padded] * -2.0 + 1.0  # other values at every padded position
    else:
        first = ids.gather(-1, mask.to(ids.device).long().argmax(-1, keepdim=True)).expand_as(ids)  # a valid token per row
        # another token id at each padded position: a row's first valid token or its neighbour,
        # whichever the position does not hold already (a pad id of 0 beside a BOS of 1)
        original, token = ids[padded], first[padded]
        other = torch.where(token > 0, token - 1, token + 1)
        other = torch.where(other != original, other, token)
        replaced[padded] = torch.where(other != original, other, token + 1)
    inputs = list(sample.inputs)
    inputs[index] = replaced
    try:
        with torch.no_grad():
            outputs = graph.run_eager(inputs)
    except Exception:  # the replaced ids are no tokens of this model: keep the masks as found
        return set()
    return {o for o, (m, before, after) in enumerate(zip(masks, sample.outputs, outputs, strict=True))
            if m is not None and before.shape == after.shape and torch.equal(before, after)}


def _user_metric(graph: RecordedGraph, samples, accuracy):
    """The engine's metric callable over the user's ``accuracy(eager, candidate)``: the
    engine hands it a candidate's outputs (DLPack capsules, valid during the call), and the
    reference's own to get the baseline."""
    def score(outputs) -> float:
        # copies for every call: the metric may change what it is given in place, and eager's
        # tensors are the engine's reference (an `e.mul_(0)` in a metric made every later
        # candidate score against zeros, and the engine compare against them)
        eager = [graph.rebuild_outputs([t.clone() for t in sample[1]]) for sample in samples]
        candidate = [graph.rebuild_outputs([torch.from_dlpack(c).clone() for c in sample]) for sample in outputs]
        return metric_number(accuracy(eager, candidate))

    return score


def _warn_vacuous(name: str, report: _core.TuneReport) -> None:
    for output, why in report.vacuous_outputs:
        logger.warning("%s: eager output '%s' cannot judge a candidate (%s): a candidate's match on it says "
                       "nothing; check the samples (report field vacuous_outputs)", name, output, why)


class _FrontEnd:
    """The front end's side of the one driver (``_core.drive_tune``, tune_driver.hpp): what
    needs torch. The engine sequences the tune and calls these."""

    #: Failures after which nothing can run: the driver stops whatever the strategy says.
    fatal_errors = (CudaContextLostError,)

    def __init__(self, name: str, graph: RecordedGraph, tuner, strategy: TuneStrategy, bar, module_call):
        self.name, self.graph, self.tuner, self.strategy = name, graph, tuner, strategy
        self.advance = (lambda: bar.update(1)) if bar is not None else (lambda: None)
        self.measure = None if module_call is None else (
            lambda tuned, inputs=None: module_call(graph, tuned, inputs))
        self.wrappers = {}  # group -> function(session, candidate) -> TunedGraph
        largest = max(range(len(graph.samples)), key=lambda i: graph.samples[i].batch_size)
        self._args, self._kwargs = graph.call_arguments(graph.samples[largest].inputs)

    def run_reference(self) -> None:
        token = eager_var.set(True)  # run_eagerly() per timed call, without a generator's cost
        try:
            self.graph.module.forward(*self._args, **self._kwargs)
        finally:
            eager_var.reset(token)

    def add_candidates(self, backend: int, group: int) -> None:
        self.wrappers[group] = self.strategy.backends[backend].add_candidates(
            self.graph, self.tuner, group, self.advance, module_call=self.measure)

    def explain_failures(self) -> None:
        trace_failed_candidates(self.graph, self.tuner)  # where each failed candidate diverges, into the report

    def warn(self, line: str) -> None:
        logger.warning("%s: %s", self.name, line)


def _driver_strategy(strategy: TuneStrategy, options: TuneOptions) -> _core.DriverStrategy:
    backends = [_core.DriverBackend(b.describe(), type(b).__name__, isinstance(b, TorchEagerBackend))
                for b in strategy.backends]
    return _core.DriverStrategy(options.strategy_config(strategy.kind, strategy.latency_budget_ms), backends,
                                strategy.stop_at_first_success, strategy.propagate_errors)


def tune_graph(strategy: TuneStrategy, graph: RecordedGraph, options: TuneOptions | None = None,
               module_call=None) -> TunedGraph:
    """The TunedGraph ``strategy`` chooses for ``graph``, or raises saying why there is none.
    ``module_call(graph, tuned, inputs) -> call``: the module's call with ``graph`` run by
    ``tuned`` (``dispatch.measured_call``; ``inputs`` None: the largest sample's tensors):
    candidates are measured through it."""
    options = options or TuneOptions()
    if strategy.option_overrides:  # the strategy's own switches (AITune's strategy.enable_...)
        options = dataclasses.replace(options, **strategy.option_overrides)
    tuner_options = options.tuner_options()
    if graph.device.type == "cuda":
        # Eager runs on torch's stream: device time by events there, and host time that
        # includes the wait for the device (candidates are timed on their own streams).
        tuner_options.cuda_stream = torch.cuda.current_stream(graph.device).cuda_stream
    name = f"{graph.module_name}/{graph.key}"
    tuner_options.log = lambda line: logger.debug("%s", line)
    _refuse_empty_tensors(graph, name)
    interior = add_interior_sample(graph)
    if interior:
        logger.info("%s: %s", name, interior)
    samples = _samples(graph, options.valid_positions)
    if samples:
        try:
            check_eager_repeatable(graph, name, samples[0][1], tuner_options)
        except NondeterministicModuleError as error:
            if graph.autocast and not autocast_enabled():
                # not randomness: the calls ran under the caller's torch.autocast, which
                # neither this eager run nor an export reproduces
                raise TuningError(
                    f"{name}: its calls were recorded under torch.autocast, and the module run again without it "
                    "(as ait.tune runs it, and as an export computes: in the module's own dtype) gives other "
                    "outputs (dtypes or values), so no candidate can match what the calls returned. Tune with "
                    "autocast off around this module's calls (aitune's own reduced-precision candidates are "
                    "ONNXRuntimeBackendConfig(precision=...), docs/tuning.md), or leave it eager: a module tuned "
                    "without autocast runs its calls under autocast eagerly anyway"
                ) from error
            raise
        note_grad_modes(graph, name, [sample[1] for sample in samples], tuner_options)
    # Calibrated acceptance: eager at a candidate's reduced precision, asked by the engine
    # once per precision (on the host the recorded outputs are the strict reference too).
    tuner_options.eager_at_precision = lambda precision: eager_outputs_at(graph, precision)
    # The batch search checks a widened batch against eager run at it (a forward may branch
    # on the batch size), not against a recorded sample's outputs repeated.
    tuner_options.reference_at = lambda inputs: eager_outputs_for(graph, inputs)
    metric = None if options.accuracy is None else (
        _user_metric(graph, samples, options.accuracy) if options.evaluation_labels is None
        else labelled_metric(graph, samples, options.accuracy, options.evaluation_labels))
    if metric is not None:
        tuner_options.accuracy_metric = metric
    tuner = _core.GraphTuner(name, graph.graph_spec(), samples, tuner_options, probes=probe_indices(graph))
    _warn_vacuous(name, tuner.report)

    # The engine sequences the tune (tune_driver.cpp): backends in order, first-wins early
    # stop, eager as the fallback, failures recorded or propagated, the choice, the outcome.
    total = sum(backend.candidate_count(graph) for backend in strategy.backends)
    with _progress_bar(total, name, options.progress) as bar:
        front_end = _FrontEnd(name, graph, tuner, strategy, bar, module_call)
        outcome = _core.drive_tune(tuner, _driver_strategy(strategy, options), front_end)
    report = tuner.report

    path = _write_report(graph, report)
    logger.info("%s: tuning report %s\n%s", name, path, report.summary_table())
    if outcome.is_failure:
        message = outcome.message + (f"\n{interior}" if interior else "")
        if outcome.kind == "all_incorrect" and options.valid_positions is None and all(len(s) == 3 for s in samples):
            masks = {name for s in graph.samples
                     for name in mask_like_inputs(graph._inputs.fill(s.inputs), s.outputs)}  # noqa: SLF001
            if masks:
                first = sorted(masks)[0]
                message += (f"\nHint: input {', '.join(repr(m) for m in sorted(masks))} looks like a padding mask (0s "
                            "and 1s over the outputs' leading [batch, seq] axes), which aitune derives only from an "
                            f"argument named 'attention_mask'; if the outputs at its 0 positions are undefined (a "
                            f"padded batch), declare it: ait.tune(..., valid_positions={first!r})")
        error = {"all_incorrect": NumericMismatchError,
                 "unsupported_dtype": UnsupportedDTypeTuningError}.get(outcome.kind, TuningError)(message)
        error.report = report  # every candidate's verdict: ait.Module.ait_reports keeps it after the failure
        raise error
    if outcome.kind == "winner":
        candidate = report.candidates[outcome.winner]
        tuned = front_end.wrappers[candidate.group](tuner.take_winner(), candidate)
    else:
        if outcome.kind == "eager_kept":
            logger.warning("%s: eager kept: %s", name, outcome.why)
        tuned = EagerGraph(graph, note=outcome.why or None)
    tuned.report = report
    return tuned
