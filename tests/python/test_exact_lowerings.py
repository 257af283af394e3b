"""Ops whose ONNX translation in onnxscript's torchlib computed other numbers than PyTorch,
at inputs the samples did not hold (a new-user probe, session 30): the dynamo export now
translates them as PyTorch's kernels compute (exact_lowerings.py). Each tuned at small
values, then called where torchlib's translation was off, silently."""

from __future__ import annotations

import math

import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState


class IntegerDivisions(torch.nn.Module):
    def forward(self, a, b):
        return (torch.div(a, b, rounding_mode="trunc"), torch.div(a, b, rounding_mode="floor"),
                torch.div(a, 3, rounding_mode="trunc"), a // b, a % b)


class FloatOps(torch.nn.Module):
    def forward(self, x, y):
        return torch.atan2(x, y), x % 0.1, torch.remainder(x, y), x // y, torch.div(x, y, rounding_mode="floor")


def _tuned(module: torch.nn.Module, samples: list) -> ait.Module:
    tuned = ait.Module(module, type(module).__name__, strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(tuned, samples, ignore_failing_modules=False, performance_validation=False, progress=False)
    assert tuned.ait_state is ModuleState.TUNED
    assert all("ONNXRuntimeBackend" in b for b in tuned.ait_backends.values()), tuned.ait_backends
    return tuned


def test_integer_division_with_a_rounding_mode_is_exact_beyond_float32():
    """torchlib divided integers in float32: 2**24 + 1 // 1 gave 2**24, int32 2**31 - 1 gave
    -2**31."""
    for dtype in (torch.int64, torch.int32):
        torch.manual_seed(0)
        samples = [(torch.randint(-20, 20, (8,), dtype=dtype), torch.randint(1, 7, (8,), dtype=dtype))
                   for _ in range(2)]
        tuned = _tuned(IntegerDivisions().eval(), samples)
        big = 2**40 + 1 if dtype == torch.int64 else 2**31 - 1
        a = torch.tensor([[2**24 + 1, 123456789, big, -big, -(2**30) - 1, 7, -7, 100000007]], dtype=dtype)
        b = torch.tensor([[1, 1, 1, 3, 1, 2, 2, -3]], dtype=dtype)
        with torch.no_grad():
            for got, expected in zip(tuned(a, b), IntegerDivisions()(a, b), strict=True):
                assert torch.equal(got, expected), (dtype, got, expected)


def test_atan2_remainder_and_floor_division_of_floats_match_pytorch():
    """atan2(+0.0, -1.0) gave -pi (PyTorch +pi), a NaN gave 0; 3e6 + 0.01 mod 0.1 gave 0.0
    (PyTorch 0.0553); a float floor division near 1.6e7 was off by one."""
    torch.manual_seed(0)
    samples = [(torch.rand(10) * 10, torch.rand(10) + 0.5) for _ in range(2)]
    tuned = _tuned(FloatOps().eval(), samples)
    zero = 0.0
    x = torch.tensor([[zero, -zero, 1.0, -1.0, float("nan"), 3e6 + 0.01, 1e6 + 0.07, 1.6e7 + 3, -7.5, 5.0]])
    y = torch.tensor([[-1.0, -1.0, -zero, -zero, 1.0, 0.1, 0.1, 0.7, 2.0, -0.3]])
    with torch.no_grad():
        outputs = zip(tuned(x, y), FloatOps()(x, y), strict=True)
        (angle, expected), exact = next(outputs), list(outputs)
        # atan2 as atan(y / x) turned by pi: within an ulp of C's atan2
        torch.testing.assert_close(angle, expected, rtol=2e-7, atol=0, equal_nan=True)
        for got, expected in exact:
            torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    angle = tuned(x, y)[0][0]
    pi = torch.tensor(math.pi).item()  # in float32
    assert angle[0].item() == pi and angle[1].item() == -pi  # the phase of a negative real number


class TinyEpsilonNorm(torch.nn.Module):
    """An RMSNorm with eps 1e-8 (Helium's and Moshi's default) and a scale within 1e-5 of 1:
    onnxscript's no-op rules matched ``x + 1e-8`` as ``x + 0`` and ``x * 1.000005`` as ``x * 1``
    (math.isclose with abs_tol 1e-8, rel_tol 1e-5) and removed them."""

    def forward(self, x):
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8)
        return normed, x * 1.000005, x / 1.000005 - 3e-9


def test_identity_like_constants_are_kept_in_the_export():
    """A pad token's all-zero embedding through Helium's RMSNorm: eager gives 0, the export
    without the epsilon gave 0 * inf = NaN at every padded position, spread by attention
    to the valid tokens of a row with a padding hole (a new-user probe, session 31)."""
    torch.manual_seed(0)
    tuned = _tuned(TinyEpsilonNorm(), [torch.randn(4, 8) + 1 for _ in range(3)])
    x = torch.randn(2, 4, 8) * 1e3
    x[1, 2] = 0.0
    with torch.no_grad():
        got, want = tuned(x), TinyEpsilonNorm()(x)
    assert torch.isfinite(got[0]).all()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=0.0)


