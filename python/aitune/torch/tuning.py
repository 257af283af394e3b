"""ait.tune: feed samples through a callable to record its ait.Modules, then tune them."""

from __future__ import annotations

import contextlib
import logging
import types
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from aitune import _core
from aitune.torch.candidate_isolation import CudaContextLostError
from aitune.torch.context import TuneSession, quiet_var, recording
from aitune.torch.dataset import iterate_calls, stacks_samples
from aitune.torch.evaluation import evaluation_batches
from aitune.torch.export import release_capture_state
from aitune.torch.inspection import lazy_result, lazy_result_hint
from aitune.torch.module import Module, ModuleState
from aitune.torch.object_paths import find_ait_modules
from aitune.torch.options import TuneOptions
from aitune.torch.valid_positions import ValidPositionsOption

logger = logging.getLogger("aitune")


class _DirectCalls:
    """While ait.tune records: counts the calls of modules that an ait.Module wraps made
    directly, not through the ait.Module (which runs its wrapped module's ``forward``, never
    its ``__call__``). The usual cause: a method of the wrapped module reached through the
    wrapper (``wrapper.generate(...)`` is the wrapped model's ``generate``, whose
    ``self(...)`` is the wrapped model), or another reference to the wrapped module. Such
    calls are neither recorded nor, once tuned, served by the tuned graphs. A call made
    inside another ait.Module's forward is not counted: that module's graph holds it (a
    module shared by a pipeline and by a wrapped encoder, which calls it directly)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.classes: dict[str, str] = {}
        # ait.Module name -> the path of the first of its wrapped module's submodules run outside
        # its forward (``vae.decode(z)`` runs ``vae.decoder``, never ``vae.forward``: the module
        # stayed untuned without a word, a session-37 probe)
        self.submodules: dict[str, str] = {}
        self._inside = 0  # ait.Module calls under way (ait.tune records on its own thread only)
        # counted calls under way (a wrapped module called directly, a wrapped module's submodule
        # run outside its forward): the submodules they run are theirs, not counted again
        self._direct: list[int] = []
        self._handles: list = []

    def __enter__(self) -> _DirectCalls:
        from aitune.torch.module_registry import MODULE_REGISTRY

        wrapped = {id(m.ait_module): m for m in MODULE_REGISTRY.modules.values()}
        if not wrapped:
            return self
        inside_wrapped = {id(sub): (wrapper, path) for wrapper in MODULE_REGISTRY.modules.values()
                          for path, sub in wrapper.ait_module.named_modules() if path}

        def before(module: torch.nn.Module, _args: Any) -> None:
            if isinstance(module, Module):
                self._inside += 1
                return
            if self._inside:
                return
            wrapper = wrapped.get(id(module))
            if wrapper is not None and wrapper.ait_module is module:
                self.counts[wrapper.ait_name] = self.counts.get(wrapper.ait_name, 0) + 1
                self.classes[wrapper.ait_name] = type(module).__name__
                self._direct.append(id(module))
            elif not self._direct and (found := inside_wrapped.get(id(module))) is not None:
                owner, path = found
                self.counts[owner.ait_name] = self.counts.get(owner.ait_name, 0) + 1
                self.classes[owner.ait_name] = type(owner.ait_module).__name__
                self.submodules.setdefault(owner.ait_name, path)
                self._direct.append(id(module))

        def after(module: torch.nn.Module, _args: Any, _outputs: Any) -> None:
            if isinstance(module, Module):
                self._inside -= 1
            elif self._direct and self._direct[-1] == id(module):
                self._direct.pop()

        hooks = torch.nn.modules.module
        self._handles = [hooks.register_module_forward_pre_hook(before),
                         hooks.register_module_forward_hook(after, always_call=True)]  # also when forward raises
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()

    def explain(self) -> str:
        which = "; ".join(
            f"The {self.classes[name]} that ait.Module '{name}' wraps ran "
            + (f"its submodules outside its forward ({count} calls, '{self.submodules[name]}' first): a method such "
               f"as decode(...) reached through the wrapper runs them directly; wrap the submodules that method "
               f"runs instead (ait.Module(<wrapped>.{self.submodules[name]}, ...) and the others)"
               if name in self.submodules
               else f"{count} times called directly")
            for name, count in self.counts.items())
        return (f"{which}, not through its ait.Module, so those calls are not recorded and will not run tuned. "
                "A method of the wrapped module reached through the wrapper (wrapper.generate(...)) runs with the "
                "wrapped module as self and calls it directly; so does another reference to the wrapped module. "
                "Wrap the modules that method calls instead (for a transformers model's generate: a DecodeStep, "
                "docs/decoders.md, or its decoder model.model called with use_cache=False), or call the ait.Module "
                "itself")


def _uncalled_modules(func: Any, session: TuneSession, bypassed: _DirectCalls) -> list[str]:
    """The names of the untuned ait.Modules that ``func`` holds (a pipeline object, or the
    objects a lambda or bound method closes over) that no recorded call reached: an optional
    branch the data never took left one untuned without a word, and ``ait.save`` then refused
    the pipeline (a session-37 probe). Those named otherwise (bypassed, other threads) are not."""
    holders = [func, getattr(func, "__self__", None),
               *(cell.cell_contents for cell in (getattr(func, "__closure__", None) or ()) if _cell_filled(cell))]
    if isinstance(func, types.FunctionType):  # ``lambda x: pipe(x)`` with pipe a global
        names = func.__globals__
        holders += [names[name] for name in func.__code__.co_names if name in names]
    called = {id(module) for module in session.modules.values()}
    named: list[str] = []
    for holder in holders:
        if holder is None or isinstance(holder, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
                                                 types.MethodType)) or not hasattr(holder, "__dict__"):
            continue
        for module, _ in find_ait_modules(holder, 8):
            if (id(module) not in called and module.ait_state is ModuleState.INIT and module.ait_name not in named
                    and module.ait_name not in bypassed.counts and module.ait_name not in session.other_threads):
                named.append(module.ait_name)
    return named


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


#: As many graphs as this differing only in a Python number given to the module: the
#: number is most likely a per-call value (a timestep, a step index), not a mode.
NUMBER_GRAPHS_WARNED = 3


def _numbers_varying_per_call(modules) -> list[str]:
    """Per module, the Python numbers (int, float) among its arguments that alone made
    ``NUMBER_GRAPHS_WARNED`` or more graphs: each value is a constant of a graph of its own,
    exported and tuned on its own, and a call with a value never recorded is not served."""
    messages = []
    for module in modules:
        groups: dict = {}
        for graph in module.ait_graphs:
            spec, descriptors = graph.identity
            # (a float's descriptor carries its sign too: -0.0 is another value than 0.0)
            masked = tuple(("number", d[0]) if len(d) in (2, 3) and d[0] in (int, float) else d for d in descriptors)
            groups.setdefault((spec, masked), []).append(descriptors)
        for (spec, masked), members in groups.items():
            if len(members) < NUMBER_GRAPHS_WARNED:
                continue
            varying = [i for i, d in enumerate(masked) if d[0] == "number" and len({m[i][1] for m in members}) > 1]
            if not varying:
                continue
            paths = [path for path, _ in pytree.tree_flatten_with_path(pytree.tree_unflatten(
                list(range(len(masked))), spec))[0]]
            names = []
            for i in varying:
                values = sorted({m[i][1] for m in members})
                shown = ", ".join(map(repr, values[:5])) + (", ..." if len(values) > 5 else "")
                names.append(f"{pytree.keystr(paths[i][1:] or paths[i])} ({shown})")
            messages.append(
                f"ait.Module '{module.ait_name}': {len(members)} graphs differ only in the Python number given as "
                f"{'; '.join(names)}: each value is a constant of a graph of its own, exported and tuned on its own, "
                "and a call with a value not recorded is not served (GraphNotRecordedError, or eager with "
                "eager_fallback). Where it changes from call to call (a timestep, a step index), pass it as a tensor "
                "(torch.tensor(t)): one graph then serves every value")
    return messages

DEFAULT_BATCH_SIZES = (1, 2)


def describe_batch(args: tuple, kwargs: dict) -> str:
    """``input_ids: int64[2, 1, 8], ...``: the tensors of a call, for messages."""
    paths_leaves, _ = pytree.tree_flatten_with_path((args, kwargs))
    parts = [f"{pytree.keystr(path[1:]).strip('[]').strip(chr(39))}: {str(leaf.dtype).removeprefix('torch.')}"
             f"{list(leaf.shape)}" for path, leaf in paths_leaves if isinstance(leaf, torch.Tensor)]
    return ", ".join(parts[:6]) + (", ..." if len(parts) > 6 else "")


@contextlib.contextmanager
def quiet_external_logging() -> Iterator[None]:
    """Silences torch.onnx / torch.export while tuning: their warnings, log records, and
    what the exporters print (torch.export prints the graph when it fails; export.py
    swallows it while ``context.exporters_quiet()``); aitune's own log records still come
    through (``ait.tune``'s ``disable_external_logging``)."""
    loggers = [logging.getLogger(n) for n in ("torch", "torch.onnx", "torch.export", "torch._dynamo", "onnxscript",
                                                 "onnx_ir")]
    levels = [lg.level for lg in loggers]
    token = quiet_var.set(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)
            quiet_var.reset(token)


def tune(
    func: Callable[..., Any],
    dataset: Any,
    batch_sizes: Sequence[int] | None = None,
    max_num_batches_per_batch_size: int | None = None,
    device: str | torch.device | None = None,
    dry_run: bool = False,
    disable_external_logging: bool = False,
    clear_cache: bool = False,
    ignore_failing_modules: bool = True,
    *,
    tolerance: tuple[float, float] | None = None,
    output_tolerances: dict[str, tuple[float, float]] | None = None,
    profile_config: _core.ProfileConfig | None = None,
    progress: bool = True,
    performance_validation: bool | None = None,
    min_speedup: float | None = None,
    find_max_batch_size: bool | None = None,
    max_batch_size: int | None = None,
    accuracy_factor: float = 2.0,
    accuracy: Callable[[list, list], float] | None = None,
    max_accuracy_drop: float = 0.0,
    valid_positions: ValidPositionsOption = None,
    evaluation: tuple[Sequence, Sequence] | None = None,
) -> None:
    """Records every ait.Module that ``func`` calls on the dataset's samples, then tunes each.

    Args:
        func: an ait.Module, or any callable (a pipeline, a parent nn.Module) that calls
            ait.Modules.
        dataset: see ``aitune.torch.dataset``: a tensor, a sequence of samples, a
            DataLoader, or a factory ``batch_size -> batches``.
        batch_sizes: samples are stacked into batches of each size; default ``[1, 2]``
            (two sizes reveal the batch axis).
        max_num_batches_per_batch_size: at most this many batches per size (None: all).
        device: where the batches go; None means the device of ``func`` when it is an
            ait.Module, else the batches stay where the dataset put them.
        dry_run: record only; the modules keep running eagerly.
        disable_external_logging: silence torch.onnx / torch.export warnings and logs.
        clear_cache: delete each tuned module's cache directory first.
        ignore_failing_modules: a module whose tuning fails stays eager and the reason
            is logged; False re-raises the failure.
        tolerance: ``(atol, rtol)`` every candidate's outputs must meet against eager,
            for every output (default: by output dtype and candidate precision, see the
            backend guide).
        output_tolerances: ``{output name: (atol, rtol)}``, winning over ``tolerance``.
        profile_config: how candidates and eager are timed (``aitune._core.ProfileConfig``).
        progress: a progress bar per graph while candidates are measured (on a terminal).
        performance_validation, min_speedup: the winner must beat eager's p50 latency by
            ``min_speedup``, else the graph keeps running eagerly. None: the default set
            by ``ait.enable_performance_validation`` (on, 1.01).
        find_max_batch_size, max_batch_size: search the largest batch the winner takes,
            up to ``max_batch_size``. None: the default set by
            ``ait.enable_find_max_batch_size`` (off, 4096).
        accuracy_factor: a candidate computing in TF32 / fp16 / bf16 is accepted when its
            error per output is at most this factor x eager PyTorch's own error at that
            precision on the same samples (the tolerance table stays a floor; default 2).
        accuracy, max_accuracy_drop: the user's metric, which then decides alone:
            ``accuracy(eager_outputs, candidate_outputs) -> float`` over lists of the
            module's outputs per sample (higher is better); a candidate passes when its
            score is at most ``max_accuracy_drop`` below ``accuracy(eager, eager)``.
        evaluation: ``(samples, labels)``, a labelled evaluation set for ``accuracy``, which
            then is ``accuracy(outputs, labels) -> float``: ``outputs`` the module's outputs
            for each evaluation batch, ``labels`` that batch's labels (collated: numbers and
            tensors stacked). Samples take the dataset's forms (no batch axis) and are
            stacked in order into batches of the largest of ``batch_sizes``; they are recorded
            with the tuning samples (so the check compares them with eager too). The metric
            is scored for eager (the baseline) and each candidate on them, and a candidate
            whose score drops more than ``max_accuracy_drop`` below eager's is refused.
        valid_positions: the output positions the model defines; the check leaves the
            rest out and the report says how many. None (default): where the call has an
            ``attention_mask`` argument whose shape prefixes an output's (``[batch, seq]``
            for logits ``[batch, seq, vocab]``), positions where it is 0 (padding) are left
            out. False: every position is compared. A string: the argument holding the
            mask. A callable ``(arguments by parameter name, output tensors) -> mask or
            None``. A position left out may hold anything in the tuned module's output.
    """
    if evaluation is not None and accuracy is None:
        raise ValueError("evaluation=(samples, labels) needs accuracy=fn(outputs, labels) -> float to score them")
    switches = dict(performance_validation=performance_validation, min_speedup=min_speedup,
                    find_max_batch_size=find_max_batch_size, max_batch_size=max_batch_size)
    options = TuneOptions(tolerance, output_tolerances, profile_config, progress,
                          **{name: value for name, value in switches.items() if value is not None},
                          accuracy_factor=accuracy_factor, accuracy=accuracy, max_accuracy_drop=max_accuracy_drop,
                          valid_positions=valid_positions)
    options.tuner_options()  # bad tolerances or profile settings fail now, before recording
    batch_sizes = list(DEFAULT_BATCH_SIZES if batch_sizes is None else batch_sizes)
    if not batch_sizes or not all(isinstance(b, int) and b > 0 for b in batch_sizes):
        raise ValueError(f"batch_sizes must be positive ints, got {batch_sizes!r}")
    evaluated = [] if evaluation is None else evaluation_batches(evaluation, max(batch_sizes))
    if evaluated:
        options.evaluation_labels = [batch.labels for batch in evaluated]
    if device is None and isinstance(func, Module):
        device = func.ait_device()

    session = TuneSession()
    bypassed = _DirectCalls()
    lazy = ""  # func returned a generator or coroutine: it ran nothing
    try:
        with torch.no_grad(), recording(session), bypassed:
            for batch_size, args, kwargs in iterate_calls(dataset, batch_sizes, max_num_batches_per_batch_size):
                _refuse_meta_tensors(args, kwargs, batch_size)
                if device is not None:
                    args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), (args, kwargs))
                session.batch_size = batch_size
                try:
                    lazy = lazy_result(func(*args, **kwargs)) or lazy
                except Exception as error:  # the user's own forward refused the batch
                    lists = _number_lists(args, kwargs)
                    # (the stacking hint where ait.tune stacked: batches a factory or DataLoader made are
                    # the user's own, and the error is the model's)
                    stacking = ("; ait.tune stacks samples on a new axis 0, so samples carry no batch axis (a "
                                "tokenizer's return_tensors='pt' output has one: take [0] of each tensor, or give "
                                "batches through a DataLoader or a factory)") if stacks_samples(dataset) else ""
                    error.add_note(
                        f"ait.tune: raised by func called eagerly with a batch of {batch_size} samples "
                        f"({describe_batch(args, kwargs)}){stacking}"
                        + (f". The batch holds Python lists of numbers ({', '.join(lists)}), which ait.tune passes "
                           "to forward as they are, not as tensors: give tensors (torch.tensor(ids), a tokenizer's "
                           "return_tensors='pt' output)" if lists else "")
                    )
                    raise
            for index, batch in enumerate(evaluated):  # recorded after the tuning samples, each marked
                args, kwargs = batch.args, batch.kwargs
                if device is not None:
                    args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.to(device), (args, kwargs))
                session.batch_size, session.evaluation = batch.size, index
                try:
                    func(*args, **kwargs)
                except Exception as error:
                    error.add_note(f"ait.tune: raised by func called eagerly with evaluation batch {index} "
                                   f"({batch.size} samples)")
                    raise
                finally:
                    session.evaluation = None
    except BaseException:  # the modules recorded so far go back to what they were
        for module in session.modules.values():
            module._ait_recording_ended(failed=True)
        raise
    for module in session.modules.values():
        module._ait_recording_ended(failed=False)
    other_threads = ""
    if elsewhere := [name for name in session.other_threads if name not in
                     {module.ait_name for module in session.modules.values()}]:
        other_threads = (
            f"ait.Module {', '.join(map(repr, elsewhere))} called on another thread than the one running func (a "
            "thread pool in the pipeline?): ait.tune records the calls made on func's thread only, so "
            f"{'it is' if len(elsewhere) == 1 else 'they are'} not tuned; call the modules on func's thread while "
            "tuning (run the pool's work inline)"
        )
    if not session.modules:
        if other_threads:
            raise ValueError("func called no ait.Module on its own thread: " + other_threads)
        if bypassed.counts:
            raise ValueError("func called no ait.Module. " + bypassed.explain())
        if lazy:
            raise ValueError("func called no ait.Module: " + lazy_result_hint(lazy, "func"))
        raise ValueError("func called no ait.Module: wrap the modules to tune with ait.Module(module, name)")
    if other_threads:
        logger.warning("ait.tune: %s", other_threads)
    for message in _numbers_varying_per_call(session.modules.values()):
        logger.warning("ait.tune: %s", message)
    if bypassed.counts:
        logger.warning("ait.tune: %s", bypassed.explain())
    if uncalled := _uncalled_modules(func, session, bypassed):
        logger.warning("ait.tune: ait.Module %s of func %s not called while ait.tune ran it (the data given never "
                       "took the path that calls %s): %s untuned and run%s eagerly; give data that reaches %s",
                       ", ".join(map(repr, uncalled)), "was" if len(uncalled) == 1 else "were",
                       "it" if len(uncalled) == 1 else "them", "it stays" if len(uncalled) == 1 else "they stay",
                       "s" if len(uncalled) == 1 else "", "it" if len(uncalled) == 1 else "them")
    declared_problem, tied = _check_dynamic_shapes(session.modules.values())
    if unknown := (_unknown_output_tolerances(output_tolerances, session.modules.values()) or declared_problem):
        for module in session.modules.values():  # tuned as they were before, not left recorded
            module._ait_tuning_interrupted()
        raise ValueError(unknown)
    for message in tied:
        logger.warning("ait.tune: %s", message)
    if dry_run:
        return

    quiet = quiet_external_logging() if disable_external_logging else contextlib.nullcontext()
    pending = list(session.modules.values())
    try:
        with torch.no_grad(), quiet:
            while pending:
                module = pending[0]
                try:
                    module._ait_tune(clear_cache=clear_cache, options=options)
                except Exception as error:
                    if not ignore_failing_modules or isinstance(error, CudaContextLostError):
                        raise  # a broken CUDA context fails every later module too
                    logger.warning(
                        "ait.Module '%s' stays eager, tuning failed: %s: %s", module.ait_name, type(error).__name__,
                        error,
                    )
                pending.pop(0)
    except BaseException as error:
        if not isinstance(error, Exception):  # interrupted: the modules not tuned yet go back as they were
            for module in pending:
                module._ait_tuning_interrupted()
        raise
    finally:
        release_capture_state()  # torch's capture state, with its weak references to the weights


