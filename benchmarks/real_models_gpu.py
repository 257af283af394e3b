"""Real models on the GPU, tuned with the Quick Start as written (issue 13): full-size
BERT-base (12 layers, batch 8, sequence 128) called with keywords, with both exporters,
and ResNet-50 at batch 1 and 16, untrained and with BatchNorm statistics set by a few
training-mode passes.

    python benchmarks/real_models_gpu.py results.json [--budget-s 450] [--only bert-dynamo,...]

Per model: the chosen candidate, its max error against the reference (eager with TF32 off,
on a held-out input), the tuned p50 against eager's p50, and whether torch is healthy
afterwards. Each model runs in a child process of its own with a time limit, so one that
fails (or breaks its CUDA context) never stops the others; the whole run stays inside
--budget-s. Writes everything to the JSON path given and prints one line per model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

# name -> (per-case time limit in seconds, description); run in this order, each within
# what is left of the budget.
CASES = {
    "bert-dynamo": (150, "BERT-base 12 layers, batch 8, seq 128, keyword call, dynamo exporter"),
    "bert-trace": (120, "BERT-base 12 layers, batch 8, seq 128, keyword call, trace exporter"),
    "resnet50-b16-bn": (90, "ResNet-50 batch 16, BatchNorm statistics from training-mode passes"),
    "resnet50-b1-bn": (90, "ResNet-50 batch 1, BatchNorm statistics from training-mode passes"),
    "resnet50-b16-untrained": (90, "ResNet-50 batch 16, untrained (BatchNorm statistics at their defaults)"),
    "resnet50-b1-untrained": (90, "ResNet-50 batch 1, untrained (BatchNorm statistics at their defaults)"),
}


# -- one case, in a child process ----------------------------------------------------------


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _p50_us(fn, device: str, iterations: int = 50) -> float:
    from timing import p50_us

    return p50_us(fn, iterations, sync=device == "cuda")


def _bert(exporter: str, device: str, smoke: bool):
    import torch
    import transformers

    config = transformers.BertConfig()  # bert-base-uncased's shape: 12 layers, hidden 768, 12 heads
    if smoke:
        config = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                         intermediate_size=64)
    model = transformers.BertModel(config).eval().to(device)

    def sample():
        mask = torch.ones(128, dtype=torch.long)
        mask[100:] = 0
        return {"input_ids": torch.randint(0, config.vocab_size, (128,)), "attention_mask": mask}

    samples = [sample() for _ in range(16)]  # two batches of 8
    ids = torch.randint(0, config.vocab_size, (8, 128), device=device)
    mask = torch.ones(8, 128, dtype=torch.long, device=device)
    mask[:, 90:] = 0
    call = dict(input_ids=ids, attention_mask=mask)
    return model, samples, [8], (), call, exporter == "dynamo"


def _resnet50(batch: int, bn_statistics: bool, device: str, smoke: bool):
    import torch

    size = 32 if smoke else 224
    try:
        if smoke:
            raise ImportError("smoke run: a tiny transformers ResNet")
        import torchvision

        model = torchvision.models.resnet50(weights=None)
        kind = "torchvision"
    except Exception:  # torchvision missing or not importable beside this torch
        import transformers

        config = transformers.ResNetConfig(num_labels=1000)
        if smoke:
            config = transformers.ResNetConfig(num_labels=10, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])
        model = transformers.ResNetForImageClassification(config)
        kind = "transformers"
    model = model.to(device)
    if bn_statistics:
        model.train()
        with torch.no_grad():
            for _ in range(5):
                model(torch.randn(16, 3, size, size, device=device))
    model.eval()
    samples = [torch.randn(3, size, size) for _ in range(2 * batch)]
    x = torch.randn(batch, 3, size, size, device=device)
    return model, samples, [batch], (x,), {}, True, kind


def run_case(name: str, smoke: bool = False) -> dict:
    import torch

    import aitune.torch as ait
    from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig
    from aitune.torch.candidate_isolation import check_cuda_health
    from aitune.torch.graph_tuning import exact_float32

    torch.manual_seed(0)
    device = "cpu" if smoke else "cuda"
    result: dict = {"case": name, "description": CASES[name][1] + (" (SMOKE: tiny, CPU)" if smoke else "")}
    if name.startswith("bert"):
        model, samples, batch_sizes, args, kwargs, use_dynamo = _bert(name.split("-")[1], device, smoke)
    else:
        batch = 16 if "b16" in name else 1
        model, samples, batch_sizes, args, kwargs, use_dynamo, kind = _resnet50(batch, name.endswith("-bn"), device,
                                                                                smoke)
        result["resnet"] = kind
    result["exporter"] = "dynamo" if use_dynamo else "trace"

    # The Quick Start, as written (default exporter unless the case says trace).
    provider = ONNXExecutionProvider.CPU if smoke else ONNXExecutionProvider.CUDA
    config = ONNXRuntimeBackendConfig(execution_provider=provider, use_dynamo=use_dynamo)
    tuned = ait.Module(model, name, strategy=ait.OneBackendStrategy(backend=ONNXRuntimeBackend(config)))
    started = time.perf_counter()
    try:
        ait.tune(tuned, samples, batch_sizes=batch_sizes, progress=False)
    except Exception as error:  # a module failing tuning stays eager; report and go on
        result["tune_error"] = f"{type(error).__name__}: {error}"[:2000]
    result["tune_s"] = round(time.perf_counter() - started, 1)
    result["state"] = tuned.ait_state.value
    result["backends"] = tuned.ait_backends
    for report in tuned.ait_reports.values():
        winner = report.candidates[report.winner] if report.winner is not None else None
        result["chosen"] = winner.name if winner else f"eager ({report.decision})"
        result["candidates"] = [
            {"name": c.name, "status": c.status, "precision": str(c.precision), "p50_us": c.p50_us,
             "max_abs_error": c.max_abs_error, "reason": (c.reason or "")[:300]}
            for c in report.candidates
        ]
        result["report_eager_p50_us"] = report.eager_p50_us
        result["report_winner_p50_us"] = winner.p50_us if winner else None

    def first_tensor(output):
        if isinstance(output, torch.Tensor):
            return output
        return output["logits"] if "logits" in output else output[0]

    with torch.no_grad():
        with exact_float32():
            reference = first_tensor(model(*args, **kwargs)).float()
        eager_default = first_tensor(model(*args, **kwargs)).float()  # the user's settings (TF32 convs)
        actual = first_tensor(tuned(*args, **kwargs)).float()
        rms = reference.pow(2).mean().sqrt().item()
        result["reference_rms"] = rms
        result["winner_max_abs_error"] = (actual - reference).abs().max().item()
        result["winner_max_error_over_rms"] = result["winner_max_abs_error"] / max(rms, 1e-30)
        result["eager_tf32_max_abs_error"] = (eager_default - reference).abs().max().item()
        result["eager_p50_us"] = _p50_us(lambda: model(*args, **kwargs), device)
        result["tuned_p50_us"] = _p50_us(lambda: tuned(*args, **kwargs), device)
        result["speedup"] = result["eager_p50_us"] / result["tuned_p50_us"]
    try:
        if device == "cuda":
            check_cuda_health(torch.device("cuda"), "(after the case)")
        a = torch.randn(256, 256, device=device)
        torch.testing.assert_close((a @ a).cpu(), a.cpu() @ a.cpu(), atol=1e-2, rtol=1e-2)
        result["torch_healthy"] = True
    except Exception as error:
        result["torch_healthy"] = False
        result["health_error"] = f"{type(error).__name__}: {error}"[:500]
    return result


# -- the driver ----------------------------------------------------------------------------


def _summary(r: dict) -> str:
    if "error" in r:
        return f"{r['case']}: ERROR {r['error'][:300]}"
    err = r.get("winner_max_abs_error")
    return (
        f"{r['case']}: chosen {r.get('chosen', '?')} | max abs error vs reference {err:.3g} "
        f"({r.get('winner_max_error_over_rms', float('nan')):.2g} of RMS {r.get('reference_rms', 0):.3g}; eager TF32 "
        f"{r.get('eager_tf32_max_abs_error', float('nan')):.3g}) | p50 {r.get('tuned_p50_us', 0):.0f} us vs eager "
        f"{r.get('eager_p50_us', 0):.0f} us ({r.get('speedup', 0):.2f}x) | tune {r.get('tune_s')} s | "
        f"torch healthy: {r.get('torch_healthy')}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="JSON file to write")
    parser.add_argument("--budget-s", type=float, default=460,
                        help="total wall-clock budget (default 460 s); cases that no longer fit are reported "
                             "skipped (run them with --only in a second call)")
    parser.add_argument("--only", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny models on the CPU provider: checks the script itself on a machine without a GPU")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # child mode
    options = parser.parse_args()

    if options.case:  # child: run one case, write its JSON to `out`
        try:
            result = run_case(options.case, options.smoke)
        except Exception as error:
            result = {"case": options.case, "error": f"{type(error).__name__}: {error}",
                      "traceback": traceback.format_exc()[-3000:]}
        options.out.write_text(json.dumps(result, indent=2, default=str))
        return 0

    names = [n for n in options.only.split(",") if n] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    deadline = time.monotonic() + options.budget_s
    results = []
    for name in names:
        left = deadline - time.monotonic()
        if left < 20:
            results.append({"case": name, "error": "skipped: the time budget is spent"})
            print(_summary(results[-1]), flush=True)
            continue
        part = options.out.with_name(options.out.name + f".{name}.part")
        limit = min(CASES[name][0] * (3 if options.smoke else 1), left)
        started = time.monotonic()
        try:
            command = [sys.executable, __file__, str(part), "--case", name] + (["--smoke"] if options.smoke else [])
            done = subprocess.run(command, timeout=limit, capture_output=True, text=True)
            if part.exists():
                result = json.loads(part.read_text())
            else:
                result = {"case": name, "error": f"child exited {done.returncode}: {done.stderr[-1500:]}"}
        except subprocess.TimeoutExpired:
            result = {"case": name, "error": f"timed out after {limit:.0f} s"}
        finally:
            part.unlink(missing_ok=True)
        result["wall_s"] = round(time.monotonic() - started, 1)
        results.append(result)
        print(_summary(result), flush=True)
        options.out.write_text(json.dumps(results, indent=2, default=str))  # partial results survive a kill
    options.out.write_text(json.dumps(results, indent=2, default=str))
    return 0 if all("error" not in r and r.get("torch_healthy") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
