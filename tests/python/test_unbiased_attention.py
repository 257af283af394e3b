"""A prefill's GroupQueryAttention without the model's mask as its bias, over rows sorted
valid tokens first (unbiased_attention.py): right for any padding, and only where the bias
is proven to be the causal and padding mask alone."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
import torch
from decoder_models import VOCAB, padded_prefill_batches, tiny_decoder
from onnx import TensorProto, helper
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import unbiased_attention

transformers = pytest.importorskip("transformers")


def _mask_model(window: int | None, extra_input: bool = False) -> onnx.ModelProto:
    """attention_mask [B, S] -> the additive bias [B, 1, S, S]: causal and padding, and a
    sliding window of ``window`` keys where given (Mistral's), as ONNX ops; with
    ``extra_input`` the causality reads position_ids instead of a Range."""
    n = helper.make_node
    one, zero = helper.make_tensor("one", TensorProto.INT64, [], [1]), helper.make_tensor("zero", TensorProto.INT64, [], [0])
    nodes = [n("Shape", ["attention_mask"], ["shape"]), n("Gather", ["shape", "one"], ["s"], axis=0)]
    if extra_input:
        nodes += [n("Squeeze", ["position_ids", "zero_1d"], ["pos"])]
    else:
        nodes += [n("Range", ["zero", "s", "one"], ["pos"])]
    nodes += [
        n("Unsqueeze", ["pos", "axis1"], ["q"]), n("Unsqueeze", ["pos", "zero_1d"], ["k"]),
        n("LessOrEqual", ["k", "q"], ["causal"]),
        n("Cast", ["attention_mask"], ["valid"], to=TensorProto.BOOL),
        n("Unsqueeze", ["valid", "axes12"], ["valid4"]),
        n("And", ["causal", "valid4"], ["allowed0"]),
    ]
    initializers = [one, zero, helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
                    helper.make_tensor("zero_1d", TensorProto.INT64, [1], [0]),
                    helper.make_tensor("axes12", TensorProto.INT64, [2], [1, 2]),
                    helper.make_tensor("big", TensorProto.FLOAT, [], [-1e9]),
                    helper.make_tensor("nothing", TensorProto.FLOAT, [], [0.0])]
    if window is not None:
        initializers.append(helper.make_tensor("w", TensorProto.INT64, [], [window]))
        nodes += [n("Sub", ["q", "w"], ["reach"]), n("Greater", ["k", "reach"], ["near"]),
                  n("And", ["allowed0", "near"], ["allowed"])]
    else:
        nodes += [n("Identity", ["allowed0"], ["allowed"])]
    nodes += [n("Where", ["allowed", "nothing", "big"], ["bias"])]
    inputs = [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"])]
    if extra_input:
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "s"]))
    graph = helper.make_graph(nodes, "mask", inputs, [helper.make_tensor_value_info("bias", TensorProto.FLOAT, None)],
                              initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("window, ranges, refused", [
    (None, {"attention_mask": ([1, 1], [4, 64])}, None),
    (4, {"attention_mask": ([1, 1], [4, 64])}, "not causal and padding alone"),
    (64, {"attention_mask": ([1, 1], [4, 64])}, None),  # a window the range never reaches
    (None, {"attention_mask": ([1, 1], [4, -1])}, "unbounded"),
    (None, {"attention_mask": ([1, 1], [4, 8192])}, "beyond 4096"),
    (None, None, "unbounded"),
])
def test_the_bias_is_dropped_only_where_it_is_causal_and_padding_alone(tmp_path, window, ranges, refused):
    model = _mask_model(window)
    (mask,) = model.graph.input
    why = unbiased_attention.bias_refusal(model, "bias", mask, ranges, tmp_path)
    assert (why is None) if refused is None else (refused in why), why


def test_a_bias_read_from_other_inputs_is_kept(tmp_path):
    model = _mask_model(None, extra_input=True)
    why = unbiased_attention.bias_refusal(model, "bias", model.graph.input[0], {"attention_mask": ([1, 1], [4, 64])},
                                          tmp_path)
    assert "position_ids" in why


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_fused_prefill_candidate_attends_sorted_rows_without_a_bias(kind, caplog):
    """Tuned with left- and right-padded samples, the fused candidate's GroupQueryAttention
    runs without the mask as a bias, over sorted rows, and passes the check."""
    model = ait.Module(tiny_decoder(kind), f"unbiased-{kind}", strategy=cpu_strategy(use_dynamo=True))
    with caplog.at_level(logging.INFO, logger="aitune"):
        ait.tune(model, padded_prefill_batches, batch_sizes=[2, 3], ignore_failing_modules=False, disable_external_logging=True,
                 progress=False)
    assert any("2 GroupQueryAttention without the mask as a bias" in r.getMessage() for r in caplog.records)
    (report,) = model.ait_reports.values()
    (fused,) = [c for c in json.loads(report.to_json())["candidates"] if c.get("transform") == "ort_fusions"]
    assert fused["fused_operators"].get("GroupQueryAttention") == 2, fused
    assert fused["correctness"]["passed"] and fused["correctness"]["max_abs_error"] < 1e-4, fused


class _Prefill(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def test_sorted_rows_are_right_for_any_padding_and_a_hole(tmp_path):
    """The fused graph over a dynamic batch and sequence, on masks it was not built with:
    left- and right-padded rows, a row with a hole (no tokenizer writes one; GQA alone would
    attend it), a fully padded row; every valid position matches eager."""
    from torch.export import Dim

    from aitune import _core
    from aitune.torch import transforms

    inner = tiny_decoder("llama")
    prefill = _Prefill(inner).eval()
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=32)
    example = {"input_ids": torch.randint(0, VOCAB, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    plain = tmp_path / "plain.onnx"
    torch.onnx.export(prefill, (), str(plain), kwargs=example, dynamo=True, optimize=True, verbose=False,
                      dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}})
    ranges = {"input_ids": ([1, 2], [8, 32]), "attention_mask": ([1, 2], [8, 32])}
    fused = transforms.fuse_for_ort(plain, tmp_path / "fused.onnx", use_dynamo=True, input_ranges=ranges)
    graph = onnx.load(str(fused.path), load_external_data=False).graph
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == 2 and all(len(n.input) < 11 or not n.input[10] for n in attention)
    session = _core.OnnxSession.create(str(fused.path), _core.OnnxSessionConfig(provider=_core.ExecutionProvider.CPU))
    ids = torch.randint(0, VOCAB, (4, 13), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(4, 13, dtype=torch.long)
    mask[0, :5], mask[1, 2], mask[1, 7], mask[2, 9:], mask[3, :] = 0, 0, 0, 0, 0
    with torch.no_grad():
        expected = prefill(ids, mask)
    feeds = [{"input_ids": ids, "attention_mask": mask}[i.name] for i in session.inputs]
    (actual,) = session.infer(feeds)
    valid = mask.bool()
    np.testing.assert_allclose(actual[valid].numpy(), expected[valid].numpy(), atol=1e-4, rtol=1e-4)
    assert torch.isfinite(actual).all()  # the fully padded row: undefined, but no NaN to spread
