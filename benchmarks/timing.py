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
