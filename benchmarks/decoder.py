"""Decoder-LLM benchmark (issue 30): a Llama-shaped model (hidden 2048, 8 layers, 32 query /
4 key-value heads, vocab 32000, random weights) and a Qwen2-shaped one (Qwen2's
architecture, with biases on Q/K/V, at the same size: 16 query / 2 key-value heads, vocab
32000 so that the batch-8 logits fit beside the model), prefill and one decode step with a
static KV cache, eager and bare torch.compile against aitune's tuned module.

    python benchmarks/decoder.py [--device cuda] [--models llama,qwen2] [--out decoder.json]
                                 [--prefill-shapes 1x256,8x512] [--decode-batches 1,8]
                                 [--cache-len 1024] [--iterations 100] [--log]
    python benchmarks/decoder.py --device cpu --tiny        # smoke test (tiny models)

Workloads (``--workloads prefill,decode``):
  prefill  ``model(input_ids, attention_mask, use_cache=False).logits`` at each
           BATCHxSEQUENCE of --prefill-shapes (--tiny: 1x16), all-ones mask.
  decode   one token per sequence through ``aitune.torch.decode_step.DecodeStep`` (the
           static cache's keys / values as inputs and outputs, one tensor per layer) at each
           batch of --decode-batches, a --cache-len cache (--tiny: 96) half full; tokens/s
           beside p50. The ONNX Runtime candidates write the cache in place
           (``in_place_outputs=True``: no copy of it per step).
Rows per case (p50 us of one call + torch.cuda.synchronize() on CUDA):
  eager            the model as a user runs it at the row's precision
  compile          bare ``torch.compile(mode="reduce-overhead")`` (CUDA graphs), a new
                   ``cudagraph_mark_step_begin()`` per call, as a user writes it; for decode
                   transformers' own route: the model's forward compiled (fullgraph) with a
                   ``StaticCache`` updated in place, the x-compile baseline of decode rows
  compile-step     (decode) bare torch.compile of the DecodeStep module itself
  step-inplace     (decode) bare torch.compile of ``DecodeStep(model, write_in_place=True)``,
                   its caches marked as static addresses (``mark_static_address``, as
                   transformers' StaticCache marks its buffers) and written in place: how much
                   of compile-step's gap to the StaticCache row the cache inputs account for
  genai            the reference: ONNX Runtime GenAI's model builder graph of the same model
                   (``onnxruntime_genai.models.builder -p fp16 -e cuda``, fp32 / cpu on the
                   CPU; GroupQueryAttention, packed QKV), built offline and run by aitune's
                   OnnxSession on the same provider without a CUDA graph, the present
                   written into the past (for decode the case's caches; for prefill zero
                   caches as long as the prompt) as GenAI's runtime runs it
                   (genai_reference.py). Left out, saying why, where the builder cannot
                   run (``--no-genai``: not tried; ``--genai-site DIR``: where it is unpacked)
  aitune           ``ait.tune`` with MaxThroughputStrategy([ONNXRuntimeBackend(cuda),
                   TorchCompileBackend(fp16)]), both with ``in_place_outputs=True`` (for
                   decode the compile candidate is the step-inplace row's compile), measured through the tuned module; the
                   winner's name and precision, every candidate's p50 and verdict, the
                   fused operators of the fusion candidate, the tune's wall time; beside
                   it ``measured_call_us``, the call the tuner measured the winner by
                   (``dispatch.measured_call``) timed here like the module (module p50 far
                   from it: the module's path differs; both far from the winner's tuner
                   p50: the timing differs), and ``frames_compiled_after_tune`` (dynamo
                   frames the module's calls compiled after tuning: 0 unless they recompile);
                   for prefill ``in_turns``: the module and the compile row's call timed
                   again taking turns call by call (``timing.p50s_in_turns``), the fair
                   ratio where a drift between rows timed apart moves them
Precision on CUDA: the model in fp16 (``.half()``) on every row, as LLMs are loaded to
serve them; decode always (the cache must have one dtype, and autocast would write fp32
keys (rotary) and fp16 values), prefill by default (``--prefill-precision half``);
``--prefill-precision autocast`` runs prefill's eager and compile rows under
``torch.autocast(float16)`` over the fp32 model (as a user of an fp32 checkpoint writes it)
and gives aitune the fp32 model, which may choose fp16 (judged against eager autocast). On the CPU everything
is fp32 (compile mode "default": no CUDA graphs). Ratios: ``x eager`` and ``x compile`` are
that row's speed-up (> 1: faster than the row named).

Each row is printed as one JSON line when it is measured and --out is rewritten after each
row, so a run cut short still leaves what it measured; --log prints the tuner's steps with
timestamps (where a tune spends its time).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import genai_reference  # noqa: E402
from candidate_rows import candidate_rows  # noqa: E402
from timing import WARMUP, p50_us, p50s_in_turns, winner_path_timings  # noqa: E402

import aitune.torch as ait  # noqa: E402
from aitune import _core  # noqa: E402
from aitune.torch.backend import (  # noqa: E402
    ONNXRuntimeBackend,
    ONNXRuntimeBackendConfig,
    TorchCompileBackend,
    TorchCompileBackendConfig,
)
from aitune.torch.decode_step import DecodeStep, empty_cache  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

FULL = {
    "llama": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=32,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048),
    "qwen2": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=2, vocab_size=32000, max_position_embeddings=2048),
}
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


class Prefill(torch.nn.Module):
    """``forward(input_ids, attention_mask) -> logits``: prefill as users call it."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def decoder_model(kind: str, tiny: bool) -> torch.nn.Module:
    """A random-weight ``kind`` ("llama" or "qwen2") causal LM from its config."""
    import transformers

    config_class, model_class = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                                 "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
    torch.manual_seed(0)
    return model_class(config_class(**(TINY if tiny else FULL[kind]))).eval()


