"""GPU benchmark precision for precision (issue 16): aitune against torch.compile at the
same precision, on ResNet-50, BERT-base and GPT-2 small, and on the four models of
docs/benchmarks.md's first table (MLP, ResNet-18 b1 / b32, nn.TransformerEncoder), random
weights.

    python benchmarks/precision_benchmarks.py --out precision.json --markdown precision.md \
        [--models resnet50_b1,resnet50_b16,bert_b8_s128,gpt2_b8_s128,mlp_b1,resnet18_b1,...]
        [--iterations 100]

Per model, one row (p50 us of one call + torch.cuda.synchronize()):
  eager (torch's defaults: cuDNN convolutions in TF32, matmuls in fp32)
  compile TF32: torch.compile(mode="reduce-overhead") with set_float32_matmul_precision("high")
  compile fp16: the same under torch.autocast("cuda", torch.float16)
  one ait.tune of MaxThroughputStrategy([ONNXRuntimeBackend(cuda), TorchCompileBackend(tf32, fp16)]):
    aitune ORT fp32/TF32: the fastest correct ONNX Runtime candidate of precision fp32 or tf32
    aitune ORT fp16: the fastest correct ONNX Runtime candidate of precision fp16
    tuned fp32/TF32: the fastest correct candidate of either backend at fp32 or tf32 (what
      the strategy with precision="tf32" would choose)
      (these three as the engine measured them while tuning: p50 of the call, which waits
      for the device, the same per-call + sync measure as the other columns)
    tuned winner: the strategy's choice over ONNX Runtime and torch.compile, measured
      through the tuned module like eager
  each winner's max |error| against eager, and the tuning time.
Ratios: compile p50 / aitune p50 at the same precision (> 1: aitune faster).
Each model runs in a process of its own (--model-timeout seconds at most): a model that
fails, crashes or hangs is recorded with its error; the others still run. BatchNorm
statistics are calibrated by a few training-mode forward passes of random inputs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

import aitune.torch as ait
from aitune import _core
from aitune.torch.backend import (
    ONNXRuntimeBackend,
    ONNXRuntimeBackendConfig,
    TorchCompileBackend,
    TorchCompileBackendConfig,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models as table_models  # noqa: E402  (benchmarks/models.py: the first table's four models)
from timing import p50_us  # noqa: E402  (benchmarks/timing.py)


class LastHidden(torch.nn.Module):
    """A transformers model as ``forward(input_ids) -> last_hidden_state`` (no KV cache)."""

    def __init__(self, model: torch.nn.Module, use_cache: bool | None):
        super().__init__()
        self.model = model
        self.use_cache = use_cache

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        kwargs = {} if self.use_cache is None else {"use_cache": self.use_cache}
        return self.model(input_ids=input_ids, **kwargs).last_hidden_state


class Logits(torch.nn.Module):
    """A causal LM as ``forward(input_ids) -> logits`` (no KV cache): the vocabulary-sized
    output whose reduced-precision error the correctness check must judge (issue 24)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def calibrated(model: torch.nn.Module, shape: tuple[int, ...]) -> torch.nn.Module:
    """``model`` on the GPU with BatchNorm statistics from data, not the init's 0 / 1 (a few
    training-mode forwards of random inputs), in eval mode."""
    model = model.cuda().train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(*shape, device="cuda"))
    return model.eval()


def resnet50(batch: int):
    import torchvision

    model = calibrated(torchvision.models.resnet50(weights=None), (16, 3, 224, 224))
    return model, torch.randn(batch, 3, 224, 224, device="cuda")


def table_model(make, shape: tuple[int, ...]):
    """One of the first table's models (benchmarks/models.py), float inputs of ``shape``."""
    model = calibrated(make(), (max(shape[0], 8), *shape[1:]))
    return model, torch.randn(*shape, device="cuda")


def bert(batch: int, seq: int):
    from transformers import BertConfig, BertModel

    model = LastHidden(BertModel(BertConfig(), add_pooling_layer=False), None).cuda().eval()
    return model, torch.randint(0, 30522, (batch, seq), device="cuda")


def gpt2(batch: int, seq: int):
    from transformers import GPT2Config, GPT2Model

    model = LastHidden(GPT2Model(GPT2Config()), use_cache=False).cuda().eval()
    return model, torch.randint(0, 50257, (batch, seq), device="cuda")


