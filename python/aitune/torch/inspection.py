"""ait.inspect: run a pipeline (any callable or object holding nn.Modules) on samples and
time every nn.Module it calls, to choose which to wrap with ``ait.wrap``."""

from __future__ import annotations

import dataclasses
import inspect as pyinspect
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

from aitune.torch.dataset import iterate_calls
from aitune.torch.object_paths import MAX_DEPTH, ModuleLocation, find_modules

DEFAULT_INSPECT_ITERATIONS = 10
DEFAULT_WARMUP_ITERATIONS = 5


@dataclasses.dataclass(eq=False)
class ModuleInfo:
    """One nn.Module found in the inspected object and what the run saw of it.

    ``name``: the last part of its object path (the attribute, list index or dict key);
    ``object_path``: dotted path from the inspected object (``"unet"``,
    ``"blocks.0"``; ``""`` for the object itself); ``parent``: the object holding it
    (None for the object itself); ``execution_count`` and ``total_execution_time``
    (seconds, synchronised on CUDA) of its calls made while no other found module ran
    (a call inside another's forward is part of that one's time); ``input_shapes``: the
    distinct tensor input shapes of those calls."""

    module: torch.nn.Module
    location: ModuleLocation
    execution_count: int = 0
    total_execution_time: float = 0.0
    input_shapes: list[tuple] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.location.name

    @property
    def object_path(self) -> str:
        return self.location.path

    @property
    def parent(self) -> Any:
        return self.location.parent

    @property
    def module_type(self) -> type:
        return type(self.module)

    @property
    def average_execution_time(self) -> float:
        return self.total_execution_time / self.execution_count if self.execution_count else 0.0

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def __repr__(self) -> str:
        return (f"ModuleInfo({self.object_path or '<object>'!r}, {type(self.module).__name__}, "
                f"calls={self.execution_count}, time={self.total_execution_time:.4f} s)")


class InspectedModulesInfo:
    """What ``ait.inspect`` found: the executed modules, none nested in another listed one."""

    def __init__(self, modules: list[ModuleInfo], total_execution_time: float, number_of_iterations: int):
        self._modules = modules
        self.total_execution_time = total_execution_time
        self.number_of_iterations = number_of_iterations

    def share(self, info: ModuleInfo) -> float:
        """The module's share of the total time of the inspected runs (0..1)."""
        return info.total_execution_time / self.total_execution_time if self.total_execution_time > 0 else 0.0

    def get_modules(self, min_execution_ratio: float | None = None, limit: int | None = None) -> list[ModuleInfo]:
        """The modules by share of total time, largest first (ties by object path);
        ``min_execution_ratio`` drops those below that share, ``limit`` keeps the first."""
        if min_execution_ratio is not None and not 0 <= min_execution_ratio <= 1:
            raise ValueError(f"min_execution_ratio must be within [0, 1], got {min_execution_ratio!r}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be a non-negative int, got {limit!r}")
        ranked = sorted(self._modules, key=lambda m: (-m.total_execution_time, m.object_path))
        if min_execution_ratio is not None:
            ranked = [m for m in ranked if self.share(m) >= min_execution_ratio]
        return ranked if limit is None else ranked[:limit]

    def table(self) -> str:
        """The modules as a text table, largest share first."""
        rows = [("object path", "class", "calls", "total s", "avg ms", "% of total", "params", "input shapes")]
        for m in self.get_modules():
            shapes = ", ".join(str(list(s)) if not isinstance(s, tuple) or len(s) != 1 else str(list(s[0]))
                               for s in m.input_shapes[:3]) + (" ..." if len(m.input_shapes) > 3 else "")
            rows.append((m.object_path or "<object>", type(m.module).__name__, str(m.execution_count),
                         f"{m.total_execution_time:.4f}", f"{m.average_execution_time * 1e3:.3f}",
                         f"{100 * self.share(m):.1f}", str(m.num_parameters), shapes))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, "-" * len(lines[0]))
        lines.append(f"total {self.total_execution_time:.4f} s over {self.number_of_iterations} iterations")
        return "\n".join(lines)

    def describe(self) -> None:
        """Prints ``table()`` (AITune's name)."""
        print(self.table())  # noqa: T201

    def __str__(self) -> str:
        return self.table()

    def __len__(self) -> int:
        return len(self._modules)


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _tensor_shapes(args: tuple, kwargs: dict) -> tuple:
    return tuple(tuple(leaf.shape) for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor))


