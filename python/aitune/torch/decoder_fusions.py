"""Decoder-LLM fusions for dynamo exports: onnxscript's ``optimize_for_ort`` sequence with our
own rewrite rules where its rules are wrong or absent for today's transformers (rotary cos/sin
computed as ``position_ids[..., None].float() * inv_freq``, position ids per row, and
grouped-query attention that keeps the model's attention mask)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.optimizer import optimize
from onnxscript.rewriter import _fusion_utils, _ir_utils, pattern, rewrite
from onnxscript.rewriter.ort_fusions import (
    attention,
    bias_gelu,
    cos_sin_cache,
    erfgelu,
    gelu,
    mha,
    mha_bias,
    mha_scale,
    rms_normalization,
    rotary_embedding,
    sdpa,
    sdpa_via_mha,
    shape_optimization,
    skip_normalization,
)
from onnxscript.rewriter.ort_fusions._core import ORT_PATTERN_REWRITE_RULES
from onnxscript.rewriter.rules.common import _gemm_to_matmul_add

_CONTRIB = "com.microsoft"
_FUSION_DOMAIN = "ai.onnxruntime._fusion"  # onnxscript's intermediate ops (RotaryEmbedding, SDPA)


# -- rotary: position ids per row ------------------------------------------------------


def _rotated_by_angles(op, x, freqs, interleaved, num_heads, dtype, cast: bool, scaled: bool = False):
    """The pattern's tail every cos / sin rule shares: rotary's ``Concat(freqs, freqs)`` ->
    Cos / Sin (times constants ``cos_scale`` / ``sin_scale`` where ``scaled``: transformers'
    ``emb.cos() * attention_scaling``, 1 but for yarn / longrope / llama4, whose 1 the
    optimizer folds away) (cast to the rotated tensor's dtype where ``cast``) ->
    onnxscript's intermediate RotaryEmbedding of ``x``."""
    return _rotated_by_table(op, x, op.Concat(freqs, freqs, axis=-1), interleaved, num_heads, dtype, cast, scaled)


def _rotated_by_table(op, x, emb, interleaved, num_heads, dtype, cast: bool, scaled: bool = False):
    """``_rotated_by_angles`` from the angle table ``emb`` ([.., S, 2E]) on."""
    cos, sin = op.Cos(emb), op.Sin(emb)
    if scaled:
        cos, sin = op.Mul(cos, pattern.Var("cos_scale")), op.Mul(sin, pattern.Var("sin_scale"))
    if cast:
        cos, sin = op.Cast(cos, to=dtype), op.Cast(sin, to=dtype)
    return op.RotaryEmbedding(x, op.Unsqueeze(cos, [1]), op.Unsqueeze(sin, [1]), interleaved=interleaved,
                              num_heads=num_heads, _domain=_FUSION_DOMAIN)


def _scale(cos_scale: ir.Value | None, sin_scale: ir.Value | None) -> tuple[float | None, str | None]:
    """The one factor of scaled cos / sin tables (``attention_scaling``): both constant
    scalars (any shape of one element), equal; otherwise None and why."""
    values = []
    for value in (cos_scale, sin_scale):
        if value is None or value.const_value is None or value.const_value.numpy().size != 1:
            return None, "the cos / sin scale is not a constant scalar"
        values.append(float(value.const_value.numpy().reshape(())))
    if values[0] != values[1]:
        return None, f"cos and sin are scaled apart ({values[0]} / {values[1]})"
    return values[0], None


def _frequencies(inv_freq: ir.Value) -> np.ndarray | None:
    """The rotary frequencies of a constant ``inv_freq`` as [1, E]: [E], [1, E, 1] or
    [1, 1, E], or [B, E, 1] (a static batch: the exporter folds ``inv_freq.expand(B, -1,
    1)`` into a constant) whose rows are equal; None for anything else."""
    if inv_freq.const_value is None:
        return None
    values = inv_freq.const_value.numpy()
    if values.ndim == 3 and values.shape[2] == 1:
        rows = values[:, :, 0]
    elif values.ndim in (1, 3) and all(d == 1 for d in values.shape[:-1]):
        rows = values.reshape(1, -1)
    else:
        return None
    if not rows.size or not (rows == rows[:1]).all():
        return None
    return np.ascontiguousarray(rows[:1], dtype=np.float32)


class _RowPositionsCosSinCache(cos_sin_cache.CosSinCacheFusion):
    """onnxscript's cos/sin-cache fusion, with the angles computed for this call's positions
    rather than for a table up to the largest position.

    - **Per-row positions.** transformers' plain forward passes [1, S] (``cache_position``)
      and ONNX Runtime's RotaryEmbedding accepts only (1) or (batch, sequence): a [1, S]
      input fails at batch > 1, so the positions are broadcast to [B, S].
    - **No data-dependent shape.** onnxscript's table (``Range(0, ReduceMax(position_ids) +
      1)``) sizes a tensor by a value on the device: ONNX Runtime's CUDA provider copies
      that value to the host on every call, which also keeps the graph from running as a
      CUDA graph ("all compute graph nodes have not been partitioned", measured on the
      decode step of a Llama-shaped model, H100, session 17). Here the table has a row per
      token of the call, ``cos(position * inv_freq)`` exactly as the model computes it, and
      the RotaryEmbedding's position ids are the row numbers ``arange(B * S)`` (sized by
      shapes only).
    - **A static batch.** Exported at one batch size B > 1, ``inv_freq`` reaches the graph
      expanded to a constant [B, E, 1]; onnxscript's rule wants [1, E, 1] and fused nothing.
      Its rows are equal: the first is the frequencies.
    - **An fp16 model** (``model.half()`` turns the ``inv_freq`` buffer to fp16): the
      export expands the fp16 frequencies to the batch and then casts them to float
      (``Cast(Expand(inv_freq))``), which onnxscript's pattern (``Expand(inv_freq)`` into the
      MatMul) does not match, so no RotaryEmbedding fused at a dynamic batch."""

    def __init__(self, name: str, *, cast: bool = False, const_freqs: bool = False, scaled: bool = False):
        if scaled and const_freqs:
            raise ValueError("scaled cos / sin tables: onnxscript's constant-positions rewrite does not scale")
        super().__init__(name, cast=cast, const_freqs=const_freqs)
        self._scaled = scaled

    def pattern(self, op, x, inv_freq, position_ids, interleaved, num_heads, freqs, dtype, extra_dims):
        if self._const_freqs:
            return super().pattern(op, x, inv_freq, position_ids, interleaved, num_heads, freqs, dtype, extra_dims)
        positions = op.Cast(op.Unsqueeze(position_ids, extra_dims), to=ir.DataType.FLOAT)  # [B|1, 1, S]
        expanded = pattern.OrValue([op.Expand(inv_freq, pattern.ANY_VALUE),
                                    op.Cast(op.Expand(inv_freq, pattern.ANY_VALUE), to=ir.DataType.FLOAT),
                                    inv_freq])  # [B|1, E, 1]
        freqs = op.Transpose(op.MatMul(expanded, positions), perm=[0, 2, 1])  # [B, S, E]
        return _rotated_by_angles(op, x, freqs, interleaved, num_heads, dtype, self._cast, self._scaled)

    def _checked_scale(self, result: pattern.MatchResult, cos_scale, sin_scale) -> pattern.MatchResult | None:
        """Where the rule is the scaled variant: the factor, kept for the rewrite, or the
        failed ``result``."""
        self._factor = None
        if not self._scaled:
            return None
        self._factor, why = _scale(cos_scale, sin_scale)
        return result.fail(why, cos_scale) if why else None

    def check(self, context, inv_freq, position_ids, freqs, extra_dims, cos_scale=None, sin_scale=None,
              **kwargs) -> pattern.MatchResult:
        if self._const_freqs:
            return super().check(context, inv_freq=inv_freq, position_ids=position_ids, freqs=freqs,
                                 extra_dims=extra_dims, **kwargs)
        result = pattern.MatchResult()
        if failure := self._checked_scale(result, cos_scale, sin_scale):
            return failure
        if not ((_ir_utils.has_rank(position_ids, 2) and _ir_utils.is_singleton_value(extra_dims, 1))
                or (_ir_utils.has_rank(position_ids, 1) and _ir_utils.is_1d_value(extra_dims, [0, 1]))):
            return result.fail("position_ids is not [B, S] or [S] unsqueezed to [B|1, 1, S]", position_ids)
        if not _ir_utils.has_rank(inv_freq, 3) or _frequencies(inv_freq) is None:
            return result.fail("inv_freq is not a constant [1, E, 1], or [B, E, 1] with equal rows", inv_freq)
        return result

    def cleanup(self):
        super().cleanup()
        self._tables = {}

    def rewrite(self, op, x, inv_freq, position_ids, interleaved, num_heads, freqs, dtype, **kwargs):
        if self._const_freqs:  # the positions are constants too: onnxscript's constant table
            rotated = super().rewrite(op, x, inv_freq, position_ids, interleaved, num_heads, freqs, dtype, **kwargs)
            node = rotated.producer()
            rows = node.inputs[1]  # [1, S] or [B, S]: the parent's (possibly unsqueezed) position ids
            batch = op.Shape(x, start=0, end=1)
            sequence = op.Shape(rows, start=1, end=2)
            node.replace_input_with(1, op.Expand(rows, op.Concat(batch, sequence, axis=0)))
            return rotated
        tables = getattr(self, "_tables", None)
        if tables is None:
            tables = self._tables = {}
        key = (inv_freq, position_ids, self._factor)
        if key not in tables:  # one table per positions, frequencies and scale, shared by the layers
            rows = (op.Unsqueeze(position_ids, op.Constant(value_ints=[0])) if _ir_utils.has_rank(position_ids, 1)
                    else position_ids)
            shape = op.Concat(op.Shape(x, start=0, end=1), op.Shape(rows, start=1, end=2), axis=0)  # [B, S]
            positions = op.Cast(op.Reshape(op.Expand(rows, shape), op.Constant(value_ints=[-1, 1])),
                                to=ir.DataType.FLOAT)  # [B * S, 1]
            angles = op.MatMul(positions, op.Constant(value=ir.tensor(_frequencies(inv_freq))))  # [B * S, E]
            cos, sin = op.Cos(angles), op.Sin(angles)
            if self._factor is not None:  # as the model scales them, before the cast
                factor = op.Constant(value=ir.tensor(np.array(self._factor, dtype=np.float32)))
                cos, sin = op.Mul(cos, factor), op.Mul(sin, factor)
            if self._cast:
                cos, sin = op.Cast(cos, to=dtype), op.Cast(sin, to=dtype)
            tokens = op.ReduceProd(shape, keepdims=0)
            row_numbers = op.Reshape(op.Range(op.Constant(value_int=0), tokens, op.Constant(value_int=1)), shape)
            tables[key] = (row_numbers, cos, sin)
        row_numbers, cos, sin = tables[key]
        return op.RotaryEmbedding(x, row_numbers, cos, sin, interleaved=interleaved, num_heads=num_heads,
                                  _domain=_CONTRIB)


class _ElementwiseCosSinCache(_RowPositionsCosSinCache):
    """transformers >= 5.2x computes the rotary angles elementwise,
    ``freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]`` ([B, S, E], no
    MatMul and no Transpose), which onnxscript's rule (4.x: ``MatMul(inv_freq, positions)``
    then ``Transpose``) does not match. Same rewrite: a cos/sin cache indexed by position."""

    def pattern(self, op, x, inv_freq, position_ids, interleaved, num_heads, freqs, dtype, extra_dims):
        positions = op.Cast(op.Unsqueeze(position_ids, extra_dims), to=ir.DataType.FLOAT)  # [B, S, 1]
        freqs = pattern.OrValue([op.Mul(positions, inv_freq), op.Mul(inv_freq, positions)])  # [B, S, E]
        return _rotated_by_angles(op, x, freqs, interleaved, num_heads, dtype, self._cast, self._scaled)

    def check(self, context, inv_freq, position_ids, extra_dims, cos_scale=None, sin_scale=None,
              **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if failure := self._checked_scale(result, cos_scale, sin_scale):
            return failure
        # positions [B, S] unsqueezed at the end (axes [2] or [-1]), or [S] (the constant-folded
        # ``cache_position[None]``) unsqueezed at both ends (axes [0, 2] or [0, -1])
        last = any(_ir_utils.is_singleton_value(extra_dims, axis) for axis in (2, -1))
        both = any(_ir_utils.is_1d_value(extra_dims, axes) for axes in ([0, 2], [0, -1]))
        if not ((_ir_utils.has_rank(position_ids, 2) and last) or (_ir_utils.has_rank(position_ids, 1) and both)):
            return result.fail("position_ids is not [B, S] or [S] unsqueezed to [B|1, S, 1]", position_ids)
        # multiplied elementwise with [B, S, 1] positions: [E] or [1, 1, E] only ([B, E, 1] is the MatMul form's)
        frequencies = _frequencies(inv_freq)
        if frequencies is None or inv_freq.const_value.numpy().shape[-1] != frequencies.shape[-1]:
            return result.fail("inv_freq is not a constant [E] or [1, 1, E]", inv_freq)
        return result


def _first_of_equal_halves(table: np.ndarray) -> np.ndarray | None:
    """[S, E] of a [S, 2E] table ``Concat(t, t, axis=-1)`` made (rotate_half's layout); None
    where its halves differ."""
    half = table.shape[-1] // 2
    return table[:, :half] if np.array_equal(table[:, :half], table[:, half:]) else None


class _FoldedCosSinCache(pattern.RewriteRuleClassBase):
    """A graph exported with a static sequence length has its cos / sin tables folded into
    constants ``[1, 1, S, Dh]`` (no Cos, no Sin left for the rules above). Row i of such a
    table is position i, so the cache is the table's first half and the position ids are
    ``arange(S)`` for every row: exactly what the constants encode."""

    def __init__(self):
        super().__init__("CosSinCacheFolded")

    def pattern(self, op, x, cos, sin, interleaved, num_heads):
        return op.RotaryEmbedding(x, cos, sin, interleaved=interleaved, num_heads=num_heads, _domain=_FUSION_DOMAIN)

    def check(self, context, x, cos, sin, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        tables = []
        for table in (cos, sin):
            if table.const_value is None:
                return result.fail("cos / sin is not a constant", table)
            values = table.const_value.numpy()
            if values.ndim < 2 or any(d != 1 for d in values.shape[:-2]) or values.shape[-1] % 2:
                return result.fail(f"cos / sin shape {values.shape} is not [1, 1, S, Dh]", table)
            first = _first_of_equal_halves(values.reshape(values.shape[-2:]))  # Concat(freqs, freqs) only
            if first is None:
                return result.fail("cos / sin halves differ (not rotate_half's table)", table)
            tables.append(first)
        if not _ir_utils.has_rank(x, 4) or x.shape[2] != tables[0].shape[0]:
            return result.fail("x is not [B, H, S, Dh] with the table's S", x)
        self._cos, self._sin = tables
        return result

    def rewrite(self, op, x, interleaved, num_heads, **_):
        rows = self._cos.shape[0]
        positions = op.Constant(value=ir.tensor(np.arange(rows, dtype=np.int64).reshape(1, rows)))
        batch = op.Shape(x, start=0, end=1)
        positions = op.Expand(positions, op.Concat(batch, op.Constant(value_ints=[rows]), axis=0))
        return op.RotaryEmbedding(x, positions, op.Constant(value=ir.tensor(np.ascontiguousarray(self._cos))),
                                  op.Constant(value=ir.tensor(np.ascontiguousarray(self._sin))),
                                  interleaved=interleaved, num_heads=num_heads, _domain=_CONTRIB)


def _constant_table_angles(emb: ir.Value) -> np.ndarray | None:
    """The rotary angles [S, E] of a constant table ``emb`` [1, S, 2E] whose halves are
    equal (``Concat(freqs, freqs)`` folded); None for anything else."""
    if emb.const_value is None:
        return None
    values = emb.const_value.numpy()
    if values.ndim != 3 or values.shape[0] != 1 or values.shape[2] % 2:
        return None
    first = _first_of_equal_halves(values[0])
    return None if first is None else first.astype(np.float32)


def _constant_angles(freqs: ir.Value) -> np.ndarray | None:
    """The rotary angles [S, E] of a constant ``freqs`` [1, S, E], or of the Transpose
    ([0, 2, 1]) of a constant [1, E, S]; None for anything else."""
    values, node = freqs.const_value, freqs.producer()
    if values is not None:
        values = values.numpy()
    elif (node is not None and node.op_type == "Transpose" and node.domain in ("", "ai.onnx")
          and list(node.attributes.get_ints("perm", [])) == [0, 2, 1] and node.inputs[0] is not None
          and node.inputs[0].const_value is not None):
        values = node.inputs[0].const_value.numpy().transpose(0, 2, 1)
    if values is None or values.ndim != 3 or values.shape[0] != 1:
        return None
    return values[0].astype(np.float32)


class _ConstantAnglesCosSinCache(_FoldedCosSinCache):
    """A static sequence length folds the rotary angles into a constant [1, S, E] (positions
    ``arange(S)``), but the constant folding stops at inputs of more than 8192 elements
    (onnxscript's limit), so two forms stay that no rule above matched (no RotaryEmbedding
    fused): where E * S > 8192 (head size 128 and S > 128, head size 64 and S > 256) the
    ``Concat(freqs, freqs) -> Cos / Sin``; where 4096 < E * S <= 8192 (head size 128 and
    64 < S <= 128, head size 64 and 128 < S <= 256: decoder.py's prefill at S = 256) the
    Concat folds into a constant [1, S, 2E] (``table``) but its Cos / Sin do not. Row s of
    the angles is token s: the cache is their cos / sin in the rotated tensor's dtype, the
    position ids ``arange(S)`` for every row."""

    def __init__(self, cast: bool, scaled: bool = False, table: bool = False):
        # the Cos / Sin are shared by every layer's rotations: dead nodes go in the final optimize
        pattern.RewriteRuleClassBase.__init__(
            self, "CosSinCacheConstant" + ("Table" if table else "Angles") + ("_cast" if cast else "")
            + ("_scaled" if scaled else ""), remove_nodes=False)
        self._cast, self._scaled, self._table = cast, scaled, table

    def pattern(self, op, x, freqs, interleaved, num_heads, dtype):
        if self._table:  # ``freqs`` is the folded Concat(freqs, freqs) here
            return _rotated_by_table(op, x, freqs, interleaved, num_heads, dtype, self._cast, self._scaled)
        return _rotated_by_angles(op, x, freqs, interleaved, num_heads, dtype, self._cast, self._scaled)

    def check(self, context, x, freqs, cos_scale=None, sin_scale=None, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        factor = 1.0
        if self._scaled:
            factor, why = _scale(cos_scale, sin_scale)
            if why:
                return result.fail(why, cos_scale)
        angles = _constant_table_angles(freqs) if self._table else _constant_angles(freqs)
        if angles is None:
            return result.fail("the angle table is not a constant [1, S, 2E] of equal halves" if self._table else
                               "freqs is not a constant [1, S, E] (or a Transpose of [1, E, S])", freqs)
        if not _ir_utils.has_rank(x, 4) or x.shape[2] != angles.shape[0] or x.dtype is None:
            return result.fail("x is not [B, H, S, Dh] with the angles' S", x)
        dtype = x.dtype.numpy()
        scale = np.float32(factor)
        self._cos, self._sin = (np.cos(angles) * scale).astype(dtype), (np.sin(angles) * scale).astype(dtype)
        return result


def _cos_sin_cache_rules() -> pattern.RewriteRuleSet:
    """Every onnxscript variant (cast or not, constant angles or not) with per-row position
    ids, the elementwise-angle variants, and folded tables (or folded angles); those but
    onnxscript's constant-positions rewrite also with cos / sin scaled by a constant."""
    rules = [_FoldedCosSinCache.rule()]
    for cast in (True, False):
        suffix = "_cast" if cast else ""
        rules.append(_ConstantAnglesCosSinCache.rule(cast=cast))
        rules.append(_ConstantAnglesCosSinCache.rule(cast=cast, table=True))
        rules.append(_RowPositionsCosSinCache.rule(f"CosSinCacheRows{suffix}", cast=cast, const_freqs=False))
        rules.append(_RowPositionsCosSinCache.rule(f"CosSinCacheRows{suffix}_const", cast=cast, const_freqs=True))
        rules.append(_ElementwiseCosSinCache.rule(f"CosSinCacheElementwise{suffix}", cast=cast, const_freqs=False))
        # cos / sin times transformers' attention_scaling (yarn, longrope): the same, scaled
        rules.append(_ConstantAnglesCosSinCache.rule(cast=cast, scaled=True))
        rules.append(_ConstantAnglesCosSinCache.rule(cast=cast, scaled=True, table=True))
        rules.append(_RowPositionsCosSinCache.rule(f"CosSinCacheRows{suffix}_scaled", cast=cast, scaled=True))
        rules.append(_ElementwiseCosSinCache.rule(f"CosSinCacheElementwise{suffix}_scaled", cast=cast, scaled=True))
    return pattern.RewriteRuleSet(rules)


# -- static shapes: the key's transpose as the attention rules expect it -----------------


class _FlatKeyTranspose(pattern.RewriteRuleClassBase):
    """Exported with a static sequence length, ``key.transpose(-1, -2)`` of a [B, H, S, Dh]
    key reaches the graph as ``Reshape([-1, S, Dh]) -> Transpose([0, 2, 1]) -> Reshape([-1,
    H, Dh, S])`` (the batch folded into the heads; B * H and B where the batch is static too), which onnxscript's SDPA rule (a 4-D
    Transpose [0, 1, 3, 2]) does not match, so no attention fuses. Rewritten to
    ``Reshape([B | -1, H, S, Dh]) -> Transpose([0, 1, 3, 2])``: the same elements for any input
    (row n of the [B * H, S, Dh] view is head n % H of batch n // H in both). Only for keys
    grouped by ``repeat_kv``, which MaskedGroupQueryAttention then matches."""

    def __init__(self):
        super().__init__("FlatKeyTranspose", remove_nodes=False)  # the Expand stays the key's input

    def pattern(self, op, kv, flat_shape, key_shape):
        # only grouped keys (``repeat_kv``: Unsqueeze -> Expand): other attention (BERT's)
        # already matches onnxscript's rules, whose later fusions (packed QKV Attention)
        # expect the exporter's form
        x = op.Expand(op.Unsqueeze(kv, [2]), pattern.ANY_VALUE, _outputs=["x"])
        flat = op.Reshape(x, flat_shape, _allow_other_attributes=True)
        return op.Reshape(op.Transpose(flat, perm=[0, 2, 1]), key_shape, _allow_other_attributes=True)

    def check(self, context, flat_shape, key_shape, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        flat = flat_shape.const_value.numpy().tolist() if flat_shape.const_value is not None else None
        key = key_shape.const_value.numpy().tolist() if key_shape.const_value is not None else None
        if flat is None or key is None or len(flat) != 3 or len(key) != 4:
            return result.fail("the reshapes' shapes are not constants [-1, S, Dh] and [-1, H, Dh, S]", flat_shape)
        batch_heads, rows, width = flat
        batch, heads = key[0], key[1]
        # [B * H | -1, S, Dh] and [B | -1, H, Dh, S] (static shapes name B * H and B)
        if key[2] != width or key[3] != rows or min(rows, width, heads) <= 0:
            return result.fail(f"shapes {flat} / {key} are not [B*H, S, Dh] / [B, H, Dh, S]", flat_shape)
        if not ((batch_heads == -1 and batch == -1) or (batch > 0 and batch_heads == batch * heads)):
            return result.fail(f"shapes {flat} / {key}: the batch of the two reshapes differs", flat_shape)
        self._batch, self._heads, self._rows, self._width = batch, heads, rows, width
        return result

    def rewrite(self, op, x, **_):
        heads = op.Reshape(x, op.Constant(value_ints=[self._batch, self._heads, self._rows, self._width]))
        transposed = op.Transpose(heads, perm=[0, 1, 3, 2])
        # the batch dimension by name where x shows it ([B, ...] holding B * H * S * Dh
        # elements), so the attention rules' shape checks see the query's B (shape inference
        # of a -1 reshape would call it unknown)
        known = x.shape is not None and x.shape.rank() >= 2 and all(isinstance(d, int) for d in x.shape[1:])
        if known and int(np.prod(list(x.shape[1:]))) == self._heads * self._rows * self._width:
            batch = x.shape[0]
            heads.shape = ir.Shape([batch, self._heads, self._rows, self._width])
            transposed.shape = ir.Shape([batch, self._heads, self._width, self._rows])
            heads.dtype = transposed.dtype = x.dtype
        return transposed


_flat_key_transpose_rules = pattern.RewriteRuleSet([_FlatKeyTranspose.rule()])


# -- grouped-query attention that keeps the mask ---------------------------------------

#: Ops whose presence among the mask's producers shows it compares query and key positions
#: (transformers 5: LessOrEqual(kv_idx, q_idx); 4.x: Greater / Trilu).
_CAUSAL_COMPARISONS = {"LessOrEqual", "GreaterOrEqual", "Less", "Greater", "Trilu"}
_MASK_SEARCH_LIMIT = 400  # producers visited before the mask is called unrecognised


def _is_causal_table(value: ir.Value) -> bool:
    """A constant [..., S, S] (S > 1) that is the lower triangle: True / 0 where the key
    position is at most the query's, False / negative elsewhere (a causal mask the
    exporter folded, with a static sequence length)."""
    if value.const_value is None or value.shape is None or value.shape.rank() < 2:
        return False
    table = value.const_value.numpy()
    if table.shape[-1] != table.shape[-2] or table.shape[-1] < 2:
        return False
    allowed = table if table.dtype == np.bool_ else table == 0
    lower = np.tril(np.ones(table.shape[-2:], dtype=bool))
    return bool(np.all(allowed.reshape(-1, *lower.shape) == lower))


def _mask_is_causal(mask: ir.Value) -> bool:
    """Whether the mask's producers compare positions, or hold a folded causal table (a
    causal mask). GroupQueryAttention is always causal: a mask built without either
    (bidirectional attention) must not be fused into it."""
    seen, stack = set(), [mask]
    while stack and len(seen) < _MASK_SEARCH_LIMIT:
        value = stack.pop()
        if value is not None and _is_causal_table(value):
            return True
        node = value.producer() if value is not None else None
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type in _CAUSAL_COMPARISONS and node.domain in ("", "ai.onnx"):
            return True
        stack.extend(v for v in node.inputs if v is not None)
    return False


def _grouped_causal_failure(result: pattern.MatchResult, dims: dict, query: ir.Value, mask: ir.Value | None,
                            keys: str) -> pattern.MatchResult | None:
    """The failed ``result`` where a GroupQueryAttention cannot take this attention: heads not
    grouped, no mask, a mask that is not ``[B|1, 1, S, <keys>]`` additive of the query's
    dtype, or one that compares no positions (GQA is always causal); None where it can."""
    heads, kv_heads = dims["H"], dims["Hkv"]
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or heads % kv_heads or heads == kv_heads:
        return result.fail(f"heads {heads} / kv heads {kv_heads} are not grouped", query)
    if mask is None:
        return result.fail("no attention mask: causality unknown", query)
    if mask.shape is None or mask.shape.rank() != 4 or mask.dtype != query.dtype:
        return result.fail("the mask is not a 4-D additive mask of the query's dtype", mask)
    batch, head, rows, columns = mask.shape
    if head != 1 or batch not in (1, dims["B"]) or rows != dims["S"] or columns != dims[keys]:
        return result.fail(f"mask shape {mask.shape} is not [B|1, 1, S, {keys}]", mask)
    if not _mask_is_causal(mask):
        return result.fail("the mask compares no positions (not causal): GroupQueryAttention is causal", mask)
    return None


def _flat_heads(op, value):
    """[B, H, S, Dh] -> [B, S, H * Dh], GroupQueryAttention's layout."""
    return op.Reshape(op.Transpose(value, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))


def _attention_bias(op, mask: ir.Value):
    """The model's additive mask as GQA's ``attention_bias``. Fully masked rows (a padded
    query position) would be -inf everywhere, NaN after the softmax, and NaN times a zero
    weight spreads to valid rows in the next layer: clamped to the lowest finite value
    those rows get a finite (undefined) result."""
    lowest = np.array(np.finfo(mask.dtype.numpy()).min, dtype=mask.dtype.numpy())
    return op.Max(mask, op.Constant(value=ir.tensor(lowest)))


def _scale_of(attention: ir.Value) -> dict:
    """The SDPA's own scale, where it has one, as GQA's attribute."""
    scale = attention.producer().attributes.get_float("scale", None)
    return {} if scale is None else {"scale": scale}


class MaskedGroupQueryAttention(pattern.RewriteRuleClassBase):
    """SDPA over ``repeat_kv``-expanded keys and values (grouped KV heads) -> ONNX Runtime's
    GroupQueryAttention, prefill without past. Unlike onnxscript's GQA rule (which drops
    the attention mask and derives ``seqlens_k`` from position ids, right only for unpadded
    rows; and accepts its mask sub-pattern's falsy result as a match), the model's own
    additive mask goes in as ``attention_bias`` (padding of any side and causality kept as
    the model computed them), rotary stays outside (per-row positions), ``seqlens_k`` is
    S - 1 for every row ([batch], so batch > 1 runs). Refused (a falsy MatchResult) where
    the mask is missing, not [B|1, 1, S, S] float, or not causal."""

    def __init__(self):
        super().__init__("MaskedGroupQueryAttention", remove_nodes=False)  # shared values: dead nodes go in the final optimize

    def pattern(self, op, query_BHSDh, key_BHkvSDh, value_BHkvSDh, mask):
        key_BHSDh = op.Reshape(op.Expand(op.Unsqueeze(key_BHkvSDh, [2]), pattern.ANY_VALUE), pattern.ANY_VALUE,
                               _outputs=["key_BHSDh"])
        value_BHSDh = op.Reshape(op.Expand(op.Unsqueeze(value_BHkvSDh, [2]), pattern.ANY_VALUE), pattern.ANY_VALUE,
                                 _outputs=["value_BHSDh"])
        attention_BHSDh = op.SDPA(query_BHSDh, key_BHSDh, value_BHSDh, mask, key_format="BHSd",
                                  _allow_other_attributes=True, _domain=_FUSION_DOMAIN, _outputs=["attention_BHSDh"])
        attention_BSHDh = op.Transpose(attention_BHSDh, perm=[0, 2, 1, 3])
        return op.Reshape(attention_BSHDh, pattern.ANY_VALUE, _outputs=["attention_BSD"])

    def check(self, context, query_BHSDh, key_BHkvSDh, value_BHkvSDh, key_BHSDh, value_BHSDh, mask, attention_BSD,
              **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        dims: dict = {}
        for value, names in ((query_BHSDh, "B H S Dh"), (key_BHkvSDh, "B Hkv S Dh"), (value_BHkvSDh, "B Hkv S Dh"),
                             (key_BHSDh, "B H S Dh"), (value_BHSDh, "B H S Dh"), (attention_BSD, "B S D")):
            if not _fusion_utils.check_shape_bool(dims, value, names.split()):
                return result.fail(f"{value.name} is not [{names}] (a past or a cross attention)", value)
        if failure := _grouped_causal_failure(result, dims, query_BHSDh, mask, "S"):
            return failure
        self._heads, self._kv_heads = dims["H"], dims["Hkv"]
        return result

    def rewrite(self, op, query_BHSDh, key_BHkvSDh, value_BHkvSDh, mask, attention_BHSDh, **_):
        # the lengths from the flat query GQA takes, not the model's [B, H, S, Dh] one: read
        # by nothing else, that one's Transpose can go (_FlatHeadsRotary)
        query_BSD = _flat_heads(op, query_BHSDh)
        sequence = op.Cast(op.Shape(query_BSD, start=1, end=2), to=ir.DataType.INT32)  # [1]
        one = op.Constant(value=ir.tensor(np.array([1], dtype=np.int32)))
        # every row's total length is S: padding is the mask's business, not GQA's
        seqlens_k = op.Expand(op.Sub(sequence, one), op.Shape(query_BSD, start=0, end=1))
        total_sequence_length = op.Squeeze(sequence)
        output, _present_key, _present_value = op.GroupQueryAttention(
            query_BSD, _flat_heads(op, key_BHkvSDh), _flat_heads(op, value_BHkvSDh), None, None,
            seqlens_k, total_sequence_length, None, None, None, _attention_bias(op, mask), num_heads=self._heads,
            kv_num_heads=self._kv_heads, _domain=_CONTRIB, _outputs=3, **_scale_of(attention_BHSDh))
        return output


_masked_gqa_rules = pattern.RewriteRuleSet([MaskedGroupQueryAttention.rule()])


class CachedGroupQueryAttention(pattern.RewriteRuleClassBase):
    """A step over a static KV cache (``DecodeStep``: this step's keys and values written into
    the layer's cache inputs by ScatterND, attention over the whole cache through
    ``repeat_kv``) -> GroupQueryAttention with the cache as its past and present, for a
    graph whose caches are updated in place (``in_place_outputs``: the engine binds each
    present to its past's buffer, ORT's past/present buffer sharing, so GQA writes only
    this step's slots). Only then: without the sharing, GQA's present holds the past up to
    this step's slots and nothing after them, where the ScatterND's output keeps every slot.

    ``seqlens_k`` (per row, the last slot written) is read from the ScatterND's indices
    (``[B, Hkv, S, 3]``: row, head, slot), so GQA writes the S new tokens at the slots the
    model writes them when those are consecutive and the same for every head, as
    DecodeStep writes them; the candidate's check against eager (caches included) refuses
    any other layout. The model's mask goes in as ``attention_bias`` (padding, causality and
    sliding windows as the model computed them, over all M slots, ``total_sequence_length``
    = M), rotary stays outside. Refused (a falsy MatchResult) where the heads are not
    grouped, the shapes are not those of a cache (past [B, Hkv, M, Dh], new [B, Hkv, S, Dh],
    mask [B|1, 1, S, M]), the step is not one token per row (S = 1: ONNX Runtime refuses a
    past with more new tokens at batch > 1; a prefill keeps MultiHeadAttention), or the
    mask compares no positions."""

    def __init__(self):
        super().__init__("CachedGroupQueryAttention", remove_nodes=False)

    def pattern(self, op, query_BHSDh, past_key, key_indices, key_update, past_value, value_indices, value_update,
                mask):
        key_cache = op.ScatterND(past_key, key_indices, key_update, _allow_other_attributes=True,
                                 _outputs=["key_cache"])
        value_cache = op.ScatterND(past_value, value_indices, value_update, _allow_other_attributes=True,
                                   _outputs=["value_cache"])
        key_BHMDh = op.Reshape(op.Expand(op.Unsqueeze(key_cache, [2]), pattern.ANY_VALUE), pattern.ANY_VALUE,
                               _outputs=["key_BHMDh"])
        value_BHMDh = op.Reshape(op.Expand(op.Unsqueeze(value_cache, [2]), pattern.ANY_VALUE), pattern.ANY_VALUE,
                                 _outputs=["value_BHMDh"])
        attention_BHSDh = op.SDPA(query_BHSDh, key_BHMDh, value_BHMDh, mask, key_format="BHSd",
                                  _allow_other_attributes=True, _domain=_FUSION_DOMAIN, _outputs=["attention_BHSDh"])
        attention_BSHDh = op.Transpose(attention_BHSDh, perm=[0, 2, 1, 3])
        attention_BSD = op.Reshape(attention_BSHDh, pattern.ANY_VALUE, _outputs=["attention_BSD"])
        return attention_BSD, key_cache, value_cache

    @staticmethod
    def _new_states(update: ir.Value) -> ir.Value:
        """The step's keys or values a ScatterND writes: its update, or what an Expand of it
        broadcast (``index_put`` exports the broadcast of its values to the indices' shape)."""
        producer = update.producer()
        return producer.inputs[0] if producer is not None and producer.op_type == "Expand" else update

    def check(self, context, query_BHSDh, past_key, key_indices, key_update, past_value, value_indices,
              value_update, key_cache, value_cache, key_BHMDh, value_BHMDh, mask, attention_BSD,
              **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        key_BHkvSDh, value_BHkvSDh = self._new_states(key_update), self._new_states(value_update)
        dims: dict = {}
        for value, names in ((query_BHSDh, "B H S Dh"), (key_BHkvSDh, "B Hkv S Dh"), (value_BHkvSDh, "B Hkv S Dh"),
                             (past_key, "B Hkv M Dh"), (past_value, "B Hkv M Dh"), (key_cache, "B Hkv M Dh"),
                             (value_cache, "B Hkv M Dh"), (key_BHMDh, "B H M Dh"), (value_BHMDh, "B H M Dh"),
                             (attention_BSD, "B S D")):
            if not _fusion_utils.check_shape_bool(dims, value, names.split()):
                return result.fail(f"{value.name} is not [{names}] (not a step over a static cache)", value)
        if dims["S"] != 1:  # ONNX Runtime: "batch_size must be 1 when sequence_length > 1 and past context is given"
            return result.fail(f"{dims['S']} new tokens per row: GroupQueryAttention takes a past with one", query_BHSDh)
        for indices in (key_indices, value_indices):
            if indices.shape is None or indices.shape.rank() != 4 or indices.shape[3] != 3:
                return result.fail("the cache write's indices are not [B, Hkv, S, 3] (row, head, slot)", indices)
        if past_key.dtype != query_BHSDh.dtype or past_value.dtype != query_BHSDh.dtype:
            return result.fail("the caches are not of the query's dtype", past_key)
        if failure := _grouped_causal_failure(result, dims, query_BHSDh, mask, "M"):
            return failure
        self._heads, self._kv_heads = dims["H"], dims["Hkv"]
        return result

    def rewrite(self, op, query_BHSDh, past_key, key_indices, key_update, past_value, value_update, mask,
                attention_BHSDh, **_):
        key_BHkvSDh, value_BHkvSDh = self._new_states(key_update), self._new_states(value_update)

        def scalar(number):
            return op.Constant(value=ir.tensor(np.array(number, dtype=np.int64)))

        # the slot of each row's last new token, head 0: indices[:, 0, S - 1, 2]
        first_head = op.Gather(key_indices, scalar(0), axis=1)  # [B, S, 3]
        last_token = op.Gather(first_head, scalar(-1), axis=1)  # [B, 3]
        seqlens_k = op.Cast(op.Gather(last_token, scalar(2), axis=1), to=ir.DataType.INT32)  # [B]
        total_sequence_length = op.Squeeze(op.Cast(op.Shape(past_key, start=2, end=3), to=ir.DataType.INT32))
        output, present_key, present_value = op.GroupQueryAttention(
            _flat_heads(op, query_BHSDh), _flat_heads(op, key_BHkvSDh), _flat_heads(op, value_BHkvSDh), past_key,
            past_value, seqlens_k, total_sequence_length, None, None, None, _attention_bias(op, mask),
            num_heads=self._heads, kv_num_heads=self._kv_heads, _domain=_CONTRIB, _outputs=3,
            **_scale_of(attention_BHSDh))
        return output, present_key, present_value


_cached_gqa_rules = pattern.RewriteRuleSet([CachedGroupQueryAttention.rule()])


# -- the rotary in GroupQueryAttention's layout ---------------------------------------------


class _FlatHeadsRotary(pattern.RewriteRuleClassBase):
    """GroupQueryAttention takes its query and key as [B, S, H * Dh]; the rules above give
    it the model's rotated [B, H, S, Dh] flattened back (``_flat_heads``), so each is
    Reshape -> Transpose -> RotaryEmbedding -> Transpose -> Reshape: two Transpose kernels per
    tensor and layer (on an H100, 50 µs of a b1 s256 Llama prefill, 190 µs at b8 s512).
    ONNX Runtime's RotaryEmbedding rotates a 3-D [B, S, H * Dh] given ``num_heads``: the
    same rotation, neither Transpose. Refused where the shapes do not show the [B, S, D] ->
    [B, H, S, Dh] split and its inverse, or the rotary packs its batch."""

    def __init__(self):
        super().__init__("FlatHeadsRotary")

    def pattern(self, op, x_BSHDh, position_ids, cos, sin, flat_shape):
        # the split Reshape before the Transpose is not matched (not removed): Shapes read it
        rotated = op.RotaryEmbedding(op.Transpose(x_BSHDh, perm=[0, 2, 1, 3]), position_ids, cos, sin,
                                     _domain=_CONTRIB, _allow_other_attributes=True, _outputs=["rotated"])
        return op.Reshape(op.Transpose(rotated, perm=[0, 2, 1, 3]), flat_shape, _outputs=["rotated_BSD"])

    def check(self, context, x_BSHDh, rotated, rotated_BSD, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        split = x_BSHDh.producer()
        if split is None or split.op_type != "Reshape" or split.domain not in ("", "ai.onnx"):
            return result.fail("the rotated tensor is not a Reshape of [B, S, D] into heads", x_BSHDh)
        x_BSD = self._x_BSD = split.inputs[0]
        dims: dict = {}
        for value, names in ((x_BSD, "B S D"), (x_BSHDh, "B S H Dh"), (rotated, "B H S Dh"), (rotated_BSD, "B S D")):
            if not _fusion_utils.check_shape_bool(dims, value, names.split()):
                return result.fail(f"{value.name} is not [{names}]", value)
        heads, head_size, hidden = dims["H"], dims["Dh"], dims["D"]
        if not all(isinstance(d, int) for d in (heads, head_size, hidden)) or heads * head_size != hidden:
            return result.fail(f"[B, S, {hidden}] is not split into {heads} heads of {head_size}", x_BSD)
        node = rotated.producer()
        if node.attributes.get_int("is_packed_batching", 0):
            return result.fail("a packed-batch rotary", rotated)
        self._heads = heads
        return result

    def rewrite(self, op, position_ids, cos, sin, rotated, **_):
        attributes = {name: attr.value for name, attr in rotated.producer().attributes.items()}
        attributes["num_heads"] = self._heads
        return op.RotaryEmbedding(self._x_BSD, position_ids, cos, sin, _domain=_CONTRIB, **attributes)


class _ShapeThroughTranspose(pattern.RewriteRuleClassBase):
    """``Shape(Transpose(x), start, end)`` where the transpose keeps axes start..end in place
    (the batch of a [B, S, H, Dh] -> [B, H, S, Dh] one, which the cos / sin cache rules read)
    -> ``Shape(x, start, end)``: the Transpose then runs only where its values are used."""

    def __init__(self):
        super().__init__("ShapeThroughTranspose", remove_nodes=False)  # the Transpose has other readers

    def pattern(self, op, x):
        return op.Shape(op.Transpose(x, _allow_other_attributes=True, _outputs=["transposed"]),
                        _allow_other_attributes=True, _outputs=["shape"])

    def check(self, context, x, transposed, shape, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        perm = transposed.producer().attributes.get_ints("perm", None)
        rank = x.shape.rank() if x.shape is not None else None
        if perm is None or rank is None:
            return result.fail("the transpose's perm or its input's rank is unknown", transposed)
        attributes = shape.producer().attributes
        start, end = attributes.get_int("start", 0), attributes.get_int("end", rank)
        start, end = start + rank if start < 0 else start, min(end + rank if end < 0 else end, rank)
        if list(perm[start:end]) != list(range(start, end)):
            return result.fail(f"perm {list(perm)} moves axes {start}..{end}", transposed)
        self._start, self._end = start, end
        return result

    def rewrite(self, op, x, **_):
        return op.Shape(x, start=self._start, end=self._end)


_shape_through_transpose_rules = pattern.RewriteRuleSet([_ShapeThroughTranspose.rule()])
_flat_heads_rotary_rules = pattern.RewriteRuleSet([_FlatHeadsRotary.rule()])


# -- MultiHeadAttention that keeps the rotary it takes in ----------------------------------

#: RotaryEmbedding attributes onnxscript's MultiHeadAttention rewrite drops (it rebuilds the
#: query's and key's rotary with none), at the values that make dropping them harmless.
_ROTARY_DEFAULTS = {"interleaved": 0, "rotary_embedding_dim": 0, "is_packed_batching": 0, "scale": 1.0}


class _RotaryKeepingMultiHeadAttention(mha.MultiHeadAttention):
    """onnxscript's MultiHeadAttention rules, refused where the rotary they take into the
    match has an attribute their rewrite would drop: ``rotary_embedding_dim`` (a partial
    rotary, Phi3 / Phi-4-mini's ``partial_rotary_factor``: the whole head was rotated, a
    Phi3 prefill over a cache off by 2.1), ``interleaved``, a scale. (``num_heads`` is
    dropped harmlessly: without a rotary dimension ORT reads the head size from the cache.)"""

    def check(self, context, **bindings) -> pattern.MatchResult:
        result = super().check(context, **bindings)
        if not result or not self._is_rotary:
            return result
        for node in context.nodes:
            if node.op_type != "RotaryEmbedding" or node.domain != _CONTRIB:
                continue
            for name, attribute in node.attributes.items():
                if name != "num_heads" and attribute.value != _ROTARY_DEFAULTS.get(name):
                    return result.fail(f"the rotary's {name}={attribute.value} would be dropped by the rewrite",
                                       node.outputs[0])
        return result


def _mha_rules(has_past_present: bool) -> pattern.RewriteRuleSet:
    """onnxscript's ``mha._make_rule_set`` with the rotary-keeping rule."""
    return pattern.RewriteRuleSet([
        _RotaryKeepingMultiHeadAttention.rule(
            f"MHA{'_Rotary' if rotary else ''}{'_Past' if has_past_present else ''}{'_CrossAttention' if cross else ''}",
            is_rotary=rotary, has_past_present=has_past_present, is_cross_attention=cross)
        for rotary in (False, True) for cross in ((False,) if has_past_present else (False, True))])


_mha_rules_with_past, _mha_rules_no_past = _mha_rules(True), _mha_rules(False)


# -- the sequence ------------------------------------------------------------------------

def _apply(rules, model: ir.Model, **kwargs) -> int:
    return _fusion_utils.apply_fusion_rules(rules)(model, **kwargs)


def optimize_for_ort(model: ir.Model, caches_in_place: bool = False) -> tuple[ir.Model, dict[str, int]]:
    """onnxscript's ``optimize_for_ort`` in its order, with the cos/sin-cache rules replaced
    by the per-row and elementwise variants and its GQA rule by MaskedGroupQueryAttention;
    with ``caches_in_place`` (the graph's outputs written into its inputs' buffers), a step
    over a static KV cache becomes CachedGroupQueryAttention. Returns the model (changed in
    place) and the count of each fusion."""
    rewrite(model, [_gemm_to_matmul_add.gemm_to_matmul_add_rule])
    common_passes.ShapeInferencePass()(model)
    optimize(model)
    shape_optimization.rules.apply_to_model(model)
    optimize(model)
    counts = {
        "erf_gelu": erfgelu.fuse_erfgelu(model),
        "rms_normalization": rms_normalization.fuse_rms_normalization(model),
        "skip_layer_normalization": skip_normalization.fuse_skip_layer_normalization(model),
        "skip_rms_normalization": skip_normalization.fuse_skip_rms_normalization(model),
        "rotary_embedding": rotary_embedding.fuse_rotary_embedding(model),
        "cos_sin_cache": _apply(_cos_sin_cache_rules(), model),
    }
    common_passes.CommonSubexpressionEliminationPass()(model)
    counts["partial_rotary_embedding"] = rotary_embedding.fuse_partial_rotary_embedding(model)
    counts["flat_key_transpose"] = _apply(_flat_key_transpose_rules, model)
    counts["sdpa"] = sdpa.fuse_sdpa(model, apply_shape_inference=True)
    counts["masked_gqa"] = _apply(_masked_gqa_rules, model)
    if caches_in_place:
        counts["cached_gqa"] = _apply(_cached_gqa_rules, model)
    counts["mha1"] = _apply(_mha_rules_with_past, model)  # onnxscript's fuse_mha1 / fuse_mha2, rotary kept
    counts["mha2"] = _apply(_mha_rules_no_past, model)
    counts["mha_scale"] = mha_scale.fuse_mha_scale(model)
    if counts["mha1"] or counts["mha2"]:
        counts["mha_bias"] = mha_bias.fuse_mha_bias(model)
        counts["attention"] = attention.fuse_attention(model)
    counts["gelu"] = gelu.fuse_gelu(model)
    counts["bias_gelu"] = bias_gelu.fuse_bias_gelu(model)
    counts["sdpa_via_mha"] = sdpa_via_mha.replace_sdpa_by_mha(model)
    optimize(model)  # inlines intermediate fusion functions nothing consumed, drops dead nodes
    rewrite(model, ORT_PATTERN_REWRITE_RULES)  # onnxscript's intermediate ops -> ONNX Runtime's (RotaryEmbedding)
    # after it (the rotary is ONNX Runtime's by now; the cache writes GQA took over are gone)
    if _apply(_shape_through_transpose_rules, model):
        common_passes.RemoveUnusedNodesPass()(model)  # the Shapes replaced still read the Transposes
    counts["flat_heads_rotary"] = _apply(_flat_heads_rotary_rules, model)
    ir.passes.Sequential(
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=False, size_limit=1),
        common_passes.RemoveInitializersFromInputsPass(),
        common_passes.ShapeInferencePass(),
    )(model)
    return model, counts
