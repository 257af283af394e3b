"""Why aitune's torch.compile candidate can be slower than bare torch.compile (issue 28):
the same model compiled several ways, timed and kernel-profiled side by side in one run.

    python benchmarks/compile_candidate_gap.py --model gpt2_lm_b8_s128 --out gap.json

Rows (all mode="reduce-overhead", fp16 autocast, TF32 matmuls on, as precision_benchmarks):
  bare            torch.compile(model) called under autocast, as a user writes it
  bare+cast       the same, its output cast to the module's dtype (fp32) after the call
  inside          autocast inside the compiled forward, outputs as autocast leaves them
  inside+cast     autocast inside, outputs cast back inside the compiled code (aitune's form)
  aitune module   the module tuned with TorchCompileBackend(precisions=("fp16",), half_weights=False),
                  called as a user calls it; with the candidate p50 the tuner recorded
  aitune half weights / fp16 outputs   the same with TorchCompileBackendConfig(half_weights=True)
                  and with output_dtype="compute" (rows named by the winner), each
                  with every compile candidate's tuner p50 printed
Per row: p50 us, output dtype, device time per call by kernel family (profile_kernels).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from precision_benchmarks import MODELS  # noqa: E402
from profile_kernels import kernel_profile  # noqa: E402
from timing import p50_us  # noqa: E402

import aitune.torch as ait  # noqa: E402
from aitune.torch.backend import TorchCompileBackend, TorchCompileBackendConfig  # noqa: E402


class Inside(torch.nn.Module):
    """autocast inside the compiled forward, optionally casting the output back."""

    def __init__(self, model, cast: torch.dtype | None):
        super().__init__()
        self.model, self.cast = model, cast

    def forward(self, x):
        with torch.autocast("cuda", dtype=torch.float16):
            y = self.model(x)
        return y if self.cast is None else y.to(self.cast)


def stepped(compiled, x, outside_autocast: bool, cast: torch.dtype | None = None):
    def call():
        torch.compiler.cudagraph_mark_step_begin()
        if outside_autocast:
            with torch.autocast("cuda", dtype=torch.float16):
                y = compiled(x)
        else:
            y = compiled(x)
        return y if cast is None else y.to(cast)
    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2_lm_b8_s128", choices=list(MODELS))
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", required=True)
    parser.add_argument("--beside-ort", action="store_true",
                        help="also tune with ONNX Runtime's CUDA backend listed before / after the compile backend "
                             "(session 24's lead: the compile candidate compiled while ONNX Runtime's sessions hold "
                             "their arenas is slower than bare compile on ResNet-50 and Swin-T)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this comparison needs the GPU", file=sys.stderr)
        return 2
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="aitune-gap-"))
    torch.manual_seed(0)
    model, x = MODELS[args.model]()
    dtype = next(model.parameters()).dtype
    rows = {}
    with torch.no_grad():
        torch.set_float32_matmul_precision("high")
        variants = {
            "bare": lambda: stepped(torch.compile(copy.deepcopy(model), mode="reduce-overhead"), x, True),
            "bare+cast": lambda: stepped(torch.compile(copy.deepcopy(model), mode="reduce-overhead"), x, True, dtype),
            "inside": lambda: stepped(torch.compile(Inside(copy.deepcopy(model), None), mode="reduce-overhead"), x,
                                      False),
            "inside+cast": lambda: stepped(torch.compile(Inside(copy.deepcopy(model), dtype), mode="reduce-overhead"),
                                           x, False),
        }
        for name, make in variants.items():
            torch._dynamo.reset()
            call = make()
            out = call()
            rows[name] = {"p50_us": p50_us(call, args.iterations), "output_dtype": str(out.dtype),
                          "kernels": kernel_profile(call, args.calls)}
            print(f"{name:14s} p50 {rows[name]['p50_us']:8.1f} us  out {out.dtype}  "
                  f"kernels {rows[name]['kernels']['device_us_per_call']:8.1f} us/call", flush=True)
        torch.set_float32_matmul_precision("highest")
        variants = {"aitune module": {"half_weights": False}, "aitune half weights": {"half_weights": True},
                    "aitune fp16 outputs": {"half_weights": True, "output_dtype": "compute"}}
        if args.beside_ort:
            variants["aitune after ORT"] = {"half_weights": False, "ort": "before"}
            variants["aitune before ORT"] = {"half_weights": False, "ort": "after"}
        for label, options in variants.items():
            torch._dynamo.reset()
            options = dict(options)
            ort = options.pop("ort", None)
            backend = TorchCompileBackend(TorchCompileBackendConfig(precisions=("fp16",), **options))
            strategy = ait.OneBackendStrategy(backend)
            if ort is not None:
                from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig

                onnx = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda"))
                strategy = ait.MaxThroughputStrategy([onnx, backend] if ort == "before" else [backend, onnx])
            module = ait.Module(copy.deepcopy(model), f"gap-{args.model}-{len(rows)}", strategy=strategy)
            ait.tune(module, [x[i] for i in range(x.shape[0])], batch_sizes=[x.shape[0]], progress=False)
            (report,) = module.ait_reports.values()
            print(report.summary_table())
            winner = report.candidates[report.winner] if report.winner is not None else None
            out = module(x)
            rows[label] = {
                "p50_us": p50_us(lambda: module(x), args.iterations), "output_dtype": str(out.dtype),
                "candidate": winner.name if winner else report.decision,
                "candidate_p50_us": winner.p50_us if winner else None,
                "candidates": {c.name: c.p50_us for c in report.candidates},
                "kernels": kernel_profile(lambda: module(x), args.calls),
            }
            r = rows[label]
            print(f"{label}  p50 {r['p50_us']:8.1f} us  out {out.dtype}  candidate {r['candidate']} "
                  f"p50 {r['candidate_p50_us']}  kernels {r['kernels']['device_us_per_call']:8.1f} us/call")
    base = rows["bare"]["p50_us"]
    print(f"\n| row | p50 us | bare / row | output | kernel us/call | launches/call |\n|---|---|---|---|---|---|")
    for name, r in rows.items():
        k = r["kernels"]
        print(f"| {name} | {r['p50_us']:.0f} | {base / r['p50_us']:.2f} | {r['output_dtype']} | "
              f"{k['device_us_per_call']:.0f} | {k['kernels_per_call']:.0f} |")
    for name, r in rows.items():
        print(f"\n== {name}")
        for fam, us in r["kernels"]["families_us_per_call"].items():
            print(f"  {fam:28s} {us:8.1f} us")
        for k in r["kernels"]["top"][:6]:
            print(f"    {k['us_per_call']:8.1f} us x{k['launches_per_call']:.0f}  {k['name'][:100]}")
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