def llama(batch: int, seq: int):
    """Llama-shaped (hidden 2048, 8 layers, 32 query / 4 key-value heads, vocab 32000)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=32,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
    model = Logits(LlamaForCausalLM(config)).cuda().eval()
    return model, torch.randint(0, 32000, (batch, seq), device="cuda")


def gpt2_lm(batch: int, seq: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = Logits(GPT2LMHeadModel(GPT2Config())).cuda().eval()
    return model, torch.randint(0, 50257, (batch, seq), device="cuda")


MODELS = {
    "resnet50_b1": lambda: resnet50(1),
    "resnet50_b16": lambda: resnet50(16),
    "bert_b8_s128": lambda: bert(8, 128),
    "gpt2_b8_s128": lambda: gpt2(8, 128),
    "mlp_b1": lambda: table_model(table_models.MLP, (1, 256)),
    "resnet18_b1": lambda: table_model(lambda: table_models.resnet18()[0], (1, 3, 224, 224)),
    "resnet18_b32": lambda: table_model(lambda: table_models.resnet18()[0], (32, 3, 224, 224)),
    "encoder_b8_s128": lambda: table_model(table_models.Encoder, (8, 128, 256)),
    "llama_b1_s256": lambda: llama(1, 256),
    "gpt2_lm_b8_s128": lambda: gpt2_lm(8, 128),
}



def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def compiled_call(model, x, *, fp16: bool):
    """One call of torch.compile(model, mode="reduce-overhead") on ``x`` as a user makes it
    (a new CUDA-graph step each call; under fp16 autocast for ``fp16``). The matmul
    precision (TF32 or not) is the caller's setting when the first call compiles."""
    compiled = torch.compile(model, mode="reduce-overhead")

    def call():
        torch.compiler.cudagraph_mark_step_begin()
        if fp16:
            with torch.autocast("cuda", dtype=torch.float16):
                return compiled(x)
        return compiled(x)

    return call


def compile_column(model, x, reference, iterations, *, tf32: bool, fp16: bool) -> dict:
    """torch.compile(mode="reduce-overhead") as a user runs it at this precision."""
    torch._dynamo.reset()
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        call = compiled_call(model, x, fp16=fp16)
        start = time.perf_counter()
        out = call()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        error = max_error(out, reference)
        return {"p50_us": p50_us(call, iterations), "max_error": error, "compile_s": compile_s}
    finally:
        torch.set_float32_matmul_precision(previous)


def best(candidates, group: int, precisions: tuple[str, ...]):
    ok = [c for c in candidates if c.group == group and c.p50_us is not None
          and c.status in ("passed", "selected", "not chosen", "slower than eager", "over budget")
          and _core.precision_name(c.precision) in precisions]
    return min(ok, key=lambda c: c.p50_us) if ok else None


def aitune_columns(name, model, x, reference, iterations, profile) -> dict:
    torch._dynamo.reset()
    strategy = ait.MaxThroughputStrategy([
        ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda")),
        TorchCompileBackend(TorchCompileBackendConfig(precisions=("tf32", "fp16"))),
    ])
    module = ait.Module(copy.deepcopy(model), f"precision-{name}", strategy=strategy)
    start = time.perf_counter()
    ait.tune(module, [x[i] for i in range(x.shape[0])], batch_sizes=[x.shape[0]], progress=False,
             profile_config=profile)
    wall_s = time.perf_counter() - start
    (report,) = module.ait_reports.values()
    cols = {"tuning_s": report.tuning_s, "tuning_wall_s": wall_s, "table": report.summary_table(),
            "candidates": [
                {"name": c.name, "backend": c.backend, "precision": _core.precision_name(c.precision),
                 "status": c.status, "p50_us": c.p50_us, "device_p50_us": c.device_p50_us,
                 "max_abs_error": c.max_abs_error, "transform": c.transform,
                 "fused_operators": dict(c.fused_operators), "reason": c.reason}
                for c in report.candidates]}
    for column, groups, precisions in (("aitune ORT fp32/TF32", (0,), ("fp32", "tf32")),
                                       ("aitune ORT fp16", (0,), ("fp16",)),
                                       ("tuned fp32/TF32", (0, 1), ("fp32", "tf32"))):
        found = [c for c in (best(report.candidates, g, precisions) for g in groups) if c is not None]
        c = min(found, key=lambda c: c.p50_us) if found else None
        cols[column] = None if c is None else {"p50_us": c.p50_us, "max_error": c.max_abs_error, "candidate": c.name,
                                               "precision": _core.precision_name(c.precision)}
    with torch.no_grad():
        out = module(x)
        winner = report.candidates[report.winner] if report.winner is not None else None
        cols["tuned winner"] = {
            "p50_us": p50_us(lambda: module(x), iterations),
            "max_error": max_error(out, reference),
            "candidate": winner.name if winner else f"eager kept ({report.decision})",
            "precision": _core.precision_name(winner.precision) if winner else "eager",
        }
    return cols


def bench(name: str, iterations: int, profile) -> dict:
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model, x = MODELS[name]()
    row: dict = {"model": name, "input": list(x.shape)}
    with torch.no_grad():
        reference = model(x)
        row["eager"] = {"p50_us": p50_us(lambda: model(x), iterations)}
        for column, tf32, fp16 in (("compile TF32", True, False), ("compile fp16", True, True)):
            try:
                row[column] = compile_column(model, x, reference, iterations, tf32=tf32, fp16=fp16)
            except Exception as error:  # the other columns still stand
                row[column] = {"error": f"{type(error).__name__}: {error}"}
    try:
        row.update(aitune_columns(name, model, x, reference, iterations, profile))
    except Exception as error:
        row["aitune error"] = f"{type(error).__name__}: {error}"
        traceback.print_exc()
    torch._dynamo.reset()
    return row


