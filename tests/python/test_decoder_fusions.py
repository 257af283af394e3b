"""Decoder fusions (decoder_fusions.py) on transformers' tiny Llama and Qwen2: RotaryEmbedding
(both rotary angle forms) and GroupQueryAttention with the attention mask kept fuse, and the
fused candidate matches eager at valid positions of left- and right-padded batches of 1, 2
and 3 rows; attention GroupQueryAttention cannot express (no mask, a bidirectional mask) is
not fused into it."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import onnx
import pytest
import torch
from decoder_models import VOCAB, data_fed_host_inputs, tiny_decoder
from torch_models import cpu_backend, cpu_strategy

import aitune.torch as ait

transformers = pytest.importorskip("transformers")
onnx_ir = pytest.importorskip("onnx_ir")
ort = pytest.importorskip("onnxruntime")

LENGTH = 8


def _elementwise_rotary(self, x, position_ids):
    """The rotary angles as later transformers 5 releases compute them (``positions[..., None]
    * inv_freq``, no MatMul, no Transpose); the installed release may use the 4.x form."""
    freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :].float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def _padded(batch_size: int, static: bool = False) -> dict:
    """Rows left-padded, right-padded and unpadded in turn; the length differs per batch
    size (a dynamic sequence axis in the export) unless ``static`` (a static one: the
    exporter folds the causal mask and the rotary tables into constants and the key's
    transpose into 3-D reshapes, which our rules normalise)."""
    generator = torch.Generator().manual_seed(batch_size)
    length = LENGTH if static else LENGTH - batch_size
    ids = torch.randint(0, VOCAB, (batch_size, length), generator=generator)
    mask = torch.ones(batch_size, length, dtype=torch.long)
    for row in range(batch_size):
        if row % 3 == 0:
            mask[row, :3] = 0
        elif row % 3 == 1:
            mask[row, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "use_cache": False}


@pytest.mark.parametrize("kind,rotary,static,sizes", [
    ("llama", "matmul", False, (1, 2, 3)), ("qwen2", "elementwise", False, (1, 2, 3)),
    ("llama-yarn", "elementwise", False, (2, 3)),  # cos / sin scaled by yarn's attention factor
    ("llama", "matmul", True, (1, 2, 3)),
    ("qwen2", "matmul", True, (1,)),  # every shape static (the benchmark's prefill at batch 1)
    ("llama", "matmul", True, (2,)),  # every shape static at batch 2: inv_freq folded to [2, E, 1]
])
def test_fused_decoder_candidate_matches_eager_on_padded_batches(kind, rotary, static, sizes, monkeypatch):
    inner = tiny_decoder(kind)
    if rotary == "elementwise":
        monkeypatch.setattr(type(inner.model.rotary_emb), "forward", _elementwise_rotary)
    name = f"fused-{kind}-{rotary}-{static}-{'-'.join(map(str, sizes))}"
    model = ait.Module(inner, name, strategy=cpu_strategy(use_dynamo=True))
    ait.tune(model, lambda size: [_padded(size, static)], batch_sizes=list(sizes), ignore_failing_modules=False,
             disable_external_logging=True, progress=False)
    (report,) = model.ait_reports.values()
    (fused,) = [c for c in json.loads(report.to_json())["candidates"] if c.get("transform") == "ort_fusions"]
    ops = fused["fused_operators"]
    assert ops.get("GroupQueryAttention") == 2 and ops.get("RotaryEmbedding") == 4, ops
    assert ops.get("SkipSimplifiedLayerNormalization", 0) > 0, ops
    correctness = fused["correctness"]
    assert correctness["passed"] and correctness["max_abs_error"] < 1e-4, correctness
    assert len(correctness["samples"]) == len(sizes)  # a batch per size, each padded
    (fused_file,) = Path(os.environ["AITUNE_CACHE_DIR"]).glob(f"{name}/**/model_fused.onnx")
    assert data_fed_host_inputs(fused_file) == []
    # the query and key rotated in GroupQueryAttention's [B, S, H * Dh]: no Transpose into and
    # out of the model's [B, H, S, Dh] around the rotary (two kernels per tensor and layer)
    graph = onnx.load(str(fused_file), load_external_data=False).graph
    assert [n.name for n in graph.node if n.op_type == "Transpose"] == []
    # and the tuned module (whichever candidate won) agrees at valid positions
    batch = _padded(max(sizes), static)
    with torch.no_grad():
        expected, actual = inner(**batch).logits, model(**batch).logits
    valid = batch["attention_mask"].bool()
    torch.testing.assert_close(actual[valid], expected[valid], atol=1e-4, rtol=1e-4)


#: The attention operator each family's fused prefill gets (None: none may fuse), with
#: the RotaryEmbedding count (0: the family has no rotary).
_FAMILY_FUSIONS = {
    "mistral-window": ("GroupQueryAttention", 4),  # the window is in the mask, GQA's attention_bias
    "phi3": ("GroupQueryAttention", 4),  # fused qkv projection split by Slice
    "gemma": ("GroupQueryAttention", 4),  # scaled embeddings, (1 + w) norms, head size 16 != 64 / 4
    "gemma2-softcap": (None, 4),  # eager attention with tanh soft-capping: no attention rule may match
    "gemma3": ("GroupQueryAttention", 4),  # q / k norms before rotary
    "qwen3": ("GroupQueryAttention", 4),  # q / k norms before rotary
    "gpt-neox": ("MultiHeadAttention", 4),  # partial rotary, no grouped heads
    "llama-yarn": ("GroupQueryAttention", 4),  # cos / sin scaled by yarn's attention factor
    "opt": ("Attention", 0),  # learned positions, biases on q / k / v
    "mixtral": ("GroupQueryAttention", 4),  # experts exported as batched_mm (grouped_mm has no ONNX form)
}
_ATTENTION_OPERATORS = ("GroupQueryAttention", "MultiHeadAttention", "Attention")


@pytest.mark.parametrize("kind", sorted(_FAMILY_FUSIONS))
def test_each_family_fuses_only_what_keeps_its_padded_prefill(kind):
    """Tuned as users call it (MaxThroughputStrategy, ONNX Runtime on the CPU, keyword
    prefill with left- and right-padded rows): the fused candidate gets the family's
    attention operator (or none, where its attention is not what the rules understand),
    matches eager at valid positions, and so does the tuned module. The weights are drawn
    with std 0.2 (decoder_models), so a dropped mask or soft-capping would show."""
    inner = tiny_decoder(kind)
    model = ait.Module(inner, f"family-{kind}", strategy=ait.MaxThroughputStrategy([cpu_backend()]))
    ait.tune(model, lambda size: [_padded(size)], batch_sizes=[2, 3], ignore_failing_modules=False,
             disable_external_logging=True, progress=False)
    (report,) = model.ait_reports.values()
    (fused,) = [c for c in json.loads(report.to_json())["candidates"] if c.get("transform") == "ort_fusions"]
    ops = fused["fused_operators"]
    attention, rotary = _FAMILY_FUSIONS[kind]
    assert {op: ops[op] for op in _ATTENTION_OPERATORS if op in ops} == ({attention: 2} if attention else {}), ops
    assert ops.get("RotaryEmbedding", 0) == rotary, ops
    correctness = fused["correctness"]
    assert correctness["passed"] and correctness["max_abs_error"] < 1e-4, correctness
    batch = _padded(3)
    with torch.no_grad():
        expected, actual = inner(**batch).logits, model(**batch).logits
    valid = batch["attention_mask"].bool()
    torch.testing.assert_close(actual[valid], expected[valid], atol=1e-4, rtol=1e-4)
    if kind == "mixtral":  # the user's experts kernel, switched for the export only, is restored
        assert inner.config._experts_implementation == "grouped_mm"


def test_phi3_longrope_is_refused_naming_the_rotary_state():
    """Phi3's longrope (Phi-3-mini-128k, Phi-3.5) picks its rotary factors per call by
    rewriting ``rotary_emb.inv_freq`` in forward: state an ONNX graph cannot write back, so
    the ONNX Runtime candidate is refused, naming that buffer (docs/decoders.md)."""
    model = ait.Module(tiny_decoder("phi3-longrope"), "family-phi3-longrope",
                       strategy=ait.MaxThroughputStrategy([cpu_backend()]))
    refusal = r"ExportError.*changes the module's state \(model\.rotary_emb\.inv_freq\)"
    with pytest.raises(ait.TuningError, match=refusal):
        ait.tune(model, lambda size: [_padded(size)], batch_sizes=[2], ignore_failing_modules=False,
                 disable_external_logging=True, progress=False)


class _GroupedAttention(torch.nn.Module):
    """Grouped KV heads (repeat_kv) into SDPA with a given mask kind: "causal" (causal and
    padding, additive), "bidirectional" (padding only), "none"."""

    def __init__(self, mask_kind: str, heads: int = 4, kv_heads: int = 2, head_size: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.mask_kind, self.heads, self.kv_heads, self.head_size = mask_kind, heads, kv_heads, head_size
        hidden = heads * head_size
        self.q = torch.nn.Linear(hidden, hidden, bias=False)
        self.k = torch.nn.Linear(hidden, kv_heads * head_size, bias=False)
        self.v = torch.nn.Linear(hidden, kv_heads * head_size, bias=False)

    def forward(self, x, attention_mask):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_size).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_size).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_size).transpose(1, 2)
        groups = self.heads // self.kv_heads
        k = k[:, :, None].expand(b, self.kv_heads, groups, s, self.head_size).reshape(b, self.heads, s, -1)
        v = v[:, :, None].expand(b, self.kv_heads, groups, s, self.head_size).reshape(b, self.heads, s, -1)
        keep = attention_mask.bool()[:, None, None, :]
        if self.mask_kind == "causal":
            positions = torch.arange(s, device=x.device)
            keep = keep & (positions[None, :] <= positions[:, None])[None, None]
        scores = q @ k.transpose(-1, -2) / self.head_size**0.5
        if self.mask_kind != "none":
            scores = scores + torch.where(keep, 0.0, torch.finfo(x.dtype).min)
        out = torch.softmax(scores, dim=-1) @ v
        return out.transpose(1, 2).reshape(b, s, -1)


@pytest.mark.parametrize("mask_kind,fuses", [("causal", True), ("bidirectional", False), ("none", False)])
def test_group_query_attention_fuses_only_a_causal_mask(mask_kind, fuses, tmp_path):
    from aitune.torch import decoder_fusions

    module = _GroupedAttention(mask_kind).eval()
    x, mask = torch.randn(2, 6, 32), torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    path = tmp_path / "attention.onnx"
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    torch.onnx.export(module, (x, mask), str(path), dynamo=True, input_names=["x", "attention_mask"],
                      dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    fused, counts = decoder_fusions.optimize_for_ort(onnx_ir.load(str(path)))
    ops = collections.Counter(n.op_type for n in fused.graph if n.domain == "com.microsoft")
    assert (ops["GroupQueryAttention"] == 1) is fuses, (ops, counts)
    onnx_ir.save(fused, str(tmp_path / "fused.onnx"))
    session = ort.InferenceSession(str(tmp_path / "fused.onnx"), providers=["CPUExecutionProvider"])
    for rows in (1, 3):
        xs, masks = torch.randn(rows, 6, 32), torch.ones(rows, 6, dtype=torch.long)
        masks[0, :2] = 0
        with torch.no_grad():
            expected = module(xs, masks)
        (actual,) = session.run(None, {"x": xs.numpy(), "attention_mask": masks.numpy()})
        valid = masks.bool()  # a padded query row is undefined (fully masked where causal)
        torch.testing.assert_close(torch.from_numpy(actual)[valid], expected[valid], atol=1e-5, rtol=1e-5)


class _PrefillLogits(torch.nn.Module):
    """A causal LM's prefill, with explicit position ids (as generate passes them for
    left-padded rows) or without (the model counts them from 0), returning the logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=False).logits


