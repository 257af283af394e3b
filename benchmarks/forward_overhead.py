"""Where the time of an aitune CUDA forward goes, on the MLP at batch 1 (p50, one call +
torch.cuda.synchronize()): the tuned module's forward, the session called directly with
tensors and with DLPack capsules, the CUDA-graph session likewise, and the pieces of the
Python boundary on their own.

    python benchmarks/forward_overhead.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.dlpack import to_dlpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402
from gpu_benchmarks import tuned_module  # noqa: E402
from timing import p50_us  # noqa: E402

import aitune.torch as ait  # noqa: E402
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="aitune-overhead-"))
    model, x = models.MLP().eval().cuda(), torch.randn(1, 256, device="cuda")
    ait.enable_performance_validation(False)
    for label, options in [("strict", None), ("CUDA graph", {"enable_cuda_graph": "1"})]:
        module = tuned_module(model, x, ait.OneBackendStrategy(ONNXRuntimeBackend(ONNXRuntimeBackendConfig(
            execution_provider="cuda", tune_provider_options=False, provider_options=options))),
            f"overhead-{label.replace(' ', '-')}")
        ((_, tuned),) = module._ait_tuned.values()
        session, stream = tuned.session, torch.cuda.current_stream().cuda_stream
        with torch.no_grad():
            rows = {
                "module forward": p50_us(lambda: module(x), 2000),
                "session.infer(tensors, stream)": p50_us(lambda: session.infer([x], stream=stream), 2000),
                "session.infer(capsules, stream)": p50_us(lambda: session.infer([to_dlpack(x)], stream=stream), 2000),
                "session.infer(capsules), synchronous": p50_us(lambda: session.infer([to_dlpack(x)]), 2000),
                "eager": p50_us(lambda: model(x), 2000),
                # pieces of the Python boundary, without ORT
                "to_dlpack(x)": p50_us(lambda: to_dlpack(x), 2000),
                "from_dlpack(to_dlpack(x))": p50_us(lambda: torch.utils.dlpack.from_dlpack(to_dlpack(x)), 2000),
                "torch.cuda.current_stream().cuda_stream": p50_us(
                    lambda: torch.cuda.current_stream().cuda_stream, 2000),
            }
        for name, value in rows.items():
            print(f"{label:10s} {name:40s} {value:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
