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


def _setup(tmp_path, module_class=None):
    torch.manual_seed(0)
    model = ait.Module((module_class or OffsetHead)().eval(), "offset_head")
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


def _search(models, tuner, config, graph, tmp_path, name="cpu fp16 searched model", backend=None):
    """The backend's fp32-node search for one planned fp16 candidate under ``config``."""
    backend = backend or ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu"))
    planned = types.SimpleNamespace(name=name, config=config, precision=_core.Precision.FP16)
    backend._search_fp16(planned, models, tuner, 0, [0], graph, tmp_path)


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
    nodes = onnx.load(str(exported)).graph.node
    head = [n.name for n in nodes if n.op_type in ("Gemm", "MatMul")]
    assert len(head) == 1 and head[0] in mixed.fp32_nodes  # the vocabulary-sized projection
    # As under autocast, every operator but the matmul / conv family stays fp32.
    assert set(mixed.fp32_nodes) == {n.name for n in nodes if n.name and n.op_type != "Constant"}
    tuner.evaluate_onnx(str(mixed.path), _core.OnnxCandidate("cpu fp16 mixed model", config, _core.Precision.FP16,
                                                             mixed.transform, {}, mixed.fp32_nodes),
                        "ONNXRuntimeBackend", 0)
    assert tuner.report.candidates[1].status == "passed", tuner.report.candidates[1].reason
    assert tuner.report.candidates[1].fp32_nodes == mixed.fp32_nodes

    _search(models, tuner, config, graph, tmp_path)
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
    _search(models, tuner, config, graph, tmp_path)
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
    _search(models, tuner, config, graph, tmp_path)
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


class Block(torch.nn.Module):
    """A residual block as a transformer has them: x + W2 silu(W1 norm(x))."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))))


def test_the_mixed_model_computes_in_fp16_what_autocast_does_and_nothing_else(tmp_path):
    """Only the matmuls go to fp16 (their weights stored in fp16); the residual add, the
    activation and the norm stay fp32, as autocast computes them (transforms.AUTOCAST_FP16_OPS)."""
    torch.manual_seed(0)
    block = Block().eval()
    torch.onnx.export(block, (torch.randn(2, 8, 32),), str(tmp_path / "block.onnx"), dynamo=False,
                      input_names=["x"], output_names=["y"])
    models = transforms.TransformedModels(tmp_path / "block.onnx", transforms.TransformContext(tmp_path))
    mixed = onnx.load(str(models.get("fp16_mixed").path))
    types_of = {i.name: i.data_type for i in mixed.graph.initializer}
    inferred = onnx.shape_inference.infer_shapes(mixed)
    value_types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.input,
                                                                   *inferred.graph.output]}
    value_types.update(types_of)
    fp16 = onnx.TensorProto.FLOAT16
    by_type = {}
    for node in mixed.graph.node:
        if node.op_type == "Cast":
            continue
        dtypes = {value_types.get(name) for name in node.input if name in value_types}
        by_type.setdefault(node.op_type, set()).update(dtypes)
    matmuls = [op for op in by_type if op in ("MatMul", "Gemm")]
    assert matmuls and all(by_type[op] == {fp16} for op in matmuls), by_type
    for op in ("Add", "LayerNormalization", "Sigmoid", "Mul"):
        if op in by_type:
            assert fp16 not in by_type[op], (op, by_type)
    assert any(op in by_type for op in ("Add", "LayerNormalization"))
    x = torch.randn(2, 8, 32)
    import onnxruntime

    out = onnxruntime.InferenceSession(str(models.get("fp16_mixed").path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.numpy()})[0]
    error = abs(out - block(x).detach().numpy()).max()
    assert out.dtype.name == "float32" and 0 < error < 1e-2, error  # fp16 matmuls: close, not exact


def test_no_mixed_model_without_an_operator_autocast_computes_in_fp16(tmp_path):
    torch.onnx.export(torch.nn.ReLU(), (torch.randn(2, 4),), str(tmp_path / "relu.onnx"), dynamo=False)
    models = transforms.TransformedModels(tmp_path / "relu.onnx", transforms.TransformContext(tmp_path))
    assert models.get("fp16_mixed") is None


def _rejected_all_fp16(tuner, models, config, name):
    fp16 = models.get("fp16")
    tuner.evaluate_onnx(str(fp16.path), _core.OnnxCandidate(name, config, _core.Precision.FP16, fp16.transform),
                        "ONNXRuntimeBackend", 0)
    assert tuner.report.candidates[-1].status == "incorrect", tuner.report.candidates[-1].reason


def test_one_search_per_graph_and_provider_its_set_reused_by_later_configurations(tmp_path, monkeypatch):
    """Whether a set of fp32 nodes passes is a matter of the model's numbers, not of the
    session's options: where the all-fp16 model of two configurations was rejected, the
    search (each step a conversion of the whole export) runs once, and the second
    configuration's candidate runs on the set it found, checked and measured as its own."""
    graph, exported, tuner, config = _setup(tmp_path)
    threads = _core.OnnxSessionConfig()
    threads.provider = _core.parse_execution_provider("cpu")
    threads.intra_op_threads = 1
    models = transforms.TransformedModels(exported, transforms.TransformContext(tmp_path))
    _rejected_all_fp16(tuner, models, config, "cpu fp16 model")
    _rejected_all_fp16(tuner, models, threads, "cpu[intra_op_threads=1] fp16 model")

    searches, steps = [], []
    search = _core.search_fp32_nodes

    def counted_search(nodes, passes, **limits):
        def counted(kept):
            steps.append(list(kept))
            return passes(kept)

        searches.append(list(nodes))
        return search(nodes, counted, **limits)

    monkeypatch.setattr(_core, "search_fp32_nodes", counted_search)
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu"))
    for name, session in (("cpu fp16 searched model", config), ("cpu[intra_op_threads=1] fp16 searched model", threads)):
        _search(models, tuner, session, graph, tmp_path, name=name, backend=backend)

    assert len(searches) == 1, f"{len(searches)} searches ({len(steps)} converted models) for one graph and provider"
    first, second = tuner.report.candidates[2], tuner.report.candidates[3]
    assert (first.name, second.name) == ("cpu fp16 searched model", "cpu[intra_op_threads=1] fp16 searched model")
    assert first.status == "passed" and second.status == "passed", (first.reason, second.reason)
    assert second.fp32_nodes == first.fp32_nodes and len(first.fp32_nodes) == 1
    assert json.loads(second.config_json)["intra_op_threads"] == 1  # its own session configuration
    assert second.p50_us is not None  # measured as its own candidate
    assert first.transform_note.startswith("fp32-node search: minimal"), first.transform_note
    assert second.transform_note.startswith("fp32-node set from the search for cpu fp16 searched model"), \
        second.transform_note
    report = tuner.select(_core.StrategyConfig(performance_validation=False))
    assert json.loads(report.to_json())["candidates"][3]["transform_note"] == second.transform_note
    assert f"graph of {second.name}: fp16_search; kept in fp32: 1 node ({second.fp32_nodes[0]}); " \
           f"{second.transform_note}\n" in report.summary_table()