def prefill_case(model, device: str, batch: int, seq: int):
    vocab = model.config.vocab_size
    inputs = {"input_ids": torch.randint(0, vocab, (batch, seq), device=device),
              "attention_mask": torch.ones(batch, seq, dtype=torch.long, device=device)}
    return Prefill(model), inputs


def decode_case(model, device: str, batch: int, cache_len: int):
    filled = cache_len // 2
    keys, values = empty_cache(model, batch, cache_len, device=device)
    for layer_cache in keys + values:
        layer_cache.normal_()  # a cache holding something, as after a prefill
    mask = torch.zeros(batch, cache_len, dtype=torch.long, device=device)
    mask[:, : filled + 1] = 1
    inputs = {"input_ids": torch.randint(0, model.config.vocab_size, (batch, 1), device=device),
              "attention_mask": mask, "position_ids": torch.full((batch, 1), filled, device=device),
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


def static_cache_call(model, inputs, *, cuda: bool):
    """One decode step as transformers documents a compiled generation loop: the model's
    own forward under ``torch.compile(mode="reduce-overhead", fullgraph=True)`` with a
    ``StaticCache`` it updates in place, the cache filled by a prefill of the same length
    as the DecodeStep case's, the same token and positions per call. transformers 5's
    StaticCache writes each call at the slot after the last (a counter of its own), so a
    measurement may make at most ``cache_len - filled`` calls (``free_slots(call)``)."""
    from transformers import StaticCache

    batch, cache_len = inputs["attention_mask"].shape
    filled = int(inputs["cache_position"][0])
    device = inputs["input_ids"].device
    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    prompt = torch.randint(0, model.config.vocab_size, (batch, filled), device=device)
    model(input_ids=prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(filled, device=device))
    compiled = torch.compile(model, mode="reduce-overhead" if cuda else "default", fullgraph=True)
    step = {"input_ids": inputs["input_ids"], "position_ids": inputs["position_ids"],
            "cache_position": inputs["cache_position"], "past_key_values": cache, "use_cache": True}

    def call():
        if cuda:
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(**step).logits

    call.free_slots = cache_len - filled
    return call


def _autocast(enabled: bool):
    return torch.autocast("cuda", dtype=torch.float16) if enabled else contextlib.nullcontext()


def tune_backends(cuda: bool, compile_modes: tuple[str, ...] | None = None,
                  max_compile_s: float | None = None) -> list:
    """The backends every decoder row tunes over (winner_gap_probe.py too): ONNX Runtime on
    the device's provider and torch.compile (fp16 reduce-overhead on CUDA), each writing the
    decode step's caches where they lie (``in_place_outputs``; the prefill has none)."""
    return [ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda" if cuda else "cpu",
                                                        in_place_outputs=True)),
            TorchCompileBackend(TorchCompileBackendConfig(
                precisions=("fp16",) if cuda else ("fp32",), mode="reduce-overhead" if cuda else "default",
                modes=compile_modes, max_compile_s=max_compile_s, in_place_outputs=True))]


