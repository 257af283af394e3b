"""The fp16 copies of exported models load and compute: a graph output that other nodes
also read (a BERT pooler reads last_hidden_state) used to make a model ONNX Runtime
refuses at load (issue 28)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from aitune.torch import export


def _ort():
    """The onnxruntime Python package, imported when a test runs: imported at collection, it
    loaded another install's ONNX Runtime provider bridge before aitune's in every worker
    of the GPU host's suite (docs/gpu.md, session 25)."""
    import onnxruntime

    return onnxruntime


def _pooler_shaped(path):
    """hidden = x @ W (an output), pooled = hidden[:, 0] @ V (reads it): BERT's shape."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W")
    v = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "V")
    zero = numpy_helper.from_array(np.array(0, dtype=np.int64), "zero")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["hidden"], name="node_matmul"),
        helper.make_node("Gather", ["hidden", "zero"], ["select"], axis=1, name="node_select"),
        helper.make_node("MatMul", ["select", "V"], ["pooled"], name="node_pool"),
    ]
    graph = helper.make_graph(
        nodes, "pooler", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 8])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [2, 5, 8]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [2, 4])],
        [w, v, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    model = onnx.shape_inference.infer_shapes(model)  # value_info as exporters write it
    onnx.save(model, str(path))


def test_an_output_other_nodes_read_converts_to_a_loadable_fp16_model(tmp_path):
    pytest.importorskip("onnxconverter_common")
    source, target = tmp_path / "model.onnx", tmp_path / "model_fp16.onnx"
    _pooler_shaped(source)
    export.convert_to_fp16(source, target)
    session = _ort().InferenceSession(str(target), providers=["CPUExecutionProvider"])  # raised the type error
    reference = _ort().InferenceSession(str(source), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    got, expected = session.run(None, {"x": x}), reference.run(None, {"x": x})
    assert [o.name for o in session.get_outputs()] == ["hidden", "pooled"]
    assert all(o.type == "tensor(float)" for o in session.get_outputs())  # the interface is kept
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-2, rtol=2e-2)
    converted = onnx.load(str(target))
    assert any(n.op_type == "Gather" and n.input[0] != "hidden" for n in converted.graph.node)


def test_separating_leaves_models_without_such_outputs_alone(tmp_path):
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
    before = model.SerializeToString()
    assert export.separate_consumed_outputs(model) == 0
    assert model.SerializeToString() == before


def test_a_weight_read_by_two_kept_norms_and_an_fp16_node_loads_in_the_mixed_model(tmp_path):
    """A LayerNorm weight also read by an fp16 node (GPT-2's and DistilBERT's ln weights on
    the H200): the converter cast it to fp32 once per kept norm under one node name, and
    ONNX Runtime refused the mixed model ("two nodes with same node name")."""
    ones = numpy_helper.from_array(np.linspace(0.5, 1.5, 8).astype(np.float32), "ln.weight")
    zeros = numpy_helper.from_array(np.zeros(8, np.float32), "ln.bias")
    m = numpy_helper.from_array(np.eye(8, dtype=np.float32), "m")
    nodes = [helper.make_node("LayerNormalization", ["x", "ln.weight", "ln.bias"], ["h"], name="ln1", axis=-1),
             helper.make_node("MatMul", ["h", "m"], ["h2"], name="mm"),
             helper.make_node("LayerNormalization", ["h2", "ln.weight", "ln.bias"], ["h3"], name="ln2", axis=-1),
             helper.make_node("Mul", ["h3", "ln.weight"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, "norms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [ones, zeros, m])
    source = tmp_path / "norms.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(source))
    target = export.convert_to_fp16(source, tmp_path / "norms_mixed.onnx", op_block_list=["LayerNormalization"])
    names = [n.name for n in onnx.load(str(target)).graph.node]
    assert len(names) == len(set(names)), names
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    expected = _ort().InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (got,) = _ort().InferenceSession(str(target), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got, expected, atol=1e-2)