def test_the_search_stops_at_its_time_bound_with_the_set_that_passed(tmp_path):
    """fp16_search_seconds bounds the search: past it no step starts, and the candidate
    runs on the last set that passed (here the first, every node kept), its note saying
    where the search stopped."""
    graph, exported, tuner, config = _setup(tmp_path)
    models = transforms.TransformedModels(exported, transforms.TransformContext(tmp_path))
    _rejected_all_fp16(tuner, models, config, "cpu fp16 model")
    _search(models, tuner, config, graph, tmp_path,
            backend=ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu", fp16_search_seconds=1e-9)))
    searched = tuner.report.candidates[1]
    assert searched.status == "passed", searched.reason
    assert searched.fp32_nodes == transforms.float_compute_nodes(exported)
    assert searched.transform_note.startswith("fp32-node search: stopped after "), searched.transform_note
    assert searched.transform_note.endswith(" s (1 check)"), searched.transform_note


def test_fp16_search_seconds_is_checked():
    import math

    import pytest

    assert ONNXRuntimeBackendConfig().fp16_search_seconds == _core.DEFAULT_FP32_NODE_SEARCH_SECONDS == 120.0
    assert ONNXRuntimeBackendConfig(fp16_search_seconds=30).fp16_search_seconds == 30.0
    assert ONNXRuntimeBackendConfig(fp16_search_seconds=math.inf).fp16_search_seconds == math.inf
    for bad in (0, -1.0, math.nan, "60", True, None):
        with pytest.raises(_core.InvalidArgumentError, match="fp16_search_seconds must be a positive number"):
            ONNXRuntimeBackendConfig(fp16_search_seconds=bad)


def test_a_search_step_converts_exactly_as_a_fresh_conversion_does(tmp_path):
    """The search loads and shape-infers the export once and converts a copy per step: each
    step's model is byte for byte the one converting from the file would write."""
    from onnxruntime.transformers import float16

    torch.manual_seed(0)
    source = tmp_path / "scaled.onnx"
    torch.onnx.export(ScaledHead().eval(), (torch.randn(2, 16),), str(source), dynamo=False)
    nodes = transforms.float_compute_nodes(source)
    constants = transforms.float_constant_nodes(onnx.load(str(source)))
    keeping = transforms.Fp16Keeping(source)
    for kept in (nodes, nodes[:1], [], nodes[1:]):  # one loaded model, several steps
        step = keeping.write(tmp_path / "step.onnx", kept)
        fresh = export.convert_to_fp16(source, tmp_path / "fresh.onnx", op_block_list=list(float16.DEFAULT_OP_BLOCK_LIST),
                                       node_block_list=[*kept, *constants])
        assert step.read_bytes() == fresh.read_bytes(), kept


def test_an_export_the_search_cannot_load_fails_its_candidate_only(tmp_path, monkeypatch):
    """Loading and shape-inferring the export now happens once, before the steps (a model
    past protobuf's 2 GB fails there): that fails the searched candidate with the reason,
    it does not end the tune."""
    graph, exported, tuner, config = _setup(tmp_path)
    models = transforms.TransformedModels(exported, transforms.TransformContext(tmp_path))
    _rejected_all_fp16(tuner, models, config, "cpu fp16 model")

    def too_large(self, source):
        raise ValueError("Message onnx.ModelProto exceeds maximum protobuf size of 2GB")

    monkeypatch.setattr(transforms.Fp16Keeping, "__init__", too_large)
    _search(models, tuner, config, graph, tmp_path)
    searched = tuner.report.candidates[1]
    assert searched.status == "failed"
    assert searched.reason == ("fp32-node search: the export could not be converted: ValueError: "
                               "Message onnx.ModelProto exceeds maximum protobuf size of 2GB"), searched.reason


def test_the_mixed_model_and_the_search_share_one_prepared_export(tmp_path, monkeypatch):
    """The export is loaded and shape-inferred once for the mixed-precision model and the
    search that follows it; the mixed model is byte for byte what converting from the file
    writes."""
    from onnxruntime.transformers import float16

    graph, exported, tuner, config = _setup(tmp_path)
    prepared = []
    init = transforms.Fp16Keeping.__init__

    def counted(self, source):
        prepared.append(source)
        init(self, source)

    monkeypatch.setattr(transforms.Fp16Keeping, "__init__", counted)
    models = transforms.TransformedModels(exported, transforms.TransformContext(tmp_path))
    _rejected_all_fp16(tuner, models, config, "cpu fp16 model")
    mixed = models.get("fp16_mixed")
    present = {n.op_type for n in onnx.load(str(exported)).graph.node}
    kept_ops = sorted({*float16.DEFAULT_OP_BLOCK_LIST, *(present - set(transforms.AUTOCAST_FP16_OPS))})
    fresh = export.convert_to_fp16(exported, tmp_path / "fresh_mixed.onnx", op_block_list=kept_ops,
                                   node_block_list=transforms.vocabulary_projections(onnx.load(str(exported))))
    assert mixed.path.read_bytes() == fresh.read_bytes()

    _search(models, tuner, config, graph, tmp_path)
    assert tuner.report.candidates[-1].status == "passed", tuner.report.candidates[-1].reason
    assert len(prepared) == 1, prepared


class ProjectedOffsetHead(torch.nn.Module):
    """A small projection (which the mixed model computes in fp16) before OffsetHead."""

    def __init__(self):
        super().__init__()
        self.project = torch.nn.Linear(16, 16)
        self.head = OffsetHead()

    def forward(self, x):
        return self.head(torch.relu(self.project(x)))


def test_the_search_starts_from_the_mixed_models_fp32_set_when_that_model_passed(tmp_path, monkeypatch):
    """A bounded search spends its steps below a set known to pass: its first probe keeps
    exactly the nodes the passing mixed model kept (not every node), and it still ends on
    the smallest set (the head alone)."""
    graph, exported, tuner, config = _setup(tmp_path, ProjectedOffsetHead)
    models = transforms.TransformedModels(exported, transforms.TransformContext(tmp_path))
    _rejected_all_fp16(tuner, models, config, "cpu fp16 model")
    mixed = models.get("fp16_mixed")
    tuner.evaluate_onnx(str(mixed.path), _core.OnnxCandidate("cpu fp16 mixed model", config, _core.Precision.FP16,
                                                             mixed.transform, {}, mixed.fp32_nodes),
                        "ONNXRuntimeBackend", 0)
    assert tuner.report.candidates[-1].status == "passed"
    probes = []
    write = transforms.Fp16Keeping.write

    def recorded(self, target, kept):
        probes.append(list(kept))
        return write(self, target, kept)

    monkeypatch.setattr(transforms.Fp16Keeping, "write", recorded)
    extra = set(transforms.float_compute_nodes(exported)) - set(mixed.fp32_nodes)
    _search(models, tuner, config, graph, tmp_path)
    searched = tuner.report.candidates[-1]
    assert searched.status == "passed", searched.reason
    assert set(probes[0]) == set(mixed.fp32_nodes) & set(transforms.float_compute_nodes(exported))
    assert not any(set(p) & extra for p in probes)  # never above the mixed model's set
    assert extra  # the projection's matmul, in fp16 in the mixed model
    head = transforms.vocabulary_projections(onnx.load(str(exported)))
    assert searched.fp32_nodes == head
    assert "started from the mixed model's" in searched.transform_note