class _Timer:
    """Forward hooks on every found module: own calls counted and timed. Only calls made
    while no other found module runs on the same thread count (a module called inside
    another's forward is part of that one's time: a child, or a module the pipeline also
    holds at a place of its own), so ``get_modules`` never counts time twice. Nesting is
    per thread: modules a pipeline runs at once on several threads (two towers) are each
    counted."""

    def __init__(self, infos: list[ModuleInfo]):
        self.infos = {id(info.module): info for info in infos}
        self.thread = threading.local()  # .running: found modules whose forward runs now; .starts
        self.lock = threading.Lock()  # the infos are updated from every thread
        self.active = False
        self.handles = []
        for info in infos:
            self.handles.append(info.module.register_forward_pre_hook(self._pre, with_kwargs=True))
            self.handles.append(info.module.register_forward_hook(self._post, always_call=True))

    def _state(self) -> tuple[int, dict[int, list[tuple[float, bool]]]]:
        if not hasattr(self.thread, "starts"):
            self.thread.running, self.thread.starts = 0, {}
        return self.thread.running, self.thread.starts

    def _pre(self, module, args, kwargs):
        if self.active:
            running, starts = self._state()
            nested = running > 0
            self.thread.running = running + 1
            if not nested:
                info = self.infos[id(module)]
                shapes = _tensor_shapes(args, kwargs)
                with self.lock:
                    if shapes not in info.input_shapes:
                        info.input_shapes.append(shapes)
                _synchronize()
            starts.setdefault(id(module), []).append((time.perf_counter(), nested))
        return None

    def _post(self, module, args, output):
        running, starts = self._state()
        calls = starts.get(id(module))
        if self.active and calls:
            start, nested = calls.pop()
            self.thread.running = running - 1
            if not nested:
                _synchronize()
                info = self.infos[id(module)]
                with self.lock:
                    info.total_execution_time += time.perf_counter() - start
                    info.execution_count += 1
        return None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def lazy_result(value: Any) -> str:
    """What a pipeline returned that runs nothing until it is iterated or awaited (a
    generator, an async generator, a coroutine): its kind, for the message saying why no
    module ran; '' for anything else. It is closed (never started: nothing of it runs)."""
    for check, kind in ((pyinspect.isgenerator, "a generator"), (pyinspect.isasyncgen, "an async generator"),
                        (pyinspect.iscoroutine, "a coroutine")):
        if check(value):
            close = getattr(value, "close", None) if kind != "an async generator" else None
            if close is not None:
                close()
            return kind
    return ""


def lazy_result_hint(kind: str, what: str) -> str:
    """Why a function that returned ``kind`` called no module, and the way out."""
    consume = "asyncio.run(pipeline(*args, **kwargs))" if kind == "a coroutine" else "list(pipeline(*args, **kwargs))"
    until = "awaited" if kind == "a coroutine" else "iterated"
    return (f"{what} returned {kind}, which runs nothing until it is {until}: give a function that consumes it "
            f"(lambda *args, **kwargs: {consume})")


def _calls(dataset: Any, count: int) -> Iterator[tuple[tuple, dict]]:
    """``count`` calls at batch size 1, cycling through the dataset."""
    if count <= 0:
        return
    produced = 0
    while produced < count:
        before = produced
        for _, args, kwargs in itertools.islice(iterate_calls(dataset, [1]), count - produced):
            produced += 1
            yield args, kwargs
        if produced == before:
            raise ValueError("the dataset gave no samples")


