"""fp16 where it is safe, on the CPU provider (ONNX Runtime runs fp16 models there, in
fp32 through casts where it has no fp16 kernel, so what fp16 loses there is in the
weights): the all-fp16 model of a vocabulary-sized head fails the check, the
mixed-precision model keeps the head in fp32 and passes, and the measured search finds
the smallest set of fp32 nodes that passes, carried in the candidate's report."""

from __future__ import annotations

import json
import types

import onnx
import torch

import aitune.torch as ait
from aitune import _core
from aitune.torch import export, transforms
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig


class OffsetHead(torch.nn.Module):
    """A 1024-column head around an offset of 100: in fp16 its bias keeps 1/16 of a unit
    at 100, an error of ~0.03 on logits of RMS < 1, beyond the fp16 table."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 1024)
        with torch.no_grad():
            self.linear.weight *= 0.1
            self.linear.bias += 100.0

    def forward(self, x):
        return self.linear(x) - 100.0


def _setup(tmp_path):
    torch.manual_seed(0)
    model = ait.Module(OffsetHead().eval(), "offset_head")
    ait.tune(model, [torch.randn(16) for _ in range(3)], batch_sizes=[2], dry_run=True)
    (graph,) = model.ait_graphs
    spec = graph.graph_spec()
    exported = export.export_onnx(graph, spec, tmp_path / "model_raw.onnx", use_dynamo=False)
    samples = [([t.contiguous() for t in s.inputs], [t.contiguous() for t in s.outputs], s.batch_size)
               for s in graph.samples]
    options = _core.TunerOptions()
    options.profile.warmup_calls, options.profile.window_calls, options.profile.time_cap_s = 1, 5, 0.2
    tuner = _core.GraphTuner("offset_head", spec, samples, options)
    config = _core.OnnxSessionConfig()
    config.provider = _core.parse_execution_provider("cpu")
    return graph, exported, tuner, config


def test_mixed_precision_keeps_sensitive_nodes_and_the_search_finds_a_smaller_set(tmp_path):
    graph, exported, tuner, config = _setup(tmp_path)
    context = transforms.TransformContext(tmp_path)
    models = transforms.TransformedModels(exported, context)

    fp16 = models.get("fp16")
    assert fp16.transform == "fp16"
    tuner.evaluate_onnx(str(fp16.path), _core.OnnxCandidate("cpu fp16 model", config, _core.Precision.FP16,
                                                            fp16.transform), "ONNXRuntimeBackend", 0)
    assert tuner.report.candidates[0].status == "incorrect", tuner.report.candidates[0].reason

    mixed = models.get("fp16_mixed")
    head = [n.name for n in onnx.load(str(exported)).graph.node if n.op_type in ("Gemm", "MatMul")]
    assert len(head) == 1 and mixed.fp32_nodes == head
    tuner.evaluate_onnx(str(mixed.path), _core.OnnxCandidate("cpu fp16 mixed model", config, _core.Precision.FP16,
                                                             mixed.transform, {}, mixed.fp32_nodes),
                        "ONNXRuntimeBackend", 0)
    assert tuner.report.candidates[1].status == "passed", tuner.report.candidates[1].reason
    assert tuner.report.candidates[1].fp32_nodes == mixed.fp32_nodes

    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu"))
    planned = types.SimpleNamespace(name="cpu fp16 searched model", config=config, precision=_core.Precision.FP16)
    backend._search_fp16(planned, models, tuner, 0, [0], graph, tmp_path)
    searched = tuner.report.candidates[2]
    assert searched.status == "passed", searched.reason
    assert searched.transform == "fp16_search"
    every = transforms.float_compute_nodes(exported)
    assert len(every) > 1
    assert searched.fp32_nodes == head  # the head alone must stay fp32; the rest goes to fp16
    report = tuner.select(_core.StrategyConfig(performance_validation=False))
    data = json.loads(report.to_json())
    assert data["candidates"][2]["fp32_nodes"] == searched.fp32_nodes
    assert f"graph of cpu fp16 searched model: fp16_search; kept in fp32: 1 node ({head[0]})" in report.summary_table()
    assert not (tmp_path / "model_fp16_search_step.onnx").exists()


def test_no_search_where_no_all_fp16_model_was_rejected(tmp_path):
    graph, exported, tuner, config = _setup(tmp_path)
    models = transforms.TransformedModels(exported, transforms.TransformContext(tmp_path))
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu"))
    planned = types.SimpleNamespace(name="cpu fp16 searched model", config=config, precision=_core.Precision.FP16)
    backend._search_fp16(planned, models, tuner, 0, [0], graph, tmp_path)
    assert list(tuner.report.candidates) == []  # no rejected fp16 candidate: nothing searched, nothing added


def test_a_vocabulary_sized_final_projection_is_kept_in_fp32(tmp_path):
    head = torch.nn.Linear(16, 2048, bias=False)
    torch.onnx.export(head, (torch.randn(1, 16),), str(tmp_path / "head.onnx"), dynamo=False)
    model = onnx.load(str(tmp_path / "head.onnx"))
    names = transforms.vocabulary_projections(model)
    assert len(names) == 1 and model.graph.node[[n.name for n in model.graph.node].index(names[0])].op_type in (
        "MatMul", "Gemm")


class ScaledHead(torch.nn.Module):
    """A linear layer and two scalars: the trace exporter makes them Constant nodes, and
    1.0001 is 1.0 in fp16."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.linear(x) * 1.0001 - 100.0