def aitune_row(name: str, module, inputs, *, cuda: bool, iterations: int, baseline=None,
               compile_modes: tuple[str, ...] | None = None, max_compile_s: float | None = None) -> dict:
    torch._dynamo.reset()
    backends = tune_backends(cuda, compile_modes, max_compile_s)
    tuned = ait.Module(copy.deepcopy(module), f"decoder-bench-{name}", strategy=ait.MaxThroughputStrategy(backends))
    start = time.perf_counter()
    ait.tune(tuned, lambda size: [inputs], batch_sizes=[1], progress=False, disable_external_logging=True)
    tuning_s = time.perf_counter() - start
    (report,) = tuned.ait_reports.values()
    winner = report.candidates[report.winner] if report.winner is not None else None
    fused = [c for c in report.candidates if c.transform.startswith("ort_fusions")]
    frames_before = dict(counters["frames"])
    inductor_before = dict(counters["inductor"])
    with torch.no_grad():
        out = _first(tuned(**inputs)).clone()  # a CUDA-graph winner's next replay overwrites it
        p50 = p50_us(lambda: tuned(**inputs), iterations)
        # the winner's measured call and the module by events, beside p50 (timing.py)
        paths = winner_path_timings(tuned, lambda: tuned(**inputs), iterations, cuda) if winner is not None else {}
    frames_after = dict(counters["frames"])
    # inductor's CUDA-graph events during the module's calls (skips: calls run without a
    # CUDA graph; recorded non-static inputs: copies into the graph's buffers)
    cudagraph_events = {key: value - inductor_before.get(key, 0) for key, value in counters["inductor"].items()
                        if "cudagraph" in key and value != inductor_before.get(key, 0)}
    # The module and bare compile (``baseline``, compiled again here: the tune reset dynamo;
    # after the counts above, which are the module's alone) taking turns call by call: the
    # ratio a drift between rows cannot move.
    if baseline is not None:
        with torch.no_grad():
            turns = p50s_in_turns({"module": lambda: tuned(**inputs), "compile": baseline}, iterations)
        paths["in_turns"] = {"module_us": turns["module"], "compile_us": turns["compile"],
                             "x_compile": turns["compile"] / turns["module"]}
    return {"p50_us": p50, "output": out, "tuning_s": tuning_s, **paths,
            "cudagraph_events_after_tune": cudagraph_events,
            "winner_p50_us": winner.p50_us if winner else None,
            "winner_device_p50_us": winner.device_p50_us if winner else None,
            # torch.compile frames compiled by the module's calls after tuning (0: no recompile)
            "frames_compiled_after_tune": frames_after.get("total", 0) - frames_before.get("total", 0),
            "winner": winner.name if winner else f"eager kept ({report.decision})",
            "precision": _core.precision_name(winner.precision) if winner else "eager",
            "fused_operators": dict(fused[0].fused_operators) if fused else {},
            "candidates": candidate_rows(report)}


def genai_row(model, workload: str, inputs: dict, reference, *, cuda: bool, iterations: int,
              site: Path | None) -> dict | None:
    """The reference row: ONNX Runtime GenAI's model builder graph of ``model``
    (genai_reference.py) run by aitune's OnnxSession on the same provider, fp16 on CUDA
    (``-p fp16 -e cuda``), fp32 on the CPU, no CUDA graph; None (said on stderr) where the
    builder cannot run."""
    precision, provider = ("fp16", "cuda") if cuda else ("fp32", "cpu")
    with tempfile.TemporaryDirectory(prefix="aitune-genai-") as directory:
        try:
            path, build_s = genai_reference.build(model, Path(directory), precision=precision, provider=provider,
                                                  site=site)
            graph = genai_reference.GenAIGraph(path, provider=provider)
            feeds = graph.prefill_feeds(inputs) if workload == "prefill" else graph.decode_feeds(inputs)
        except genai_reference.GenAIUnavailable as error:
            print(f"decoder.py: the genai row is left out: {error}", file=sys.stderr)
            return None
        with torch.no_grad():
            out = graph.run(feeds).clone()
            p50 = p50_us(lambda: graph.run(feeds), iterations)
    return {"row": "genai", "precision": f"{precision} (builder)", "p50_us": p50, "build_s": build_s,
            "max_error": _error(out, reference),
            "reference": f"onnxruntime-genai {genai_reference.version(site)} model builder -p {precision} "
                         f"-e {provider}, OnnxSession, present written into past"}


def cases(args) -> list[tuple[str, str, int, int]]:
    """(model kind, workload, batch, sequence or cache length) per case, in the order run."""
    prefill_shapes = ["1x16"] if args.tiny else args.prefill_shapes.split(",")
    decode_batches = [1] if args.tiny else [int(b) for b in args.decode_batches.split(",")]
    cache_len = 96 if args.tiny else args.cache_len
    out = []
    for kind in args.models.split(","):
        for workload in args.workloads.split(","):
            if workload == "prefill":
                for shape in prefill_shapes:
                    batch, seq = (int(x) for x in shape.lower().split("x"))
                    out.append((kind, workload, batch, seq))
            elif workload == "decode":
                out.extend((kind, workload, batch, cache_len) for batch in decode_batches)
            else:
                raise SystemExit(f"--workloads: unknown workload {workload!r} (prefill, decode)")
    return out


