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
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from typing import Optional

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


def log1p(self: TFloat) -> TFloat:
    """log1p(Tensor self) -> Tensor: Goldberg's ``log(u) * x / (u - 1)`` with ``u = 1 + x``,
    exact to a few ulps where ``log(1 + x)`` (torchlib's) loses every digit of a small x
    (``log1p(1e-8) / 1e-8`` gave 0, PyTorch 1; a session-32 probe); x itself where u rounds
    to 1 (-0.0 kept), ``log(u)`` where u is infinite."""
    one = _like(1.0, self)
    u = op.Add(self, one)
    u_minus_one = op.Sub(u, one)
    ratio = op.Mul(op.Log(u), op.Div(self, u_minus_one))
    return op.Where(op.Equal(u_minus_one, _like(0.0, self)), self, op.Where(op.IsInf(u), op.Log(u), ratio))


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


def _trace_log1p(g, x):
    """The trace exporter's ``aten::log1p`` as ``log1p`` above (its own is ``log(1 + x)``,
    off by 100 % at 1e-8 there too)."""
    one = g.op("CastLike", g.op("Constant", value_t=torch.tensor(1.0)), x)
    zero = g.op("CastLike", g.op("Constant", value_t=torch.tensor(0.0)), x)
    u = g.op("Add", x, one)
    u_minus_one = g.op("Sub", u, one)
    ratio = g.op("Mul", g.op("Log", u), g.op("Div", x, u_minus_one))
    return g.op("Where", g.op("Equal", u_minus_one, zero), x, g.op("Where", g.op("IsInf", u), g.op("Log", u), ratio))


@contextlib.contextmanager
def exact_trace_symbolics() -> Iterator[None]:
    """While active, the trace exporter (``torch.onnx.export(dynamo=False)``) translates the
    ops above it would compute otherwise (``log1p``) as the dynamo export does; its own
    symbolics are back after (the registration is process-wide). From opset 15 (CastLike)."""
    from torch.onnx import register_custom_op_symbolic, unregister_custom_op_symbolic

    register_custom_op_symbolic("aten::log1p", _trace_log1p, 15)
    try:
        yield
    finally:
        unregister_custom_op_symbolic("aten::log1p", 15)


def translation_table() -> dict:
    """The aten overloads above, for ``torch.onnx.export(custom_translation_table=...)``."""
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
        aten.special_log_ndtr.default: log_ndtr,
    }
