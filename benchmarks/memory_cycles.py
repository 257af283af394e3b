"""Memory over tune + save + load cycles (issue 17, item 8): does aitune hold anything?

Runs N cycles of ait.tune (CPU provider, a tiny MLP), ait.save and ait.load into a new
module, dropping every object each cycle, and prints RSS and tracemalloc's view: the
Python allocations still live after the cycles, grouped by file, so what grows is
attributed to aitune, torch's exporter or onnx. Usage:
    python benchmarks/memory_cycles.py [--cycles 30] [--top 15]
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--frames", type=int, default=6, help="traceback depth kept by tracemalloc")
    args = parser.parse_args()

    import torch
    import aitune.torch as ait
    from torch_models import MLP, cpu_strategy

    work = Path(tempfile.mkdtemp(prefix="aitune-mem-"))
    os.environ["AITUNE_CACHE_DIR"] = str(work / "cache")
    ait.enable_performance_validation(False)
    torch.manual_seed(0)
    samples = [torch.randn(16) for _ in range(2)]
    x = torch.randn(2, 16)

    def cycle(i: int) -> None:
        model = ait.Module(MLP().eval(), "mlp", strategy=cpu_strategy())
        ait.tune(model, samples, disable_external_logging=True, ignore_failing_modules=False)
        path = work / f"ckpt{i % 2}"
        ait.save(model, path)
        loaded = ait.load(ait.Module(MLP().eval(), "mlp"), path)
        with torch.no_grad():
            loaded(x)
        shutil.rmtree(work / "cache", ignore_errors=True)

    for i in range(args.warmup):
        cycle(i)
    gc.collect()
    tracemalloc.start(args.frames)
    before_snapshot = tracemalloc.take_snapshot()
    rss = [rss_mb()]
    for i in range(args.cycles):
        cycle(i)
        gc.collect()
        rss.append(rss_mb())
        print(f"cycle {i + 1}/{args.cycles}: RSS {rss[-1]:.1f} MB", flush=True)
    after_snapshot = tracemalloc.take_snapshot()
    traced, _ = tracemalloc.get_traced_memory()

    growth = rss[-1] - rss[0]
    print(f"RSS: {rss[0]:.1f} MB after {args.warmup} warm-up cycles -> {rss[-1]:.1f} MB after {args.cycles} more "
          f"({growth * 1000 / args.cycles:.0f} KB per cycle); max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.1f} MB")
    print(f"RSS per cycle: {' '.join(f'{v:.1f}' for v in rss)}")
    stats = after_snapshot.compare_to(before_snapshot, "filename")
    total = sum(s.size_diff for s in stats)
    print(f"Python allocations still live after the cycles: {total / 1024:.0f} KB "
          f"({total / 1024 / args.cycles:.1f} KB per cycle); tracemalloc traced {traced / 1e6:.1f} MB")
    for s in stats[: args.top]:
        print(f"  {s.size_diff / 1024:+9.1f} KB {s.count_diff:+7d} blocks  {s.traceback[0].filename}")
    stats = after_snapshot.compare_to(before_snapshot, "traceback")
    print("largest growing allocation sites (innermost aitune frame shown when there is one):")
    for s in stats[: args.top]:
        frames = [f for f in s.traceback if "aitune" in f.filename] or list(s.traceback)
        f = frames[-1]
        print(f"  {s.size_diff / 1024:+9.1f} KB {s.count_diff:+7d} blocks  {f.filename}:{f.lineno}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
