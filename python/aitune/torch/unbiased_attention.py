"""A prefill's GroupQueryAttention without the model's mask as ``attention_bias``, right for
padded rows: each row's tokens sorted so its valid ones come first, in order.

With an ``attention_bias``, ONNX Runtime 1.31.1's CUDA GroupQueryAttention runs an unfused
softmax (4.4 of 13.7 ms of a Llama-shaped prefill at batch 8, sequence 512 on an H100;
docs/benchmarks.md, session 22); without one it runs flash attention, but its prompt path
knows only right padding (keys up to ``seqlens_k``) and causality. So the rows are made
right-padded: per row a permutation puts the valid tokens (``attention_mask`` 1) first in
their order and the padded ones after, the query, key and value of every GroupQueryAttention
(already rotated: the rotary stays a RotaryEmbedding before it) are gathered by it, GQA runs
with ``seqlens_k`` = the row's valid length - 1 and no bias, and its output is gathered back.
Query ``i`` then sees exactly the valid keys up to its own position, the model's causal and
padding mask, for any mask: left- or right-padded rows, holes (``[1, 0, 1, 1]``) included.

Dropping the bias is right only where it is exactly that mask. Not assumed: the bias's
subgraph is evaluated on the CPU (aitune's own engine) over padded masks at the smallest,
middle and largest sequence length the graph accepts, and compared with causal and padding;
a sliding window (Mistral, Gemma 2/3), a chunked or bidirectional mask, a mask read from
other inputs (position ids) or an unbounded or very long sequence range (where a window
could hide) keep the bias. Outputs at padded positions are the graph's (undefined by the
model's contract, left out of the check: docs/tuning.md)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

_CONTRIB = "com.microsoft"
_PREFIX = "aitune_rows_"
#: The names of the nodes that compute the row order, in float32 (positions up to 2 * S are
#: exact there, not in fp16 past 2048): an fp16 conversion keeps them (transforms.fused_to_fp16).
INDEX_NODE_PREFIX = _PREFIX + "index_"
#: The longest sequence the bias's subgraph is evaluated at ([S, S] per row); beyond it the
#: bias is kept (a window longer than the sequences checked would go unseen).
MAX_CHECKED_SEQUENCE = 4096
_INTEGERS = (TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL, TensorProto.INT8, TensorProto.UINT8)


def _mask_input(graph: onnx.GraphProto) -> onnx.ValueInfoProto | None:
    for value in graph.input:
        t = value.type.tensor_type
        if ((value.name == "attention_mask" or value.name.endswith("_attention_mask"))
                and t.elem_type in _INTEGERS and len(t.shape.dim) == 2):
            return value
    return None


def _attention_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The prompt GroupQueryAttention nodes with a bias, no past and no rotary of their own."""
    found = []
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or node.domain != _CONTRIB:
            continue
        inputs = list(node.input) + [""] * (11 - len(node.input))
        rotary = any(a.name == "do_rotary" and a.i for a in node.attribute)
        if inputs[10] and not inputs[3] and not inputs[4] and not rotary:
            found.append(node)
    return found


def _extent(value: onnx.ValueInfoProto, axis: int, ranges: dict | None) -> tuple[int, int] | None:
    """(smallest, largest) extent the graph accepts on ``axis`` of input ``value``: static in
    the model, else the graph spec's range (None: unbounded or unknown)."""
    dim = value.type.tensor_type.shape.dim[axis]
    if dim.HasField("dim_value"):
        return dim.dim_value, dim.dim_value
    if ranges is None or value.name not in ranges:
        return None
    lo, hi = ranges[value.name]
    return (max(int(lo[axis]), 1), int(hi[axis])) if int(hi[axis]) > 0 else None