def ratio(row, aitune: str, compile_: str | None = None) -> str:
    """compile p50 / aitune p50; compile_ None: compile at the aitune cell's own precision."""
    a = row.get(aitune) or {}
    if compile_ is None:
        compile_ = "compile fp16" if a.get("precision") == "fp16" else "compile TF32"
    c = row.get(compile_) or {}
    if not a.get("p50_us") or not c.get("p50_us"):
        return "-"
    return f"{c['p50_us'] / a['p50_us']:.2f}x"


def markdown(rows: list[dict], header: str) -> str:
    def cell(row, column):
        v = row.get(column)
        if not isinstance(v, dict) or v.get("p50_us") is None:
            return "fail" if isinstance(v, dict) and "error" in v else "-"
        err = f" ({v['max_error']:.1e})" if v.get("max_error") is not None else ""
        return f"{v['p50_us']:.0f}{err}"

    columns = ["eager", "compile TF32", "compile fp16", "aitune ORT fp32/TF32", "aitune ORT fp16", "tuned fp32/TF32",
               "tuned winner"]
    lines = [header, "",
             "p50 us per call + sync (max |error| vs eager); ratios = compile / aitune at the same precision "
             "(> 1: aitune faster)", "",
             "| model | " + " | ".join(columns) + " | ORT TF32 vs compile TF32 | ORT fp16 vs compile fp16 "
             "| tuned TF32 vs compile TF32 | winner vs compile (its precision) | winner | tuning s |",
             "|---" * (len(columns) + 7) + "|"]
    for r in rows:
        failure = r.get("aitune error") or r.get("error")
        winner = (r.get("tuned winner") or {}).get("candidate") or (failure or "-")[:120]
        precision = (r.get("tuned winner") or {}).get("precision")
        tuning = f"{r['tuning_s']:.0f}" if isinstance(r.get("tuning_s"), (int, float)) else "-"
        lines.append(
            f"| {r['model']} | " + " | ".join(cell(r, c) for c in columns)
            + f" | {ratio(r, 'aitune ORT fp32/TF32', 'compile TF32')} | {ratio(r, 'aitune ORT fp16', 'compile fp16')}"
            + f" | {ratio(r, 'tuned fp32/TF32', 'compile TF32')} | {ratio(r, 'tuned winner')}"
            + f" | {winner}{f' ({precision})' if precision else ''} | {tuning} |")
    return "\n".join(lines)


def run_child(name: str, args, out: Path) -> dict:
    """One model in a process of its own: a crash (a CUDA-graph capture that segfaults) or a
    hang costs that row only."""
    command = [sys.executable, __file__, "--child", name, "--out", str(out), "--iterations", str(args.iterations),
               "--profile-time-cap", str(args.profile_time_cap)]
    try:
        done = subprocess.run(command, timeout=args.model_timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "error": f"timed out after {args.model_timeout} s"}
    if done.returncode != 0 or not out.exists():
        return {"model": name, "error": f"the model's process exited with {done.returncode}"}
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of: {', '.join(MODELS)}")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--profile-time-cap", type=float, default=2.0,
                        help="seconds of profiling per candidate while tuning (keeps the run short)")
    parser.add_argument("--model-timeout", type=float, default=270, help="seconds per model (its own process)")
    parser.add_argument("--out", required=True, help="JSON results")
    parser.add_argument("--markdown", help="markdown table (also printed)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one model, in this process
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark needs the GPU", file=sys.stderr)
        return 2
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="aitune-precision-"))
    if args.child:
        profile = _core.ProfileConfig()
        profile.warmup_calls, profile.window_calls, profile.time_cap_s = 10, 20, args.profile_time_cap
        start = time.perf_counter()
        try:
            row = bench(args.child, args.iterations, profile)
        except Exception as error:
            traceback.print_exc()
            row = {"model": args.child, "error": f"{type(error).__name__}: {error}"}
        row["wall_s"] = time.perf_counter() - start
        Path(args.out).write_text(json.dumps(row, indent=2, default=str))
        return 0
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(MODELS)}")
    import onnxruntime

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "onnxruntime_python": onnxruntime.__version__,
            "onnxruntime_engine": _core.OrtRuntime.load().version}
    rows = []
    with tempfile.TemporaryDirectory(prefix="precision-rows-") as scratch:
        for name in names:
            row = run_child(name, args, Path(scratch) / f"{name}.json")
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("table", "candidates")}, default=str),
                  flush=True)
            if "table" in row:
                print(row["table"], flush=True)
            Path(args.out).write_text(json.dumps({**meta, "rows": rows}, indent=2, default=str))  # after every model
    text = markdown(rows, f"{meta['device']}, torch {meta['torch']}, ONNX Runtime {meta['onnxruntime_engine']}")
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
