"""ait.export_triton / aitune._core.export_triton: every config.pbtxt parsed with Triton's
model-config protobuf and each field the exporter sets asserted; the exported model run
against the tuned module; an ensemble for a chain; bad input writes nothing."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from google.protobuf import text_format
from onnx import TensorProto, helper
from torch_models import MLP, MaskedModel, SmallCNN, cpu_strategy

import aitune.torch as ait
from aitune import _core
from aitune.torch import ModuleState


def _ort():
    """The onnxruntime Python package, imported when a test runs: imported at collection, it
    loaded another install's ONNX Runtime provider bridge before aitune's in every worker
    of the GPU host's suite (docs/gpu.md, session 25)."""
    import onnxruntime

    return onnxruntime

TOL = dict(rtol=1e-4, atol=1e-5)


def _model_config_pb2():
    """Triton's generated model_config_pb2, loaded from tritonclient's file by path:
    importing the tritonclient.grpc package would need grpcio, this needs only protobuf."""
    tritonclient = pytest.importorskip(
        "tritonclient", reason="tritonclient is not installed (scripts/setup.sh installs it): configs not parsed")
    path = Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location("triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PB2 = _model_config_pb2()


def parse_config(model_dir: Path):
    """config.pbtxt as inference.ModelConfig; text_format refuses unknown fields and bad values."""
    return text_format.Parse((Path(model_dir) / "config.pbtxt").read_text(), PB2.ModelConfig())


def _tune(inner, name, samples, **kwargs):
    model = ait.Module(inner, name, strategy=cpu_strategy())
    ait.tune(model, samples, disable_external_logging=True, ignore_failing_modules=False, **kwargs)
    assert model.ait_state is ModuleState.TUNED
    return model


def _session_of(model):
    ((_, tuned),) = model._ait_tuned.values()
    return tuned.session


def _run_exported(model_dir: Path, config, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Runs 1/model.onnx as Triton's ONNX Runtime backend would: inputs and outputs by the
    names config.pbtxt declares, with the dtypes it declares."""
    session = _ort().InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    to_numpy = {PB2.TYPE_FP32: np.float32, PB2.TYPE_INT64: np.int64, PB2.TYPE_BOOL: np.bool_}
    assert [i.name for i in config.input] == [i.name for i in session.get_inputs()]
    assert [o.name for o in config.output] == [o.name for o in session.get_outputs()]
    # Triton's backend checks the configured dims against the model's: same rank (batch
    # axis prepended when batching), a fixed model extent equal to the configured one.
    for declared, actual in [*zip(config.input, session.get_inputs()), *zip(config.output, session.get_outputs())]:
        dims = ([-1] if config.max_batch_size > 0 else []) + list(declared.dims)
        assert len(dims) == len(actual.shape), (declared.name, dims, actual.shape)
        for configured, model_dim in zip(dims, actual.shape):
            assert not isinstance(model_dim, int) or model_dim in (-1, configured), (declared.name, dims, actual.shape)
    for declared in config.input:
        assert feeds[declared.name].dtype == to_numpy[declared.data_type], declared.name
    outputs = session.run([o.name for o in config.output], feeds)
    return dict(zip([o.name for o in config.output], outputs))


def _assert_dims_accept(config, tensor, shape):
    """The declared dims (batch axis prepended when batching) accept `shape`."""
    dims = list(tensor.dims)
    if config.max_batch_size > 0:
        assert 1 <= shape[0] <= config.max_batch_size
        shape = shape[1:]
    assert len(dims) == len(shape), (tensor.name, dims, shape)
    assert all(d == -1 or d == s for d, s in zip(dims, shape)), (tensor.name, dims, shape)


# -- the three models ---------------------------------------------------------------------


def test_mlp_with_dynamic_batch(tmp_path):
    inner = MLP().eval()
    model = _tune(inner, "mlp", [torch.randn(16) for _ in range(4)], batch_sizes=[1, 8])
    result = ait.export_triton(model, tmp_path / "repo", instances=2)
    (exported,) = result.models
    assert exported.name == "mlp" and exported.max_batch_size == 8 and result.ensemble == ""
    model_dir = tmp_path / "repo" / "mlp"
    assert Path(exported.directory) == model_dir.resolve()

    config = parse_config(model_dir)
    assert config.name == "mlp"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 8
    (x,) = config.input
    (y,) = config.output
    assert session_names(model) == ([x.name], [y.name])
    assert (x.data_type, list(x.dims)) == (PB2.TYPE_FP32, [16])  # batch axis dropped
    assert (y.data_type, list(y.dims)) == (PB2.TYPE_FP32, [8])
    assert config.HasField("dynamic_batching")
    (group,) = config.instance_group
    assert (group.kind, group.count) == (PB2.ModelInstanceGroup.KIND_CPU, 2)
    assert not config.optimization.execution_accelerators.gpu_execution_accelerator

    # The exact model file that won, run with the declared names, matches the tuned module.
    assert (model_dir / "1" / "model.onnx").read_bytes() == Path(_session_of(model).model_path).read_bytes()
    batch = torch.randn(5, 16)
    _assert_dims_accept(config, x, tuple(batch.shape))
    out = _run_exported(model_dir, config, {x.name: batch.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out[y.name]), model(batch), **TOL)
        torch.testing.assert_close(torch.from_numpy(out[y.name]), inner(batch), **TOL)
    readme = (model_dir / "README.md").read_text()
    assert "Nothing: every setting" in readme
    # the module exported, not the scratch checkpoint deleted after the export
    assert "ait.Module 'mlp' (ait.export_triton)" in readme and "aitune-triton-" not in readme


def session_names(model):
    spec = _session_of(model).graph_spec
    return [t.name for t in spec.inputs], [t.name for t in spec.outputs]


def test_cnn_with_dynamic_batch_and_spatial_dims(tmp_path):
    inner = SmallCNN().eval()
    samples = [torch.randn(3, 16, 16), torch.randn(3, 16, 16), torch.randn(3, 24, 24), torch.randn(3, 24, 24)]
    model = _tune(inner, "cnn", samples, batch_sizes=[1, 2, 4])
    result = ait.export_triton(model, tmp_path / "repo", model_name="resnet_like", max_batch_size=4)
    assert [m.name for m in result.models] == ["resnet_like"]
    config = parse_config(tmp_path / "repo" / "resnet_like")
    assert config.name == "resnet_like" and config.max_batch_size == 4
    (image,) = config.input
    (logits,) = config.output
    assert (image.data_type, list(image.dims)) == (PB2.TYPE_FP32, [3, -1, -1])  # spatial axes dynamic
    assert list(logits.dims) == [10]
    assert config.HasField("dynamic_batching")
    x = torch.randn(3, 3, 20, 20)  # a size between the recorded ones
    _assert_dims_accept(config, image, tuple(x.shape))
    out = _run_exported(tmp_path / "repo" / "resnet_like", config, {image.name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out[logits.name]), model(x), **TOL)
    # -1 in dims accepts any size; the graph was tuned and checked over 16..24 only
    readme = (tmp_path / "repo" / "resnet_like" / "README.md").read_text()
    assert "axis 2 was tuned and checked over 16..24" in readme and "axis 3 was tuned" in readme, readme


class TinyTransformer(torch.nn.Module):
    """One attention block over token embeddings with a padding mask: two inputs."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.scale = dim**-0.5

    def forward(self, tokens, mask):
        q, k, v = self.qkv(tokens).chunk(3, dim=-1)
        scores = (q @ k.transpose(-1, -2)) * self.scale + (1.0 - mask[:, None, :]) * -1e4
        return self.norm(tokens + self.out(scores.softmax(-1) @ v))


def test_two_input_transformer(tmp_path):
    inner = TinyTransformer().eval()
    samples = [(torch.randn(seq, 16), torch.ones(seq)) for seq in (6, 6, 10, 10)]
    model = _tune(inner, "encoder", samples, batch_sizes=[1, 2])
    result = ait.export_triton(model, tmp_path / "repo", max_batch_size=0)
    (exported,) = result.models
    assert exported.max_batch_size == 0
    assert any("batching turned off" in n for n in exported.not_expressed)
    config = parse_config(tmp_path / "repo" / "encoder")
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    tokens, mask = config.input
    (hidden,) = config.output
    assert (tokens.data_type, list(tokens.dims)) == (PB2.TYPE_FP32, [-1, -1, 16])  # batch kept, dynamic
    assert (mask.data_type, list(mask.dims)) == (PB2.TYPE_FP32, [-1, -1])
    assert list(hidden.dims) == [-1, -1, 16]
    x, m = torch.randn(2, 8, 16), torch.ones(2, 8)
    m[1, 6:] = 0
    out = _run_exported(tmp_path / "repo" / "encoder", config, {tokens.name: x.numpy(), mask.name: m.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out[hidden.name]), model(x, m), **TOL)

    # By default the recorded batch range is served, with dynamic batching.
    again = ait.export_triton(model, tmp_path / "repo", overwrite=True)
    assert again.models[0].max_batch_size == 2
    config = parse_config(tmp_path / "repo" / "encoder")
    assert config.max_batch_size == 2 and config.HasField("dynamic_batching")
    assert [list(t.dims) for t in config.input] == [[-1, 16], [-1]]


# -- provider options, straight from a graph ----------------------------------------------


def _graph_with(provider, options, *, intra=0, level=None):
    model = _tune(MLP().eval(), "mlp", [torch.randn(16) for _ in range(2)], batch_sizes=[1, 4])
    session = _session_of(model)
    config = _core.OnnxSessionConfig(
        provider=provider,
        provider_options=options,
        intra_op_threads=intra,
        graph_optimization_level=level or _core.GraphOptimizationLevel.ALL,
    )
    return _core.CheckpointGraph(key="g", graph_spec=session.graph_spec, backend_config=config)


def test_tensorrt_winner_becomes_the_tensorrt_accelerator():
    options = {
        "trt_fp16_enable": "1",
        "trt_engine_cache_enable": "1",
        "trt_timing_cache_enable": "1",
        "trt_builder_optimization_level": "5",
        "trt_max_workspace_size": "2147483648",
        "trt_profile_min_shapes": "x:1x16",
        "trt_profile_opt_shapes": "x:4x16",
        "trt_profile_max_shapes": "x:4x16",
        "trt_not_an_option": "1",
    }
    graph = _graph_with(_core.ExecutionProvider.TENSORRT, options, intra=3)
    cfg = _core.triton_model_config(graph, "mlp_trt", None, 2)
    config = text_format.Parse(cfg.text, PB2.ModelConfig())
    assert config.max_batch_size == 4
    (group,) = config.instance_group
    assert (group.kind, group.count) == (PB2.ModelInstanceGroup.KIND_GPU, 2)
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt"
    assert dict(accelerator.parameters) == {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": "2147483648",
        "trt_engine_cache_enable": "1",
        "trt_timing_cache_enable": "1",
        "trt_builder_optimization_level": "5",
        "trt_profile_min_shapes": "x:1x16",
        "trt_profile_opt_shapes": "x:4x16",
        "trt_profile_max_shapes": "x:4x16",
    }
    assert config.parameters["intra_op_thread_count"].string_value == "3"
    assert any("trt_not_an_option=1" in n for n in cfg.not_expressed)
    with pytest.raises(_core.InvalidArgumentError, match="trt_profile_max_shapes"):
        _core.triton_model_config(graph, "mlp_trt", 8, 1)


def test_cuda_winner_options_and_cuda_graphs():
    options = {"enable_cuda_graph": "1", "use_tf32": "0", "cudnn_conv_algo_search": "DEFAULT",
               "arena_extend_strategy": "kSameAsRequested", "prefer_nhwc": "1"}
    graph = _graph_with(_core.ExecutionProvider.CUDA, options, level=_core.GraphOptimizationLevel.EXTENDED)
    cfg = _core.triton_model_config(graph, "mlp_cuda", None, 1)
    config = text_format.Parse(cfg.text, PB2.ModelConfig())
    (group,) = config.instance_group
    assert group.kind == PB2.ModelInstanceGroup.KIND_GPU
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "cuda"
    assert dict(accelerator.parameters) == {"use_tf32": "0", "prefer_nhwc": "1"}
    assert config.parameters["cudnn_conv_algo_search"].string_value == "2"
    assert config.parameters["arena_extend_strategy"].string_value == "1"
    assert config.optimization.graph.level == 1
    # optimization.cuda.graphs is read only by Triton's TensorRT backend: not written, but said.
    assert not config.optimization.HasField("cuda")
    (note,) = cfg.not_expressed
    assert "enable_cuda_graph=1" in note and "not expressible" in note


def test_cuda_tuned_module_exports_its_winner():
    """On a GPU: the winner of a real CUDA tuning, its provider options as tuned."""
    status = _core.OrtRuntime.load().provider_status(_core.ExecutionProvider.CUDA)
    if not (status.available and torch.cuda.is_available()):
        pytest.skip(f"CUDA execution provider or device unavailable: {status.reason or 'no CUDA device'}")
    from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider=ONNXExecutionProvider.CUDA))
    model = ait.Module(MLP().eval().cuda(), "mlp_cuda", strategy=ait.OneBackendStrategy(backend))
    ait.tune(model, [torch.randn(16, device="cuda") for _ in range(4)], batch_sizes=[1, 4],
             ignore_failing_modules=False)
    options = dict(_session_of(model).config.provider_options)
    with tempfile.TemporaryDirectory() as repo:
        result = ait.export_triton(model, repo)
        config = parse_config(Path(repo) / "mlp_cuda")
    (group,) = config.instance_group
    assert group.kind == PB2.ModelInstanceGroup.KIND_GPU
    moved = {"cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream"}
    said = {"enable_cuda_graph", "user_compute_stream", "has_user_compute_stream", "device_id"}
    expected = {k: v for k, v in options.items() if k not in moved | said}
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert {a.name: dict(a.parameters) for a in accelerators} == {"cuda": expected}
    for key in moved & options.keys():
        assert key in config.parameters, key
    print(f"CUDA winner {options} -> config {text_format.MessageToString(config.optimization, as_one_line=True)}; "
          f"not expressed: {result.models[0].not_expressed}")


