"""The tuning driver: drives the C++ tuning engine for one recorded graph as a strategy
(plain data, strategy.py) says: hands it the samples and the eager reference, lets each
backend add its candidates, and turns the winner into a TunedGraph. Writes the JSON
report and logs the summary table."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from aitune import _core
from aitune.torch import cache
from aitune.torch.backend.base import TunedGraph
from aitune.torch.backend.onnx_runtime_backend import NumericMismatchError
from aitune.torch.backend.torch_eager import EagerGraph, TorchEagerBackend
from aitune.torch.candidate_isolation import CudaContextLostError
from aitune.torch.context import run_eagerly
from aitune.torch.graph import RecordedGraph
from aitune.torch.options import TuneOptions
from aitune.torch.strategy import TuneStrategy
from aitune.torch.valid_positions import ValidPositionsOption
from aitune.torch.valid_positions import masks_for as valid_position_masks

logger = logging.getLogger("aitune")

REPORT_FILE = "tune_report.json"


class TuningError(_core.AituneError):
    """No backend of a strategy produced a correct candidate; the message lists why each failed."""


def _progress_bar(total: int, description: str, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience; the log has the same steps
        return contextlib.nullcontext(None)
    # disable=None: no bar unless stderr is a terminal.
    return tqdm(total=total, desc=description, unit="candidate", leave=False, disable=None if enabled else True)


def _write_report(graph: RecordedGraph, report: _core.TuneReport) -> Path:
    """``<cache>/<module>/<graph>/tune_report.json``, replaced atomically."""
    directory = cache.module_dir(graph.module_name) / graph.key
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / REPORT_FILE
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tune_report-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(report.to_json())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """float32 matmuls and convolutions of eager PyTorch in full fp32 (TF32 off) on CUDA,
    the settings restored afterwards. On a GPU torch computes convolutions in TF32 by
    default (``torch.backends.cudnn.allow_tf32``), matmuls too where the user allowed it;
    the correctness reference must be the most exact output the machine gives instead."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def reference_outputs(graph: RecordedGraph) -> list[list[torch.Tensor]]:
    """Per sample, the outputs every candidate is compared with, in host memory. On CUDA
    the module runs again on each sample with TF32 off (``exact_float32``): the outputs
    recorded while the user's code ran were computed with the user's (TF32) settings. On
    the host they are the recorded outputs (no TF32 there)."""
    if graph.device.type != "cuda":
        return [[t.detach().cpu().contiguous() for t in s.outputs] for s in graph.samples]
    outputs = []
    with torch.no_grad(), exact_float32():
        for sample in graph.samples:
            outputs.append([t.detach().cpu().contiguous() for t in graph.run_eager(sample.inputs)])
    return outputs


def _samples(graph: RecordedGraph, valid_positions: ValidPositionsOption = None) -> list[tuple]:
    """Inputs on the module's device, reference outputs in host memory (the engine compares
    there), and where a sample has positions its outputs leave undefined (padding), the
    masks the engine's check leaves them out by (``valid_positions``)."""
    samples = []
    for i, (s, expected) in enumerate(zip(graph.samples, reference_outputs(graph), strict=True)):
        sample = ([t.detach().contiguous() for t in s.inputs], expected, max(s.batch_size, 1))
        masks = valid_position_masks(valid_positions, graph._inputs.fill(s.inputs), s.outputs,  # noqa: SLF001
                                     f"{graph.module_name}/{graph.key} sample {i}")
        samples.append(sample if masks is None else (*sample, *masks))
    return samples


def _failure(strategy: TuneStrategy, graph: RecordedGraph, report: _core.TuneReport) -> Exception:
    table = report.summary_table()
    incorrect = [c for c in report.candidates if c.status == "incorrect"]
    if strategy.propagate_errors and incorrect and len(incorrect) == len(report.candidates):
        return NumericMismatchError(
            f"{graph.module_name}/{graph.key}: every candidate differs from eager PyTorch; "
            f"{incorrect[0].name}: {incorrect[0].reason}\n{table}"
        )
    reasons = "\n".join(f"  - {c.name} ({c.backend}): {c.status}: {c.reason}" for c in report.candidates)
    return TuningError(f"no backend could build {graph.module_name}/{graph.key}:\n{reasons}\n{table}")


def tune_graph(strategy: TuneStrategy, graph: RecordedGraph, options: TuneOptions | None = None) -> TunedGraph:
    """The TunedGraph ``strategy`` chooses for ``graph``, or raises saying why there is none."""
    options = options or TuneOptions()
    tuner_options = options.tuner_options()
    if graph.device.type == "cuda":
        # Eager runs on torch's stream: device time by events there, and host time that
        # includes the wait for the device (candidates are timed on their own streams).
        tuner_options.cuda_stream = torch.cuda.current_stream(graph.device).cuda_stream
    name = f"{graph.module_name}/{graph.key}"
    tuner_options.log = lambda line: logger.debug("%s", line)
    tuner = _core.GraphTuner(name, graph.graph_spec(), _samples(graph, options.valid_positions), tuner_options)

    largest = max(range(len(graph.samples)), key=lambda i: graph.samples[i].batch_size)
    args, kwargs = graph.call_arguments(graph.samples[largest].inputs)
    with run_eagerly():
        tuner.profile_reference(lambda: graph.module(*args, **kwargs), "eager")

    wrappers = {}  # group -> function(session, candidate) -> TunedGraph
    eager_group = None
    total = sum(backend.candidate_count(graph) for backend in strategy.backends)
    with _progress_bar(total, name, options.progress) as bar:
        for group, backend in enumerate(strategy.backends):
            if isinstance(backend, TorchEagerBackend):
                eager_group = group  # eager wins unless an earlier backend already has
                break
            advance = (lambda: bar.update(1)) if bar is not None else (lambda: None)
            try:
                wrappers[group] = backend.add_candidates(graph, tuner, group, advance)
            except CudaContextLostError:
                raise  # nothing after it can run: never reported as one backend's failure
            except Exception as error:
                if strategy.propagate_errors:
                    error.add_note(f"while building {name} with {backend.describe()}")
                    raise
                reason = f"{type(error).__name__}: {error}"
                logger.warning("%s: %s: %s", name, backend.describe(), reason)
                tuner.add_failed(backend.describe(), type(backend).__name__, group, reason)
            if strategy.stop_at_first_success and any(
                c.group == group and c.status == "passed" for c in tuner.report.candidates
            ):
                break
        report = tuner.select(options.strategy_config(strategy.kind, strategy.latency_budget_ms))

    path = _write_report(graph, report)
    logger.info("%s: tuning report %s\n%s", name, path, report.summary_table())
    if report.winner is None:
        kept_by_validation = any(c.status == "slower than eager" for c in report.candidates)
        if eager_group is None and not kept_by_validation:
            raise _failure(strategy, graph, report)
        why = report.decision if kept_by_validation else "no earlier backend had a correct candidate"
        if kept_by_validation:
            logger.warning("%s: eager kept: %s", name, why)
        tuned = EagerGraph(graph, note=None if eager_group is not None and not kept_by_validation else why)
    else:
        candidate = report.candidates[report.winner]
        tuned = wrappers[candidate.group](tuner.take_winner(), candidate)
    tuned.report = report
    return tuned