def test_an_fp16_model_at_a_dynamic_batch_fuses_rotary(tmp_path):
    """``model.half()`` (the benchmark's fp16 rows) turns rotary's ``inv_freq`` buffer to
    fp16: exported at a dynamic batch it is expanded to the batch and then cast to float,
    which onnxscript's cos / sin pattern did not match (no RotaryEmbedding fused). Fused,
    the graph computes what eager fp16 computes at valid positions of left-padded rows of
    other batch sizes and lengths, with no data-fed host input."""
    from aitune.torch import decoder_fusions

    module = _PrefillLogits(tiny_decoder("llama").half()).eval()

    def batch(rows, length):
        ids = torch.randint(2, VOCAB, (rows, length), generator=torch.Generator().manual_seed(rows))
        mask = torch.ones(rows, length, dtype=torch.long)
        mask[1::2, :3] = 0
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    path = tmp_path / "prefill.onnx"
    rows, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    torch.onnx.export(module, batch(2, 8), str(path), dynamo=True,
                      input_names=["input_ids", "attention_mask", "position_ids"],
                      dynamic_shapes=({0: rows, 1: seq},) * 3)
    fused, counts = decoder_fusions.optimize_for_ort(onnx_ir.load(str(path)))
    ops = collections.Counter(n.op_type for n in fused.graph if n.domain == "com.microsoft")
    assert ops["RotaryEmbedding"] == 4 and ops["GroupQueryAttention"] == 2, (ops, counts)
    onnx_ir.save(fused, str(tmp_path / "fused.onnx"))
    assert data_fed_host_inputs(tmp_path / "fused.onnx") == []
    session = ort.InferenceSession(str(tmp_path / "fused.onnx"), providers=["CPUExecutionProvider"])
    for size, length in ((3, 7), (1, 5)):
        ids, mask, positions = batch(size, length)
        with torch.no_grad():
            expected = module(ids, mask, positions)
        (actual,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                                       "position_ids": positions.numpy()})
        valid = mask.bool()
        torch.testing.assert_close(torch.from_numpy(actual)[valid], expected[valid], atol=2e-3, rtol=2e-3)


