"""Writes the bundled example model: an MLP of 4 x (Linear 256, ReLU), batch symbolic.

Random weights from a fixed seed, built with onnx.helper and checked with onnx.checker,
so `make demo` needs no download.  Usage: python examples/make_example_mlp.py OUT.onnx
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH, LAYERS = 256, 4


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    prev = "x"
    for i in range(LAYERS):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        b = (0.01 * rng.standard_normal(WIDTH)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        out = "y" if i == LAYERS - 1 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"g{i}"], transB=1))
        nodes.append(helper.make_node("Relu", [f"g{i}"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes, "example_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


if __name__ == "__main__":
    onnx.save(build(), sys.argv[1])
