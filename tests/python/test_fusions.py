"""Transformer fusion candidates: ONNX Runtime's fused operators (Attention,
SkipLayerNormalization, BiasGelu) made from exports of tiny transformers BertModels,
checked against eager PyTorch and reported with their counts (CPU provider)."""

from __future__ import annotations

import json

import onnx
import pytest
import torch

import aitune.torch as ait
from aitune import _core
from aitune.torch import transforms
from torch_models import cpu_backend


def _ort():
    """The onnxruntime Python package, imported when a test runs: imported at collection, it
    loaded another install's ONNX Runtime provider bridge before aitune's in every worker
    of the GPU host's suite (docs/gpu.md, session 25)."""
    import onnxruntime

    return onnxruntime

transformers = pytest.importorskip("transformers")

#: A 2-layer BertModel exported by dynamo and fused by optimize_for_ort (issue 16).
DYNAMO_FUSED = {"Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
#: onnxruntime.transformers.optimizer on the trace export: its attention patterns do not
#: match today's transformers, so only the normalisations and GELUs fuse.
TRACE_FUSED = {"SkipLayerNormalization": 4, "BiasGelu": 2}


class TinyBert(torch.nn.Module):
    """A 2-layer BertModel (random weights) as ``forward(input_ids) -> last_hidden_state``."""

    def __init__(self):
        super().__init__()
        config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=128, vocab_size=100, max_position_embeddings=64)
        self.bert = transformers.BertModel(config, add_pooling_layer=False)
        self.config = config

    def forward(self, input_ids):
        return self.bert(input_ids=input_ids).last_hidden_state


def _relu_mlp():
    """No attention, normalisation or GELU: nothing for the fusions to match."""
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()


def _ids(n: int = 4):
    return [torch.randint(0, 100, (16,)) for _ in range(n)]


def _tune(name: str, **config):
    model = ait.Module(TinyBert().eval(), name, strategy=ait.OneBackendStrategy(cpu_backend(**config)))
    ait.tune(model, _ids(), disable_external_logging=True)
    (report,) = model.ait_reports.values()
    return model, report


def _fused(report):
    """The candidates on a fused model. Not every transformed model is fused: the fp16 and
    fp16_mixed conversions of the export (CUDA plans) carry a transform and no fused
    operators; picking them up made the CUDA test below expect fusion counts of them."""
    fusions = {transforms.ORT_FUSIONS, transforms.ORT_TRANSFORMERS_OPTIMIZER}
    return [c for c in report.candidates if fusions & set(_core.model_transform_steps(c.transform))]


def test_only_candidates_on_fused_models_count_as_fused():
    """The CUDA plan's transforms (aitune candidates on a CUDA device print them): the fp16
    conversions of the export are transformed but not fused, and must not be judged by
    the fusion counts (the H200 failure of the CUDA test below)."""
    import types

    plan = ["", "fp16", "fp16_mixed", "fp16_search", "ort_fusions", "ort_fusions+fp16", "ort_transformers_optimizer"]
    report = types.SimpleNamespace(candidates=[types.SimpleNamespace(transform=t) for t in plan])
    assert [c.transform for c in _fused(report)] == ["ort_fusions", "ort_fusions+fp16", "ort_transformers_optimizer"]


@pytest.mark.parametrize(
    "use_dynamo, transform, expected",
    [(True, transforms.ORT_FUSIONS, DYNAMO_FUSED), (False, transforms.ORT_TRANSFORMERS_OPTIMIZER, TRACE_FUSED)],
)
def test_fused_candidate_with_its_operator_counts_is_checked_and_reported(use_dynamo, transform, expected):
    model, report = _tune(f"bert-{transform}", use_dynamo=use_dynamo)
    (fused,) = _fused(report)  # CPU: one fused candidate, ORT's default session settings
    assert fused.transform == transform
    assert dict(fused.fused_operators) == expected
    assert fused.name.endswith(f" + {transform}")
    assert fused.status in ("selected", "not chosen"), fused.reason  # correct against eager
    assert fused.max_abs_error < 1e-4
    # Reports: the JSON carries transform and counts, the table the counts in words.
    data = json.loads(report.to_json())
    (entry,) = [c for c in data["candidates"] if c["transform"]]
    assert entry["fused_operators"] == expected and entry["precision"] == "fp32"
    table = report.summary_table()
    for op, count in expected.items():
        assert f"{op}: {count}" in table
    ids = torch.randint(0, 100, (2, 16))  # within the recorded batch sizes (1, 2)
    torch.testing.assert_close(model(ids), model.ait_module(ids), atol=1e-4, rtol=1e-4)


def test_no_fused_candidate_when_switched_off_or_nothing_fuses():
    _, report = _tune("bert-nofusion", transformer_fusions=False)
    assert not _fused(report)
    mlp = ait.Module(_relu_mlp(), "mlp-nofusion", strategy=ait.OneBackendStrategy(cpu_backend()))
    ait.tune(mlp, [torch.randn(16) for _ in range(4)], disable_external_logging=True)
    (report,) = mlp.ait_reports.values()
    assert not _fused(report) and all(c.status != "failed" for c in report.candidates)


