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

``--threads`` (torch.set_num_threads, default 1): on a shared machine torch's thread pool
contending with other work swamps the microseconds measured here.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def interleaved_p50s(columns: dict, calls: int, warmup: int = 50) -> dict[str, float]:
    """Per column, the median µs of ``calls`` calls, the columns taking turns call by call."""
    import time

    samples = {name: [] for name in columns}
    for _ in range(warmup):
        for fn in columns.values():
            fn()
    clock = time.perf_counter_ns
    for _ in range(calls):
        for name, fn in columns.items():
            start = clock()
            fn()
            samples[name].append((clock() - start) / 1e3)
    return {name: statistics.median(v) for name, v in samples.items()}


def build(name: str):
    import transformers as tf

    torch.manual_seed(0)
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


def row(name: str, calls: int) -> dict:
    import aitune.torch as ait
    from aitune.torch.backend import TorchCompileBackend, TorchCompileBackendConfig

    model, kwargs = build(name)
    backend = TorchCompileBackend(TorchCompileBackendConfig(mode="default", precisions=("fp32",)))
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

    columns = {
        "compiled call alone": lambda: compiled._compiled(*call_args, **call_kwargs),
        "module": lambda: tuned(**kwargs),
        "module, general path": general_call,
    }
    with torch.no_grad():
        tuned(**kwargs)  # the first call adds the route
        p50 = interleaved_p50s(columns, calls)
    return {"model": name, "winner": winner.name, "candidate_us": winner.p50_us, **{f"{c}_us": v for c, v in p50.items()},
            "module_over_candidate": p50["module"] / winner.p50_us,
            "module_minus_compiled_us": p50["module"] - p50["compiled call alone"],
            "general_minus_compiled_us": p50["module, general path"] - p50["compiled call alone"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,gpt2")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="aitune-overhead-"))
    print("| model | compiled call alone | candidate (tuner) | module | module / candidate | module - compiled | "
          "general path - compiled |\n|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        r = row(name, args.calls)
        print(f"| {name} | {r['compiled call alone_us']:.1f} | {r['candidate_us']:.1f} | {r['module_us']:.1f} | "
              f"{r['module_over_candidate']:.2f} | {r['module_minus_compiled_us']:.1f} | "
              f"{r['general_minus_compiled_us']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
