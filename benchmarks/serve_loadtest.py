"""Ray Serve load test of a tuned checkpoint: one and several replicas (one per GPU with
--num-gpus 1), a concurrency sweep each, answers checked against the tuned module, GPU
utilisation per GPU sampled with nvidia-smi, the replicas' device ids reported.

    python benchmarks/serve_loadtest.py --make mlp --device cpu --replicas 1,2 --num-cpus 0.5
    python benchmarks/serve_loadtest.py --make resnet50 --device cuda --replicas 1,2 --num-gpus 1 \
        --concurrency 1,4,16,64 --json serve_gpu.json

A local Ray instance of its own (temp dir under /tmp, 127.0.0.1, usage statistics off) is
started and shut down; --checkpoint serves an existing checkpoint instead of --make.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def make_checkpoint(kind: str, device: str, out: Path) -> Path:
    """Tunes a random-weight model (batch search on) and saves it."""
    import torch

    import aitune.torch as ait
    from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    if kind == "mlp":
        from models import MLP

        model, sample, batches = MLP(), lambda: torch.randn(256), [1, 4]
    elif kind == "resnet18":
        from models import resnet18

        model, sample, batches = resnet18()[0], lambda: torch.randn(3, 224, 224), [1, 4]
    elif kind == "resnet50":
        import torchvision

        model, sample, batches = torchvision.models.resnet50(weights=None), lambda: torch.randn(3, 224, 224), [1, 8]
    elif kind == "bert":
        import transformers

        config = transformers.BertConfig()
        inner = transformers.BertModel(config)

        class Bert(torch.nn.Module):  # a plain tensor out: the pooled output
            def __init__(self):
                super().__init__()
                self.bert = inner

            def forward(self, input_ids, attention_mask):
                return self.bert(input_ids=input_ids, attention_mask=attention_mask).pooler_output

        model, batches = Bert(), [1, 8]
        sample = lambda: (torch.randint(0, config.vocab_size, (128,)), torch.ones(128, dtype=torch.int64))  # noqa: E731
    else:
        raise SystemExit(f"unknown model {kind}")
    provider = ONNXExecutionProvider.CUDA if device == "cuda" else ONNXExecutionProvider.CPU
    model = model.eval().to(device)
    wrapped = ait.Module(model, f"{kind}_serve",
                         strategy=ait.OneBackendStrategy(ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider=provider))))
    ait.tune(wrapped, [sample() for _ in range(8)], batch_sizes=batches, device=device, disable_external_logging=True,
             ignore_failing_modules=False, find_max_batch_size=True, max_batch_size=256, performance_validation=False)
    ait.save(wrapped, out)
    return out


class GpuSampler:
    """Mean utilisation per GPU from `nvidia-smi` while the level runs (empty without one)."""

    def __init__(self):
        self.samples: dict[str, list[float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.2):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.TimeoutExpired):
                return
            for line in out.strip().splitlines():
                index, util = (s.strip() for s in line.split(","))
                self.samples.setdefault(index, []).append(float(util))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def means(self) -> dict[str, float]:
        return {k: round(sum(v) / len(v), 1) for k, v in self.samples.items() if v}


def replica_infos(handle, replicas: int, tries: int = 50) -> dict[str, dict]:
    """Each replica's info (device ids among them), asked through the handle until all answered."""
    seen: dict[str, dict] = {}
    for _ in range(tries):
        info = handle.info.remote().result(timeout_s=30)
        seen[info["replica"]] = info
        if len(seen) >= replicas:
            break
    return seen


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint")
    source.add_argument("--make", choices=["mlp", "resnet18", "resnet50", "bert"])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--replicas", default="1,2")
    p.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per replica")
    p.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica (1: one replica per GPU)")
    p.add_argument("--threads", type=int, default=0, help="ORT intra-op threads per replica (0: as saved)")
    p.add_argument("--slo-ms", type=float)
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--requests-per-client", type=int, default=40)
    p.add_argument("--format", choices=["json", "npz", "raw"], default="npz")
    p.add_argument("--port", type=int, default=26482)
    p.add_argument("--json", dest="json_out")
    args = p.parse_args()

    import ray
    from ray import serve

    import aitune
    from aitune import _core
    from aitune.serve import loadtest, plan_for, ray_instance
    from aitune.serve.deployment import build

    work = Path(tempfile.mkdtemp(prefix="aitune-serve-bench-"))
    checkpoint = args.checkpoint or str(make_checkpoint(args.make, args.device, work / f"{args.make}.ait"))
    plan = plan_for(_core.Checkpoint.load(checkpoint), args.slo_ms)
    print(plan.explain())
    pool = loadtest.RequestPool(checkpoint, device=None if args.device == "cuda" else "cpu")
    levels = [int(c) for c in args.concurrency.split(",")]
    results = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "versions": {"aitune": getattr(aitune, "__version__", "?"), "ray": ray.__version__,
                            "onnxruntime": _core.OrtRuntime.load().version if hasattr(_core, "OrtRuntime") else "?"},
               "checkpoint": checkpoint, "plan": json.loads(plan.to_json()), "runs": []}
    ray_instance.start(metrics_port=args.port + 1, dashboard_port=args.port + 2)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        url = f"http://127.0.0.1:{args.port}/"
        for replicas in (int(r) for r in args.replicas.split(",")):
            serve.run(build(checkpoint, device=args.device, intra_op_threads=args.threads, num_replicas=replicas,
                            num_cpus=args.num_cpus, num_gpus=args.num_gpus, max_batch_size=plan.max_batch_size,
                            batch_wait_timeout_s=plan.batch_wait_timeout_s), name="aitune", route_prefix="/")
            infos = replica_infos(serve.get_app_handle("aitune"), replicas)
            for name, info in infos.items():
                print(f"replica {name}: pid {info['pid']} gpu ids {info['gpu_ids']} sessions on {info['devices']}")
            rows = []
            for c in levels:
                loadtest.run_level(url, pool, c, min(2 * c, 32), args.format)  # warm-up, not counted
                with GpuSampler() as gpus:
                    row = loadtest.run_level(url, pool, c, c * args.requests_per_client, args.format).row()
                row["gpu_util"] = gpus.means()
                rows.append(row)
            print(f"\n{replicas} replica(s):\n{loadtest.table(rows)}")
            for r in rows:
                if r["gpu_util"]:
                    print(f"  concurrency {r['concurrency']}: GPU utilisation {r['gpu_util']}")
            results["runs"].append({"replicas": replicas, "replica_infos": list(infos.values()), "rows": rows})
            serve.delete("aitune")
    finally:
        ray_instance.stop("aitune", started_here=True)
    if len(results["runs"]) >= 2:
        best = [max(r["throughput"] for r in run["rows"]) for run in results["runs"]]
        print(f"\nsaturation throughput: {best} req/s; ratio {best[-1] / best[0]:.2f}x")
        results["scaling"] = best[-1] / best[0]
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2, default=str))
    wrong = sum(r["wrong"] for run in results["runs"] for r in run["rows"])
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