def test_a_fusion_that_changes_results_is_rejected(monkeypatch):
    """The correctness check judges fused graphs like any candidate: a transform that
    breaks the numbers (here: every Attention's output scaled) loses its candidate."""
    real = transforms.fuse_for_ort

    def broken(source, target, **kwargs):
        fused = real(source, target, **kwargs)
        model = onnx.load(str(fused.path))
        graph = model.graph
        (attention,) = [n for n in graph.node if n.op_type == "Attention"][:1]
        scaled = attention.output[0] + "_unscaled"
        consumers = [n for n in graph.node if attention.output[0] in n.input]
        graph.initializer.append(onnx.numpy_helper.from_array(__import__("numpy").array(1.5, "float32"), "k"))
        graph.node.append(onnx.helper.make_node("Mul", [scaled, "k"], [attention.output[0]]))
        attention.output[0] = scaled
        assert consumers
        onnx.save(model, str(fused.path))
        return fused

    monkeypatch.setattr(transforms, "fuse_for_ort", broken)
    _, report = _tune("bert-broken")
    (fused,) = _fused(report)
    assert fused.status == "incorrect" and "beyond" in fused.reason
    assert report.candidates[report.winner].transform == ""


def test_fp16_copy_of_a_fused_model_keeps_operators_and_interface(tmp_path):
    bert = TinyBert().eval()
    ids = torch.randint(0, 100, (2, 16))
    source = tmp_path / "bert.onnx"
    torch.onnx.export(bert, (ids,), str(source), dynamo=True, input_names=["ids"], output_names=["y"])
    fused = transforms.fuse_for_ort(source, tmp_path / "fused.onnx", use_dynamo=True)
    assert fused.fused_operators == DYNAMO_FUSED and fused.nodes_after < fused.nodes_before
    half = transforms.fused_to_fp16(fused, tmp_path / "fused16.onnx")
    assert half.fused_operators == DYNAMO_FUSED
    weights = [i for i in onnx.load(str(half.path)).graph.initializer if i.data_type in (1, 10)]
    assert weights and all(i.data_type == onnx.TensorProto.FLOAT16 for i in weights)
    session = _ort().InferenceSession(str(half.path), providers=["CPUExecutionProvider"])
    assert [i.type for i in session.get_inputs()] == ["tensor(int64)"]
    (out,) = session.run(None, {"ids": ids.numpy()})
    assert out.dtype.name == "float32"
    torch.testing.assert_close(torch.from_numpy(out), bert(ids).detach(), atol=2e-2, rtol=2e-2)


class TinyGpt2(torch.nn.Module):
    """A 2-layer GPT2Model (random weights, no KV cache) as ``forward(input_ids) -> last_hidden_state``."""

    def __init__(self):
        super().__init__()
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64)
        self.gpt2 = transformers.GPT2Model(config)

    def forward(self, input_ids):
        return self.gpt2(input_ids=input_ids, use_cache=False).last_hidden_state


def test_gpt2_attention_fusion_keeps_the_2d_projection_input(tmp_path):
    """GPT-2's Conv1D flattens the attention output to (batch * sequence, hidden) for a 2-D
    Gemm; optimize_for_ort's MultiHeadAttention swallows that Reshape, and ONNX Runtime
    then refuses the graph ("Gemm: Input 0 expected to have rank 2 but has rank 3"; on the
    H200 all three GPT-2 fused candidates failed so). The transform restores the reshape:
    the fused graph loads and matches eager."""
    gpt2 = TinyGpt2().eval()
    ids = torch.randint(0, 100, (2, 16))
    source = tmp_path / "gpt2.onnx"
    torch.onnx.export(gpt2, (ids,), str(source), dynamo=True, input_names=["ids"], output_names=["y"])
    fused = transforms.fuse_for_ort(source, tmp_path / "fused.onnx", use_dynamo=True)
    assert fused.fused_operators.get("MultiHeadAttention") == 2, fused.fused_operators
    restored = [n for n in onnx.load(str(fused.path)).graph.node if n.op_type == "Flatten"]
    assert len(restored) == 2, [n.name for n in restored]
    session = _ort().InferenceSession(str(fused.path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"ids": ids.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), gpt2(ids).detach(), atol=1e-4, rtol=1e-4)


def test_nothing_to_fuse_writes_nothing(tmp_path):
    source = tmp_path / "mlp.onnx"
    torch.onnx.export(_relu_mlp(), (torch.randn(2, 16),), str(source), dynamo=True)
    assert transforms.fuse_for_ort(source, tmp_path / "fused.onnx", use_dynamo=True) is None
    assert not (tmp_path / "fused.onnx").exists()


def _cuda_ready() -> bool:
    if not torch.cuda.is_available():
        return False
    from aitune import _core

    return _core.OrtRuntime.load().provider_status(_core.ExecutionProvider.CUDA).available


@pytest.mark.skipif(not _cuda_ready(), reason="CUDA execution provider or CUDA device unavailable")
def test_fused_graphs_capture_into_cuda_graphs_on_the_gpu():
    """Static shapes: the fused candidates run with enable_cuda_graph=1, in fp32, TF32 and
    fp16, and each is correct (a capture failure would make it 'failed')."""
    from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda"))
    model = ait.Module(TinyBert().eval().cuda(), "bert-cuda-fused", strategy=ait.OneBackendStrategy(backend))
    ait.tune(model, [t.cuda() for t in _ids()], batch_sizes=[2], disable_external_logging=True)
    (report,) = model.ait_reports.values()
    fused = _fused(report)
    assert {c.precision_name for c in fused} == {"fp32", "tf32", "fp16"}, report.summary_table()
    for c in fused:
        assert dict(c.fused_operators) == DYNAMO_FUSED
        assert "enable_cuda_graph=1" in c.name
        assert c.status in ("selected", "not chosen"), f"{c.name}: {c.reason}\n{report.summary_table()}"
