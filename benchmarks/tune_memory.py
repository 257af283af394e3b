"""Peak memory of a tune against the size of its samples (issue 31, item 8).

Builds a set of samples of the given size (float32 tensors of one shape, no batch
axis), tunes a small model on them on the CPU (one candidate, so the run measures the
samples' handling, not the candidates' sessions), and prints the process's peak RSS
(ru_maxrss), the RSS before the samples were made (torch, aitune, the model) and the
ratio peak RSS / samples' bytes. Usage:
    python benchmarks/tune_memory.py [--samples-mib 2048] [--sample-kib 1024] [--batch-sizes 1 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples-mib", type=int, default=2048, help="total size of the samples")
    parser.add_argument("--sample-kib", type=int, default=1024, help="size of one sample")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    os.environ.setdefault("AITUNE_CACHE_DIR", tempfile.mkdtemp(prefix="tune-memory-cache-"))

    import torch

    import aitune.torch as ait
    from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    width = 256
    rows = args.sample_kib * 1024 // (4 * width)
    model = torch.nn.Sequential(torch.nn.Linear(width, 8), torch.nn.ReLU()).eval()
    config = ONNXRuntimeBackendConfig(execution_provider="cpu", tune_provider_options=False,
                                      transformer_fusions=False, use_dynamo=False)
    module = ait.Module(model, "tune-memory", strategy=ait.OneBackendStrategy(backend=ONNXRuntimeBackend(config)))
    baseline = rss_bytes()
    count = args.samples_mib * 1024 // args.sample_kib
    samples = [torch.randn(rows, width) for _ in range(count)]
    sample_bytes = sum(s.numel() * s.element_size() for s in samples)
    start = time.perf_counter()
    ait.tune(module, samples, batch_sizes=args.batch_sizes)
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"samples: {count} x {list(samples[0].shape)} float32 = {sample_bytes / 2**30:.2f} GiB; "
          f"batch sizes {args.batch_sizes}; tune {elapsed:.1f} s")
    print(f"RSS before the samples: {baseline / 2**30:.2f} GiB; peak RSS: {peak / 2**30:.2f} GiB")
    print(f"peak RSS / samples: {peak / sample_bytes:.2f}  (peak above the baseline / samples: "
          f"{(peak - baseline) / sample_bytes:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