class SmallArguments(torch.nn.Module):
    """log1p and expm1 where their argument is tiny: what they exist for."""

    def forward(self, y):
        return torch.log1p(y) / y, torch.log(torch.expm1(y))


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_log1p_and_expm1_keep_their_digits_for_tiny_arguments(use_dynamo):
    """torchlib's log1p is log(1 + x) and expm1 decomposed to exp(x) - 1: log1p(1e-8) / 1e-8
    gave 0 (PyTorch 1) and log(expm1(1e-8)) -inf (PyTorch -18.4), tuned on y in [0.5, 1.5]
    (a session-32 probe). The trace exporter's log1p as well (its expm1 it refuses)."""
    module = SmallArguments().eval() if use_dynamo else _Log1pOnly().eval()
    tuned = ait.Module(module, f"small-{use_dynamo}",
                       strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    ait.tune(tuned, [torch.rand(8) + 0.5 for _ in range(2)], ignore_failing_modules=False,
             performance_validation=False, progress=False)
    assert tuned.ait_state is ModuleState.TUNED
    y = torch.tensor([[1e-8, 3e-8, 1e-7, -1e-7, 1e-6, -0.5, 2.0, 30.0]])
    with torch.no_grad():
        for got, expected in zip(tuned(y), module(y), strict=True):
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5, equal_nan=True)  # log of negatives


class _Log1pOnly(torch.nn.Module):
    def forward(self, y):
        return (torch.log1p(y) / y,)


class LogNdtr(torch.nn.Module):
    def forward(self, z):
        return torch.special.log_ndtr(z)


