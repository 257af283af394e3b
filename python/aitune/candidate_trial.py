"""One tuning candidate evaluated by the engine in a process of its own (``python -m
aitune.candidate_trial DIR``), for ``aitune.torch.candidate_isolation``: a failure that
would break the CUDA context stays in this process. Imports no torch (starts fast).

DIR holds ``job.json`` (model path, candidate name, session config, precision, graph
spec, model input order, sample counts) and the samples as ``<s>_input_<i>.npy`` /
``<s>_expected_<i>.npy``. Prints one JSON line ``{"status": ..., "reason": ...}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from aitune import _core


def main(root: Path) -> int:
    job = json.loads((root / "job.json").read_text())
    spec = _core.GraphSpec.from_json(job["spec"])
    samples = []
    for s, meta in enumerate(job["samples"]):
        inputs = [np.load(root / f"{s}_input_{i}.npy") for i in range(meta["inputs"])]
        expected = [np.load(root / f"{s}_expected_{i}.npy") for i in range(meta["expected"])]
        samples.append((inputs, expected, meta["batch_size"]))
    options = _core.TunerOptions()
    profile = options.profile  # a few calls: the trial is about surviving, not about speed
    profile.warmup_calls, profile.window_calls, profile.stable_windows, profile.max_windows = 1, 2, 1, 1
    options.profile = profile
    tuner = _core.GraphTuner("isolated trial", spec, samples, options)
    candidate = _core.OnnxCandidate(
        job["name"], _core.OnnxSessionConfig.from_json(job["config"]), _core.parse_precision(job["precision"])
    )
    tuner.evaluate_onnx(job["model_path"], candidate, "isolated trial", 0, job["model_inputs"])
    (result,) = tuner.report.candidates
    print(json.dumps({"status": result.status, "reason": result.reason, "code": result.failure_code}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
