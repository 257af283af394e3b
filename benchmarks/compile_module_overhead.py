"""What the tuned module's call adds to its torch.compile graph (issue 28), on the CPU:
tiny Hugging Face models called with keywords (a BertModel returning a ModelOutput, a
GPT-2 LM), tuned with TorchCompileBackend alone (mode default, fp32), p50 µs per column:

- compiled call alone: the compiled function on the replayed call, nothing around it
- candidate (tuner): the p50 the tuner measured for the winner (through measured_call)
- module: ``tuned(**kwargs)`` as a user calls it (the C++ route after the first call)
- module, general path: the same call with no route and the pytree replay (the path every
  call of a torch.compile graph took before routes served Python graphs)

plus module / candidate and module - compiled call alone. The columns take turns call by
call (one call of each, ``--calls`` times) so the drift of a shared machine hits each alike;
each reports the median of its calls.

    python benchmarks/compile_module_overhead.py [--models bert,gpt2] [--calls 3000] [--threads 1]
    python benchmarks/compile_module_overhead.py --device cuda --models llama-prefill --calls 300 [--profile 200]

``--threads`` (torch.set_num_threads, default 1): on a shared machine torch's thread pool
contending with other work swamps the microseconds measured here.

``--device cuda`` (issue 28's prefill row: the module of a compile winner measured 1.48x its
winner's tuner p50 in session 19, timed after the tune, column by column): the model in fp16
(``.half()``), compile mode reduce-overhead (CUDA graphs, a step mark per call), every call
followed by ``torch.cuda.synchronize()``, and two more columns taking the same turns: bare
``torch.compile`` of the user's model as a user writes it, and ``measured call`` (the call the
tuner measured the winner by, ``dispatch.measured_call``). ``module (stream wait)`` times the
module waiting on an event on its stream only, as the tuner's timer does: far below
``module``, work on another stream. ``--profile N``: cProfile of N module calls (host time
by function) after the table. ``llama-prefill``: the Llama shape of benchmarks/decoder.py,
batch 1, sequence 256 (``--tiny``: its tiny config, sequence 16).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import event_p50_us, p50s_in_turns  # noqa: E402


def build(name: str, device: str = "cpu", tiny: bool = False):
    import transformers as tf

    torch.manual_seed(0)
    if name == "llama-prefill":
        from decoder import FULL, TINY, Prefill

        model = tf.LlamaForCausalLM(tf.LlamaConfig(**(TINY if tiny else FULL["llama"]))).eval().to(device)
        if device == "cuda":
            model = model.half()
        ids = torch.randint(0, model.config.vocab_size, (1, 16 if tiny else 256), device=device)
        return Prefill(model).eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if name == "bert":
        config = tf.BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512,
                               vocab_size=1000)
        model, batch = tf.BertModel(config), 1
    elif name == "gpt2":
        config = tf.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, use_cache=False)
        model, batch = tf.GPT2LMHeadModel(config), 2
    else:
        raise ValueError(f"unknown model {name!r}")
    ids = torch.randint(0, 1000, (batch, 32))
    return model.eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def row(name: str, calls: int, device: str = "cpu", tiny: bool = False, profile: int = 0) -> dict:
    import aitune.torch as ait
    from aitune.torch.backend import TorchCompileBackend, TorchCompileBackendConfig
    from aitune.torch.dispatch import measured_call

    cuda = device == "cuda"
    model, kwargs = build(name, device, tiny)
    mode = "reduce-overhead" if cuda else "default"
    backend = TorchCompileBackend(TorchCompileBackendConfig(mode=mode, precisions=("fp16",) if cuda else ("fp32",)))
    tuned = ait.Module(copy.deepcopy(model), f"overhead-{name}", strategy=ait.OneBackendStrategy(backend))
    batch = kwargs["input_ids"].shape[0]
    ait.tune(tuned, [{k: v[i] for k, v in kwargs.items()} for i in range(batch)], batch_sizes=[batch],
             progress=False, performance_validation=False, disable_external_logging=True)
    (report,) = tuned.ait_reports.values()
    winner = report.candidates[report.winner]
    ((graph, compiled),) = tuned._ait_tuned.values()
    call_args, call_kwargs = graph.call_arguments(list(kwargs.values()))

    # The general path as it was: a dispatch that adds no route, replaying through pytree.
    general = ait.Module(copy.deepcopy(model), f"overhead-{name}-general")
    general._ait_graphs = tuned._ait_graphs
    general._ait_set_tuned(dict(tuned._ait_tuned))
    general._ait_state = tuned._ait_state
    general._ait_calls._add_route = lambda *a: None
    replay_plan = graph.__dict__.get("_replay_plan")

    def general_call():
        graph._replay_plan = None
        try:
            return general(**kwargs)
        finally:
            graph._replay_plan = replay_plan

    def compiled_alone():
        if cuda:
            torch.compiler.cudagraph_mark_step_begin()
        return compiled._compiled(*call_args, **call_kwargs)

    columns = {
        "compiled call alone": compiled_alone,
        "module": lambda: tuned(**kwargs),
        "module, general path": general_call,
    }
    if cuda:
        bare = torch.compile(copy.deepcopy(model), mode=mode)

        def bare_call():
            torch.compiler.cudagraph_mark_step_begin()
            return bare(**kwargs)

        columns["bare torch.compile"] = bare_call
        columns["measured call"] = measured_call(graph, compiled)
    with torch.no_grad():
        tuned(**kwargs)  # the first call adds the route
        p50 = p50s_in_turns(columns, calls, warmup=50, sync=cuda)
        if cuda:
            # the host p50 of the tuner's kind of timer: an event on the stream waited for
            p50["module (stream wait)"] = event_p50_us(lambda: tuned(**kwargs), calls)[0]
        if profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(profile):
                tuned(**kwargs)
                if cuda:
                    torch.cuda.synchronize()
            profiler.disable()
            print(f"cProfile of {profile} module calls ({name}), by own time:", file=sys.stderr)
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return {"model": name, "winner": winner.name, "candidate_us": winner.p50_us, **{f"{c}_us": v for c, v in p50.items()},
            "module_over_candidate": p50["module"] / winner.p50_us,
            "module_minus_compiled_us": p50["module"] - p50["compiled call alone"],
            "general_minus_compiled_us": p50["module, general path"] - p50["compiled call alone"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,gpt2")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--tiny", action="store_true", help="llama-prefill: the tiny config")
    parser.add_argument("--profile", type=int, default=0, help="cProfile this many module calls")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="aitune-overhead-"))
    print("| model | compiled call alone | candidate (tuner) | module | module / candidate | module - compiled | "
          "general path - compiled |" + (" bare torch.compile | measured call | module (stream wait) |"
                                         if args.device == "cuda" else "")
          + "\n|---|---|---|---|---|---|---|" + ("---|---|---|" if args.device == "cuda" else ""))
    rows = []
    for name in args.models.split(","):
        r = row(name, args.calls, args.device, args.tiny, args.profile)
        rows.append(r)
        extra = "".join(f" {r[c]:.1f} |" for c in ("bare torch.compile_us", "measured call_us",
                                                   "module (stream wait)_us") if c in r)
        print(f"| {name} | {r['compiled call alone_us']:.1f} | {r['candidate_us']:.1f} | {r['module_us']:.1f} | "
              f"{r['module_over_candidate']:.2f} | {r['module_minus_compiled_us']:.1f} | "
              f"{r['general_minus_compiled_us']:.1f} |{extra}", flush=True)
        if args.out:
            import json

            args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
