"""The model zoo at matched precision (issue 28): per model, eager, bare torch.compile as a
user configures it, the best ONNX Runtime candidate per precision, and the tuned module
with its winner, every column timed the same way (benchmarks/timing.py), the tuned module
called as a user calls it (keywords for the language models).

    python benchmarks/zoo.py [--device cuda|cpu] [--small] [--models a,b] [--no-compile]
                             [--no-half-weights] [--cuda-ep-options] [--no-final-round]
                             [--iterations 200] [--json zoo.json]

Models (random weights from Hugging Face transformers configs; no download):
EfficientNet-B0 b32, Swin-T b8, GPT-2 with LM head b8 s128 (keywords), DistilBERT
classifier b16 s128 (keywords), ResNet-50 b16, ViT-B/16 b8. ``--small``: small versions
that run on this machine's CPU in minutes, and a BERT encoder (2 layers, hidden 128,
batch 1, sequence 32) called with ``input_ids=`` / ``attention_mask=``.

Columns (p50 µs): eager (the module's own dtype, fp32); bare torch.compile in
mode reduce-overhead at fp16 (autocast) and TF32 on CUDA, mode default at fp32 on the
CPU; the best ORT candidate per precision (from the tune report); the tuned module and
its winner (name, precision); the module's p50 over the p50 the tuner measured for its
winner (candidate/module: 1.0 means the module costs what was measured); best bare
compile p50 / tuned module p50 (> 1: the tuned module is faster), and the same with the tuned
module and that bare compile taking turns call by call after the tune (``in_turns_us``: a
drift of the GPU between columns timed minutes apart hits both alike). The JSON adds, on CUDA,
the module timed by the tuner's kind of timer (``module_event_us``: CUDA events, the host
waiting on the last one only; ``module_event_device_us``: the GPU time between them) and the
winner's GPU time as the tuner measured it (``winner.device_p50_us``): a gap between module
and candidate that these close is the timer's, one they keep is the path's; and, for the
GPU's own drift over a row, eager timed again after the tune (``eager_after_us``) and the
module again after the GPU rested ``REST_S`` seconds (``module_after_rest_us``).

The torch.compile fp16 candidates are tried as aitune tries them by default on CUDA: under
autocast and with the module's weights converted once to fp16 (half_weights=None);
``--no-half-weights``: the autocast candidate alone (half_weights=False). ``--cuda-ep-options``:
CUDA EP options not in the default plan tried as extra candidates (for CNNs; a measurement
decides whether they join the plan): ORT's plan again with ``cudnn_conv_algo_search=EXHAUSTIVE``
+ ``cudnn_conv_use_max_workspace=1``, and with ``fuse_conv_bias=1`` in every variant (the
default plan uses it in fp16 NHWC only). Every candidate's verdict, p50 and accuracy
figures (its error, eager's at its precision, their ratio) are in the JSON (``candidates``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from candidate_rows import candidate_rows  # noqa: E402
from timing import p50_us, p50s_in_turns, winner_path_timings  # noqa: E402


def _vision(model, batch: int, size: int, device):
    pixels = torch.randn(batch, 3, size, size, device=device)
    return model, (pixels,), {}


def _text(model, batch: int, seq: int, vocab: int, device):
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    mask = torch.ones(batch, seq, dtype=torch.int64, device=device)
    return model, (), {"input_ids": ids, "attention_mask": mask}


def _calibrated_batch_norms(model, size: int):
    """The model with its batch-norm statistics measured on random images (a few batches in
    training mode, cumulative averages), as a trained network's would be: each layer's
    activations then have unit scale. transformers initialises EfficientNet's convolutions
    with N(0, 0.02) and its running statistics at (0, 1): through B0's blocks the
    activations vanish and every logit is 0 (seen on the H200: every candidate "matched"
    eager with error 0 and the row measured nothing). Its batch norms' scales are drawn
    from N(0, 0.02) as well: they are reset to 1 (shift 0), as torch initialises them."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            torch.nn.init.ones_(m.weight)  # transformers draws these from N(0, 0.02) too
            torch.nn.init.zeros_(m.bias)
            m.momentum = None  # cumulative average over the calibration batches
    model.train()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 3, size, size, generator=generator))
    return model.eval()


