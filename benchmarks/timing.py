"""The one latency measure every benchmark here uses: the median wall time of one call,
waiting for the GPU after each call when there is one, so every column of a table is
timed the same way (warm-up calls first, not measured)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

#: Warm-up calls before measuring: CUDA graphs capture, cuDNN picks algorithms, caches fill.
WARMUP = 20


def p50_us(fn: Callable[[], object], iterations: int, warmup: int = WARMUP, sync: bool | None = None) -> float:
    """Median microseconds of ``fn()`` (+ ``torch.cuda.synchronize()`` when ``sync``; None:
    when CUDA is available)."""
    if sync is None:
        import torch

        sync = torch.cuda.is_available()
    wait = _cuda_synchronize if sync else _nothing
    for _ in range(warmup):
        fn()
    wait()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        wait()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def p50s_in_turns(columns: dict[str, Callable[[], object]], iterations: int, warmup: int = WARMUP,
                  sync: bool | None = None) -> dict[str, float]:
    """Per column, the median microseconds of ``iterations`` calls, timed like ``p50_us``
    but with the columns taking turns call by call: a drift of the machine (clocks, other
    work, a GPU still busy after a tune) hits every column alike. Columns timed one after
    another are not comparable to a few percent (session 19's prefill row: a module timed
    first after its tune at 1.38x the same module timed in turns, docs/benchmarks.md)."""
    if sync is None:
        import torch

        sync = torch.cuda.is_available()
    wait = _cuda_synchronize if sync else _nothing
    for _ in range(warmup):
        for fn in columns.values():
            fn()
            wait()
    samples: dict[str, list[float]] = {name: [] for name in columns}
    for _ in range(iterations):
        for name, fn in columns.items():
            start = time.perf_counter()
            fn()
            wait()
            samples[name].append((time.perf_counter() - start) * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def _cuda_synchronize() -> None:
    import torch

    torch.cuda.synchronize()


def _nothing() -> None:
    pass


def event_p50_us(fn: Callable[[], object], iterations: int, warmup: int = WARMUP) -> tuple[float, float]:
    """(host p50, device p50) in microseconds of ``fn()`` timed as aitune's tuner times a
    candidate (``profile_calls`` with a CUDA event timer): an event recorded before and
    after each call on the current stream, the host waiting on the second event only
    (not on the whole device). Beside ``p50_us`` it tells a timer's share of a gap between
    a module's p50 here and the p50 the tuner measured (issue 28)."""
    import torch

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    host, device = [], []
    for _ in range(iterations):
        begin = time.perf_counter()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        host.append((time.perf_counter() - begin) * 1e6)
        device.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(host), statistics.median(device)


def winner_path_timings(tuned, call: Callable[[], object], iterations: int, cuda: bool) -> dict:
    """A tuned ait.Module's winner timed beside the module (``call`` calls the module as the
    benchmark does): ``measured_call_us``, the call the tuner measured the winner by
    (``dispatch.measured_call``: its recorded sample through a dispatch of its own) timed
    like every column; with ``cuda`` ``module_event_us`` / ``module_event_device_us``, the module
    timed by the tuner's kind of timer (``event_p50_us``). The module far from the measured
    call: the paths differ; both far from the winner's tuner p50 while the events agree
    with them: the conditions differ, not the timer."""
    from aitune.torch.dispatch import measured_call

    ((graph, tuned_graph),) = tuned._ait_calls.tuned.values()  # noqa: SLF001
    timings = {"measured_call_us": p50_us(measured_call(graph, tuned_graph), iterations),
               "module_event_us": None, "module_event_device_us": None}
    if cuda:
        timings["module_event_us"], timings["module_event_device_us"] = event_p50_us(call, iterations)
    return timings