def _check_dynamic_shapes(modules) -> tuple[str | None, list[str]]:
    """Each module's ``dynamic_shapes`` against its recorded graphs, one graph spec built per
    graph: why a declaration names an input none of the graphs takes, or leaves out a
    recorded extent (None when none does), and the lines to warn with for the axes that
    had a declared axis's extent in every call without being declared
    (``DynamicShapes.tied_but_left_out``)."""
    tied = []
    for module in modules:
        declared = module._ait_dynamic_shapes
        if not declared:
            continue
        inputs = [graph.input_names for graph in module._ait_graphs.values()]
        if why := declared.unknown(inputs):
            return f"ait.Module '{module.ait_name}': {why}", tied
        for graph in module._ait_graphs.values():
            try:  # a declared range must hold the recorded extents (the C++ builder says which)
                spec = graph.graph_spec()
            except _core.InvalidArgumentError as error:
                return f"ait.Module '{module.ait_name}' {graph.key}: {error}", tied
            if shapes := [[tuple(t.shape) for t in sample.inputs] for sample in graph.samples]:
                tied += [f"ait.Module '{module.ait_name}' {graph.key}: {line}"
                         for line in declared.tied_but_left_out(spec, shapes)]
    return None, tied


def _unknown_output_tolerances(output_tolerances, modules) -> str | None:
    """Why ``output_tolerances`` names an output no recorded graph has (a typo would
    otherwise leave that output at the default tolerance, unknown to the user), or None.
    Not judged where a module recorded no graph (its outputs are unknown)."""
    if not output_tolerances:
        return None
    graphs = [graph for module in modules for graph in module._ait_graphs.values()]
    if not graphs or any(not module._ait_graphs for module in modules):
        return None
    names = sorted({name for graph in graphs for name in graph.output_names})
    unknown = [name for name in output_tolerances if str(name) not in names]
    if not unknown:
        return None
    return (f"output_tolerances names {', '.join(repr(str(name)) for name in unknown)}, which no recorded graph "
            f"outputs; the outputs are: {', '.join(repr(name) for name in names)}")


