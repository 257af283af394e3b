"""What a tuned ait.Module's forward adds on top of its session call, on the CPU
provider: the MLP of benchmarks/models.py at batch 1, p50 µs of one call, side by side:

- module forward: ``tuned(x)``, served by the C++ hot path (``_core.TorchDispatch``:
  guards, DLPack in and out, the session run) after the first call
- module forward, m(x=x): a keyword call, served by the hot path too (its own route)
- module.forward(x): the Python path, which calls the hot path does not serve take
  (binding, graph lookup, then TorchDispatch.run: DLPack in and out, output rebuild),
  without nn.Module's call
- hot path alone: ``_core.TorchDispatch.serve`` without nn.Module's call and the guards
- session.infer: the engine's session called directly (numpy views in and out,
  outputs wrapped by ``torch.from_numpy``)
- onnxruntime run: onnxruntime's own Python ``InferenceSession.run`` on the same ONNX
  file, with default session options as aitune's CPU session
- eager: the PyTorch module

    python benchmarks/forward_dispatch.py [--iterations 300] [--rounds 40] [--profile 10000]

Columns are measured in alternating short blocks (``--rounds`` of ``--iterations``) so
drift on a shared machine hits each alike; each column reports the median and the
fastest of its block medians. ``--profile N`` prints cProfile's top functions over N
calls of the Python path.
"""

from __future__ import annotations

import argparse
import cProfile
import copy
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402

import aitune.torch as ait  # noqa: E402
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig  # noqa: E402


def block_p50s(columns: dict, iterations: int, rounds: int, warmup: int = 50) -> dict[str, list[float]]:
    """Per column, the p50 (µs) of each of ``rounds`` blocks, the columns taking turns."""
    blocks = {name: [] for name in columns}
    clock = time.perf_counter
    for _ in range(rounds):
        for name, fn in columns.items():
            for _ in range(warmup):
                fn()
            samples = []
            for _ in range(iterations):
                start = clock()
                fn()
                samples.append((clock() - start) * 1e6)
            blocks[name].append(statistics.median(samples))
    return blocks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile N keyword calls")
    args = parser.parse_args()
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="aitune-dispatch-"))
    torch.manual_seed(0)

    model, x = models.MLP().eval(), torch.randn(1, 256)
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu", tune_provider_options=False))
    module = ait.Module(copy.deepcopy(model), "dispatch-mlp", strategy=ait.OneBackendStrategy(backend))
    ait.tune(module, list(x), batch_sizes=[1], progress=False)
    ((_, tuned),) = module._ait_tuned.values()
    session = tuned.session
    onnx_file = session.model_path
    ort_session = ort.InferenceSession(onnx_file, providers=["CPUExecutionProvider"])
    input_name = ort_session.get_inputs()[0].name
    x_np = x.numpy()

    with torch.no_grad():
        expected = model(x).numpy()
        np.testing.assert_allclose(module(x).numpy(), expected, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(ort_session.run(None, {input_name: x_np})[0], expected, atol=1e-4, rtol=1e-4)

    with torch.no_grad():
        module(x), module(x=x)  # resolve the two call forms: the next ones take the hot path
    assert module._ait_calls.direct is not None and len(module._ait_calls.direct) == 2
    columns = {
        "module forward": lambda: module(x),
        "module forward, m(x=x)": lambda: module(x=x),
        "module.forward(x)": lambda: module.forward(x),
        "hot path alone": lambda: module._ait_calls.direct.serve((x,)),
        "session.infer": lambda: [torch.from_numpy(a) for a in session.infer([x_np], framework="numpy")],
        "onnxruntime run": lambda: ort_session.run(None, {input_name: x_np}),
        "eager": lambda: model(x),
    }
    with torch.no_grad():
        blocks = block_p50s(columns, args.iterations, args.rounds)
    p50 = {c: statistics.median(v) for c, v in blocks.items()}
    print(f"MLP b1, CPU provider, {os.cpu_count()} CPUs, torch {torch.__version__}, onnxruntime {ort.__version__}")
    print(f"  {'':28s} {'p50':>7s} {'fastest block':>14s}")
    for column, value in p50.items():
        print(f"  {column:28s} {value:7.1f} {min(blocks[column]):14.1f} us")
    ratio = p50["module forward"] / p50["onnxruntime run"]
    fastest = min(blocks["module forward"]) / min(blocks["onnxruntime run"])
    print(f"  module forward / onnxruntime run: {ratio:.2f} (fastest blocks: {fastest:.2f})")
    print(f"  dispatch over session.infer: {p50['module forward'] - p50['session.infer']:.1f} us (hot path), "
          f"{p50['module.forward(x)'] - p50['session.infer']:.1f} us (Python path)")

    if args.profile:
        profiler = cProfile.Profile()
        with torch.no_grad():
            profiler.enable()
            for _ in range(args.profile):
                module.forward(x)
            profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