def test_log_ndtr_is_not_exported(caplog):
    """Its decomposition gave -inf from -8 and NaN from -20 where PyTorch is finite (a
    session-32 probe): the export is refused, saying why, and the module stays in PyTorch."""
    tuned = ait.Module(LogNdtr().eval(), "log-ndtr", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(tuned, [torch.randn(8) for _ in range(2)], performance_validation=False, progress=False)
    assert tuned.ait_state is ModuleState.PASSTHROUGH
    z = torch.tensor([[-5.0, -10.0, -40.0, 1.0]])
    torch.testing.assert_close(tuned(z), LogNdtr()(z))
    assert "log_ndtr has no exact ONNX translation" in caplog.text



_INF, _NAN = float("inf"), float("nan")


def _assert_matches_eager(got, expected, ulps: float = 4e-7):
    """The tuned outputs against eager: the same infinities and NaNs at the same places,
    finite values within a few float32 ulps (``rtol``), a subnormal tail (``logsigmoid(90)``
    is -8e-40) within ``atol``, as ONNX Runtime's exp may flush it to zero."""
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(torch.isnan(g), torch.isnan(e)), (g, e)
        assert torch.equal(torch.isposinf(g), torch.isposinf(e)), (g, e)
        assert torch.equal(torch.isneginf(g), torch.isneginf(e)), (g, e)
        torch.testing.assert_close(g, e, rtol=ulps, atol=1e-37, equal_nan=True)


class LogSigmoidLosses(torch.nn.Module):
    """Bradley-Terry / DPO's log-probability that a margin wins, and BCE with logits (which
    the dynamo export decomposes to ``(1 - y) * x - (1 + (pos_weight - 1) * y) * log_sigmoid(x)``,
    and the trace exporter translates as a whole)."""

    def forward(self, x, y, w):
        functional = torch.nn.functional
        return (functional.logsigmoid(x), functional.binary_cross_entropy_with_logits(x, y, reduction="none"),
                functional.binary_cross_entropy_with_logits(x, y, weight=w, pos_weight=w, reduction="none"),
                functional.binary_cross_entropy_with_logits(x[:, 1:-1], y[:, 1:-1], reduction="sum"))


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_log_sigmoid_and_bce_with_logits_stay_finite_in_the_tail(use_dynamo):
    """torchlib's log_sigmoid is ``log(sigmoid(x))``: -inf at x = -20 (PyTorch -20), -14.844 at
    -15, and BCE with logits +inf where PyTorch gives 20 (a session-33 probe); the trace
    exporter's the same, and its BCE ``log(1 - sigmoid(x))`` +inf at x = 20, y = 0 too."""
    torch.manual_seed(0)
    module = LogSigmoidLosses().eval()
    tuned = ait.Module(module, f"log-sigmoid-{use_dynamo}",
                       strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    ait.tune(tuned, [(torch.randn(8), torch.rand(8), torch.rand(8) + 0.5) for _ in range(2)],
             ignore_failing_modules=False, performance_validation=False, progress=False)
    assert tuned.ait_state is ModuleState.TUNED
    x = torch.tensor([[-_INF, -200.0, -104.0, -30.0, -20.0, -15.0, -1e-8, -0.0],
                      [0.0, 1e-8, 15.0, 20.0, 90.0, 200.0, _INF, _NAN]])
    w = torch.rand(2, 8) + 0.5
    for y in (torch.ones_like(x), torch.zeros_like(x), torch.full_like(x, 0.25)):
        with torch.no_grad():
            _assert_matches_eager(tuned(x, y, w), module(x, y, w))


class LogAddExps(torch.nn.Module):
    """Combining log-probabilities, as CTC, HMM forward passes and beam search do."""

    def forward(self, a, b):
        return torch.logaddexp(a, b), torch.logaddexp2(a, b)


def test_logaddexp_and_logaddexp2_neither_overflow_nor_underflow():
    """torchlib's logaddexp is ``log(exp(a) + exp(b))``: -inf for (-120, -121) (PyTorch
    -119.687), +inf for (95, 94); logaddexp2 +inf from about 128 (a session-33 probe). Two
    equal infinities give that infinity, as PyTorch (not inf - inf = NaN); NaN stays NaN."""
    torch.manual_seed(0)
    tuned = _tuned(LogAddExps().eval(), [(torch.randn(8), torch.randn(8)) for _ in range(2)])
    a = torch.tensor([[-_INF, _INF, -_INF, _INF, _NAN, 1.0, _NAN, _INF],
                      [-120.0, 95.0, -1e-30, 200.0, 3e38, -3e38, 88.7, -1000.0]])
    b = torch.tensor([[-_INF, _INF, _INF, -_INF, 1.0, _NAN, _INF, _NAN],
                      [-121.0, 94.0, 1e-30, 200.0, 3e38, -3e38, 88.7, -1000.5]])
    with torch.no_grad():
        for first, second in ((a, b), (b, a), (a, a.flip(-1))):
            _assert_matches_eager(tuned(first, second), LogAddExps()(first, second))


class LogCumSumExps(torch.nn.Module):
    def forward(self, a, c):
        return torch.logcumsumexp(a, dim=-1), torch.logcumsumexp(a, dim=0), torch.logcumsumexp(c, dim=-1)


def test_logcumsumexp_is_finite_wherever_pytorch_is():
    """torchlib subtracted the whole row's maximum before a cumulative sum of exps: terms
    far below it underflowed, and [-120, -200, -5, 0, 95, 2] gave -inf at the first places
    (PyTorch -120, a session-33 probe); a row holding +inf, or -inf alone, gave NaN. Along an
    axis of a size the export keeps (``c``'s 7) and of sizes it does not (``a``'s)."""
    torch.manual_seed(0)
    tuned = _tuned(LogCumSumExps().eval(), [(torch.randn(n), torch.randn(7)) for n in (5, 6)])
    rows = torch.tensor([[-120.0, -200.0, -5.0, 0.0, 95.0, 2.0, 1.0],
                         [-_INF, -_INF, 3.0, -_INF, _INF, 1.0, _INF],
                         [1.0, _NAN, 2.0, 3.0, 4.0, 5.0, 6.0],
                         [-_INF] * 7,
                         [-1000.0, -2000.0, 0.0, 1e30, -3e38, 5.0, 3e38],
                         [-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0]])
    for pair in (rows[:2], rows[2:4], rows[4:], rows[[0, 4]], rows[[3, 1]]):
        for a in (pair[:, :6], pair[:, :5]):  # other lengths than the samples' too
            with torch.no_grad():
                # (a scan of logaddexps: a few ulps more than one)
                _assert_matches_eager(tuned(a, pair), LogCumSumExps()(a, pair), ulps=1e-6)


class Erfcx(torch.nn.Module):
    def forward(self, x):
        return (torch.special.erfcx(x),)


def test_erfcx_is_finite_for_large_arguments():
    """torchlib's erfcx is ``exp(x**2) * (1 - erf(x))``: 0 from x = 4 (PyTorch 0.137 there,
    0.0561 at 10) and NaN (inf * 0) from 10 (a session-33 probe). Compared within 1e-6:
    PyTorch's own float32 kernel is up to 4e-7 off the true value."""
    torch.manual_seed(0)
    tuned = _tuned(Erfcx().eval(), [torch.randn(8) for _ in range(2)])
    x = torch.tensor([[-_INF, -30.0, -10.0, -9.0, -3.0, -0.5, -0.0, 0.0],
                      [0.5, 2.0, 4.0, 7.0, 10.0, 1e4, 1e30, _INF],
                      [_NAN, 0.05, 0.2, 1.0, 3.0, 5.0, 30.0, 60.0]])
    for rows in (x[:2], x[2:]):
        with torch.no_grad():
            _assert_matches_eager(tuned(rows), Erfcx()(rows), ulps=1e-6)


class ScatterMeans(torch.nn.Module):
    def forward(self, values, index, counts):
        base = torch.full_like(values, 5.0)
        return (base.scatter_reduce(-1, index, values, "mean", include_self=False),
                base.scatter_reduce(-1, index, values, "mean", include_self=True),
                torch.zeros_like(counts).scatter_reduce(-1, index, counts, "mean", include_self=False),
                base.scatter_reduce(-1, index, values, "sum", include_self=False))


def test_scatter_reduce_mean_averages_what_meets_at_one_place():
    """torchlib translated reduce="mean" as a plain scatter (the last write wins): tuned on
    samples whose every index is reached once, it passed; where two pieces meet at one place
    it returned the last (a word-pooling model 1.16 off, a session-34 probe). Integers
    average by floor division, as PyTorch's kernel; places no index reaches keep self."""
    torch.manual_seed(0)
    samples = [(torch.randn(6), torch.arange(6), torch.randint(-9, 9, (6,))) for _ in range(2)]
    tuned = _tuned(ScatterMeans().eval(), samples)
    index = torch.tensor([[0, 0, 1, 2, 2, 2], [0, 1, 1, 3, 3, 5]])
    values, counts = torch.randn(2, 6), torch.tensor([[3, 4, -7, 1, 2, 2], [-5, 8, 1, 0, -3, 9]])
    with torch.no_grad():
        for got, expected in zip(tuned(values, index, counts), ScatterMeans()(values, index, counts), strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
