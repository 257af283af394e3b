"""Why ONNX Runtime's prefill graph of a decoder LLM is slower than torch.compile (issue 30):
the Llama shape of decoder.py in fp16, exported as aitune exports it, in graph variants each
run in the engine's own ``OnnxSession`` on the CUDA provider (with and without a CUDA graph)
beside bare ``torch.compile(mode="reduce-overhead")``, with the kernels of each side.

    python benchmarks/prefill_graph_probe.py --shapes 1x256,8x512 --out probe.json

Variants of one export (``--variants``, comma-separated):
  plain       the dynamo export as it is
  fused_sorted_rows  aitune's ``ort_fusions`` candidate as it is made: GroupQueryAttention
              without a bias over rows sorted valid tokens first (unbiased_attention.py)
  fused       the same fusions with the model's mask as GroupQueryAttention's ``attention_bias``
  fused_nobias  the same with ``attention_bias`` cut off: right only for an unpadded batch
              (this probe's all-ones mask), to see what the mask costs GroupQueryAttention
  gqa_rotary  fused, with the rotary inside GroupQueryAttention (``do_rotary``) and no
              Transpose around it, as ONNX Runtime GenAI's graph has it (right here: positions
              0..S-1 in every row)
  gqa_rotary_nobias  the same without ``attention_bias``
  gqa_rotary_rolled  the same with each row rolled so its valid tokens come first, as a
              right-padded row, and GroupQueryAttention's output rolled back: right for left-
              and right-padded rows too (``_rolled_rows``); what the rolls cost
Each variant is also run with a left-padded first row (a quarter of it) and a right-padded
second one: ``padded rows err`` is its error against eager at the valid positions.
  mha_bias    fused, each GroupQueryAttention as MultiHeadAttention over keys / values expanded
              to every head, the mask kept as its ``attention_bias`` (right for any mask)
With ``--sdpa-kernels``, each variant with a mask also runs with the CUDA provider's ``sdpa_kernel`` option
(the attention kernels ONNX Runtime may pick) at those values.

Per variant and shape: p50 µs (each call followed by a synchronize, as decoder.py times),
the kernels of 10 calls by family and the top ones (profile_kernels.kernel_profile), the
node count per op type, and the max error of the logits against eager fp16.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

import onnx
import torch

sys.path.insert(0, os.path.dirname(__file__))
from decoder import decoder_model, prefill_case  # noqa: E402  (the same model and inputs)
from profile_kernels import kernel_profile, print_kernels  # noqa: E402
from timing import p50_us  # noqa: E402

from aitune import _core  # noqa: E402
from aitune.torch import transforms  # noqa: E402


def _op_counts(path: Path) -> dict[str, int]:
    model = onnx.load(str(path), load_external_data=False)
    return dict(collections.Counter(n.op_type for n in model.graph.node).most_common())


def _pruned(model: onnx.ModelProto) -> onnx.ModelProto:
    """Without the nodes whose outputs nothing reads (what a cut input left behind)."""
    while True:
        read = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
        dead = [n for n in model.graph.node if not any(o in read for o in n.output if o)]
        if not dead:
            return model
        for node in dead:
            model.graph.node.remove(node)


def _without_attention_bias(source: Path, target: Path) -> int:
    model = onnx.load(str(source))
    cut = 0
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention" and len(node.input) > 10 and node.input[10]:
            node.input[10] = ""
            cut += 1
    onnx.save(_pruned(model), str(target), save_as_external_data=True, location=target.name + ".data")
    return cut


def _rotary_in_attention(source: Path, target: Path, keep_bias: bool) -> int:
    """GroupQueryAttention taking the projections' [B, S, H*Dh] outputs as they come and
    rotating query and key itself (``do_rotary=1`` with the RotaryEmbedding's cos / sin
    caches), as ONNX Runtime GenAI's graph does: no RotaryEmbedding nor Transpose around it.
    GQA rotates a prompt at positions 0..S-1 of every row: right here (an all-ones mask, no
    position ids), not in general. Returns the GroupQueryAttention nodes rewritten."""
    model = onnx.load(str(source))
    producer = {o: n for n in model.graph.node for o in n.output}

    def through_layout(name: str) -> str:  # up through Reshape / Transpose to what the projection gave
        while name in producer and producer[name].op_type in ("Reshape", "Transpose"):
            name = producer[name].input[0]
        return name

    rewritten = 0
    for node in model.graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        rotaries = [producer.get(through_layout(node.input[i])) for i in (0, 1)]
        if any(r is None or r.op_type != "RotaryEmbedding" for r in rotaries):
            continue
        node.input[0], node.input[1] = (through_layout(r.input[0]) for r in rotaries)
        node.input[2] = through_layout(node.input[2])
        while len(node.input) < 9:
            node.input.append("")
        node.input[7], node.input[8] = rotaries[0].input[2], rotaries[0].input[3]  # cos / sin caches
        if not keep_bias and len(node.input) > 10:
            node.input[10] = ""
        node.attribute.append(onnx.helper.make_attribute("do_rotary", 1))
        rewritten += 1
    onnx.save(_pruned(model), str(target), save_as_external_data=True, location=target.name + ".data")
    return rewritten


def _rolled_rows(source: Path, target: Path) -> int:
    """``gqa_rotary_nobias`` made right for left-padded rows too: each row is rolled so that
    its valid tokens come first (``attention_mask``'s first 1 at position 0), GroupQueryAttention
    runs as for a right-padded batch (``seqlens_k`` = the row's valid length - 1, no bias),
    and its output is rolled back. The rotary inside GroupQueryAttention then rotates a row's
    valid tokens at positions 0..L-1 where the model rotates them at p..p+L-1: attention
    scores depend on position differences only, so the result is the same (up to rounding)
    wherever a row's valid tokens are contiguous and its positions consecutive (any
    left- or right-padded row, positions from ``arange`` or the mask's cumsum). Each
    roll is one Gather over the flattened [B*S, D] tensor (identity for an unpadded batch:
    this probe measures what the rolls cost). Returns the GroupQueryAttention nodes rewritten."""
    from onnx import TensorProto, helper

    model = onnx.load(str(source))
    graph = model.graph
    if not any(i.name == "attention_mask" for i in graph.input):
        return 0

    def const(name, values, dtype=TensorProto.INT64):
        graph.initializer.append(helper.make_tensor(name, dtype, [len(values)], values))
        return name

    const("roll_zero", [0]), const("roll_one", [1]), const("roll_minus_one", [-1])
    head = [
        helper.make_node("Cast", ["attention_mask"], ["roll_mask_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["roll_mask_f", "roll_one"], ["roll_lengths"], keepdims=0),
        helper.make_node("ArgMax", ["roll_mask_f"], ["roll_first"], axis=1, keepdims=0),  # first 1 of a row
        helper.make_node("Shape", ["attention_mask"], ["roll_shape"]),
        helper.make_node("Slice", ["roll_shape", "roll_zero", "roll_one"], ["roll_b1"]),
        helper.make_node("Slice", ["roll_shape", "roll_one", const("roll_two", [2])], ["roll_s1"]),
    ]
    head += [
        helper.make_node("Squeeze", ["roll_b1"], ["roll_b"]),
        helper.make_node("Squeeze", ["roll_s1"], ["roll_s"]),
        helper.make_node("Range", ["roll_zero_s", "roll_s", "roll_one_s"], ["roll_positions"]),  # [S]
        helper.make_node("Range", ["roll_zero_s", "roll_b", "roll_one_s"], ["roll_rows"]),  # [B]
        helper.make_node("Unsqueeze", ["roll_positions", "roll_zero"], ["roll_positions_1s"]),  # [1, S]
        helper.make_node("Unsqueeze", ["roll_first", "roll_one"], ["roll_first_b1"]),  # [B, 1]
        helper.make_node("Unsqueeze", ["roll_rows", "roll_one"], ["roll_rows_b1"]),
        helper.make_node("Mul", ["roll_rows_b1", "roll_s"], ["roll_base"]),  # b * S
        helper.make_node("Add", ["roll_positions_1s", "roll_first_b1"], ["roll_fwd_raw"]),
        helper.make_node("Mod", ["roll_fwd_raw", "roll_s"], ["roll_fwd"]),
        helper.make_node("Add", ["roll_fwd", "roll_base"], ["roll_fwd_flat_2d"]),
        helper.make_node("Reshape", ["roll_fwd_flat_2d", "roll_minus_one"], ["roll_in"]),  # [B*S]
        helper.make_node("Add", ["roll_positions_1s", "roll_s"], ["roll_back_raw0"]),
        helper.make_node("Sub", ["roll_back_raw0", "roll_first_b1"], ["roll_back_raw"]),
        helper.make_node("Mod", ["roll_back_raw", "roll_s"], ["roll_back"]),
        helper.make_node("Add", ["roll_back", "roll_base"], ["roll_back_flat_2d"]),
        helper.make_node("Reshape", ["roll_back_flat_2d", "roll_minus_one"], ["roll_out"]),  # [B*S]
        helper.make_node("Max", ["roll_lengths", "roll_one_f"], ["roll_lengths_1"]),  # a fully padded row: 1
        helper.make_node("Sub", ["roll_lengths_1", "roll_one_f"], ["roll_last"]),
        helper.make_node("Cast", ["roll_last"], ["roll_seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Concat", ["roll_b1", "roll_s1", "roll_minus_one"], ["roll_bs_shape"], axis=0),
    ]
    graph.initializer.extend([helper.make_tensor("roll_zero_s", TensorProto.INT64, [], [0]),
                              helper.make_tensor("roll_one_s", TensorProto.INT64, [], [1]),
                              helper.make_tensor("roll_one_f", TensorProto.FLOAT, [], [1.0])])
    nodes, rewritten = [], 0
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or (len(node.input) > 10 and node.input[10]):
            nodes.append(node)
            continue
        tag = f"roll{rewritten}"
        for i in (0, 1, 2):
            nodes += [helper.make_node("Flatten", [node.input[i]], [f"{tag}_{i}_flat"], axis=2),
                      helper.make_node("Gather", [f"{tag}_{i}_flat", "roll_in"], [f"{tag}_{i}_rolled"], axis=0),
                      helper.make_node("Reshape", [f"{tag}_{i}_rolled", "roll_bs_shape"], [f"{tag}_{i}"])]
            node.input[i] = f"{tag}_{i}"
        node.input[5] = "roll_seqlens_k"
        output = node.output[0]
        node.output[0] = f"{tag}_out"
        nodes += [node,
                  helper.make_node("Flatten", [f"{tag}_out"], [f"{tag}_out_flat"], axis=2),
                  helper.make_node("Gather", [f"{tag}_out_flat", "roll_out"], [f"{tag}_out_rolled"], axis=0),
                  helper.make_node("Reshape", [f"{tag}_out_rolled", "roll_bs_shape"], [output])]
        rewritten += 1
    del graph.node[:]
    graph.node.extend(head + nodes)
    onnx.save(_pruned(model), str(target), save_as_external_data=True, location=target.name + ".data")
    return rewritten


def _multi_head_over_expanded_kv(source: Path, target: Path) -> int:
    """Each GroupQueryAttention (with its ``attention_bias``) as MultiHeadAttention over keys
    and values expanded to every query head (repeat_kv), the bias kept: correct for any
    mask, and ONNX Runtime's MultiHeadAttention may pick kernels that take a bias (cuDNN
    flash, ``sdpa_kernel=8``) where GroupQueryAttention falls back to an unfused softmax.
    Returns the nodes rewritten."""
    from onnx import helper

    model = onnx.load(str(source))
    nodes, rewritten = [], 0
    for node in model.graph.node:
        if node.op_type != "GroupQueryAttention" or len(node.input) < 11 or not node.input[10]:
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        heads, kv_heads = attrs["num_heads"], attrs["kv_num_heads"]
        tag = f"mha{rewritten}"
        expanded = []
        for which, name in (("k", node.input[1]), ("v", node.input[2])):
            # [B, S, Hkv*Dh] -> [B, S, Hkv, 1, Dh] -> [B, S, Hkv, G, Dh] -> [B, S, H*Dh]
            split = helper.make_tensor(f"{tag}_{which}_split", onnx.TensorProto.INT64, [5], [0, 0, kv_heads, 1, -1])
            grown = helper.make_tensor(f"{tag}_{which}_grown", onnx.TensorProto.INT64, [5],
                                       [1, 1, 1, heads // kv_heads, 1])
            flat = helper.make_tensor(f"{tag}_{which}_flat", onnx.TensorProto.INT64, [3], [0, 0, -1])
            model.graph.initializer.extend([split, grown, flat])
            nodes += [helper.make_node("Reshape", [name, split.name], [f"{tag}_{which}5"]),
                      helper.make_node("Expand", [f"{tag}_{which}5", grown.name], [f"{tag}_{which}x"]),
                      helper.make_node("Reshape", [f"{tag}_{which}x", flat.name], [f"{tag}_{which}_full"])]
            expanded.append(f"{tag}_{which}_full")
        extra = {"scale": attrs["scale"]} if "scale" in attrs else {}
        nodes.append(helper.make_node("MultiHeadAttention", [node.input[0], *expanded, "", "", node.input[10]],
                                      [node.output[0]], domain="com.microsoft", num_heads=heads, **extra))
        rewritten += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(_pruned(model), str(target), save_as_external_data=True, location=target.name + ".data")
    return rewritten


def _session(path: Path, cuda_graph: bool, sdpa_kernel: str | None = None):
    config = _core.OnnxSessionConfig(provider=_core.ExecutionProvider.CUDA)
    options = {"enable_cuda_graph": "1"} if cuda_graph else {}
    if sdpa_kernel:
        options["sdpa_kernel"] = sdpa_kernel
    config.provider_options = options
    return _core.OnnxSession.create(str(path), config)


def probe_shape(batch: int, seq: int, args, work: Path) -> dict:
    model = decoder_model("llama", args.tiny).half().cuda()
    prefill, inputs = prefill_case(model, "cuda", batch, seq)
    row: dict = {"batch": batch, "sequence": seq, "variants": {}}
    with torch.no_grad():
        reference = prefill(**inputs).float()
        compiled = torch.compile(prefill, mode="reduce-overhead")

        def compile_call():
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(**inputs)

        row["compile"] = {"p50_us": p50_us(compile_call, args.iterations),
                          "error": (compile_call().float() - reference).abs().max().item(),
                          "kernels": kernel_profile(compile_call, args.calls)}
        torch._dynamo.reset()
        plain = work / f"plain_{batch}x{seq}.onnx"
        torch.onnx.export(prefill, (), str(plain), kwargs=inputs, dynamo=True, optimize=True,
                          external_data=True, verbose=False)
        paths = {"plain": plain}
        # the fused graph as aitune makes it (GroupQueryAttention over sorted rows, no bias:
        # unbiased_attention.py), and with the mask as its bias, the base of the variants below
        sorted_rows = transforms.fuse_for_ort(plain, work / f"fused_sorted_{batch}x{seq}.onnx", use_dynamo=True)
        if sorted_rows is not None:
            paths["fused_sorted_rows"] = sorted_rows.path
        fused = transforms.fuse_for_ort(plain, work / f"fused_{batch}x{seq}.onnx", use_dynamo=True,
                                        sort_padded_rows=False)
        if fused is not None:
            paths["fused"] = fused.path
            row["fused_operators"] = fused.fused_operators
            nobias = work / f"fused_nobias_{batch}x{seq}.onnx"
            if _without_attention_bias(fused.path, nobias):
                paths["fused_nobias"] = nobias
            if "mha_bias" in args.variants.split(","):
                path = work / f"mha_bias_{batch}x{seq}.onnx"
                if _multi_head_over_expanded_kv(fused.path, path):
                    paths["mha_bias"] = path
            for keep_bias, name in ((True, "gqa_rotary"), (False, "gqa_rotary_nobias")):
                if name in args.variants.split(",") or (name == "gqa_rotary_nobias"
                                                        and "gqa_rotary_rolled" in args.variants.split(",")):
                    path = work / f"{name}_{batch}x{seq}.onnx"
                    if _rotary_in_attention(fused.path, path, keep_bias):
                        paths[name] = path
            if "gqa_rotary_rolled" in args.variants.split(",") and "gqa_rotary_nobias" in paths:
                path = work / f"gqa_rotary_rolled_{batch}x{seq}.onnx"
                if _rolled_rows(paths["gqa_rotary_nobias"], path):
                    paths["gqa_rotary_rolled"] = path
        # a left-padded first row (and a right-padded second): the error at valid positions
        padded_mask = inputs["attention_mask"].clone()
        padded_mask[0, : seq // 4] = 0
        if batch > 1:
            padded_mask[1, seq - seq // 8:] = 0
        padded_reference = prefill(inputs["input_ids"], padded_mask).float()
        valid = padded_mask.bool()
        feeds_by_name = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
        for name in args.variants.split(","):
            if name not in paths:
                row["variants"][name] = {"skipped": "not produced for this export"}
                continue
            entry = {"ops": _op_counts(paths[name])}
            runs = ([] if args.cuda_graph_only else [(False, None)]) + [(True, None)]
            if "nobias" not in name:  # the attention kernel choices matter where there is a bias
                runs += [(True, k) for k in args.sdpa_kernels.split(",") if k]
            for cuda_graph, sdpa_kernel in runs:
                key = ("cuda_graph" if cuda_graph else "no_cuda_graph") + (f" sdpa_kernel={sdpa_kernel}"
                                                                            if sdpa_kernel else "")
                try:
                    session = _session(paths[name], cuda_graph, sdpa_kernel)
                    feeds = [feeds_by_name[i.name].contiguous() for i in session.inputs]

                    def call(session=session, feeds=feeds):
                        return session.infer(feeds)[0]

                    out = call().float()
                    entry[key] = {"p50_us": p50_us(call, args.iterations),
                                  "error": (out - reference).abs().max().item(),
                                  "kernels": kernel_profile(call, args.calls)}
                    padded_feeds = [padded_mask if i.name == "attention_mask" else feeds_by_name[i.name].contiguous()
                                    for i in session.inputs]
                    padded = session.infer(padded_feeds)[0].float()
                    entry[key]["padded_error"] = (padded - padded_reference).abs()[valid].max().item()
                    del session
                except Exception as error:  # noqa: BLE001  (a variant that fails is a finding, not the end)
                    entry[key] = {"failed": f"{type(error).__name__}: {str(error)[:300]}"}
            row["variants"][name] = entry
    return row


def _print(row: dict) -> None:
    print(f"\n=== prefill b{row['batch']} s{row['sequence']} (fp16; fused: {row.get('fused_operators')})")
    sides = [("compile reduce-overhead", row["compile"])]
    for name, entry in row["variants"].items():
        for key, side in entry.items():
            if key != "ops":
                sides.append((f"{name} {key}", side))
    for label, side in sides:
        if "failed" in side:
            print(f"{label:32s} FAILED {side['failed']}")
            continue
        k = side["kernels"]
        print(f"{label:32s} p50 {side['p50_us']:8.0f} us  kernels {k['device_us_per_call']:8.0f} us "
              f"x{k['kernels_per_call']:.0f}  err {side['error']:.3g}  padded rows err {side.get('padded_error', -1):.3g}")
        print_kernels(k, top=8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="1x256,8x512", help="BATCHxSEQUENCE, comma-separated")
    parser.add_argument("--variants", default="plain,fused,fused_nobias")
    parser.add_argument("--sdpa-kernels", default="", help="CUDA provider option sdpa_kernel values, each also run "
                        "with a CUDA graph (ONNX Runtime's AttentionBackend bits: 1 flash, 2 memory-efficient, "
                        "8 cuDNN flash, 16 math)")
    parser.add_argument("--cuda-graph-only", action="store_true", help="no run without a CUDA graph")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--calls", type=int, default=10, help="calls profiled for the kernel tables")
    parser.add_argument("--tiny", action="store_true", help="decoder.py's tiny model (smoke test)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this probe needs the GPU", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="prefill-probe-") as tmp:
        for shape in args.shapes.split(","):
            batch, seq = (int(v) for v in shape.split("x"))
            rows.append(probe_shape(batch, seq, args, Path(tmp)))
            _print(rows[-1])
            args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
