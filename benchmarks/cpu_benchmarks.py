"""CPU benchmark of docs/benchmarks.md: aitune's forward on the CPU provider against
onnxruntime's own Python InferenceSession (numpy in/out, and IOBinding) on the same
ONNX file, and eager PyTorch, measured side by side in one run.

    python benchmarks/cpu_benchmarks.py [--iterations 200] [--out cpu_benchmarks.json]

Both ONNX Runtimes use their default session options (all graph optimisations, default
thread pools). aitune's column is an ait.Module call (binding, flattening, DLPack in
and out included) with the engine's default CPU configuration.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import p50_us  # noqa: E402
import models  # noqa: E402

import aitune.torch as ait  # noqa: E402
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig  # noqa: E402



def bench_case(name, model, shape, iterations, rounds):
    model = model.eval()
    x = torch.randn(*shape)
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu", tune_provider_options=False))
    tuned = ait.Module(copy.deepcopy(model), f"cpu-{name}", strategy=ait.OneBackendStrategy(backend))
    ait.tune(tuned, list(x), batch_sizes=[shape[0]], progress=False)
    onnx_file = next(ait.cache_root().glob(f"cpu-{name.replace(' ', '_')}/*/*/model_raw.onnx"))

    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    x_np = x.numpy()
    binding = session.io_binding()
    binding.bind_cpu_input(input_name, x_np)
    for output in session.get_outputs():
        binding.bind_output(output.name, "cpu")

    def with_binding():
        session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()

    expected = model(x).detach().numpy()
    np.testing.assert_allclose(session.run(None, {input_name: x_np})[0], expected, atol=1e-3, rtol=1e-3)
    np.testing.assert_allclose(tuned(x).numpy(), expected, atol=1e-3, rtol=1e-3)
    columns = {
        "eager": lambda: model(x),
        "onnxruntime run (numpy)": lambda: session.run(None, {input_name: x_np}),
        "onnxruntime IOBinding": with_binding,
        "aitune ORT CPU": lambda: tuned(x),
    }
    # Alternated rounds so that drift on a shared machine hits every column alike.
    measured = {c: [] for c in columns}
    with torch.no_grad():
        for _ in range(rounds):
            for column, fn in columns.items():
                measured[column].append(p50_us(fn, iterations, warmup=10, sync=False))
    row = {"model": name, **{c: statistics.median(v) for c, v in measured.items()}}
    row["aitune / onnxruntime run"] = row["aitune ORT CPU"] / row["onnxruntime run (numpy)"]
    row["aitune / onnxruntime IOBinding"] = row["aitune ORT CPU"] / row["onnxruntime IOBinding"]
    row["aitune / eager"] = row["aitune ORT CPU"] / row["eager"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="substring of the model names to run")
    parser.add_argument("--out", default="cpu_benchmarks.json")
    args = parser.parse_args()
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="aitune-bench-"))
    torch.manual_seed(0)
    rows = []
    for name, model, shape, _ in models.cases():
        if name == "ResNet-18 b32" or (args.only and args.only not in name):
            continue  # b32 is a GPU case
        rows.append(bench_case(name, model, shape, args.iterations, args.rounds))
        print(json.dumps(rows[-1]), flush=True)
    Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "onnxruntime (Python)": ort.__version__,
                                          "torch": torch.__version__, "rows": rows}, indent=2))
    cols = ["eager", "onnxruntime run (numpy)", "onnxruntime IOBinding", "aitune ORT CPU"]
    print("| model | " + " | ".join(cols) + " | aitune / run | aitune / IOBinding |")
    print("|---" * (len(cols) + 3) + "|")
    for r in rows:
        print(f"| {r['model']} | " + " | ".join(f"{r[c]:.0f}" for c in cols) +
              f" | {r['aitune / onnxruntime run']:.2f} | {r['aitune / onnxruntime IOBinding']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
