"""Attributes memory growth of tune + save + load cycles (issue 17, item 8) to its parts.

Each mode runs in a fresh process: warm-up cycles, then N measured cycles of one part of
the pipeline alone, dropping every object each cycle. It prints the RSS growth per cycle
(/proc/self/statm) and the Python heap growth per cycle (tracemalloc, started after the
warm-up), so growth can be pinned on torch.onnx's exporter, ONNX Runtime's sessions,
aitune's tuning driver or its checkpoint save/load. Usage:
    python benchmarks/memory_attribution.py [--cycles 30] [--modes export,session,...] [--trim]
Modes:
    export    torch.onnx.export(dynamo=True) of a tiny MLP to a file (no aitune)
    trace     torch.onnx.export(dynamo=False) of the same MLP (no aitune)
    session   aitune._core.OnnxSession.create + one infer + release (no torch export)
    variants  sessions as a CPU tune makes them: thread counts x optimisation levels, each
              created, run 20 times and released (no torch export)
    ortpy     onnxruntime.InferenceSession (ORT's own Python API) create + run + release
    tune      ait.tune of a new ait.Module each cycle (export, sessions, measurements)
    saveload  ait.save + ait.load + one call, of a module tuned once before the cycles
    full      tune + save + load + call (benchmarks/memory_cycles.py's cycle)
    tune-trace, full-trace   the same with the trace exporter (use_dynamo=False): aitune
              without the dynamo exporter's growth
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

MODES = ("export", "trace", "session", "variants", "ortpy", "tune", "saveload", "full", "tune-trace", "full-trace")


def rss_kb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024


def make_cycle(mode: str, work: Path):
    import torch

    import aitune.torch as ait
    from aitune import _core
    from torch_models import MLP, cpu_strategy

    os.environ["AITUNE_CACHE_DIR"] = str(work / "cache")
    ait.enable_performance_validation(False)
    torch.manual_seed(0)
    samples = [torch.randn(16) for _ in range(2)]
    x = torch.randn(2, 16)
    model_path = work / "mlp.onnx"

    def export(dynamo: bool) -> None:
        kwargs = dict(dynamic_shapes=({0: torch.export.Dim("batch")},)) if dynamo else dict(
            dynamic_axes={"x": {0: "batch"}})
        torch.onnx.export(MLP().eval(), (x,), str(model_path), dynamo=dynamo, input_names=["x"],
                          output_names=["y"], verbose=False, **kwargs)

    strategy_config = dict(use_dynamo=False) if mode.endswith("-trace") else {}
    mode = mode.removesuffix("-trace")

    def tuned() -> ait.Module:
        model = ait.Module(MLP().eval(), "mlp", strategy=cpu_strategy(**strategy_config))
        ait.tune(model, samples, disable_external_logging=True, ignore_failing_modules=False)
        return model

    if mode in ("export", "trace"):
        return lambda i: export(mode == "export")
    if mode in ("session", "ortpy", "variants"):
        export(False)
        if mode == "ortpy":
            import onnxruntime

            def run_ortpy(i: int) -> None:
                sess = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
                sess.run(None, {"x": x.numpy()})

            return run_ortpy
        config = _core.OnnxSessionConfig(provider=_core.ExecutionProvider.CPU)
        if mode == "variants":
            levels = [_core.GraphOptimizationLevel.ALL, _core.GraphOptimizationLevel.BASIC,
                      _core.GraphOptimizationLevel.DISABLE_ALL]

            def run_variants(i: int) -> None:
                for threads in (0, 1, 2):
                    for level in levels:
                        variant = _core.OnnxSessionConfig(provider=_core.ExecutionProvider.CPU,
                                                                 graph_optimization_level=level,
                                                                 intra_op_threads=threads)
                        backend = _core.OnnxSession.create(str(model_path), variant)
                        for _ in range(20):
                            backend.infer([x])

            return run_variants

        def run_session(i: int) -> None:
            backend = _core.OnnxSession.create(str(model_path), config)
            backend.infer([x])

        return run_session
    if mode == "tune":
        def run_tune(i: int) -> None:
            tuned()
            shutil.rmtree(work / "cache", ignore_errors=True)

        return run_tune
    if mode == "saveload":
        model = tuned()

        def run_saveload(i: int) -> None:
            path = work / f"ckpt{i % 2}"
            ait.save(model, path)
            loaded = ait.load(ait.Module(MLP().eval(), "mlp"), path)
            with torch.no_grad():
                loaded(x)

        return run_saveload

    def run_full(i: int) -> None:
        model = tuned()
        path = work / f"ckpt{i % 2}"
        ait.save(model, path)
        loaded = ait.load(ait.Module(MLP().eval(), "mlp"), path)
        with torch.no_grad():
            loaded(x)
        shutil.rmtree(work / "cache", ignore_errors=True)

    return run_full


def trim_heap() -> None:
    """glibc's malloc_trim(0): hands freed heap pages back to the system, so what RSS
    still shows is memory in use, not freed memory malloc kept (fragmentation)."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def measure(mode: str, cycles: int, warmup: int, trim: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"aitune-mem-{mode}-"))
    try:
        cycle = make_cycle(mode, work)
        for i in range(warmup):
            cycle(i)
        gc.collect()
        if trim:
            trim_heap()
        tracemalloc.start(1)
        snapshot = tracemalloc.take_snapshot()
        py_before = tracemalloc.get_traced_memory()[0]
        rss_before = rss_kb()
        for i in range(cycles):
            cycle(i)
        gc.collect()
        if trim:
            trim_heap()
        py_after = tracemalloc.get_traced_memory()[0]
        rss_after = rss_kb()
        growth = tracemalloc.take_snapshot().compare_to(snapshot, "filename")
        top = [f"{g.size_diff / 1024 / cycles:+.2f} KB/cycle {g.traceback[0].filename}" for g in growth[:4]]
        return {"mode": mode, "cycles": cycles, "rss_kb_per_cycle": (rss_after - rss_before) / cycles,
                "python_kb_per_cycle": (py_after - py_before) / 1024 / cycles, "rss_mb_end": rss_after / 1024,
                "top": top}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--top", action="store_true", help="print the Python files whose allocations grew most")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) before each RSS reading")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child process: one mode, JSON out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.cycles, args.warmup, args.trim)))
        return 0
    print(f"{'mode':9} {'RSS KB/cycle':>13} {'Python heap KB/cycle':>21} {'RSS at end MB':>14}")
    for mode in args.modes.split(","):
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
        out = subprocess.run([sys.executable, __file__, "--one", mode, "--cycles", str(args.cycles),
                              "--warmup", str(args.warmup)] + (["--trim"] if args.trim else []), capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{mode:9} failed:\n{out.stderr[-2000:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{mode:9} {r['rss_kb_per_cycle']:13.1f} {r['python_kb_per_cycle']:21.2f} {r['rss_mb_end']:14.1f}",
              flush=True)
        if args.top:
            for line in r["top"]:
                print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
