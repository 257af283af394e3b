"""Where a tuned module's latency parts from its winner's tuner p50 (issue 28) on a
decoder case of decoder.py: after the tune, the module (the user's inputs) and the call the
tuner measured (``dispatch.measured_call``: the recorded sample, copies where the candidate
writes its inputs) take turns call by call, each timed by the wall clock with a device
sync and by CUDA events (the tuner's timer); then ``torch.profiler`` lists the GPU work of
one call of each (kernels and copies, µs per call, as profile_kernels.py lists them). Same latency now and the gap is the
tune's conditions; a gap here and the profile says which work the module's call adds.

    python benchmarks/winner_gap_probe.py [--workload decode] [--batch 1] [--length 1024]
                                          [--iterations 100] [--out probe.json]
    python benchmarks/winner_gap_probe.py --device cpu --tiny      # smoke test
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decoder  # noqa: E402
from profile_kernels import kernel_profile  # noqa: E402  (the kernels of a call, as profile_kernels.py lists them)
from timing import event_p50_us, p50s_in_turns  # noqa: E402

import aitune.torch as ait  # noqa: E402
from aitune.torch.dispatch import measured_call  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--model", default="llama", choices=tuple(decoder.FULL))
    parser.add_argument("--workload", default="decode", choices=("decode", "prefill"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--length", type=int, default=1024, help="decode: cache slots; prefill: sequence")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--profile-calls", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    length = min(args.length, 96 if args.workload == "decode" else 16) if args.tiny else args.length
    model = decoder.decoder_model(args.model, args.tiny).to(args.device)
    if cuda:
        model = model.half()
    if args.workload == "decode":
        module, inputs = decoder.decode_case(model, args.device, args.batch, length)
    else:
        module, inputs = decoder.prefill_case(model, args.device, args.batch, length)
    tuned = ait.Module(module, "winner-gap-probe", strategy=ait.MaxThroughputStrategy(decoder.tune_backends(cuda)))
    ait.tune(tuned, lambda size: [inputs], batch_sizes=[1], progress=False, disable_external_logging=True)
    (report,) = tuned.ait_reports.values()
    winner = report.candidates[report.winner]
    ((graph, tuned_graph),) = tuned._ait_calls.tuned.values()  # noqa: SLF001
    measured = measured_call(graph, tuned_graph)

    def module_call():
        return tuned(**inputs)

    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "case": f"{args.model} {args.workload} b{args.batch} {length}", "winner": winner.name,
              "winner_tuner_p50_us": winner.p50_us, "winner_tuner_device_p50_us": winner.device_p50_us}
    with torch.no_grad():
        result["in_turns_us"] = p50s_in_turns({"module": module_call, "measured_call": measured}, args.iterations)
        if cuda:
            result["events_us"] = {name: dict(zip(("host", "device"), event_p50_us(fn, args.iterations)))
                                   for name, fn in (("module", module_call), ("measured_call", measured))}
            result["gpu_work"] = {name: kernel_profile(fn, args.profile_calls)
                                  for name, fn in (("module", module_call), ("measured_call", measured))}
    print(json.dumps({k: v for k, v in result.items() if k != "gpu_work"}, indent=1))
    for name, work in result.get("gpu_work", {}).items():
        print(f"\n{name}: {work['device_us_per_call']:.1f} us of GPU work per call, "
              f"{work['kernels_per_call']:.0f} kernels and copies")
        for r in work["top"][:12]:
            print(f"  {r['us_per_call']:8.1f} us  x{r['launches_per_call']:5.1f}  {r['name'][:90]}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
