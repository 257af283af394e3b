"""GPU benchmark of docs/benchmarks.md: every column measured in one run, side by side.

    python benchmarks/gpu_benchmarks.py --raw-loop build/bench/raw_ort_loop --out results.json
        [--skip-compile]   (the aitune columns only: benchmarks/ort_versions.py compares ORTs)

Columns (p50 latency of one call + torch.cuda.synchronize()):
  eager · torch.compile default · torch.compile reduce-overhead · raw ORT C++ IOBinding
  loop (the floor; strict fp32, and with a CUDA graph) · aitune ORT CUDA (strict fp32)
  · aitune ORT CUDA + CUDA graph (strict fp32) · aitune tuned (MaxThroughputStrategy
  over the CUDA variants, performance validation on: the variant that won, or eager).
  aitune's calls are ordered with torch's stream by events; the raw loop runs on ORT's
  own stream.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402
from timing import p50_us  # noqa: E402

import aitune.torch as ait  # noqa: E402
from aitune import _core  # noqa: E402
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig  # noqa: E402



def tuned_module(model, x, strategy, name):
    module = ait.Module(copy.deepcopy(model), name, strategy=strategy)
    ait.tune(module, list(x), batch_sizes=[x.shape[0]], progress=False)
    return module


def raw_loop(binary: str, onnx: Path, batch: int, iterations: int, *options: str) -> float | None:
    env = dict(os.environ, ORT_LIB_DIR=str(Path(os.environ["AITUNE_ORT_LIBRARY"]).parent))
    result = subprocess.run([binary, str(onnx), "cuda", str(batch), str(iterations), *options],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        print(f"raw loop failed on {onnx}: {result.stderr[-400:]}", file=sys.stderr)
        return None
    return float(result.stdout.split()[0].split("=")[1])


def bench_case(name, model, shape, source, raw_binary, iterations, compile_columns=True):
    torch.backends.cudnn.benchmark = True
    model = model.eval().cuda()
    x = torch.randn(*shape, device="cuda")
    row = {"model": name, "source": source}
    with torch.no_grad():
        row["eager"] = p50_us(lambda: model(x), iterations)
        for mode in ("default", "reduce-overhead") if compile_columns else ():
            torch._dynamo.reset()
            compiled = torch.compile(copy.deepcopy(model), mode=None if mode == "default" else mode)
            row[f"compile {mode}"] = p50_us(lambda: compiled(x), iterations)
        torch._dynamo.reset()

        ait.enable_performance_validation(False)  # the fixed configurations are measured as they are
        strict = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda", tune_provider_options=False))
        plain = tuned_module(model, x, ait.OneBackendStrategy(strict), f"bench-{name}-strict")
        row["aitune ORT CUDA"] = p50_us(lambda: plain(x), iterations)
        graphed = tuned_module(model, x, ait.OneBackendStrategy(ONNXRuntimeBackend(ONNXRuntimeBackendConfig(
            execution_provider="cuda", tune_provider_options=False, provider_options={"enable_cuda_graph": "1"}))),
            f"bench-{name}-graph")
        row["aitune ORT CUDA + CUDA graph"] = p50_us(lambda: graphed(x), iterations)
        with torch.no_grad():
            row["graph max |diff| vs eager"] = (graphed(x) - model(x)).abs().max().item()
        ait.enable_performance_validation(True)
        tuned = tuned_module(model, x, ait.MaxThroughputStrategy([ONNXRuntimeBackend(
            ONNXRuntimeBackendConfig(execution_provider="cuda"))]), f"bench-{name}-tuned")
        row["aitune tuned"] = p50_us(lambda: tuned(x), iterations)
        (report,) = tuned.ait_reports.values()
        row["tuned winner"] = report.candidates[report.winner].name if report.winner is not None else "eager kept"
        row["tuned decision"] = report.decision
        row["tuned candidates"] = [
            {"name": c.name, "status": c.status, "p50_us": c.p50_us, "device_p50_us": c.device_p50_us,
             "max_abs_error": c.max_abs_error, "reason": c.reason}
            for c in report.candidates
        ]
        row["tuned table"] = report.summary_table()

    onnx = next(iter(ait.cache_root().glob(f"bench-{name.replace(' ', '_')}-strict/*/*/model_raw.onnx")), None)
    if raw_binary and onnx is not None:
        row["raw ORT"] = raw_loop(raw_binary, onnx, shape[0], iterations, "use_tf32=0")
        row["raw ORT + CUDA graph"] = raw_loop(raw_binary, onnx, shape[0], iterations, "use_tf32=0",
                                               "enable_cuda_graph=1")
    return row


def table(rows) -> str:
    columns = ["eager", "compile default", "compile reduce-overhead", "raw ORT", "raw ORT + CUDA graph",
               "aitune ORT CUDA", "aitune ORT CUDA + CUDA graph", "aitune tuned"]
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    lines = ["| model | " + " | ".join(columns) + " | tuned winner |", "|---" * (len(columns) + 2) + "|"]
    for r in rows:
        lines.append(f"| {r['model']} | " + " | ".join(fmt(r.get(c)) for c in columns) + f" | {r['tuned winner']} |")
    lines += ["", "Ratios (lower is faster): against eager / against the raw ORT floor", "",
              "| model | aitune ORT CUDA | aitune + CUDA graph (vs the raw graph loop) | tuned | "
              "compile reduce-overhead |", "|---|---|---|---|---|"]
    for r in rows:
        def ratio(c):
            v, e, f = r.get(c), r["eager"], r.get("raw ORT")
            if v is None:
                return "-"
            return f"{v / e:.2f} / {v / f:.2f}" if f else f"{v / e:.2f} / -"
        g, fg = r.get("aitune ORT CUDA + CUDA graph"), r.get("raw ORT + CUDA graph")
        graph = "-" if g is None else f"{g / r['eager']:.2f} / " + (f"{g / fg:.2f}" if fg else "-")
        lines.append(f"| {r['model']} | {ratio('aitune ORT CUDA')} | {graph} | {ratio('aitune tuned')} | "
                     f"{ratio('compile reduce-overhead')} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--raw-loop", help="benchmarks/raw_ort_loop.cpp built for this ORT")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--only", help="substring of the model names to run")
    parser.add_argument("--out", default="gpu_benchmarks.json")
    parser.add_argument("--skip-compile", action="store_true", help="leave out the torch.compile columns")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: run benchmarks/cpu_benchmarks.py instead", file=sys.stderr)
        return 2
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="aitune-bench-"))
    torch.manual_seed(0)
    rows = []
    for name, model, shape, source in models.cases():
        if args.only and args.only not in name:
            continue
        rows.append(bench_case(name, model, shape, source, args.raw_loop, args.iterations,
                               compile_columns=not args.skip_compile))
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("tuned table", "tuned candidates")}),
              flush=True)
        print(rows[-1]["tuned table"], flush=True)
    ort = _core.OrtRuntime.load()  # the library this process runs (AITUNE_ORT_LIBRARY, the wheel, ...)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                          "onnxruntime_engine": ort.version, "onnxruntime_library": ort.library_path,
                                          "rows": rows}, indent=2))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
