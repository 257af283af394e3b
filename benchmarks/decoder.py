"""Decoder-LLM benchmark (issue 30): a Llama-shaped model (hidden 2048, 8 layers, 32 query /
4 key-value heads, vocab 32000, random weights), prefill and one decode step with a static
KV cache, eager and bare torch.compile against aitune's tuned module.

    python benchmarks/decoder.py [--device cuda] [--out decoder.json] [--iterations 100]
    python benchmarks/decoder.py --device cpu --tiny        # smoke test (a tiny Llama)

Workloads:
  prefill  ``model(input_ids, attention_mask, use_cache=False).logits``, batch 1, sequence
           256 (--tiny: 16), all-ones mask.
  decode   one token through ``aitune.torch.decode_step.DecodeStep`` (the static cache's
           keys / values as inputs and outputs, one tensor per layer), batch 1, a 512-slot
           cache (--tiny: 32) half full; the ONNX Runtime candidates write the cache in
           place (``in_place_outputs=True``: no copy of it per step).
Rows per workload (p50 us of one call + torch.cuda.synchronize() on CUDA):
  eager            the model as a user runs it at the row's precision
  compile          bare ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), a new
                   ``cudagraph_mark_step_begin()`` per call, as a user writes it
  aitune           ``ait.tune`` with MaxThroughputStrategy([ONNXRuntimeBackend(cuda),
                   TorchCompileBackend(fp16)]), measured through the tuned module; the
                   winner's name and precision, the fused operators of the fusion candidate
Precision on CUDA: prefill under ``torch.autocast(float16)`` over the fp32 model for eager
and compile (as a user writes it; aitune is given the fp32 model and may choose fp16);
decode with the model in fp16 (``.half()``) on every row, since the cache must have one
dtype and autocast would write fp32 keys (rotary) and fp16 values. On the CPU everything
is fp32 (compile mode "default": no CUDA graphs). Ratios: ``x eager`` and ``x compile`` are
that row's speed-up (> 1: faster than the row named).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import p50_us  # noqa: E402

import aitune.torch as ait  # noqa: E402
from aitune import _core  # noqa: E402
from aitune.torch.backend import (  # noqa: E402
    ONNXRuntimeBackend,
    ONNXRuntimeBackendConfig,
    TorchCompileBackend,
    TorchCompileBackendConfig,
)
from aitune.torch.decode_step import DecodeStep, empty_cache  # noqa: E402

FULL = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=32,
            num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


class Prefill(torch.nn.Module):
    """``forward(input_ids, attention_mask) -> logits``: prefill as users call it."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def llama(tiny: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**(TINY if tiny else FULL))).eval()


def prefill_case(model, device: str, seq: int):
    vocab = model.config.vocab_size
    inputs = {"input_ids": torch.randint(0, vocab, (1, seq), device=device),
              "attention_mask": torch.ones(1, seq, dtype=torch.long, device=device)}
    return Prefill(model), inputs


def decode_case(model, device: str, cache_len: int):
    filled = cache_len // 2
    keys, values = empty_cache(model, 1, cache_len, device=device)
    for layer_cache in keys + values:
        layer_cache.normal_()  # a cache holding something, as after a prefill
    mask = torch.zeros(1, cache_len, dtype=torch.long, device=device)
    mask[:, : filled + 1] = 1
    inputs = {"input_ids": torch.randint(0, model.config.vocab_size, (1, 1), device=device), "attention_mask": mask,
              "position_ids": torch.tensor([[filled]], device=device),
              "cache_position": torch.tensor([filled], device=device), "key_cache": keys, "value_cache": values}
    return DecodeStep(model), inputs


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def _error(a, b) -> float:
    return (_first(a).float() - _first(b).float()).abs().max().item()


def compiled_call(module, inputs, *, cuda: bool, autocast: bool):
    """torch.compile as a user writes it: reduce-overhead on CUDA (a step mark per call),
    the default mode on the CPU."""
    compiled = torch.compile(module, mode="reduce-overhead" if cuda else "default")

    def call():
        if cuda:
            torch.compiler.cudagraph_mark_step_begin()
        with _autocast(autocast):
            return compiled(**inputs)

    return call


def _autocast(enabled: bool):
    return torch.autocast("cuda", dtype=torch.float16) if enabled else contextlib.nullcontext()


