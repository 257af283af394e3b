"""What a tuned ait.Module's forward adds on top of its session call, on the CPU
provider: the MLP of benchmarks/models.py at batch 1, p50 µs of one call, side by side:

- module forward: ``tuned(x)`` (binding, graph lookup, input ordering, output rebuild),
  and ``tuned(x=x)``
- session.infer: the engine's session called directly, as the module's host path calls
  it (numpy views in and out, outputs wrapped by ``torch.from_numpy``)
- onnxruntime run: onnxruntime's own Python ``InferenceSession.run`` on the same ONNX file
- eager: the PyTorch module
- the first two again with a stub session that returns the outputs without running
  the model: the Python dispatch alone, without ORT's run time and its noise

    python benchmarks/forward_dispatch.py [--iterations 2000] [--rounds 5] [--profile 10000]

``--profile N`` also prints cProfile's top functions over N module forwards (stub
session: the dispatch alone). Columns are measured in alternating rounds so drift on
a shared machine hits each alike; the dispatch cost is the difference of module
forward and session.infer.
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


def p50_us(fn, iterations: int, warmup: int = 50) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    clock = time.perf_counter
    for _ in range(iterations):
        start = clock()
        fn()
        samples.append((clock() - start) * 1e6)
    return statistics.median(samples)


class _StubSession:
    """Stands in for a session: the same inputs and outputs, no model run."""

    def __init__(self, session, outputs):
        self.inputs, self.outputs, self.device = session.inputs, session.outputs, session.device
        self._result = outputs

    def infer(self, arrays, framework="torch", stream=None):
        return list(self._result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile N module forwards")
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

    columns = {
        "module forward": lambda: module(x),
        "module forward, m(x=x)": lambda: module(x=x),
        "session.infer": lambda: [torch.from_numpy(a) for a in session.infer([x_np], framework="numpy")],
        "onnxruntime run": lambda: ort_session.run(None, {input_name: x_np}),
        "eager": lambda: model(x),
    }
    # The Python dispatch alone: the same calls with a stub session that hands back
    # the session's outputs at once, so ORT's run time (and its noise) drops out.
    outputs = session.infer([x_np], framework="numpy")
    stub = _StubSession(session, outputs)
    stub_module = ait.Module(copy.deepcopy(model), "dispatch-mlp-stub", strategy=ait.OneBackendStrategy(backend))
    (identity, (graph, _)), stub_tuned = next(iter(module._ait_tuned.items())), copy.copy(tuned)
    stub_tuned.session = stub
    stub_module._ait_restore({identity: (graph, stub_tuned)})
    columns["module forward, stub session"] = lambda: stub_module(x)
    columns["stub session.infer"] = lambda: [torch.from_numpy(a) for a in stub.infer([x_np], framework="numpy")]

    measured = {c: [] for c in columns}
    with torch.no_grad():
        for _ in range(args.rounds):
            for column, fn in columns.items():
                measured[column].append(p50_us(fn, args.iterations))
    p50 = {c: statistics.median(v) for c, v in measured.items()}
    print(f"MLP b1, CPU provider, {os.cpu_count()} CPUs, torch {torch.__version__}, onnxruntime {ort.__version__}")
    for column, value in p50.items():
        print(f"  {column:28s} {value:7.1f} us")
    print(f"  {'dispatch':28s} {p50['module forward'] - p50['session.infer']:7.1f} us (module forward - session.infer)")
    stub_dispatch = p50["module forward, stub session"] - p50["stub session.infer"]
    print(f"  {'dispatch, stub session':28s} {stub_dispatch:7.1f} us")

    if args.profile:
        profiler = cProfile.Profile()
        with torch.no_grad():
            profiler.enable()
            for _ in range(args.profile):
                stub_module(x)
            profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