def bench(kind: str, workload: str, batch: int, length: int, args, emit) -> None:
    """Measures one case's rows, handing each to ``emit`` as soon as it is measured."""
    cuda = args.device == "cuda"
    model = decoder_model(kind, args.tiny).to(args.device)
    # see the module docstring: decode has one cache dtype; prefill as --prefill-precision says
    half = cuda and (workload == "decode" or args.prefill_precision == "half")
    autocast = cuda and not half
    if half:
        model = model.half()
    precision = "fp16 (autocast)" if autocast else "fp16 (.half())" if half else "fp32"
    if workload == "prefill":
        module, inputs = prefill_case(model, args.device, batch, length)
    else:
        module, inputs = decode_case(model, args.device, batch, length)
    case = {"model": kind, "workload": workload, "batch": batch,
            ("sequence" if workload == "prefill" else "cache_len"): length}
    # Decode makes one token per sequence per call; prefill's tokens/s counts the prompt's.
    tokens = batch * (length if workload == "prefill" else 1)

    def finish(row: dict) -> dict:
        row = {**case, **row}
        row["tokens_per_s"] = tokens / (row["p50_us"] * 1e-6)
        row["x_eager"] = eager_p50 / row["p50_us"] if eager_p50 else None
        row["x_compile"] = compile_p50 / row["p50_us"] if compile_p50 else None
        emit(row)
        return row

    eager_p50 = compile_p50 = None
    prefill_baseline = None
    with torch.no_grad():
        with _autocast(autocast):
            reference = module(**inputs)

        def eager_call():
            with _autocast(autocast):
                return module(**inputs)

        eager_p50 = p50_us(eager_call, args.iterations)
        finish({"row": "eager", "precision": precision, "p50_us": eager_p50})
        if not args.skip_compile:
            torch._dynamo.reset()
            call = compiled_call(module, inputs, cuda=cuda, autocast=autocast)
            start = time.perf_counter()
            # Cloned: with CUDA graphs the next replay overwrites the output (torch raises on a read).
            out = _first(call()).clone()
            compile_s = time.perf_counter() - start
            step_p50 = p50_us(call, args.iterations)
            if workload == "decode":
                # The baseline a user has for decode is transformers' static cache compiled;
                # bare compile of the DecodeStep module is a row beside it.
                finish({"row": "compile-step", "precision": precision, "p50_us": step_p50, "compile_s": compile_s,
                        "max_error": _error(out, reference)})
                # The same step writing its caches in place, marked as static addresses, as
                # transformers' StaticCache is: how much of the gap to that baseline the
                # step's cache inputs and out-of-place writes account for.
                torch._dynamo.reset()
                own = {name: tuple(t.clone() for t in inputs[name]) for name in ("key_cache", "value_cache")}
                for t in (*own["key_cache"], *own["value_cache"]):
                    torch._dynamo.mark_static_address(t)
                call = compiled_call(DecodeStep(model, write_in_place=True), {**inputs, **own}, cuda=cuda,
                                     autocast=autocast)
                start = time.perf_counter()
                out = _first(call()).clone()
                compile_s = time.perf_counter() - start
                finish({"row": "step-inplace", "precision": precision, "p50_us": p50_us(call, args.iterations),
                        "compile_s": compile_s, "max_error": _error(out, reference)})
                torch._dynamo.reset()
                call = static_cache_call(model, inputs, cuda=cuda)
                start = time.perf_counter()
                out = call().clone()
                compile_s = time.perf_counter() - start
                # The first call wrote one slot; warm-up and measured calls each write one more.
                iterations = min(args.iterations, call.free_slots - 1 - WARMUP)
                if iterations < 5:
                    raise SystemExit(f"--cache-len {length}: too few free slots for the static-cache row")
                compile_p50 = p50_us(call, iterations)
                finish({"row": "compile", "precision": precision, "p50_us": compile_p50, "compile_s": compile_s,
                        "cache": "transformers StaticCache", "max_error": _error(out, reference)})
            else:
                compile_p50 = step_p50
                prefill_baseline = call
                finish({"row": "compile", "precision": precision, "p50_us": compile_p50, "compile_s": compile_s,
                        "max_error": _error(out, reference)})
    if args.genai:
        row = genai_row(model, workload, inputs, reference, cuda=cuda, iterations=args.iterations,
                        site=args.genai_site)
        if row is not None:
            finish(row)
    name = f"{kind}-{workload}-b{batch}-{length}"
    # Prefill's bare compile is timed again beside the module, in turns (decode's StaticCache
    # call has a bounded number of free slots: its rows are timed one after another only).
    tuned = aitune_row(name, module, inputs, cuda=cuda, iterations=args.iterations, baseline=prefill_baseline,
                       compile_modes=tuple(args.compile_modes.split(",")) if args.compile_modes else None,
                       max_compile_s=args.max_compile_s)
    tuned_out = tuned.pop("output")
    finish({"row": "aitune", **tuned, "max_error": _error(tuned_out, reference)})


