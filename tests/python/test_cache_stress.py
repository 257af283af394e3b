"""Stress (issue 31): several processes tune, save and load modules of the same and of
colliding names (``coll/x``, ``coll_x``) in one cache directory, saving to shared and
private checkpoint paths at once, for a few rounds. Every checkpoint a process loads
computes what the process that saved it computed, and nothing is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

_WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    import aitune.torch as ait
    from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig
    sys.path.insert(0, sys.argv[1])
    from torch_models import MLP
    root, worker, rounds = __import__("pathlib").Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    names = ["shared", "coll/x", "coll_x"]
    x = torch.linspace(-1, 1, 2 * 16).reshape(2, 16)
    config = ONNXRuntimeBackendConfig(execution_provider="cpu", tune_provider_options=False,
                                      transformer_fusions=False, use_dynamo=False)
    records = []
    for r in range(rounds):
        name = names[(worker + r) % len(names)]
        torch.manual_seed(1000 * worker + r)
        inner = MLP().eval()
        with torch.no_grad():
            expected = inner(x)
        model = ait.Module(inner, name, strategy=ait.OneBackendStrategy(backend=ONNXRuntimeBackend(config)))
        ait.tune(model, torch.randn(16))
        tag = f"w{worker}r{r}"
        private, shared = root / "private" / tag, root / "shared" / name.replace("/", "%")
        ait.save(model, private)
        ait.save(model, shared)
        records.append({"kind": "saved", "name": name, "tag": tag, "out": expected.tolist()})
        for path, kind in ((private, "private"), (shared, "shared")):
            loaded = ait.load(ait.Module(MLP().eval(), name), path)
            with torch.no_grad():
                records.append({"kind": kind, "name": name, "tag": tag, "out": loaded(x).tolist()})
    (root / f"worker{worker}.json").write_text(json.dumps(records))
""")

WORKERS, ROUNDS = 3, 2


def test_processes_sharing_one_cache_never_cross(tmp_path):
    import torch

    env = {**os.environ, "AITUNE_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp_path / "tmp"),
           "OMP_NUM_THREADS": "1"}
    (tmp_path / "tmp").mkdir()
    tests = str(Path(__file__).resolve().parent)
    workers = [subprocess.Popen([sys.executable, "-c", _WORKER, tests, str(tmp_path), str(w), str(ROUNDS)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for w in range(WORKERS)]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    assert all(w.returncode == 0 for w in workers), "\n".join(outputs)

    records = [r for w in range(WORKERS) for r in json.loads((tmp_path / f"worker{w}.json").read_text())]
    saved = {r["tag"]: r for r in records if r["kind"] == "saved"}
    for r in records:
        got = torch.tensor(r["out"])
        if r["kind"] == "private":  # this process's own checkpoint: its own weights
            torch.testing.assert_close(got, torch.tensor(saved[r["tag"]]["out"]), rtol=1e-4, atol=1e-5)
        elif r["kind"] == "shared":  # whoever saved last: some process's module of this name, whole
            matches = [s for s in saved.values() if s["name"] == r["name"]
                       and torch.allclose(got, torch.tensor(s["out"]), rtol=1e-4, atol=1e-5)]
            assert matches, f"{r['tag']} loaded {r['name']} computing what no process saved"
    debris = [p for p in tmp_path.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]
    debris += list((tmp_path / "tmp").glob("aitune-*"))
    assert not debris, debris
