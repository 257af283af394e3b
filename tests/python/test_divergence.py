"""Divergence traced to the module: a small HF-style decoder whose exported graph gets a
wrong op in layer 1's attention; the tune report, the error OneBackendStrategy raises and
`aitune debug-precision` name that layer's module path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import aitune.torch as ait
from aitune import _core
from aitune.torch import export
from aitune.torch.backend.onnx_runtime_backend import NumericMismatchError
from aitune.torch.graph_tuning import TuningError
from report_page import CHROMIUM, dump_dom
from torch_models import cpu_backend

FAULTY_SCOPE = "inner.model.layers.1.self_attn"  # as the exporter records it (aitune's wrapper is `inner`)


class Attention(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(hidden, hidden) for _ in range(4))

    def forward(self, x):
        scores = self.q_proj(x) @ self.k_proj(x).transpose(-1, -2) / x.shape[-1] ** 0.5
        return self.o_proj(torch.softmax(scores, dim=-1) @ self.v_proj(x))


class MLP(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.gate_proj, self.up_proj = torch.nn.Linear(hidden, 2 * hidden), torch.nn.Linear(hidden, 2 * hidden)
        self.down_proj, self.act_fn = torch.nn.Linear(2 * hidden, hidden), torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = torch.nn.RMSNorm(hidden), torch.nn.RMSNorm(hidden)
        self.self_attn, self.mlp = Attention(hidden), MLP(hidden)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(DecoderLayer(hidden) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(hidden)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class TinyCausalLM(torch.nn.Module):
    """LlamaForCausalLM's module layout (model.layers.N.self_attn / .mlp, lm_head) at toy size."""

    def __init__(self, vocab: int = 32, hidden: int = 16, layers: int = 3):
        super().__init__()
        self.model = Decoder(vocab, hidden, layers)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids))


def _break_softmax(path: Path) -> None:
    """The wrong op: layer 1's attention Softmax becomes a LogSoftmax (same attributes)."""
    model = onnx.load(str(path))
    broken = [n for n in model.graph.node if n.op_type == "Softmax"
              and any(p.key == "pkg.torch.onnx.name_scopes" and f"'{FAULTY_SCOPE}'" in p.value for p in n.metadata_props)]
    assert len(broken) == 1, "the exporter's scope metadata no longer names the attention's Softmax"
    broken[0].op_type = "LogSoftmax"
    onnx.save(model, str(path))


@pytest.fixture
def faulty_export(monkeypatch, tmp_path):
    """Every export gets the fault; the clean export is kept as tmp_path/clean.onnx, the
    faulty one's path in tmp_path/faulty.txt."""
    original = export.export_onnx

    def export_with_fault(graph, spec, path, **kwargs):
        produced = original(graph, spec, path, **kwargs)
        onnx.save(onnx.load(str(produced)), str(tmp_path / "clean.onnx"))  # weights inline
        _break_softmax(produced)
        (tmp_path / "faulty.txt").write_text(str(produced))
        return produced

    monkeypatch.setattr(export, "export_onnx", export_with_fault)
    return tmp_path


def _cli() -> str | None:
    beside = Path(sys.executable).parent / "aitune"
    return str(beside) if beside.exists() else shutil.which("aitune")