def _subgraph(model: onnx.ModelProto, output: str, base_dir: Path) -> tuple[onnx.ModelProto, list[str]] | None:
    """The nodes computing ``output`` from graph inputs and initializers as a model of their
    own (its output cast to float32), with the graph inputs it reads; None where a node holds
    a subgraph (control flow)."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output if o}
    initializers = {t.name: t for t in graph.initializer}
    inputs = {v.name: v for v in graph.input}
    needed, needed_ids, seen, stack, used_inputs, used_inits = [], set(), set(), [output], [], []
    while stack:
        name = stack.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        if name in inputs:
            used_inputs.append(name)
        elif name in initializers:
            used_inits.append(name)
        elif name in producer:
            node = producer[name]
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                return None
            if id(node) not in needed_ids:
                needed_ids.add(id(node))
                needed.append(node)
                stack.extend(node.input)
    order = {id(n): i for i, n in enumerate(graph.node)}
    nodes = sorted(needed, key=lambda n: order[id(n)])
    tensors = []
    for name in used_inits:
        t = initializers[name]
        tensors.append(numpy_helper.from_array(numpy_helper.to_array(t, base_dir=str(base_dir)), name)
                       if t.data_location == TensorProto.EXTERNAL else t)
    cast = helper.make_node("Cast", [output], [_PREFIX + "bias_f32"], to=TensorProto.FLOAT)
    sub = helper.make_graph(nodes + [cast], "bias", [inputs[n] for n in used_inputs],
                            [helper.make_tensor_value_info(_PREFIX + "bias_f32", TensorProto.FLOAT, None)], tensors)
    out = helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    out.functions.extend(model.functions)
    return out, used_inputs


def _masks(seq: int) -> list[np.ndarray]:
    """One row each: no padding, left-padded, right-padded, a hole."""
    rows = [np.ones(seq, dtype=np.int64)]
    if seq >= 3:
        left = np.ones(seq, dtype=np.int64)
        left[: seq // 3] = 0
        right = np.ones(seq, dtype=np.int64)
        right[seq - max(seq // 4, 1):] = 0
        hole = np.ones(seq, dtype=np.int64)
        hole[1] = 0
        rows += [left, right, hole]
    return rows


def bias_refusal(model: onnx.ModelProto, bias: str, mask: onnx.ValueInfoProto, ranges: dict | None,
                 base_dir: Path) -> str | None:
    """None where the value ``bias`` is the causal and padding mask of ``mask`` (0 where query
    i may attend key j: j <= i and j valid; below -1000 elsewhere) at every sequence length
    checked, for every valid query; else why not (the bias is then kept)."""
    from aitune import _core

    seq = _extent(mask, 1, ranges)
    if seq is None or seq[1] > MAX_CHECKED_SEQUENCE:
        return f"the sequence range is unbounded or beyond {MAX_CHECKED_SEQUENCE} (a sliding window could hide there)"
    batch = _extent(mask, 0, ranges) or (1, 1)
    found = _subgraph(model, bias, base_dir)
    if found is None:
        return "the mask is computed under control flow"
    sub, reads = found
    shapes = {v.name: v for v in model.graph.input}
    for name in reads:  # the token ids for their shape, at most: anything else (positions) may shift the mask
        t = shapes[name].type.tensor_type
        if name != mask.name and not (name.endswith("input_ids") and t.elem_type in _INTEGERS
                                      and len(t.shape.dim) == 2):
            return f"the mask also reads input {name!r}"
    with tempfile.TemporaryDirectory(prefix="aitune-bias-") as tmp:
        path = Path(tmp) / "bias.onnx"
        onnx.save(sub, str(path))
        try:
            return _compare(_core.OnnxSession.create(str(path), _core.OnnxSessionConfig(
                provider=_core.ExecutionProvider.CPU)), mask, shapes, seq, batch)
        except _core.AituneError as error:  # the mask's ops as ONNX Runtime's CPU provider runs them
            return f"the mask's subgraph could not be evaluated ({error})"


def _compare(session, mask: onnx.ValueInfoProto, shapes: dict, seq: tuple[int, int],
             batch: tuple[int, int]) -> str | None:
    """``bias_refusal``'s comparison, on the bias's own session."""
    for length in sorted({seq[0], (seq[0] + seq[1]) // 2, seq[1]}):
        for row in _masks(length):
            rows = np.repeat(row[None, :], batch[0], axis=0)
            feeds = []
            for value in session.inputs:
                dtype = shapes[value.name].type.tensor_type.elem_type
                array = rows if value.name == mask.name else np.ones_like(rows)
                feeds.append(torch.from_numpy(array.astype(onnx.helper.tensor_dtype_to_np_dtype(dtype))))
            (out,) = session.infer(feeds)
            got = out.numpy() if hasattr(out, "numpy") else np.asarray(out)
            if got.ndim != 4 or got.shape[-2:] != (length, length) or got.shape[0] not in (1, batch[0]):
                return f"the mask has shape {list(got.shape)}, not [B, 1, S, S]"
            allowed = np.tril(np.ones((length, length), dtype=bool)) & row.astype(bool)[None, :]
            plane = got[0, 0] if got.shape[1] == 1 else None
            if plane is None:
                return "the mask differs per head"
            valid = row.astype(bool)
            if not (np.all(plane[valid][allowed[valid]] == 0) and np.all(plane[valid][~allowed[valid]] < -1000)):
                return (f"the mask at sequence length {length} is not causal and padding alone (a sliding "
                        "window, a chunked or bidirectional mask)")
    return None


def sort_padded_rows(model: onnx.ModelProto, ranges: dict | None, base_dir: Path) -> tuple[int, str | None]:
    """Rewrites ``model`` in place: every prompt GroupQueryAttention whose bias is the causal
    and padding mask of the graph's ``attention_mask`` runs without it over rows sorted valid
    tokens first (module docstring). ``ranges``: ONNX input name -> (smallest shape, largest
    shape) the graph accepts (the graph spec's). Returns (nodes rewritten, why none where 0)."""
    graph = model.graph
    mask = _mask_input(graph)
    if mask is None:
        return 0, "no [batch, sequence] attention_mask input"
    nodes = _attention_nodes(graph)
    if not nodes:
        return 0, "no GroupQueryAttention with the mask as its bias"
    for bias in dict.fromkeys(n.input[10] for n in nodes):
        if (why := bias_refusal(model, bias, mask, ranges, base_dir)) is not None:
            return 0, why
    p = _PREFIX

    def const(name, values, dtype=TensorProto.INT64, dims=None):
        graph.initializer.append(helper.make_tensor(p + name, dtype, [len(values)] if dims is None else dims, values))
        return p + name

    one_axis, minus_one = const("axis1", [1]), const("minus_one", [-1])
    f_one, f_zero = const("f_one", [1.0], TensorProto.FLOAT, []), const("f_zero", [0.0], TensorProto.FLOAT, [])
    one_scalar = const("one_scalar", [1], TensorProto.INT64, [])
    zero_scalar = const("zero_scalar", [0], TensorProto.INT64, [])
    n = helper.make_node
    head = [
        n("Cast", [mask.name], [p + "mask"], to=TensorProto.FLOAT),
        n("Mul", [p + "mask", f_zero], [p + "zeros"]),
        n("Add", [p + "zeros", f_one], [p + "ones"]),  # [B, S] of 1, on the mask's device
        n("CumSum", [p + "ones", one_scalar], [p + "count"]),
        n("Sub", [p + "count", f_one], [p + "position"]),  # 0..S-1 per row
        n("ReduceSum", [p + "ones", one_axis], [p + "length"], keepdims=1),  # [B, 1]: S
        n("Sub", [f_one, p + "mask"], [p + "padded"]),
        n("Mul", [p + "padded", p + "length"], [p + "after"]),
        n("Add", [p + "after", p + "position"], [p + "key"]),  # valid: its position; padded: S + it
        n("Shape", [mask.name], [p + "shape"]),
        n("Slice", [p + "shape", one_axis, const("axis2", [2])], [p + "k"]),
        n("TopK", [p + "key", p + "k"], [p + "sorted_keys", p + "order"], axis=1, largest=0, sorted=1),
        n("Cast", [p + "order"], [p + "order_f"], to=TensorProto.FLOAT),
        n("TopK", [p + "order_f", p + "k"], [p + "unsorted", p + "inverse"], axis=1, largest=0, sorted=1),
        n("ReduceMax", [p + "ones", one_axis], [p + "row_one"], keepdims=1),  # [B, 1] of 1
        n("CumSum", [p + "row_one", zero_scalar], [p + "row_count"]),
        n("Sub", [p + "row_count", f_one], [p + "row"]),
        n("Mul", [p + "row", p + "length"], [p + "base_f"]),  # b * S
        n("Cast", [p + "base_f"], [p + "base"], to=TensorProto.INT64),
        n("Add", [p + "order", p + "base"], [p + "gather_in_2d"]),
        n("Reshape", [p + "gather_in_2d", minus_one], [p + "gather_in"]),  # [B * S]
        n("Add", [p + "inverse", p + "base"], [p + "gather_out_2d"]),
        n("Reshape", [p + "gather_out_2d", minus_one], [p + "gather_out"]),
        n("ReduceSum", [p + "mask", one_axis], [p + "valid"], keepdims=0),  # [B]
        n("Max", [p + "valid", f_one], [p + "valid_1"]),  # a fully padded row: one key, its output undefined
        n("Sub", [p + "valid_1", f_one], [p + "last"]),
        n("Cast", [p + "last"], [p + "seqlens_k"], to=TensorProto.INT32),
        n("Concat", [p + "shape", minus_one], [p + "bsd"], axis=0),  # [B, S, -1]
    ]
    for i, node in enumerate(head):
        node.name = f"{INDEX_NODE_PREFIX}{i}"
    rewritten = {id(node) for node in nodes}
    body = []
    for index, node in enumerate(graph.node):
        if id(node) not in rewritten:
            body.append(node)
            continue
        tag = f"{p}gqa{index}_"
        for i in (0, 1, 2):
            body += [n("Flatten", [node.input[i]], [f"{tag}{i}_flat"], axis=2),
                     n("Gather", [f"{tag}{i}_flat", p + "gather_in"], [f"{tag}{i}_sorted"], axis=0),
                     n("Reshape", [f"{tag}{i}_sorted", p + "bsd"], [f"{tag}{i}"])]
            node.input[i] = f"{tag}{i}"
        node.input[5] = p + "seqlens_k"
        node.input[10] = ""
        output = node.output[0]
        node.output[0] = tag + "out"
        body += [node,
                 n("Flatten", [tag + "out"], [tag + "out_flat"], axis=2),
                 n("Gather", [tag + "out_flat", p + "gather_out"], [tag + "out_back"], axis=0),
                 n("Reshape", [tag + "out_back", p + "bsd"], [output])]
    del graph.node[:]
    graph.node.extend(head + body)
    _drop_unread(graph)
    return len(nodes), None


def _drop_unread(graph: onnx.GraphProto) -> None:
    """The nodes (the bias's subgraph) and initializers nothing reads any more."""
    while True:
        read = {i for node in graph.node for i in node.input} | {o.name for o in graph.output}
        dead = [node for node in graph.node if not any(o in read for o in node.output if o)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    read = {i for node in graph.node for i in node.input}
    # deleted in place, from the end: copying the kept ones would copy the weights
    for index in reversed([i for i, t in enumerate(graph.initializer) if t.name not in read]):
        del graph.initializer[index]