_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}


@pytest.mark.parametrize("rope_scaling,length", [(None, 300), (_YARN, 300), (None, 200), (_YARN, 200), (None, 100)],
                         ids=["default-300", "yarn-300", "default-200", "yarn-200", "default-100"])
def test_a_static_prefill_whose_rotary_angles_fold_but_not_their_cos_fuses_rotary(rope_scaling, length, tmp_path):
    """Exported with every shape static (the benchmark's prefill at batch 1), the rotary
    angles fold into a constant [1, S, E]; onnxscript folds no node with an input of more
    than 8192 elements. Head size 64 (E = 32) here, so three regimes: S = 100 (E * S = 3200)
    folds Cos / Sin too (constant tables); S = 300 (9600) folds nothing after the angles
    (``Concat -> Cos / Sin`` stay); S = 200 (6400, like decoder.py's prefill at S = 256)
    folds ``Concat(freqs, freqs)`` into a constant [1, S, 2E] but not its Cos / Sin, which no
    rule matched (no RotaryEmbedding: the rotation stayed as Slice / Neg / Concat / Mul).
    Fused in each, the graph computes what eager does; with yarn's cos / sin scaled by its
    attention factor too."""
    from aitune.torch import decoder_fusions

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=512, rope_scaling=rope_scaling)).eval()
    module = _PrefillLogits(model).eval()
    ids = torch.randint(2, VOCAB, (1, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(1, length, dtype=torch.long)
    path = tmp_path / "prefill.onnx"
    torch.onnx.export(module, (ids, mask), str(path), dynamo=True, input_names=["input_ids", "attention_mask"])
    fused, counts = decoder_fusions.optimize_for_ort(onnx_ir.load(str(path)))
    ops = collections.Counter(n.op_type for n in fused.graph if n.domain == "com.microsoft")
    assert ops["RotaryEmbedding"] == 4 and ops["GroupQueryAttention"] == 2, (ops, counts)
    onnx_ir.save(fused, str(tmp_path / "fused.onnx"))
    session = ort.InferenceSession(str(tmp_path / "fused.onnx"), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        expected = module(ids, mask)
    torch.testing.assert_close(torch.from_numpy(actual), expected, atol=1e-4, rtol=1e-4)


class _StepOfTensors(torch.nn.Module):
    """DecodeStep with its caches as separate tensors (2 layers), for torch.onnx.export."""

    def __init__(self, model):
        super().__init__()
        from aitune.torch.decode_step import DecodeStep

        self.step = DecodeStep(model)

    def forward(self, input_ids, attention_mask, position_ids, cache_position, k0, k1, v0, v1):
        logits, keys, values = self.step(input_ids, attention_mask, position_ids, cache_position, (k0, k1), (v0, v1))
        return (logits, *keys, *values)


def test_multi_head_attention_over_partial_rotary_keeps_the_rotary_dimension(tmp_path):
    """onnxscript's MultiHeadAttention rules take the query's and key's RotaryEmbedding into
    the match and rebuild them without their attributes: a partial rotary's
    ``rotary_embedding_dim`` was dropped, the whole head rotated, and a Phi3 prefill over a
    cache (partial_rotary_factor 0.5; keys longer than the query, so MultiHeadAttention,
    not GroupQueryAttention) differed from eager by 2.1. Refused where the rotary has such
    attributes; the fused graph computes what eager does."""
    from aitune.torch import decoder_fusions
    from aitune.torch.decode_step import empty_cache

    model = tiny_decoder("phi3-partial")
    batch, length, slots = 2, 6, 10
    ids = torch.randint(2, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))
    prompt = torch.ones(batch, length, dtype=torch.long)
    prompt[0, :2] = 0  # left-padded
    mask = torch.zeros(batch, slots, dtype=torch.long)
    mask[:, :length] = prompt
    keys, values = empty_cache(model, batch, slots)
    inputs = (ids, mask, (prompt.cumsum(-1) - 1).clamp(min=0), torch.arange(length), *keys, *values)
    names = ["input_ids", "attention_mask", "position_ids", "cache_position", "k0", "k1", "v0", "v1"]
    module = _StepOfTensors(model).eval()
    path = tmp_path / "prefill.onnx"
    with torch.no_grad():
        expected = module(*inputs)[0]
        torch.onnx.export(module, inputs, str(path), dynamo=True, input_names=names)
    fused, counts = decoder_fusions.optimize_for_ort(onnx_ir.load(str(path)))
    ops = collections.Counter(n.op_type for n in fused.graph if n.domain == "com.microsoft")
    assert ops["RotaryEmbedding"] == 4, (ops, counts)
    onnx_ir.save(fused, str(tmp_path / "fused.onnx"))
    session = ort.InferenceSession(str(tmp_path / "fused.onnx"), providers=["CPUExecutionProvider"])
    actual = torch.from_numpy(session.run(None, {n: t.numpy() for n, t in zip(names, inputs)})[0])
    valid = prompt.bool()
    torch.testing.assert_close(actual[valid], expected[valid], atol=1e-4, rtol=1e-4)


class _ComplexRotary(torch.nn.Module):
    """Rotary as Llama 4 writes it: pairs of features as complex numbers times unit phases."""

    def __init__(self):
        super().__init__()
        angles = torch.arange(4, dtype=torch.float32)
        self.register_buffer("phases", torch.polar(torch.ones_like(angles), angles), persistent=False)

    def forward(self, x):
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * self.phases.unsqueeze(0)).flatten(-2)


def test_an_export_failing_on_an_operator_without_onnx_form_says_so():
    """torch's ONNX exporter translates no op on complex numbers (Llama 4's rotary) and no
    custom op: the ExportError's hint spoke of control flow on a tensor's value; it now
    says the exporter has no ONNX translation for the named operator and what to do."""
    from aitune.torch.export import ExportError

    model = ait.Module(_ComplexRotary(), "complex-rotary", strategy=ait.OneBackendStrategy(cpu_backend()))
    with pytest.raises(ExportError) as failed:
        ait.tune(model, [torch.randn(2, 8) for _ in range(2)], ignore_failing_modules=False,
                 disable_external_logging=True, progress=False)
    message = str(failed.value)
    assert "No ONNX function found for" in message and "no ONNX translation for the operator" in message, message
    assert "control flow on a tensor's value" not in message, message