# -- several graphs -----------------------------------------------------------------------


def test_two_call_structures_are_two_models_and_no_ensemble(tmp_path):
    inner = MaskedModel().eval()
    data = [(torch.randn(8),), ((torch.randn(8),), {"mask": (torch.rand(8) > 0.5).float()})]
    model = _tune(inner, "masked", data)
    assert len(model.ait_graphs) == 2
    result = ait.export_triton(model, tmp_path / "repo")
    assert result.ensemble == ""
    names = [m.name for m in result.models]
    assert len(names) == 2 and all(n.startswith("masked_") for n in names)
    (note,) = result.notes
    assert ", ".join(names) in note and "no ensemble" in note
    for name in names:
        config = parse_config(tmp_path / "repo" / name)
        assert config.name == name and config.platform == "onnxruntime_onnx"
    assert not (tmp_path / "repo" / "masked").exists()


def _onnx(path: Path, op: str, source: str, target: str) -> None:
    graph = helper.make_graph(
        [helper.make_node(op, [source], [target])],
        op.lower(),
        [helper.make_tensor_value_info(source, TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info(target, TensorProto.FLOAT, ["batch", 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def _spec(source: str, target: str) -> _core.GraphSpec:
    def tensor(name):
        return {"name": name, "dtype": "float32", "min_shape": [1, 4], "max_shape": [8, 4], "batch_axis": 0}

    # rows found independent, as the tuner finds a model's that keeps them apart: Triton may batch
    return _core.GraphSpec.from_json(json.dumps({"inputs": [tensor(source)], "outputs": [tensor(target)],
                                                 "batch_sizes": [1, 8], "batch_rows": "independent"}))


def test_a_chain_of_graphs_becomes_an_ensemble(tmp_path):
    # Listed out of order: the chain is found by the tensors, x -> relu -> h -> neg -> y.
    _onnx(tmp_path / "neg.onnx", "Neg", "h", "y")
    _onnx(tmp_path / "relu.onnx", "Relu", "x", "h")
    cpu = _core.OnnxSessionConfig(provider=_core.ExecutionProvider.CPU)
    manifest = _core.CheckpointManifest(module_name="pipeline", graphs=[
        _core.CheckpointGraph(key="second", graph_spec=_spec("h", "y"), backend_config=cpu),
        _core.CheckpointGraph(key="first", graph_spec=_spec("x", "h"), backend_config=cpu),
    ])
    _core.Checkpoint.save(str(tmp_path / "ckpt"), manifest, {
        "graphs/second/model.onnx": str(tmp_path / "neg.onnx"),
        "graphs/first/model.onnx": str(tmp_path / "relu.onnx"),
    })
    checkpoint = _core.Checkpoint.load(str(tmp_path / "ckpt"))
    result = _core.export_triton(checkpoint, str(tmp_path / "repo"))
    assert result.ensemble == "pipeline" and result.notes == []
    assert [m.name for m in result.models] == ["pipeline_second", "pipeline_first", "pipeline"]

    ensemble = parse_config(tmp_path / "repo" / "pipeline")
    assert ensemble.platform == "ensemble" and ensemble.max_batch_size == 8
    assert [(t.name, list(t.dims)) for t in ensemble.input] == [("x", [4])]
    assert [(t.name, list(t.dims)) for t in ensemble.output] == [("y", [4])]
    steps = ensemble.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["pipeline_first", "pipeline_second"]
    assert [(dict(s.input_map), dict(s.output_map)) for s in steps] == [({"x": "x"}, {"h": "h"}),
                                                                      ({"h": "h"}, {"y": "y"})]
    assert all(s.model_version == -1 for s in steps)
    assert (tmp_path / "repo" / "pipeline" / "1").is_dir()  # Triton wants the version directory

    # Running the steps as the ensemble would: names from the configs, values through.
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    tensors = {"x": x}
    for step in steps:
        member = parse_config(tmp_path / "repo" / step.model_name)
        assert member.max_batch_size >= ensemble.max_batch_size
        feeds = {key: tensors[value] for key, value in step.input_map.items()}
        for key, value in _run_exported(tmp_path / "repo" / step.model_name, member, feeds).items():
            tensors[step.output_map[key]] = value
    np.testing.assert_array_equal(tensors["y"], -np.maximum(x, 0))


# -- bad input ----------------------------------------------------------------------------


def test_untuned_module_is_refused(tmp_path):
    model = ait.Module(MLP().eval(), "mlp", strategy=cpu_strategy())
    with pytest.raises(_core.StateError, match="not TUNED"):
        ait.export_triton(model, tmp_path / "repo")
    with pytest.raises(TypeError, match="ait.Module"):
        ait.export_triton(MLP(), tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_bad_names_existing_entries_and_overwrite(tmp_path):
    model = _tune(MLP().eval(), "mlp", [torch.randn(16) for _ in range(2)])
    repo = tmp_path / "repo"
    for bad in ["a/b", "..", ".hidden", "with space", "x" * 256]:
        with pytest.raises(_core.InvalidArgumentError, match="not (a )?valid"):
            ait.export_triton(model, repo, model_name=bad)
    with pytest.raises(_core.InvalidArgumentError, match="instances"):
        ait.export_triton(model, repo, instances=0)
    assert not repo.exists()

    (repo / "mlp").mkdir(parents=True)
    (repo / "mlp" / "config.pbtxt").write_text("mine")
    with pytest.raises(_core.InvalidArgumentError, match="overwrite"):
        ait.export_triton(model, repo)
    assert (repo / "mlp" / "config.pbtxt").read_text() == "mine"
    assert sorted(p.name for p in repo.iterdir()) == ["mlp"]  # no temporary entry left

    ait.export_triton(model, repo, overwrite=True)
    assert parse_config(repo / "mlp").name == "mlp"
    assert sorted(p.name for p in repo.iterdir()) == ["mlp"]


# -- Triton itself, where its in-process server can run -----------------------------------


def test_triton_server_loads_the_export_on_cpu(tmp_path):
    """Needs Triton's in-process Python API. On PyPI `tritonserver` is only a 0.0.1.dev0
    placeholder whose install raises (the real wheel ships inside NGC's Triton container),
    so this runs where that wheel and its server libraries are installed."""
    tritonserver = pytest.importorskip("tritonserver", reason="Triton's in-process API (tritonserver) is not "
                                       "installed: its wheel ships only in NGC's Triton container")
    inner = MLP().eval()
    model = _tune(inner, "mlp", [torch.randn(16) for _ in range(4)], batch_sizes=[1, 4])
    ait.export_triton(model, tmp_path / "repo")
    config = parse_config(tmp_path / "repo" / "mlp")
    server = tritonserver.Server(model_repository=str(tmp_path / "repo"),
                                 model_control_mode=tritonserver.ModelControlMode.EXPLICIT).start(
        wait_until_ready=True)
    try:
        served = server.load("mlp")
        x = torch.randn(3, 16)
        (response,) = list(served.infer(inputs={config.input[0].name: x.numpy()}))
        value = response.outputs[config.output[0].name]
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(np.from_dlpack(value)), model(x), **TOL)
    finally:
        server.stop()


class _BatchMean(torch.nn.Module):
    def forward(self, x):
        return x - x.mean(0, keepdim=True)


def test_a_model_whose_batch_rows_mix_is_exported_without_batching(tmp_path):
    """Triton's dynamic batcher joins requests into one batch: for a model centred over the
    batch each request would get an answer computed with the others' rows. The tuner found
    the rows coupled, so the export turns batching off, says why, and refuses to force it."""
    model = ait.Module(_BatchMean().eval(), "centred", strategy=cpu_strategy())
    ait.tune(model, [torch.randn(4) for _ in range(2)], batch_sizes=[1, 2], disable_external_logging=True,
             ignore_failing_modules=False, performance_validation=False, progress=False)
    result = ait.export_triton(model, tmp_path / "repo")
    (exported,) = result.models
    assert exported.max_batch_size == 0
    assert any("batch rows depend on each other" in note for note in exported.not_expressed), exported.not_expressed
    config = parse_config(tmp_path / "repo" / exported.name)
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    with pytest.raises(_core.InvalidArgumentError, match="batch rows depend on each other"):
        ait.export_triton(model, tmp_path / "forced", max_batch_size=2)


def test_a_batched_vector_is_dims_one_with_an_empty_reshape():
    """A [batch] tensor has no dims left once the batch axis is dropped: Triton wants
    dims [1] and an empty reshape for it, as its own auto-complete writes."""
    spec = _core.GraphSpec.from_json(json.dumps({
        "inputs": [{"name": "x", "dtype": "int64", "min_shape": [1], "max_shape": [8], "batch_axis": 0}],
        "outputs": [{"name": "score", "dtype": "float16", "min_shape": [1], "max_shape": [8], "batch_axis": 0}],
        "batch_sizes": [1, 8]}))
    spec.batch_rows = "independent"  # as the tuner finds a model that keeps rows apart
    graph = _core.CheckpointGraph(key="g", graph_spec=spec,
                                  backend_config=_core.OnnxSessionConfig(provider=_core.ExecutionProvider.CPU))
    config = text_format.Parse(_core.triton_model_config(graph, "vec").text, PB2.ModelConfig())
    assert config.max_batch_size == 8
    for tensor, dtype in [(config.input[0], PB2.TYPE_INT64), (config.output[0], PB2.TYPE_FP16)]:
        assert tensor.data_type == dtype and list(tensor.dims) == [1]
        assert tensor.HasField("reshape") and list(tensor.reshape.shape) == []
    unbatched = text_format.Parse(_core.triton_model_config(graph, "vec", 0).text, PB2.ModelConfig())
    assert list(unbatched.input[0].dims) == [-1] and not unbatched.input[0].HasField("reshape")
    # A rank-0 output without batching: dims [1] with the empty reshape too (was dims [1]
    # alone, a rank Triton's ONNX Runtime backend refuses against the model's scalar)
    scalar = _core.GraphSpec.from_json(json.dumps({
        "inputs": [{"name": "x", "dtype": "float32", "min_shape": [4], "max_shape": [4]}],
        "outputs": [{"name": "s", "dtype": "float32", "min_shape": [], "max_shape": []}], "batch_sizes": []}))
    graph = _core.CheckpointGraph(key="g", graph_spec=scalar,
                                  backend_config=_core.OnnxSessionConfig(provider=_core.ExecutionProvider.CPU))
    config = text_format.Parse(_core.triton_model_config(graph, "scalar", 0).text, PB2.ModelConfig())
    assert list(config.output[0].dims) == [1] and config.output[0].HasField("reshape")
    assert list(config.output[0].reshape.shape) == [] and list(config.input[0].dims) == [4]


class _Scaled(torch.nn.Module):
    """A forward with a non-tensor argument: the exported graph holds it as a constant."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x, scale: float = 1.0, *, offset: int = 0, mask=None):
        y = self.fc(x) * scale + offset
        return y if mask is None else y * mask


def test_non_tensor_arguments_fixed_in_the_graph_are_named_in_the_readme(tmp_path):
    """scale=2.0 is baked into the ONNX graph: a Triton client cannot send another value,
    and the README said 'Nothing: every setting ... is in config.pbtxt'."""
    model = _tune(_Scaled().eval(), "scaled", [((torch.randn(8), 2.0), {"offset": 3, "mask": None}) for _ in range(2)],
                  batch_sizes=[1, 2])
    result = ait.export_triton(model, tmp_path / "repo")
    (exported,) = result.models
    (note,) = [n for n in exported.not_expressed if "constants of the exported graph" in n]
    assert "scale = 2.0 (float)" in note and "offset = 3 (int)" in note, note
    assert "mask = None" in note and "?" not in note, note  # was "mask = ? (none)"
    readme = (tmp_path / "repo" / "scaled" / "README.md").read_text()
    assert "scale = 2.0 (float)" in readme and "Nothing: every setting" not in readme
    assert [i.name for i in parse_config(tmp_path / "repo" / "scaled").input] == ["input_x"]
