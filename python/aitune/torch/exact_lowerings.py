"""ONNX translations, for the dynamo export, of aten ops whose translation in onnxscript's
torchlib computes other numbers than PyTorch on inputs a tune's samples rarely hold: each
one here computes what PyTorch's CPU kernel computes, written with ONNX's exact integer and
``fmod`` operators. Handed to ``torch.onnx.export(custom_translation_table=...)``, the
exporter's own way to replace a translation.

Found by a new-user probe (session 30), each tuned and checked at small samples, silently
off at others:

- integer ``div`` with ``rounding_mode`` "trunc" or "floor" went through float32: 2**24 + 1
  divided by 1 gave 2**24, int32 2**31 - 1 gave -2**31;
- ``atan2(+0.0, x < 0)`` gave -pi where PyTorch gives +pi (the phase of a negative real
  number), ``atan2(+-0, -0.0)`` gave 0, and a NaN input gave 0;
- float ``remainder`` (``t % 0.1``) and ``floor_divide`` computed ``a - b * floor(a / b)``:
  3e6 + 0.01 mod 0.1 gave 0.0 (PyTorch 0.0553), and quotients near 1.6e7 were off by one.

Left as torchlib translates them: ``atan2`` of two infinities (PyTorch gives pi / 4
multiples; here NaN), integer ``div`` without a rounding mode (a float32 division in both).
ONNX Runtime's CPU kernels give +0.0 for a float floor division PyTorch gives -0.0 for
(``-0.0 // 3.0``), where ONNX's reference evaluator gives -0.0 for the same graph.

Also here, ``exact_identity_constants``: onnxscript's no-op rules, which the export's and the
fusions' optimizer run, took constants *near* 0 and 1 for them (``math.isclose``, abs_tol
1e-8, rel_tol 1e-5) and removed the operation: an RMSNorm's ``+ 1e-8`` (Helium's, Moshi's
default epsilon) was dropped, and a pad token's all-zero embedding became 0 * inf = NaN,
spread by attention to the valid tokens of its row (a new-user probe, session 31).

Log-space ops, from a session-33 probe: torchlib's ``log(sigmoid(x))``, ``log(exp(a) + exp(b))``
and ``logcumsumexp``'s one shift by the axis's maximum under- and overflowed at ordinary
inputs (``logsigmoid(-20)`` -inf, BCE with logits +inf, ``logaddexp(-120, -121)`` -inf), and
``erfcx``'s ``exp(x**2) * (1 - erf(x))`` gave 0 from 4 and NaN from 10: each is translated
here as PyTorch's kernel computes it, the larger term factored out (``logcumsumexp`` a scan of
``logaddexp``, ``erfcx`` a Chebyshev series without either factor).

``scatter_reduce(reduce="mean")``, from a session-34 probe: torchlib scattered without a
reduction (last write wins), right only where no two sources meet at one place.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator

from typing import Optional

import onnxscript
import torch
from onnxscript import ir
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.ops import core as torchlib
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TReal, TTensor

_PI = 3.141592653589793
logger = logging.getLogger("aitune")


@contextlib.contextmanager
def exact_identity_constants() -> Iterator[None]:
    """While active, onnxscript's no-op rules (``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``)
    match their constant exactly, not within ``math.isclose``'s tolerances; restored after
    (the same rule objects serve the user's own onnxscript calls). Where onnxscript's
    internals moved (a version without these names), nothing is changed, and it is said."""
    try:
        from onnxscript.rewriter import _pattern_ir
        from onnxscript.rewriter.rules.common import _no_op

        constants = [value for rule in _no_op.rules.rules for node in rule._target_pattern._nodes
                     for value in node.inputs if isinstance(value, _pattern_ir.Constant)]
        saved = [(constant, constant._rel_tol, constant._abs_tol) for constant in constants]
    except (ImportError, AttributeError) as error:
        logger.info("onnxscript's no-op rules could not be made exact here (%s: %s): a constant within 1e-8 of 0 "
                    "or 1e-5 of 1 may be removed by the export's optimizer", type(error).__name__, error)
        yield
        return
    for constant in constants:
        constant._rel_tol = constant._abs_tol = 0.0
    try:
        yield
    finally:
        for constant, rel_tol, abs_tol in saved:
            constant._rel_tol, constant._abs_tol = rel_tol, abs_tol


def _like(value: float, like):
    """A scalar constant of ``like``'s element type."""
    return op.Constant(value=ir.tensor(value, dtype=like.dtype))


def _const(value: float, dtype, ops=op):
    """A scalar constant of element type ``dtype``, made by ``ops`` (see ``_log1p``)."""
    return ops.Constant(value=ir.tensor(value, dtype=dtype))


def _negative(x):
    """Where ``x`` has its sign bit set: below zero, or -0.0 (1 / -0.0 is -inf)."""
    zero = _like(0.0, x)
    return op.Or(op.Less(x, zero), op.And(op.Equal(x, zero), op.Less(op.Div(_like(1.0, x), x), zero)))


def _float_floor_divide(a, b):
    """PyTorch's ``div_floor_floating``: the quotient of ``a - fmod(a, b)`` (exact: a
    multiple of b), moved down where the remainder and b differ in sign, rounded to the
    nearest integer; ``a / b`` where b is 0 (inf or nan, as PyTorch)."""
    zero = _like(0.0, a)
    mod = op.Mod(a, b, fmod=1)
    div = op.Div(op.Sub(a, mod), b)
    moved = op.And(op.Not(op.Equal(mod, zero)), op.Xor(op.Less(b, zero), op.Less(mod, zero)))
    div = op.Where(moved, op.Sub(div, _like(1.0, a)), div)
    floored = op.Floor(div)
    floored = op.Where(op.Greater(op.Sub(div, floored), _like(0.5, a)), op.Add(floored, _like(1.0, a)), floored)
    quotient = op.Div(a, b)
    signed_zero = op.Where(_negative(quotient), op.Neg(zero), zero)  # (x * 0 gets folded to +0)
    floored = op.Where(op.Equal(div, zero), signed_zero, floored)
    return op.Where(op.Equal(b, zero), quotient, floored)


def _float_remainder(a, b):
    """PyTorch's float ``remainder``: ``fmod`` (exact), plus b where the remainder and b
    differ in sign."""
    zero = _like(0.0, a)
    mod = op.Mod(a, b, fmod=1)
    moved = op.And(op.Not(op.Equal(mod, zero)), op.Xor(op.Less(b, zero), op.Less(mod, zero)))
    return op.Where(moved, op.Add(mod, b), mod)


def _tensor_of(value, like):
    """A Scalar argument as a tensor of ``like``'s element type (a tensor stays itself)."""
    return value if isinstance(value, ir.Value) else _like(value, like)


def div_mode(self: TReal, other: TReal, rounding_mode: Optional[str] = None) -> TReal:
    """div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor"""
    if self.dtype.is_integer() and rounding_mode == "trunc":
        return op.Div(self, other)  # ONNX divides integers truncating, as C does
    if self.dtype.is_integer() and rounding_mode == "floor":
        return torchlib.aten_floor_divide(self, other)  # exact: integer Div, moved down by one where due
    if rounding_mode == "floor":
        return _float_floor_divide(self, other)
    return torchlib.aten_div_mode(self, other, rounding_mode=rounding_mode)


def div_scalar_mode(self: TReal, other: float, rounding_mode: Optional[str] = None) -> TReal:
    """div.Scalar_mode(Tensor self, Scalar other, *, str? rounding_mode) -> Tensor"""
    return div_mode(self, _tensor_of(other, self), rounding_mode=rounding_mode)


def floor_divide(self: TTensor, other: TTensor) -> TTensor:
    """floor_divide(Tensor self, Tensor other) -> Tensor"""
    if self.dtype.is_floating_point():
        return _float_floor_divide(self, other)
    return torchlib.aten_floor_divide(self, other)  # exact for integers already


def floor_divide_scalar(self: TTensor, other: float) -> TTensor:
    """floor_divide.Scalar(Tensor self, Scalar other) -> Tensor"""
    return floor_divide(self, _tensor_of(other, self))


def remainder(self: TTensor, other: TTensor) -> TTensor:
    """remainder.Tensor(Tensor self, Tensor other) -> Tensor"""
    if self.dtype.is_floating_point():
        return _float_remainder(self, other)
    return op.Mod(self, other)  # integers: ONNX's Mod takes the divisor's sign, as Python's %


def remainder_scalar(self: TTensor, other: float) -> TTensor:
    """remainder.Scalar(Tensor self, Scalar other) -> Tensor"""
    return remainder(self, _tensor_of(other, self))


def atan2(self: TFloat, other: TFloat) -> TFloat:
    """atan2(Tensor self, Tensor other) -> Tensor: the angle of (other, self), with the
    signs of zeros as PyTorch (C's atan2) reads them, NaN where an input is NaN."""
    y, x = self, other
    pi = _like(_PI, y)
    turn = op.Where(_negative(y), op.Neg(pi), pi)  # +-pi, by the sign of y
    angle = op.Atan(op.Div(y, x))
    angle = op.Where(_negative(x), op.Add(angle, turn), angle)
    # 0 / 0: the angle of a zero vector, from the zeros' signs alone
    both_zero = op.And(op.Equal(y, _like(0.0, y)), op.Equal(x, _like(0.0, x)))
    return op.Where(both_zero, op.Where(_negative(x), turn, y), angle)


def _log1p(x, dtype, ops=op):
    """Goldberg's log1p (``log1p`` below) of ``x`` of element type ``dtype``, its nodes made
    by ``ops``: onnxscript's opset (recorded into the export) or an ``ir`` builder (a Loop's
    body, ``logcumsumexp``)."""
    one = _const(1.0, dtype, ops)
    u = ops.Add(x, one)
    u_minus_one = ops.Sub(u, one)
    ratio = ops.Mul(ops.Log(u), ops.Div(x, u_minus_one))
    return ops.Where(ops.Equal(u_minus_one, _const(0.0, dtype, ops)), x,
                     ops.Where(ops.IsInf(u), ops.Log(u), ratio))


def log1p(self: TFloat) -> TFloat:
    """log1p(Tensor self) -> Tensor: Goldberg's ``log(u) * x / (u - 1)`` with ``u = 1 + x``,
    exact to a few ulps where ``log(1 + x)`` (torchlib's) loses every digit of a small x
    (``log1p(1e-8) / 1e-8`` gave 0, PyTorch 1; a session-32 probe); x itself where u rounds
    to 1 (-0.0 kept), ``log(u)`` where u is infinite."""
    return _log1p(self, self.dtype)


def expm1(self: TFloat) -> TFloat:
    """expm1(Tensor self) -> Tensor: Kahan's ``(u - 1) * x / log(u)`` with ``u = exp(x)``,
    exact to a few ulps where ``exp(x) - 1`` (the decomposition's) loses every digit of a
    small x (``log(expm1(1e-8))`` gave -inf, PyTorch -18.4; a session-32 probe); x itself
    where u rounds to 1, -1 where it rounds to 0, u where it is infinite."""
    one = _like(1.0, self)
    minus_one = _like(-1.0, self)
    u = op.Exp(self)
    u_minus_one = op.Sub(u, one)
    ratio = op.Div(op.Mul(u_minus_one, self), op.Log(u))
    result = op.Where(op.Equal(u_minus_one, minus_one), minus_one, op.Where(op.IsInf(u), u, ratio))
    return op.Where(op.Equal(u, one), self, result)


def log_ndtr(self: TFloat) -> TFloat:
    """special_log_ndtr(Tensor self) -> Tensor: not translated. Its decomposition loses every
    digit below about -5 (0.04 off at -5, -inf from -8, NaN from -20, where PyTorch gives
    -35 and -204; a session-32 probe), and ONNX has no erfc or erfcx to do better with: the
    export fails, so no graph computes it."""
    raise NotImplementedError(
        "torch.special.log_ndtr has no exact ONNX translation (its decomposition gives -inf or NaN below about -8 "
        "where PyTorch gives finite values); the module stays in PyTorch")


def log_sigmoid(self: TFloat) -> TFloat:
    """log_sigmoid(Tensor self) -> Tensor: PyTorch's kernel, ``min(x, 0) - log1p(exp(-|x|))``,
    where torchlib's ``log(sigmoid(x))`` underflows: -inf at x = -20 (PyTorch -20), -14.844
    at -15 (a session-33 probe). BCE with logits decomposes to ``(1 - y) * x - log_sigmoid(x)``
    in the export, so this mends it too (+inf at -20 where PyTorch gives 20). ``min`` as a
    Where on ``x > 0``: a NaN stays NaN whatever a provider's Min does with one."""
    zero = _like(0.0, self)
    below_zero = op.Where(op.Greater(self, zero), zero, self)
    return op.Sub(below_zero, _log1p(op.Exp(op.Neg(op.Abs(self))), self.dtype))


_INV_LOG_2 = 1.4426950408889634  # 1 / ln(2), as PyTorch's logaddexp2 multiplies by


def _logaddexp(a, b, dtype, ops=op, base2: bool = False):
    """PyTorch's logaddexp (``base2``: logaddexp2): ``max(a, b) + log1p(exp(-|a - b|))``, the
    larger term factored out so neither exp overflows nor both underflow; two equal
    infinities give that infinity (``inf - inf`` would be NaN), a NaN gives NaN (through
    ``a - b``, whatever ONNX's Max does with it). ``ops`` as in ``_log1p``."""
    larger = ops.Max(a, b)
    gap = ops.Neg(ops.Abs(ops.Sub(a, b)))
    if base2:  # exp2 as Pow(2, gap): exact for the integer gaps exp(gap * ln 2) is not
        term = ops.Mul(_log1p(ops.Pow(_const(2.0, dtype, ops), gap), dtype, ops), _const(_INV_LOG_2, dtype, ops))
    else:
        term = _log1p(ops.Exp(gap), dtype, ops)
    same_infinity = ops.And(ops.IsInf(a), ops.Equal(a, b))
    return ops.Where(same_infinity, a, ops.Add(larger, term))


def logaddexp(self: TFloat, other: TFloat) -> TFloat:
    """logaddexp(Tensor self, Tensor other) -> Tensor: see ``_logaddexp``; torchlib's
    ``log(exp(a) + exp(b))`` gave -inf for (-120, -121) (PyTorch -119.687) and +inf for
    (95, 94) (a session-33 probe)."""
    return _logaddexp(self, other, self.dtype)


def logaddexp2(self: TFloat, other: TFloat) -> TFloat:
    """logaddexp2(Tensor self, Tensor other) -> Tensor: see ``_logaddexp``; torchlib's
    ``log2(2**a + 2**b)`` gave +inf from about 128 on."""
    return _logaddexp(self, other, self.dtype, base2=True)


def _shifted(y, k, dim: int, dtype, ops=op):
    """``y`` moved ``k`` places along ``dim``, -inf (logaddexp's identity) in the places
    emptied: pad k at the front, drop the last k. ``k``: an int64 tensor of shape [1]; a k
    beyond the axis's size leaves -inf alone."""
    axes = ops.Constant(value=ir.tensor([dim], dtype=ir.DataType.INT64))
    pads = ops.Concat(k, ops.Constant(value=ir.tensor([0], dtype=ir.DataType.INT64)), axis=0)
    padded = ops.Pad(y, pads, _const(float("-inf"), dtype, ops), axes)
    return ops.Slice(padded, ops.Constant(value=ir.tensor([0], dtype=ir.DataType.INT64)), ops.Neg(k), axes)


class _Builder(ir.tape.Tape):
    """``ops`` for a subgraph: ``body.Add(a, b)`` makes a node, its keywords the node's
    attributes, as onnxscript's opset does (onnx_ir's own such builder is private). Each
    value it makes is named ``prefix`` and a count: the export names a subgraph's values
    from the same counter as its graph's, and ONNX wants every name once in a model."""

    def __init__(self, prefix: str):
        super().__init__()
        self._prefix = prefix
        self._count = itertools.count()

    def name(self, what: str) -> str:
        return f"{self._prefix}_{what}"

    def __getattr__(self, op_type: str):
        def make(*inputs, **attributes):
            value = self.op(op_type, inputs, attributes=attributes)
            value.name = self.name(str(next(self._count)))
            return value

        return make


_LOOPS = itertools.count()  # one prefix per Loop body, for its values' names (from 0 in each export)


def logcumsumexp(self: TFloat, dim: int) -> TFloat:
    """logcumsumexp(Tensor self, int dim) -> Tensor: a scan of ``logaddexp`` (``_logaddexp``)
    along ``dim``, Hillis and Steele's: at the step of k (1, 2, 4, ...) each place takes the
    logaddexp of itself and the place k before it, so after ceil(log2(n)) steps each holds
    that of all the places up to it, each step exact as logaddexp is. PyTorch's CPU kernel
    adds in the same pairs one at a time; the results agree to a few ulps, and are finite,
    -inf, +inf or NaN where PyTorch's are. torchlib subtracted the whole axis's maximum
    before one cumulative sum of exps: terms far below the maximum underflowed
    ([-120, -200, -5, 0, 95, 2] gave -inf at the first two places, PyTorch -120), and an axis
    holding +inf, or -inf alone, gave NaN (a session-33 probe).

    An axis of a size the export keeps is unrolled (ceil(log2(n)) steps); one of a size it
    leaves symbolic runs the step in an ONNX Loop of as many trips, counted from the size
    when the graph runs (ONNX has no scan of an arbitrary operator otherwise)."""
    shape = self.shape
    if shape is not None and len(shape) == 0:
        return op.Identity(self)  # a scalar is its own logcumsumexp
    dtype = self.dtype
    size = shape[dim] if shape is not None else None
    if isinstance(size, int):
        y, k = self, 1
        while k < size:
            y = _logaddexp(_shifted(y, op.Constant(value=ir.tensor([k], dtype=ir.DataType.INT64)), dim, dtype), y,
                           dtype)
            k *= 2
        return y
    # trips: ceil(log2(n)) in double (a power of two's log2 rounded up is one identity step
    # more at worst, a logaddexp with -inf everywhere); n 0 or 1: none
    n = op.Gather(op.Shape(self), op.Constant(value=ir.tensor([dim], dtype=ir.DataType.INT64)))
    n = op.Cast(op.Max(n, op.Constant(value=ir.tensor([1], dtype=ir.DataType.INT64))), to=ir.DataType.DOUBLE)
    trips = op.Ceil(op.Div(op.Log(n), op.Constant(value=ir.tensor(0.6931471805599453, dtype=ir.DataType.DOUBLE))))
    trips = op.Cast(op.Squeeze(trips), to=ir.DataType.INT64)
    # the body: (trip, condition, y) -> (condition, y's step of k = 2 ** trip), its nodes
    # made by an ir builder (onnxscript's opset records into the outer graph)
    body = _Builder(f"logcumsumexp_step{next(_LOOPS)}")
    trip = ir.Value(name=body.name("trip"), type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    condition = ir.Value(name=body.name("condition"), type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    y = ir.Value(name=body.name("y"), type=ir.TensorType(dtype))
    k = body.Cast(body.Pow(body.Constant(value=ir.tensor(2.0, dtype=ir.DataType.DOUBLE)),
                           body.Cast(body.Unsqueeze(trip, body.Constant(value=ir.tensor([0], dtype=ir.DataType.INT64))),
                                     to=ir.DataType.DOUBLE)), to=ir.DataType.INT64)
    step = _logaddexp(_shifted(y, k, dim, dtype, body), y, dtype, body)
    condition_out = body.Identity(condition)
    step.dtype = dtype
    condition_out.dtype, condition_out.shape = ir.DataType.BOOL, ir.Shape([])
    graph = ir.Graph([trip, condition, y], [condition_out, step], nodes=body.nodes, name=body.name("graph"))
    # (by keyword: torch's recorder binds a variadic input to every positional argument,
    # M and cond included)
    return onnxscript.values.Op(op, "Loop")(M=trips, cond=None, v_initial=(self,), body=graph)


# Chebyshev coefficients of log(erfcx(z) * (2 + z) / 2) in u = (2 - z) / (2 + z), z >= 0 (u in
# (-1, 1]): fitted with numpy.polynomial.chebyshev.chebinterpolate(deg=24) against
# torch.special.erfcx in float64 (Numerical Recipes' erfccheb sums the same series, halved c0).
# Truncated after 16 terms the series is off by 1e-10 at most (float32's ulp is 6e-8); all
# 25, by 5e-15.
_ERFCX_CHEBYSHEV = (
    -0.6513268598908547, 0.6419697923564904, 0.019476473204185708, -0.00956151478680863,
    -0.0009465953444820733, 0.00036683949785280785, 4.2523324806755235e-05, -2.0278578112490945e-05,
    -1.6242900046945478e-06, 1.303655835720129e-06, 1.562644157273678e-08, -8.523809568933831e-08,
    6.529054286476926e-09, 5.059343647496768e-09, -9.913644559187097e-10, -2.2736487943461407e-10,
    9.646743957736206e-11, 2.394465990071051e-12, -6.886391464639792e-12, 8.948019378875956e-13,
    3.1324154734868355e-13, -1.1333527023161162e-13, 1.1412486553779912e-15, 6.081349041036923e-15,
    -6.549459098258569e-16,
)


def special_erfcx(self: TFloat) -> TFloat:
    """special_erfcx(Tensor self) -> Tensor: ``exp(x**2) * erfc(x)`` without either factor:
    for x >= 0 ``t * exp(S(u))`` with ``t = 2 / (2 + x)``, ``u = 2t - 1`` and S the Chebyshev
    series above (Clenshaw's recurrence), finite for every x and 0 at +inf; for x < 0
    ``2 * exp(x**2) - erfcx(-x)``, as PyTorch's kernel computes it (``x * x`` in the input's
    type, as there; inf from about -9.4, its exp overflowing there too). The series is summed
    in double for a float input: within half an ulp of the true value for x >= 0 (summed in
    float32, 4 ulps; PyTorch's float32 kernel is up to 4e-7 off itself). torchlib's
    ``exp(x**2) * (1 - erf(x))`` lost every digit from x = 4 (0 where PyTorch gives 0.137) and
    gave NaN from 10 (inf * 0; a session-33 probe)."""
    double = ir.DataType.DOUBLE
    x = self if self.dtype == double else op.Cast(self, to=double)
    terms = _ERFCX_CHEBYSHEV if self.dtype == double else _ERFCX_CHEBYSHEV[:16]

    def constant(value: float):
        return _const(value, double)

    two = constant(2.0)
    t = op.Div(two, op.Add(two, op.Abs(x)))
    u = op.Sub(op.Mul(two, t), constant(1.0))
    two_u = op.Mul(two, u)
    b1, b2 = constant(terms[-1]), constant(0.0)  # Clenshaw: b_k = c_k + 2u b_{k+1} - b_{k+2}
    for c in reversed(terms[1:-1]):
        b1, b2 = op.Add(op.Sub(op.Mul(two_u, b1), b2), constant(c)), b1
    series = op.Add(op.Sub(op.Mul(u, b1), b2), constant(terms[0]))
    of_magnitude = op.Mul(t, op.Exp(series))  # erfcx(|x|)
    if self.dtype != double:
        of_magnitude = op.Cast(of_magnitude, to=self.dtype)
    reflected = op.Sub(op.Mul(_like(2.0, self), op.Exp(op.Mul(self, self))), of_magnitude)
    return op.Where(op.Less(self, _like(0.0, self)), reflected, of_magnitude)


def scatter_reduce(self: TReal, dim: int, index, src: TReal, reduce: str, include_self: bool = True) -> TReal:
    """scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool
    include_self=True) -> Tensor: ``reduce="mean"`` as PyTorch's kernel computes it, the sum
    of what lands on each place (and self's value there, with ``include_self``) over their
    count (floor division for integers), places no index reaches keeping self's value.
    torchlib translated "mean" as a plain scatter (ONNX has no mean reduction): the last
    write won, which equals the mean only where every target is reached once, so a tune on
    samples of one-piece words passed and words of two pieces got their last piece's vector
    (a session-34 probe, 1.16 off). The other reductions are torchlib's."""
    if reduce != "mean":
        return torchlib.aten_scatter_reduce(self, dim, index, src, reduce, include_self=include_self)
    dtype = src.dtype or self.dtype
    scalar = self.shape is not None and len(self.shape) == 0
    if scalar:
        flat = op.Constant(value_ints=[-1])
        self, index, src = op.Reshape(self, flat), op.Reshape(index, flat), op.Reshape(src, flat)
    zero, one = _const(0, dtype), _const(1, dtype)
    zeros = op.ConstantOfShape(op.Shape(self), value=ir.tensor([0], dtype=dtype))
    ones = op.ConstantOfShape(op.Shape(src), value=ir.tensor([1], dtype=dtype))
    count = op.ScatterElements(zeros, index, ones, axis=dim, reduction="add")
    if include_self:
        total = op.ScatterElements(self, index, src, axis=dim, reduction="add")
        count = op.Add(count, one)
    else:  # self's value is left out where an index reaches, kept where none does
        reached = op.Greater(count, zero)
        total = op.ScatterElements(op.Where(reached, zeros, self), index, src, axis=dim, reduction="add")
        count = op.Where(reached, count, one)
    if dtype.is_integer():  # floor of total / count, count >= 1: ONNX's Div truncates, one less below zero
        quotient = op.Div(total, count)
        mean = op.Where(op.Less(op.Sub(total, op.Mul(quotient, count)), zero), op.Sub(quotient, one), quotient)
    else:
        mean = op.Div(total, count)
    return op.Squeeze(mean) if scalar else mean


def _trace_log1p(g, x):
    """The trace exporter's ``aten::log1p`` as ``log1p`` above (its own is ``log(1 + x)``,
    off by 100 % at 1e-8 there too)."""
    one = g.op("CastLike", g.op("Constant", value_t=torch.tensor(1.0)), x)
    zero = g.op("CastLike", g.op("Constant", value_t=torch.tensor(0.0)), x)
    u = g.op("Add", x, one)
    u_minus_one = g.op("Sub", u, one)
    ratio = g.op("Mul", g.op("Log", u), g.op("Div", x, u_minus_one))
    return g.op("Where", g.op("Equal", u_minus_one, zero), x, g.op("Where", g.op("IsInf", u), g.op("Log", u), ratio))


def _trace_log_sigmoid(g, x):
    """The trace exporter's ``aten::log_sigmoid`` as ``log_sigmoid`` above (its own is
    ``log(sigmoid(x))``, -inf from about -88 there too)."""
    zero = g.op("CastLike", g.op("Constant", value_t=torch.tensor(0.0)), x)
    below_zero = g.op("Where", g.op("Greater", x, zero), zero, x)
    return g.op("Sub", below_zero, _trace_log1p(g, g.op("Exp", g.op("Neg", g.op("Abs", x)))))


def _trace_bce_with_logits(g, input, target, weight, pos_weight, reduction):
    """The trace exporter's ``aten::binary_cross_entropy_with_logits`` as PyTorch's kernel
    computes it, ``(1 - y) * x - (1 + (pos_weight - 1) * y) * log_sigmoid(x)``, times weight,
    reduced; its own took ``log(sigmoid(x))`` and ``log(1 - sigmoid(x))``: +inf where PyTorch
    gives 20 at x = -20 and y = 1, and at x = 20 and y = 0."""
    from torch.onnx import symbolic_helper

    one = g.op("CastLike", g.op("Constant", value_t=torch.tensor(1.0)), input)
    log_sigmoid = _trace_log_sigmoid(g, input)
    if not symbolic_helper._is_none(pos_weight):
        log_sigmoid = g.op("Mul", g.op("Add", g.op("Mul", g.op("Sub", pos_weight, one), target), one), log_sigmoid)
    loss = g.op("Sub", g.op("Mul", g.op("Sub", one, target), input), log_sigmoid)
    if not symbolic_helper._is_none(weight):
        loss = g.op("Mul", loss, weight)
    reduction = symbolic_helper._maybe_get_const(reduction, "i")
    if reduction == 0:
        return loss
    if reduction in (1, 2):
        return g.op("ReduceMean" if reduction == 1 else "ReduceSum", loss, keepdims_i=0)
    return symbolic_helper._onnx_unsupported(f"binary_cross_entropy_with_logits with reduction {reduction}", input)


_TRACE_SYMBOLICS = {"aten::log1p": _trace_log1p, "aten::log_sigmoid": _trace_log_sigmoid,
                    "aten::binary_cross_entropy_with_logits": _trace_bce_with_logits}


@contextlib.contextmanager
def exact_trace_symbolics() -> Iterator[None]:
    """While active, the trace exporter (``torch.onnx.export(dynamo=False)``) translates the
    ops above it would compute otherwise (``log1p``, ``log_sigmoid``, BCE with logits) as the
    dynamo export does; its own symbolics are back after (the registration is
    process-wide). From opset 15 (CastLike). (``logaddexp``, ``logcumsumexp`` and ``erfcx``
    it does not export at all: the module stays in PyTorch.)"""
    from torch.onnx import register_custom_op_symbolic, unregister_custom_op_symbolic

    for name, symbolic in _TRACE_SYMBOLICS.items():
        register_custom_op_symbolic(name, symbolic, 15)
    try:
        yield
    finally:
        for name in _TRACE_SYMBOLICS:
            unregister_custom_op_symbolic(name, 15)


def translation_table() -> dict:
    """The aten overloads above, for ``torch.onnx.export(custom_translation_table=...)``;
    called once an export (the Loop bodies' names counted from 0, the same in each)."""
    global _LOOPS
    _LOOPS = itertools.count()
    aten = torch.ops.aten
    return {
        aten.div.Tensor_mode: div_mode,
        aten.div.Scalar_mode: div_scalar_mode,
        aten.floor_divide.default: floor_divide,
        aten.floor_divide.Scalar: floor_divide_scalar,
        aten.remainder.Tensor: remainder,
        aten.remainder.Scalar: remainder_scalar,
        aten.atan2.default: atan2,
        aten.log1p.default: log1p,
        aten.expm1.default: expm1,
        aten.log_sigmoid.default: log_sigmoid,
        aten.logaddexp.default: logaddexp,
        aten.logaddexp2.default: logaddexp2,
        aten.logcumsumexp.default: logcumsumexp,
        aten.special_log_ndtr.default: log_ndtr,
        aten.special_erfcx.default: special_erfcx,
        aten.scatter_reduce.two: scatter_reduce,
    }