def test_a_wrong_op_in_layer_1_is_traced_to_its_module(faulty_export, cache_dir):
    torch.manual_seed(0)
    model = ait.Module(TinyCausalLM().eval(), "tiny-lm",
                       strategy=ait.OneBackendStrategy(cpu_backend(tune_provider_options=False)))
    with pytest.raises((NumericMismatchError, TuningError)) as raised:
        ait.tune(model, torch.randint(0, 32, (1, 8)), ignore_failing_modules=False)

    # The error names the module where the graph first diverges, not only the output.
    message = str(raised.value)
    # ...the module holding the wrong op (the Softmax is self_attn's own code), not the
    # child (o_proj) whose output first shows it
    assert "first diverges in model.layers.1.self_attn (" in message, message
    assert "model.layers.0" not in message.split("first diverges in")[1].split(":")[0]

    # The report: a divergence per incorrect candidate, compared with eager's module outputs.
    (graph,) = model.ait_graphs
    directory = cache_dir / "tiny-lm" / graph.key
    report = json.loads((directory / "tune_report.json").read_text())
    incorrect = [c for c in report["candidates"] if c["status"] == "incorrect"]
    assert incorrect
    for candidate in incorrect:
        divergence = candidate["divergence"]
        assert divergence["reference"] == "eager PyTorch's module inputs and outputs"
        assert divergence["first"]["module"].startswith("model.layers.1.self_attn"), divergence
        assert divergence["first"]["location"] == "model.layers.1.self_attn", divergence
        assert "LogSoftmax" in [s["op_type"] for s in divergence["first"]["suspects"]]
        assert divergence["first"]["suspect_count"] == len(divergence["first"]["suspects"]) < 20
        assert divergence["compared"] > 10  # every module of layer 0 compared within tolerance first
        assert divergence["first"]["max_abs_error"] > 0.1

    # Scopes as the engine reads them from the node metadata.
    nodes = _core.onnx_graph_nodes(str(faulty_export / "clean.onnx"))
    softmax = [n for n in nodes if n.op_type == "Softmax"]
    assert [n.scope for n in softmax] == [f"inner.model.layers.{i}.self_attn" for i in range(3)]
    # The export wrapper calls the wrapped module's forward (its hooks run around the
    # graph, not inside it), so the outermost scope is the model's first submodule.
    assert softmax[1].scopes == ["inner.model", "inner.model.layers.1", "inner.model.layers.1.self_attn"]

    # The command line on the ONNX model alone: the faulty graph against the clean one in fp32.
    assert _cli() is not None, "the aitune CLI is not installed in this environment (make build installs it)"
    faulty = Path((faulty_export / "faulty.txt").read_text())
    clean = faulty_export / "clean.onnx"
    ids = faulty_export / "ids.npy"
    np.save(ids, np.random.default_rng(0).integers(0, 32, (1, 1, 8), dtype=np.int64))  # [batch, *sample]
    name = export.onnx_io_names(clean)[0][0]

    same = subprocess.run([_cli(), "debug-precision", str(clean), "--input", f"{name}={ids}"],
                          capture_output=True, text=True, timeout=300)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "no node output beyond tolerance" in same.stdout

    result_json = faulty_export / "divergence.json"
    broken = subprocess.run([_cli(), "debug-precision", str(clean), "--candidate-model", str(faulty),
                             "--input", f"{name}={ids}", "--json", str(result_json)],
                            capture_output=True, text=True, timeout=300)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "(LogSoftmax)" in broken.stdout and f"module: {FAULTY_SCOPE}" in broken.stdout, broken.stdout
    first = json.loads(result_json.read_text())["first"]
    assert first["module"] == FAULTY_SCOPE and first["op_type"] == "LogSoftmax"
    assert json.loads(result_json.read_text())["reference"] == "the fp32 CPU run of the same graph"

    # The page beside it shows the divergence point.
    page = directory / "tune_report.html"
    assert "model.layers.1.self_attn" in page.read_text()
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it): the page was not opened")
    dom = dump_dom(page, faulty_export / "chromium-profile")
    assert 'id="divergence"' in dom and "model.layers.1.self_attn" in dom.split('id="divergence"')[1]


def _break_node(path: Path, op_type: str, scope: str, replacement: str) -> None:
    model = onnx.load(str(path))
    broken = [n for n in model.graph.node if n.op_type == op_type
              and any(p.key == "pkg.torch.onnx.name_scopes" and f"'{scope}'" in p.value for p in n.metadata_props)]
    assert broken, f"no {op_type} in {scope}: the exporter's scope metadata changed"
    broken[-1].op_type = replacement
    onnx.save(model, str(path))


@pytest.mark.parametrize(("op_type", "scope", "replacement", "location"), [
    # a wrong op in self_attn's own code (between its children): named self_attn
    ("Softmax", "inner.model.layers.1.self_attn", "LogSoftmax", "model.layers.1.self_attn"),
    # a wrong op inside a leaf module: named the leaf, not its parent
    ("Add", "inner.model.layers.2.mlp.down_proj", "Sub", "model.layers.2.mlp.down_proj"),
])
def test_an_fp16_candidate_is_traced_to_the_deepest_module_holding_the_fault(tmp_path, op_type, scope, replacement,
                                                                            location):
    """The candidate is the fp16 conversion of the export (onnxconverter-common keeps the
    node metadata and value names; its Casts have no scope), with one node broken in a
    chosen submodule: the divergence names that submodule's path, compared with eager."""
    from aitune.torch.divergence import trace_failed_candidates
    from aitune.torch.graph_tuning import _samples

    torch.manual_seed(0)
    model = ait.Module(TinyCausalLM().eval(), "tiny-lm-fp16")
    ait.tune(model, torch.randint(0, 32, (1, 8)), dry_run=True)
    (graph,) = model.ait_graphs
    spec = graph.graph_spec()
    exported = export.export_onnx(graph, spec, tmp_path / "model.onnx", use_dynamo=True)
    fp16 = export.convert_to_fp16(exported, tmp_path / "model_fp16.onnx")
    _break_node(fp16, op_type, scope, replacement)
    options = _core.TunerOptions()
    options.profile.warmup_calls, options.profile.window_calls, options.profile.time_cap_s = 1, 5, 0.2
    tuner = _core.GraphTuner("tiny-lm-fp16", spec, _samples(graph), options)
    config = _core.OnnxSessionConfig()
    config.provider = _core.parse_execution_provider("cpu")
    tuner.evaluate_onnx(str(fp16), _core.OnnxCandidate("cpu fp16 model", config, _core.Precision.FP16, "fp16"),
                        "ONNXRuntimeBackend", 0)
    assert tuner.report.candidates[0].status == "incorrect"
    trace_failed_candidates(graph, tuner)
    first = json.loads(tuner.report.to_json())["candidates"][0]["divergence"]["first"]
    assert first["location"] == location, first
    assert replacement in [s["op_type"] for s in first["suspects"]]
    assert tuner.report.candidates[0].divergence_summary.startswith(f"first diverges in {location} ")
