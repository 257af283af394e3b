"""docs/benchmarks.md's first table (benchmarks/gpu_benchmarks.py, its aitune columns) on two
or more ONNX Runtime libraries in one run, each in a process of its own (one ORT per
process), and the per-model ratio of each library's latency to the first's (issue 14:
the PyPI wheel's 1.31.1 next to the npm 1.29.0 build).

    python benchmarks/ort_versions.py --out ort_versions.json --markdown ort_versions.md \\
        --library 1.29.0=/tmp/ort129/lib/libonnxruntime.so.1 \\
        --library 1.31.1=/tmp/ortgpu/onnxruntime/capi/libonnxruntime.so.1.31.1 [--only ResNet]

A library's label is what the table calls it; the engine's own version string (what it
loaded) is recorded next to it. Extra CUDA library folders for a library that is not in a
wheel layout (the npm build finds no pip nvidia-* packages by itself) come from
--ld-library-path, prepended to LD_LIBRARY_PATH of every child.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: The aitune columns of gpu_benchmarks.py that depend on the ONNX Runtime library.
COLUMNS = ("aitune ORT CUDA", "aitune ORT CUDA + CUDA graph", "aitune tuned")


def run_library(label: str, library: str, args, out: Path) -> dict:
    env = dict(os.environ, AITUNE_ORT_LIBRARY=library)
    if args.ld_library_path:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [args.ld_library_path, env.get("LD_LIBRARY_PATH")]))
    command = [sys.executable, str(Path(__file__).with_name("gpu_benchmarks.py")), "--skip-compile",
               "--iterations", str(args.iterations), "--out", str(out)]
    if args.only:
        command += ["--only", args.only]
    try:
        done = subprocess.run(command, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"label": label, "library": library, "error": f"timed out after {args.timeout} s"}
    if done.returncode != 0 or not out.exists():
        return {"label": label, "library": library, "error": f"exited with {done.returncode}"}
    return {"label": label, "library": library, **json.loads(out.read_text())}


def markdown(runs: list[dict]) -> str:
    base = runs[0]
    lines = [", ".join(f"{r['label']}: {r.get('onnxruntime_engine', r.get('error'))} ({r['library']})" for r in runs),
             "", "p50 us per call + sync; ratio = this library / the first (< 1: faster)", ""]
    head = ["model", "column"] + [r["label"] for r in runs] + [f"{r['label']} / {base['label']}" for r in runs[1:]]
    lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for i, row in enumerate(base.get("rows", [])):
        for column in (*COLUMNS, "tuned winner"):
            cells = [r["rows"][i].get(column) if i < len(r.get("rows", [])) else None for r in runs]
            fmt = [c if isinstance(c, str) else ("-" if c is None else f"{c:.0f}") for c in cells]
            ratios = []
            for c in cells[1:]:
                ok = isinstance(c, (int, float)) and isinstance(cells[0], (int, float)) and cells[0]
                ratios.append(f"{c / cells[0]:.2f}" if ok else "-")
            lines.append(f"| {row['model']} | {column} | " + " | ".join(fmt + ratios) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", action="append", required=True, metavar="LABEL=PATH",
                        help="an ONNX Runtime library to measure (two or more; the first is the baseline)")
    parser.add_argument("--ld-library-path", help="folders prepended to LD_LIBRARY_PATH of every child")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--only", help="substring of the model names to run")
    parser.add_argument("--timeout", type=float, default=540, help="seconds per library")
    parser.add_argument("--out", required=True)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    libraries = []
    for item in args.library:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            parser.error(f"--library wants LABEL=PATH, got {item!r}")
        if not Path(path).is_file():
            parser.error(f"--library {label}: no file at {path}")
        libraries.append((label, path))
    if len(libraries) < 2:
        parser.error("give two or more --library")
    runs = []
    with tempfile.TemporaryDirectory(prefix="ort-versions-") as scratch:
        for i, (label, path) in enumerate(libraries):
            runs.append(run_library(label, path, args, Path(scratch) / f"{i}.json"))
            Path(args.out).write_text(json.dumps(runs, indent=2, default=str))
    text = markdown(runs)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