def vacuous_outputs(outputs) -> list[str]:
    """Floating outputs of eager that cannot judge a candidate (constant or not finite):
    a row measured on them compares nothing, so it is refused rather than reported."""
    leaves = outputs.values() if isinstance(outputs, dict) else outputs if isinstance(outputs, (list, tuple)) \
        else [outputs]
    names = list(outputs.keys()) if isinstance(outputs, dict) else [str(i) for i in range(len(leaves))]
    bad = []
    for n, t in zip(names, leaves):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 1:
            if not bool(torch.isfinite(t).all()):
                bad.append(f"{n} (not finite)")
            elif bool((t == t.flatten()[0]).all()):
                bad.append(f"{n} (constant {t.flatten()[0].item():g})")
    return bad


def build(name: str, small: bool, device):
    """(module, args, kwargs of the timed call) of a zoo model."""
    import transformers as tf

    torch.manual_seed(0)
    if name == "bert-encoder-keywords":  # the CPU row the issue measured (1.6x before)
        config = tf.BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512,
                               vocab_size=1000)
        return _text(tf.BertModel(config), 1, 32, 1000, device)
    if name == "efficientnet-b0":
        config = tf.EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280,
                                       num_labels=1000)
        if small:
            config = tf.EfficientNetConfig(width_coefficient=0.25, depth_coefficient=0.25, image_size=64,
                                           hidden_dim=320, num_labels=10)
        model = _calibrated_batch_norms(tf.EfficientNetForImageClassification(config), config.image_size)
        return _vision(model, 4 if small else 32, 64 if small else 224, device)
    if name == "swin-t":
        config = tf.SwinConfig(image_size=64, embed_dim=24, depths=[1, 1], num_heads=[1, 2]) if small else tf.SwinConfig()
        return _vision(tf.SwinForImageClassification(config), 2 if small else 8, config.image_size, device)
    if name == "gpt2-lm-keywords":
        config = tf.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, use_cache=False) if small else \
            tf.GPT2Config(use_cache=False)
        return _text(tf.GPT2LMHeadModel(config), 2 if small else 8, 32 if small else 128, config.vocab_size, device)
    if name == "distilbert-cls-keywords":
        config = tf.DistilBertConfig(n_layers=2, dim=64, n_heads=2, hidden_dim=128, vocab_size=1000) if small else \
            tf.DistilBertConfig()
        return _text(tf.DistilBertForSequenceClassification(config), 2 if small else 16, 32 if small else 128,
                     config.vocab_size, device)
    if name == "resnet-50":
        config = tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic") \
            if small else tf.ResNetConfig()
        return _vision(tf.ResNetForImageClassification(config), 2 if small else 16, 64 if small else 224, device)
    if name == "vit-b16":
        config = tf.ViTConfig(image_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=128) if small else tf.ViTConfig()
        return _vision(tf.ViTForImageClassification(config), 2 if small else 8, config.image_size, device)
    raise ValueError(f"unknown model {name!r}")


FULL = ["efficientnet-b0", "swin-t", "gpt2-lm-keywords", "distilbert-cls-keywords", "resnet-50", "vit-b16"]
SMALL = ["bert-encoder-keywords", "resnet-50", "distilbert-cls-keywords"]


def bare_compile(model, args, kwargs, device, precision: str, iterations: int) -> float:
    """p50 of torch.compile as a user configures it: reduce-overhead on CUDA (fp16 under
    autocast around the call, TF32 by the global flags), default on the CPU (fp32)."""
    torch._dynamo.reset()
    return p50_us(bare_compile_call(model, args, kwargs, device, precision), iterations)


def bare_compile_call(model, args, kwargs, device, precision: str):
    """One call of torch.compile(model) as bare_compile times it, its precision's settings
    (autocast, the TF32 flags) around each call, so that it can take turns with other columns."""
    import contextlib

    mode = "reduce-overhead" if device.type == "cuda" else "default"
    compiled = torch.compile(model, mode=mode)
    tf32 = precision == "tf32"

    def call():
        matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        autocast = (torch.autocast(device.type, dtype=torch.float16) if precision == "fp16"
                    else contextlib.nullcontext())
        try:
            with torch.no_grad(), autocast:
                return compiled(*args, **kwargs)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn

    return call


#: --cuda-ep-options: base provider options of the extra ORT backends (each planned in full).
EXTRA_CUDA_EP_OPTIONS = (
    {"cudnn_conv_algo_search": "EXHAUSTIVE", "cudnn_conv_use_max_workspace": "1"},
    {"fuse_conv_bias": "1"},
)


