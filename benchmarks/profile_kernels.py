"""Where the time goes, kernel by kernel: the tuned ONNX Runtime winner against
torch.compile at the same precision (issue 16's "why does a row lose").

    python benchmarks/profile_kernels.py --model resnet50_b16 --precision fp16 --out kernels.json

Tunes the model with the CUDA provider only (default tuning, the fp16 candidates included),
then records the CUDA kernels of --calls calls of the tuned module and of
torch.compile(mode="reduce-overhead") (under fp16 autocast for --precision fp16, TF32
matmuls for tf32) with torch.profiler. CUPTI sees every kernel in the process, those ONNX
Runtime launches (also from CUDA-graph replays) as well as torch's, so both sides are
measured the same way. Prints per side the device time per call by kernel family
(convolution, GEMM, layout transpose / reorder, normalization, elementwise / activation,
reduction / pooling, attention, copy) and the top kernels.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import re
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from precision_benchmarks import MODELS, compiled_call  # noqa: E402  (the same models, built the same way)

import aitune.torch as ait  # noqa: E402
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig  # noqa: E402

FAMILIES = [  # first match wins; names of cuDNN, cuBLAS(Lt), CUTLASS, Triton and ORT kernels
    ("attention", r"attention|fmha|flash|softmax"),
    ("layout transpose/reorder", r"transpose|nchwtonhwc|nhwctonchw|nchw2nhwc|nhwc2nchw|reorder|permute|convert_?layout"),
    ("convolution", r"conv|implicit_?gemm|cudnn|xmma_fprop|fprop|dgrad|wgrad|winograd|sm\d+_xmma"),
    ("gemm", r"gemm|cublas|cutlass|matmul|\bmm\b|splitk|sgemm|hgemm|nvjet"),  # nvjet: cuBLAS's sm90 kernels
    ("normalization", r"norm|batchnorm|layernorm|bn_"),
    ("reduction/pooling", r"pool|reduce|mean|sum_kernel"),
    ("copy/cast", r"copy|cast|memcpy|memset|convert"),
    ("elementwise/activation", r"elementwise|vectorized|relu|gelu|add|mul|triton|fused|unrolled"),
]


def family(name: str) -> str:
    low = name.lower()
    for label, pattern in FAMILIES:
        if re.search(pattern, low):
            return label
    return "other"


def kernel_profile(fn, calls: int) -> dict:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per_kernel = collections.Counter()
    count = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
            count[event.name] += 1
    families = collections.Counter()
    for name, us in per_kernel.items():
        families[family(name)] += us
    return {
        "device_us_per_call": sum(per_kernel.values()) / calls,
        "kernels_per_call": sum(count.values()) / calls,
        "families_us_per_call": {k: v / calls for k, v in families.most_common()},
        "top": [{"name": n[:160], "us_per_call": us / calls, "launches_per_call": count[n] / calls,
                 "family": family(n)} for n, us in per_kernel.most_common(15)],
    }


def print_kernels(profile: dict, top: int = 10) -> None:
    """A kernel_profile's families, then its ``top`` kernels, indented under a heading line."""
    for name, us in profile["families_us_per_call"].items():
        print(f"  {name:28s} {us:8.1f} us")
    for k in profile["top"][:top]:
        print(f"    {k['us_per_call']:8.1f} us x{k['launches_per_call']:<4.0f} [{k['family']}] {k['name'][:100]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50_b16", choices=list(MODELS))
    parser.add_argument("--precision", default="fp16", choices=["fp16", "tf32"])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a CUDA provider option set in every candidate (e.g. fuse_conv_bias=1)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this profile needs the GPU", file=sys.stderr)
        return 2
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="aitune-kernels-"))
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model, x = MODELS[args.model]()
    options = dict(o.split("=", 1) for o in args.provider_option)
    result = {"model": args.model, "precision": args.precision, "provider_options": options}
    with torch.no_grad():
        torch.set_float32_matmul_precision("high")
        compile_call = compiled_call(copy.deepcopy(model), x, fp16=args.precision == "fp16")
        result["compile"] = kernel_profile(compile_call, args.calls)
        torch.set_float32_matmul_precision("highest")
        torch._dynamo.reset()

        backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda", precision=args.precision,
                                                             provider_options=options or None))
        module = ait.Module(copy.deepcopy(model), f"kernels-{args.model}", strategy=ait.OneBackendStrategy(backend))
        ait.tune(module, [x[i] for i in range(x.shape[0])], batch_sizes=[x.shape[0]], progress=False)
        (report,) = module.ait_reports.values()
        winner = report.candidates[report.winner] if report.winner is not None else None
        result["aitune_candidate"] = winner.name if winner else f"eager kept ({report.decision})"
        result["aitune"] = kernel_profile(lambda: module(x), args.calls)
        result["candidates"] = [{"name": c.name, "status": c.status, "p50_us": c.p50_us} for c in report.candidates]
        print(report.summary_table())
    for side in ("compile", "aitune"):
        r = result[side]
        print(f"\n== {side} ({result.get('aitune_candidate') if side == 'aitune' else 'reduce-overhead'}): "
              f"{r['device_us_per_call']:.0f} us of kernels per call, {r['kernels_per_call']:.0f} launches")
        print_kernels(r)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
