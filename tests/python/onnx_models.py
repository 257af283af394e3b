"""Tiny ONNX models for the binding tests, built with onnx.helper (no downloads)."""
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def mlp(path: Path, width_in: int = 16, width_out: int = 8, seed: int = 0):
    """y = relu(x @ W1^T + b1) @ W2^T + b2 with x: float32[batch, width_in]. Returns (path, numpy reference)."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((32, width_in)).astype(np.float32) / 4
    b1 = rng.standard_normal(32).astype(np.float32) / 4
    w2 = rng.standard_normal((width_out, 32)).astype(np.float32) / 4
    b2 = rng.standard_normal(width_out).astype(np.float32) / 4
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1)],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width_out])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    def reference(x: np.ndarray) -> np.ndarray:
        return np.maximum(x @ w1.T + b1, 0) @ w2.T + b2

    return _save(model, path), reference


def two_inputs(path: Path) -> Path:
    """z = x + y (float32[n, 4]) and c = Cast(mask -> float32) (bool[n, 4])."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["z"]), helper.make_node("Cast", ["mask"], ["c"], to=TensorProto.FLOAT)],
        "two_inputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["n", 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, ["n", 4])])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