def tune(name: str, model, args, kwargs, device, compile_candidates: bool, half_weights: bool | None = None,
         cuda_ep_options: bool = False, final_round: bool = True):
    """The module tuned on the timed batch itself (its rows as samples, one batch of
    that size), with ORT and, unless told not to, torch.compile candidates."""
    import aitune.torch as ait
    from aitune.torch.backend import (ONNXRuntimeBackend, ONNXRuntimeBackendConfig, TorchCompileBackend,
                                      TorchCompileBackendConfig)

    provider = "cuda" if device.type == "cuda" else "cpu"
    backends = [ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider=provider))]
    if cuda_ep_options and provider == "cuda":
        backends += [ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda", provider_options=options))
                     for options in EXTRA_CUDA_EP_OPTIONS]
    if compile_candidates:
        precisions = ("tf32", "fp16") if device.type == "cuda" else ("fp32",)
        mode = "reduce-overhead" if device.type == "cuda" else "default"
        backends.append(TorchCompileBackend(TorchCompileBackendConfig(mode=mode, precisions=precisions,
                                                                      half_weights=half_weights)))
    tuned = ait.Module(model, f"zoo-{name}", strategy=ait.MaxThroughputStrategy(backends))
    batch = (args[0] if args else next(iter(kwargs.values()))).shape[0]
    rows = [tuple(a[i] for a in args) if args else {k: v[i] for k, v in kwargs.items()} for i in range(batch)]
    profile = None
    if not final_round:  # each candidate's first measurement decides (before the final round)
        from aitune import _core

        profile = _core.ProfileConfig()
        profile.final_round_windows = 0
    ait.tune(tuned, rows, batch_sizes=[batch], disable_external_logging=True, progress=False,
             performance_validation=False, profile_config=profile)
    return tuned


#: Seconds the GPU rests before the module is timed again (module_after_rest_us).
REST_S = 5.0


def row(name: str, small: bool, device, iterations: int, compile_columns: bool, half_weights: bool | None = None,
        cuda_ep_options: bool = False, final_round: bool = True) -> dict:
    model, args, kwargs = build(name, small, device)
    model = model.to(device).eval()
    result = {"model": name, "device": str(device), "dtype": "float32"}
    with torch.no_grad():
        reference = model(*args, **kwargs)
        bad = vacuous_outputs(reference)
        if bad:
            raise ValueError(f"eager outputs {', '.join(bad)} cannot judge a candidate: the row would measure "
                             "nothing (initialise the model's weights so that its outputs vary)")
        result["eager_us"] = p50_us(lambda: model(*args, **kwargs), iterations)
    bare = {}
    if compile_columns:
        for precision in (("fp16", "tf32") if device.type == "cuda" else ("fp32",)):
            try:
                bare[precision] = bare_compile(model, args, kwargs, device, precision, iterations)
            except Exception as error:  # a row still reports what it could measure
                bare[precision] = None
                result[f"bare_compile_{precision}_error"] = f"{type(error).__name__}: {error}"[:300]
        torch._dynamo.reset()
    result["bare_compile_us"] = bare
    start = time.perf_counter()
    tuned = tune(name, model, args, kwargs, device, compile_columns, half_weights, cuda_ep_options, final_round)
    result["tune_s"] = round(time.perf_counter() - start, 1)
    (report,) = tuned.ait_reports.values()
    best = {}
    for c in report.candidates:
        if c.backend.startswith("ONNXRuntimeBackend") and c.p50_us and c.status in ("selected", "not chosen"):
            if c.precision_name not in best or c.p50_us < best[c.precision_name]["p50_us"]:
                best[c.precision_name] = {"name": c.name, "p50_us": c.p50_us}
    result["best_ort_per_precision"] = best
    result["candidates"] = candidate_rows(report)  # every candidate: verdict, p50, accuracy figures
    compiled = [c for c in report.candidates if c.backend.startswith("TorchCompileBackend")]
    result["compile_candidates"] = [{"name": c.name, "status": c.status, "p50_us": c.p50_us} for c in compiled]
    with torch.no_grad():
        result["module_us"] = p50_us(lambda: tuned(*args, **kwargs), iterations)
    if report.winner is not None:
        winner = report.candidates[report.winner]
        result["winner"] = {"name": winner.name, "backend": winner.backend, "precision": winner.precision_name,
                            "p50_us": winner.p50_us}
        result["module_over_candidate"] = result["module_us"] / winner.p50_us
        with torch.no_grad():
            result.update(winner_path_timings(tuned, lambda: tuned(*args, **kwargs), iterations,
                                              device.type == "cuda"))
        result["module_over_measured_call"] = result["module_us"] / result["measured_call_us"]
        result["measured_call_over_candidate"] = result["measured_call_us"] / winner.p50_us
        if device.type == "cuda":
            result["winner"]["device_p50_us"] = winner.device_p50_us
            # Drift of the process and GPU over the row: eager again now, and the module
            # again after the GPU rested; an eager slower now than at the start, or a module
            # faster after the rest, say the gap is the state the tune left, not the path.
            result["eager_after_us"] = p50_us(lambda: model(*args, **kwargs), iterations)
            time.sleep(REST_S)
            result["module_after_rest_us"] = p50_us(lambda: tuned(*args, **kwargs), iterations)
    else:
        result["winner"] = {"name": "eager", "decision": report.decision}
    finite = [v for v in bare.values() if v]
    if finite:
        result["best_bare_compile_over_tuned"] = min(finite) / result["module_us"]
        # The same comparison with the two taking turns call by call (timing.p50s_in_turns):
        # timed minutes apart, a drift of the GPU decided a row (session 32's ResNet-50 "0.98")
        best = min((p for p, v in bare.items() if v), key=lambda p: bare[p])
        try:
            columns = {"tuned": lambda: tuned(*args, **kwargs),
                       f"bare compile {best}": bare_compile_call(model, args, kwargs, device, best)}
            with torch.no_grad():
                turns = p50s_in_turns(columns, iterations)
            result["in_turns_us"] = turns
            result["best_bare_compile_over_tuned_in_turns"] = turns[f"bare compile {best}"] / turns["tuned"]
        except Exception as error:  # the row keeps what it measured
            result["in_turns_error"] = f"{type(error).__name__}: {error}"[:300]
    return result


