"""Why a tuned module's p50 differs between two timers (issue 28, session 32's ResNet-50 row:
1307 us with torch.cuda.synchronize() after each call, 1136 us with the host waiting on a
CUDA event recorded after the call on the current stream).

    python benchmarks/timer_gap_probe.py --model resnet50_b16 --out timer_gap.json

Tunes the model with the CUDA provider only, fp16, with the zoo's ResNet-50 winner options
offered, and builds bare torch.compile(mode="reduce-overhead") under fp16 autocast. Then,
in turns call by call (so a drift of clocks hits every column alike), times each side by
both timers: ``sync`` (perf_counter around call + torch.cuda.synchronize()) and ``event``
(an event recorded on the current stream after the call; the host waits on it only).
Last, records --calls calls of each side with torch.profiler and reports, per call, the
GPU activity on every stream (kernels, copies, memsets) that ends after the call's last
activity on the current stream: work the event timer cannot see and the device-wide
synchronize waits for.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from precision_benchmarks import MODELS, compiled_call  # noqa: E402

import aitune.torch as ait  # noqa: E402
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig  # noqa: E402


def timed_in_turns(columns: dict, iterations: int, warmup: int = 20) -> dict:
    """Per column, p50 host us by the sync timer and by the event timer, alternating."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(warmup):
        for fn in columns.values():
            fn()
            torch.cuda.synchronize()
    samples = {f"{name} {timer}": [] for name in columns for timer in ("sync", "event", "event-device")}
    for _ in range(iterations):
        for name, fn in columns.items():
            begin = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            samples[f"{name} sync"].append((time.perf_counter() - begin) * 1e6)
            begin = time.perf_counter()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples[f"{name} event"].append((time.perf_counter() - begin) * 1e6)
            samples[f"{name} event-device"].append(start.elapsed_time(stop) * 1e3)
            torch.cuda.synchronize()  # whatever the event did not wait for, before the next sample
    return {k: statistics.median(v) for k, v in samples.items()}


def stream_activity(fn, calls: int) -> dict:
    """GPU activity of ``calls`` calls, one profiler range per call, by stream."""
    from torch.profiler import ProfilerActivity, profile, record_function

    current = torch.cuda.current_stream().cuda_stream
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            with record_function(f"call-{i}"):
                fn()
                torch.cuda.synchronize()
    events = prof.events()
    windows = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.name.startswith("call-"))
    gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    per_call = []
    for begin, end, name in windows:
        inside = [e for e in gpu if begin <= e.time_range.start <= end]
        by_stream: dict = {}
        for e in inside:
            s = by_stream.setdefault(str(getattr(e, "device_resource_id", "?")), {"n": 0, "busy_us": 0.0,
                                                                                 "last_end_us": 0.0, "names": {}})
            s["n"] += 1
            s["busy_us"] += e.time_range.elapsed_us()
            s["last_end_us"] = max(s["last_end_us"], e.time_range.end - begin)
            s["names"][e.name[:80]] = s["names"].get(e.name[:80], 0) + 1
        for s in by_stream.values():  # the five most frequent names only
            s["names"] = dict(sorted(s["names"].items(), key=lambda kv: -kv[1])[:5])
        per_call.append({"call": name, "wall_us": end - begin, "streams": by_stream})
    return {"current_stream": current, "calls": per_call}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50_b16", choices=list(MODELS))
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--calls", type=int, default=5, help="profiled calls per side")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this probe needs the GPU", file=sys.stderr)
        return 2
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="aitune-timer-gap-"))
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model, x = MODELS[args.model]()
    result: dict = {"model": args.model, "device": torch.cuda.get_device_name()}
    with torch.no_grad():
        compile_call = compiled_call(copy.deepcopy(model), x, fp16=True)
        backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(
            execution_provider="cuda", precision="fp16",
            provider_options={"enable_cuda_graph": "1", "prefer_nhwc": "1", "fuse_conv_bias": "1"}))
        module = ait.Module(copy.deepcopy(model), f"timer-gap-{args.model}", strategy=ait.OneBackendStrategy(backend))
        ait.tune(module, [x[i] for i in range(x.shape[0])], batch_sizes=[x.shape[0]], progress=False)
        (report,) = module.ait_reports.values()
        winner = report.candidates[report.winner] if report.winner is not None else None
        result["winner"] = winner.name if winner else f"eager kept ({report.decision})"
        result["winner_tuner_p50_us"] = winner.p50_us if winner else None
        eager = copy.deepcopy(model)
        columns = {"module": lambda: module(x), "compile fp16": compile_call,
                   "eager fp32": lambda: eager(x)}
        result["p50_us_in_turns"] = timed_in_turns(columns, args.iterations)
        result["profile"] = {name: stream_activity(fn, args.calls) for name, fn in columns.items()
                             if name != "eager fp32"}
    for k, v in result["p50_us_in_turns"].items():
        print(f"{k:28s} {v:9.1f}")
    print("winner", result["winner"], "tuner p50", result["winner_tuner_p50_us"])
    for side, prof in result["profile"].items():
        print(f"== {side}: current stream {prof['current_stream']}")
        for c in prof["calls"]:
            print(f"  {c['call']} wall {c['wall_us']:.0f} us")
            for sid, s in c["streams"].items():
                print(f"    stream {sid}: {s['n']} events, busy {s['busy_us']:.0f} us, last end {s['last_end_us']:.0f} us,"
                      f" {list(s['names'].items())[:3]}")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