def test_keeping_every_node_in_fp32_is_the_fp32_model(tmp_path):
    """The search's first probe keeps every node in fp32; it must compute what the fp32
    model does, or "fails even with every node in fp32" can be the converter's doing: the
    output rounded to fp16 by its keep_io_types Cast, float Constants rounded to fp16."""
    import numpy as np
    import onnxruntime

    torch.manual_seed(0)
    source = tmp_path / "scaled.onnx"
    torch.onnx.export(ScaledHead().eval(), (torch.randn(2, 16),), str(source), dynamo=False)
    assert transforms.float_constant_nodes(onnx.load(str(source)))  # the export has float Constants
    probe = transforms.fp16_keeping(source, tmp_path / "probe.onnx", transforms.float_compute_nodes(source))
    x = {"onnx::Gemm_0": np.random.default_rng(0).standard_normal((2, 16), dtype=np.float32)}
    (expected,) = onnxruntime.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, x)
    (got,) = onnxruntime.InferenceSession(str(probe), providers=["CPUExecutionProvider"]).run(None, x)
    assert np.array_equal(got, expected), np.abs(got - expected).max()


def test_a_search_whose_models_cannot_be_built_says_so(tmp_path, monkeypatch):
    """On the H200 the search reported "fails even with every node in fp32" for a model
    ONNX Runtime had refused to load (the converter's duplicated node names): a model that
    cannot be built or run is no verdict on fp16, and the reason says what happened."""
    graph, exported, tuner, config = _setup(tmp_path)
    models = transforms.TransformedModels(exported, transforms.TransformContext(tmp_path))
    fp16 = models.get("fp16")
    tuner.evaluate_onnx(str(fp16.path), _core.OnnxCandidate("cpu fp16 model", config, _core.Precision.FP16,
                                                            fp16.transform), "ONNXRuntimeBackend", 0)
    assert tuner.report.candidates[0].status == "incorrect"

    def unloadable(self, target, nodes):
        target.write_bytes(b"not an onnx model")
        return target

    monkeypatch.setattr(transforms.Fp16Keeping, "write", unloadable)
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu"))
    planned = types.SimpleNamespace(name="cpu fp16 searched model", config=config, precision=_core.Precision.FP16)
    backend._search_fp16(planned, models, tuner, 0, [0], graph, tmp_path)
    searched = tuner.report.candidates[1]
    assert searched.status == "failed"
    assert "fails even" not in searched.reason
    assert "the model keeping every node in fp32 could not be built or run" in searched.reason, searched.reason


def test_a_llama_keeping_every_node_in_fp32_loads_and_is_the_fp32_model(tmp_path):
    """The H200 case at toy size: transformers' LlamaForCausalLM, dynamo export, logits.
    The search's first probe (every node kept) must load in ONNX Runtime (the converter's
    duplicated Cast names made it refuse the model) and compute the export's logits exactly."""
    import numpy as np
    import onnxruntime
    import pytest

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=1024, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = ait.Module(transformers.LlamaForCausalLM(config).eval(), "tiny_llama_fp32_probe")

    def batches(size):
        ids = torch.randint(0, 1024, (size, 16), generator=torch.Generator().manual_seed(size))
        return [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}]

    ait.tune(model, batches, batch_sizes=[1, 2], dry_run=True, disable_external_logging=True)
    (graph,) = model.ait_graphs
    exported = export.export_onnx(graph, graph.graph_spec(), tmp_path / "model_raw.onnx", use_dynamo=True)
    probe = transforms.fp16_keeping(exported, tmp_path / "probe.onnx", transforms.float_compute_nodes(exported))
    names, _ = export.onnx_io_names(exported)
    sample = graph.samples[-1]
    feeds = {n: sample.inputs[graph.input_names.index(n)].numpy() for n in names}
    expected = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxruntime.InferenceSession(str(probe), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True))