def table(rows: list[dict]) -> str:
    def us(value):
        return "-" if value is None else f"{value:.0f}"

    lines = ["| model | eager fp32 | bare compile | best ORT per precision | tuned module (winner, precision) | "
             "module / candidate | module / measured call (timed here) | best bare compile / tuned | "
             "the same in turns |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | failed: {r['error'][:120]} |||||||")
            continue
        bare = ", ".join(f"{p} {us(v)}" for p, v in r["bare_compile_us"].items()) or "-"
        ort = ", ".join(f"{p} {us(v['p50_us'])}" for p, v in r["best_ort_per_precision"].items()) or "-"
        w = r["winner"]
        ratio = r.get("module_over_candidate")
        same_path = r.get("module_over_measured_call")
        speed = r.get("best_bare_compile_over_tuned")
        turns = r.get("best_bare_compile_over_tuned_in_turns")
        lines.append(f"| {r['model']} | {us(r['eager_us'])} | {bare} | {ort} | {us(r['module_us'])} ({w['name']}, "
                     f"{w.get('precision', '-')}) | {'-' if ratio is None else f'{ratio:.2f}'} | "
                     f"{'-' if same_path is None else f'{same_path:.2f}'} | "
                     f"{'-' if speed is None else f'{speed:.2f}'} | {'-' if turns is None else f'{turns:.2f}'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="small models, for the CPU")
    parser.add_argument("--models", help="comma-separated subset")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile columns or candidates")
    parser.add_argument("--no-half-weights", action="store_true",
                        help="torch.compile fp16 under autocast only (half_weights=False), not also on fp16 weights")
    parser.add_argument("--cuda-ep-options", action="store_true",
                        help="extra ORT candidates with CUDA EP options not in the default plan")
    parser.add_argument("--no-final-round", action="store_true",
                        help="the tuner's final round off (final_round_windows=0): each candidate's first p50 decides")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--json", default="zoo.json", help="rewritten after each row")
    parser.add_argument("--log", action="store_true", help="the tuner's steps, with timestamps, on stderr")
    options = parser.parse_args()
    if options.log:
        import logging

        logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("aitune").setLevel(logging.DEBUG)
    device = torch.device(options.device)
    names = options.models.split(",") if options.models else (SMALL if options.small else FULL)
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="aitune-zoo-"))
    import aitune
    from aitune import _core

    ort = _core.OrtRuntime.load()  # the library aitune runs (AITUNE_ORT_LIBRARY, the wheel, ...), not onnxruntime's

    meta = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "onnxruntime": ort.version,
            "onnxruntime_library": ort.library_path, "aitune": getattr(aitune, "__version__", "?"),
            "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "small": options.small, "final_round": not options.no_final_round}
    rows = []
    for name in names:
        try:
            rows.append(row(name, options.small, device, options.iterations, not options.no_compile,
                            None if not options.no_half_weights else False, options.cuda_ep_options,
                            not options.no_final_round))
        except Exception as error:
            rows.append({"model": name, "error": f"{type(error).__name__}: {error}"})
        print(json.dumps(rows[-1]), flush=True)
        # After each row: a run cut short keeps the rows it measured.
        Path(options.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(table(rows))
    print(f"written: {options.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