def inspect(
    obj: Any,
    dataset: Any,
    inference_function: Callable[..., Any] | None = None,
    number_of_iterations: int = DEFAULT_INSPECT_ITERATIONS,
    warmup_iterations: int = DEFAULT_WARMUP_ITERATIONS,
    max_depth: int = 8,
) -> InspectedModulesInfo:
    """Runs ``obj`` (or ``inference_function``) on the dataset's samples and times every
    nn.Module of ``obj`` it calls.

    Args:
        obj: a callable or object holding nn.Modules: an nn.Module, a diffusers-style
            pipeline (a plain object whose attributes, lists and dicts hold modules).
        dataset: samples as ``ait.tune`` takes them; each call gets a batch of one.
        inference_function: what to call instead of ``obj`` (e.g. a function that calls
            the pipeline with fixed extra arguments).
        number_of_iterations: timed calls; warmup_iterations: untimed calls first.
        max_depth: how deep the search for modules goes into plain objects, lists, dicts
            (at most 64: ait.save and ait.load look that deep).

    Returns an ``InspectedModulesInfo``: ``get_modules(limit=...)`` ranks the modules
    that ran on their own (a module's calls inside another found module's forward are
    part of that one's time: a submodule called only there is not listed; one the function
    calls itself, an encoder-decoder's encoder under ``generate``, is), by share of the total time; ``table()`` / ``describe()`` print it.
    The object is left as it was (the timing hooks are removed).
    """
    for name, value in (("number_of_iterations", number_of_iterations), ("warmup_iterations", warmup_iterations)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if number_of_iterations == 0:
        raise ValueError("number_of_iterations must be at least 1")
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or not 0 <= max_depth <= MAX_DEPTH:
        raise ValueError(f"max_depth must be an int within [0, {MAX_DEPTH}] (how deep ait.save looks for the "
                         f"wrapped modules), got {max_depth!r}")
    function = obj if inference_function is None else inference_function
    if not callable(function):
        raise TypeError(f"ait.inspect calls obj or inference_function; {type(obj).__name__} is not callable")
    infos = [ModuleInfo(module, location) for module, location in find_modules(obj, max_depth=max_depth)]
    if not infos:
        within = f" within max_depth={max_depth}" if max_depth < MAX_DEPTH else ""
        hint = ""
        if inference_function is None and callable(obj) and not isinstance(obj, torch.nn.Module):
            # a function reaches its modules through globals or a closure, which are not searched
            hint = ("; a function's globals are not searched: give the object holding the modules and call it "
                    "through the function, ait.inspect(model, data, inference_function=fn)")
        raise ValueError(f"ait.inspect: {type(obj).__name__} holds no torch.nn.Module{within}{hint}")
    timer = _Timer(infos)
    total = 0.0
    lazy = ""
    try:
        with torch.no_grad():
            for args, kwargs in _calls(dataset, warmup_iterations):
                lazy = lazy_result(function(*args, **kwargs)) or lazy
            timer.active = True
            for args, kwargs in _calls(dataset, number_of_iterations):
                _synchronize()
                start = time.perf_counter()
                result = function(*args, **kwargs)
                _synchronize()
                total += time.perf_counter() - start
                lazy = lazy_result(result) or lazy
    finally:
        timer.remove()
    # The modules that ran on their own: the timer counts a call only while no other found
    # module runs, so a submodule called inside its parent's forward (part of the parent's
    # time) has none. A submodule the function calls itself is listed with those calls, even
    # where its parent ran too: generate() calls an encoder-decoder's encoder once, then the
    # decoder steps through the model's forward; the encoder's time is no part of the model's,
    # and leaving it out (as a module inside an executed one) listed the model alone at a
    # third of the total, with the encoder nowhere to be found for ait.wrap.
    ran = [info for info in infos if info.execution_count]
    if not ran:  # an empty result would leave nothing to wrap, unexplained
        called = "obj" if inference_function is None else "inference_function"
        why = (lazy_result_hint(lazy, called) if lazy else
               f"{called} calls modules that {type(obj).__name__} does not hold (found: "
               f"{', '.join(repr(info.object_path or '<the object>') for info in infos[:5])}"
               f"{', ...' if len(infos) > 5 else ''}), or none at all")
        raise ValueError(f"ait.inspect: none of the {len(infos)} nn.Modules found in the {type(obj).__name__} ran "
                         f"while calling {called} {number_of_iterations} times: {why}")
    return InspectedModulesInfo(ran, total, number_of_iterations)