def _table(rows: list[dict]) -> str:
    lines = [f"{'model':6} {'case':14} {'row':12} {'precision':16} {'p50 us':>10} {'tokens/s':>10} "
             f"{'x eager':>8} {'x compile':>9}  winner"]
    for r in rows:
        case = f"{r['workload']} b{r['batch']} " + (f"s{r['sequence']}" if "sequence" in r else f"c{r['cache_len']}")
        xc = f"{r['x_compile']:.2f}" if r.get("x_compile") else "-"
        winner = f"{r['winner']} [{r['precision']}]" if r["row"] == "aitune" else ""
        lines.append(f"{r['model']:6} {case:14} {r['row']:12} {r.get('precision', ''):16} {r['p50_us']:10.1f} "
                     f"{r['tokens_per_s']:10.0f} {r['x_eager']:8.2f} {xc:>9}  {winner}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="tiny models (smoke test)")
    parser.add_argument("--models", default="llama", help="comma-separated: llama, qwen2")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--workloads", default="prefill,decode")
    parser.add_argument("--prefill-shapes", default="1x256,8x512", help="BATCHxSEQUENCE, comma-separated")
    parser.add_argument("--prefill-precision", default="half", choices=("half", "autocast"),
                        help="CUDA prefill: the model in fp16 on every row (half, issue 30's comparison) or "
                             "the fp32 model under autocast for eager and compile, aitune given the fp32 model")
    parser.add_argument("--decode-batches", default="1,8")
    parser.add_argument("--cache-len", type=int, default=1024)
    parser.add_argument("--compile-modes", help="aitune's torch.compile candidates: modes, comma-separated (e.g. "
                        "reduce-overhead,max-autotune); default: reduce-overhead on CUDA, default on the CPU. The bare "
                        "compile rows stay reduce-overhead, as a user configures it")
    parser.add_argument("--max-compile-s", type=float,
                        help="TorchCompileBackendConfig.max_compile_s: a compile candidate compiling longer fails")
    parser.add_argument("--skip-compile", action="store_true", help="no bare torch.compile row")
    parser.add_argument("--log", action="store_true", help="the tuner's steps, with timestamps, on stderr")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here (after each row)")
    parser.add_argument("--no-genai", dest="genai", action="store_false",
                        help="no reference row from ONNX Runtime GenAI's model builder")
    parser.add_argument("--genai-site", type=Path,
                        help="a directory with onnxruntime-genai (and the onnxruntime Python package it imports) "
                             "unpacked, put first on the builder's PYTHONPATH")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu --tiny for the smoke test)")
    unknown = set(args.models.split(",")) - set(FULL)
    if unknown:
        parser.error(f"--models: unknown {sorted(unknown)} (of {', '.join(FULL)})")
    if args.log:
        logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("aitune").setLevel(logging.DEBUG)
    meta = {"device": args.device, "tiny": args.tiny, "torch": torch.__version__,
            "onnxruntime": _core.OrtRuntime.load().version,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None}
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
        if args.out:
            args.out.write_text(json.dumps({**meta, "rows": rows}, indent=2, default=str))

    for kind, workload, batch, length in cases(args):
        bench(kind, workload, batch, length, args, emit)
        torch._dynamo.reset()  # the case's compiled graphs and their CUDA-graph pools go with it
        if args.device == "cuda":
            torch.cuda.empty_cache()
    # Rows measured before their case's compile row get their x-compile now.
    key = ("model", "workload", "batch", "sequence", "cache_len")
    compile_p50 = {tuple(r.get(k) for k in key): r["p50_us"] for r in rows if r["row"] == "compile"}
    for r in rows:
        base = compile_p50.get(tuple(r.get(k) for k in key))
        r["x_compile"] = base / r["p50_us"] if base else None
    if args.out:
        args.out.write_text(json.dumps({**meta, "rows": rows}, indent=2, default=str))
    print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
