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