def _number_lists(args: tuple, kwargs: dict) -> list[str]:
    """Where a batch holds a Python list or tuple of numbers (tokenizer output without
    return_tensors): argument names, one level into dicts, at most five."""
    found = []

    def numbers(value) -> bool:
        return (isinstance(value, (list, tuple)) and len(value) > 1
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)) or (
            isinstance(value, (list, tuple)) and bool(value) and all(numbers(v) for v in value))

    named = [(f"argument {i}", v) for i, v in enumerate(args)] + list(kwargs.items())
    for name, value in named:
        if isinstance(value, dict):
            found += [f"{name}[{key!r}]" for key, inner in value.items() if numbers(inner)]
        elif numbers(value):
            found.append(str(name))
    return found[:5]


def _refuse_meta_tensors(args, kwargs, batch_size: int) -> None:
    """A sample on the meta device has no values to record, check or time against: refused
    naming it (it failed inside ``Tensor.to`` with "Cannot copy out of meta tensor")."""
    flat, _ = pytree.tree_flatten_with_path((args, kwargs))
    for path, value in flat:
        if isinstance(value, torch.Tensor) and value.is_meta:
            where = pytree.keystr(path)
            raise _core.InvalidArgumentError(
                f"ait.tune: a sample tensor is on the meta device ({where}, batch of {batch_size}, shape "
                f"{tuple(value.shape)}): it has a shape but no values, and tuning runs, checks and times real ones; "
                "give samples with values (torch.randn(..., device='cpu' or 'cuda'), or real inputs)")