def aitune_row(name: str, module, inputs, *, cuda: bool, iterations: int) -> dict:
    torch._dynamo.reset()
    # in_place_outputs: the decode step's caches are updated where they lie (the prefill has none)
    backends = [ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda" if cuda else "cpu",
                                                            in_place_outputs=True)),
                TorchCompileBackend(TorchCompileBackendConfig(
                    precisions=("fp16",) if cuda else ("fp32",), mode="reduce-overhead" if cuda else "default"))]
    tuned = ait.Module(copy.deepcopy(module), f"decoder-bench-{name}", strategy=ait.MaxThroughputStrategy(backends))
    start = time.perf_counter()
    ait.tune(tuned, lambda size: [inputs], batch_sizes=[1], progress=False, disable_external_logging=True)
    tuning_s = time.perf_counter() - start
    (report,) = tuned.ait_reports.values()
    winner = report.candidates[report.winner] if report.winner is not None else None
    fused = [c for c in report.candidates if c.transform.startswith("ort_fusions")]
    with torch.no_grad():
        out = _first(tuned(**inputs)).clone()  # a CUDA-graph winner's next replay overwrites it
        p50 = p50_us(lambda: tuned(**inputs), iterations)
    return {"p50_us": p50, "output": out, "tuning_s": tuning_s,
            "winner": winner.name if winner else f"eager kept ({report.decision})",
            "precision": _core.precision_name(winner.precision) if winner else "eager",
            "fused_operators": dict(fused[0].fused_operators) if fused else {},
            "candidates": [{"name": c.name, "precision": _core.precision_name(c.precision), "status": c.status,
                            "p50_us": c.p50_us, "reason": c.reason} for c in report.candidates]}


def bench(workload: str, args) -> list[dict]:
    cuda = args.device == "cuda"
    model = llama(args.tiny).to(args.device)
    half = cuda and workload == "decode"  # see the module docstring: one cache dtype
    autocast = cuda and workload == "prefill"
    if half:
        model = model.half()
    precision = "fp16 (autocast)" if autocast else "fp16 (.half())" if half else "fp32"
    if workload == "prefill":
        module, inputs = prefill_case(model, args.device, 16 if args.tiny else 256)
    else:
        module, inputs = decode_case(model, args.device, 32 if args.tiny else 512)
    rows = []
    with torch.no_grad():
        with _autocast(autocast):
            reference = module(**inputs)

        def eager_call():
            with _autocast(autocast):
                return module(**inputs)

        eager = {"row": "eager", "precision": precision, "p50_us": p50_us(eager_call, args.iterations)}
        rows.append(eager)
        if not args.skip_compile:
            torch._dynamo.reset()
            call = compiled_call(module, inputs, cuda=cuda, autocast=autocast)
            start = time.perf_counter()
            # Cloned: with CUDA graphs the next replay overwrites the output (torch raises on a read).
            out = _first(call()).clone()
            compile_s = time.perf_counter() - start
            rows.append({"row": "compile", "precision": precision, "p50_us": p50_us(call, args.iterations),
                         "compile_s": compile_s, "max_error": _error(out, reference)})
    tuned = aitune_row(workload, module, inputs, cuda=cuda, iterations=args.iterations)
    tuned_out = tuned.pop("output")
    rows.append({"row": "aitune", **tuned, "max_error": _error(tuned_out, reference)})
    compile_p50 = next((r["p50_us"] for r in rows if r["row"] == "compile"), None)
    for r in rows:
        r["workload"] = workload
        r["x_eager"] = eager["p50_us"] / r["p50_us"]
        r["x_compile"] = compile_p50 / r["p50_us"] if compile_p50 else None
    return rows


def _table(rows: list[dict]) -> str:
    lines = [f"{'workload':8} {'row':8} {'precision':16} {'p50 us':>10} {'x eager':>8} {'x compile':>9}  winner"]
    for r in rows:
        xc = f"{r['x_compile']:.2f}" if r["x_compile"] else "-"
        winner = f"{r['winner']} [{r['precision']}]" if r["row"] == "aitune" else ""
        lines.append(f"{r['workload']:8} {r['row']:8} {r.get('precision', ''):16} {r['p50_us']:10.1f} "
                     f"{r['x_eager']:8.2f} {xc:>9}  {winner}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama (smoke test)")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--workloads", default="prefill,decode")
    parser.add_argument("--skip-compile", action="store_true", help="no bare torch.compile row")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu --tiny for the smoke test)")
    rows = []
    for workload in args.workloads.split(","):
        rows.extend(bench(workload, args))
    print(_table(rows))
    if args.out:
        args.out.write_text(json.dumps({"device": args.device, "tiny": args.tiny, "torch": torch.__version__,
                                        "rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
