"""Issue 27 item 1: a data-dependent branch is never baked into a graph silently."""

from __future__ import annotations

import logging

import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState
from aitune.torch.export import ExportError, TraceWarningError


class SignBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # the line the refusal names
            return self.linear(x) + 2.0
        return self.linear(x) - 2.0


def _positive():
    return [torch.rand(4) + 0.1 for _ in range(4)]


def test_trace_export_with_a_value_branch_is_refused_naming_the_line():
    model = ait.Module(SignBranch().eval(), "sign", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    with pytest.raises(TraceWarningError) as refused:
        ait.tune(model, _positive(), ignore_failing_modules=False)
    text = str(refused.value)
    assert "test_semantics_control_flow.py" in text and "if x.sum() > 0:" in text
    assert "torch.cond" in text and "allow_trace_warnings=True" in text
    assert model.ait_state is ModuleState.PASSTHROUGH
    x = -torch.rand(2, 4) - 0.1  # the other branch: still eager, still right
    torch.testing.assert_close(model(x), model.ait_module(x))


class CountBranch(torch.nn.Module):
    """Branches on the size of what the values select: a shape of a value-shaped result."""

    def __init__(self, how: str):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.how = how

    def forward(self, x):
        if self.how == "len":
            count = len(torch.nonzero(x > 0))
        elif self.how == "mask":
            count = x[x > 0].shape[0]
        else:
            count = torch.unique(torch.sign(x)).numel()
        if count > 2:  # the line the refusal names (or the len() above it)
            return self.linear(x)
        return -self.linear(x)


@pytest.mark.parametrize("how", ["len", "mask", "unique"])
def test_trace_export_of_a_branch_on_a_value_shaped_size_is_refused(how):
    """``len(nonzero(x > 0))`` and ``x[x > 0].shape[0]`` were taken for shapes, which the
    samples' check covers: the trace kept the positive samples' branch and returned every
    sign flipped (or 100x off) for negative inputs, silently. They are values."""
    model = ait.Module(CountBranch(how).eval(), f"count-{how}",
                       strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    with pytest.raises(TraceWarningError, match=r"test_semantics_control_flow.py:\d+: (count = len|if count > 2:)"):
        ait.tune(model, _positive(), ignore_failing_modules=False)
    x = -torch.rand(2, 4) - 0.1
    torch.testing.assert_close(model(x), model.ait_module(x))


def test_trace_export_refused_also_when_external_logging_is_disabled():
    model = ait.Module(SignBranch().eval(), "sign", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    with pytest.raises(TraceWarningError, match=r"if x.sum\(\) > 0:"):
        ait.tune(model, _positive(), ignore_failing_modules=False, disable_external_logging=True)


def test_allow_trace_warnings_exports_and_says_so(caplog):
    strategy = cpu_strategy(use_dynamo=False, tune_provider_options=False, allow_trace_warnings=True)
    model = ait.Module(SignBranch().eval(), "sign", strategy=strategy)
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.tune(model, _positive(), ignore_failing_modules=False)
    assert model.ait_state is ModuleState.TUNED
    assert any("if x.sum() > 0:" in r.getMessage() and "allow_trace_warnings=True" in r.getMessage()
               for r in caplog.records)
    (report,) = model.ait_reports.values()
    assert all("allow_trace_warnings=True" in c.backend for c in report.candidates)


def test_dynamo_refusal_names_torch_cond_first_and_the_trace_risk():
    model = ait.Module(SignBranch().eval(), "sign", strategy=cpu_strategy(use_dynamo=True, tune_provider_options=False))
    with pytest.raises(ExportError) as refused:
        ait.tune(model, _positive(), ignore_failing_modules=False, disable_external_logging=True)
    hint = str(refused.value).split("Hint:", 1)[1]
    assert hint.index("torch.cond") < hint.index("use_dynamo=False")
    assert "only the branch the example input takes" in hint


class ShapeTensorBranch(torch.nn.Module):
    """Branches on a size read as a tensor (``torch._shape_as_tensor``, how some tracers and
    exporters read ``x.shape``): a shape, which the samples' check covers."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        if torch._shape_as_tensor(x)[0] > 1:
            return self.linear(x)
        return -self.linear(x)


def test_trace_export_of_a_branch_on_a_size_read_as_a_tensor_is_a_shape():
    """A size read as a tensor (``aten::_shape_as_tensor``) is a shape, not a value: not
    refused; the graph serves batch 3 too (the branch ``> 1`` decides alike over 2..4)."""
    model = ait.Module(ShapeTensorBranch().eval(), "shape-tensor",
                       strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False), eager_fallback=True)
    ait.tune(model, _positive(), batch_sizes=[2, 4], ignore_failing_modules=False)
    assert model.ait_state is ModuleState.TUNED
    for batch in (2, 3, 4):  # 3 runs eagerly
        x = torch.rand(batch, 4)
        torch.testing.assert_close(model(x), model.ait_module(x))


class BoolMaskIndexedByPositions(torch.nn.Module):
    """transformers 5's padding mask (``masking_utils``): a boolean mask indexed by position
    tensors, ``mask[batch, kv]``, whose result has the positions' shape, not one that follows
    the mask's values; a branch on a later size is a branch on a shape."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, mask):
        rows = torch.arange(x.shape[0])[:, None]
        cols = torch.arange(x.shape[1])[None, :]
        y = self.linear(x) * mask[rows, cols][..., None]
        if y.shape[1] > 1:  # transformers' ``q_length > 1`` in sdpa_attention.py
            return y + 1.0
        return y - 1.0


def test_trace_export_of_a_size_after_a_bool_mask_indexed_by_positions_is_a_shape():
    """Issue 28's GPU suite: the trace export of a BERT called with an attention mask was
    refused for transformers' ``q_length > 1``: indexing the boolean padding mask by position
    tensors was taken for ``x[x > 0]`` (the indexed tensor's dtype was read as the index's),
    so the size after it counted as a value of the inputs. Fails without the fix."""
    model = ait.Module(BoolMaskIndexedByPositions().eval(), "bool-mask-index",
                       strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    samples = [{"x": torch.randn(6, 4), "mask": torch.rand(6) > 0.3} for _ in range(4)]
    ait.tune(model, samples, batch_sizes=[2], ignore_failing_modules=False)
    assert model.ait_state is ModuleState.TUNED
    x, mask = torch.randn(2, 6, 4), torch.rand(2, 6) > 0.5
    torch.testing.assert_close(model(x=x, mask=mask), model.ait_module(x=x, mask=mask))


class RoutedExperts(torch.nn.Module):
    """A mixture of experts' routing as DBRX writes it: a loop over the experts a batch hit
    (``nonzero`` of the routing), whose trip count the trace keeps."""

    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(4, 3)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        choice = self.router(x).argmax(-1)
        every = torch.stack([expert(x) for expert in self.experts])  # [experts, B, 4]
        out = torch.zeros_like(x)
        hit = torch.nonzero((choice[:, None] == torch.arange(3)).sum(0) > 0)[:, 0]
        for expert in hit:  # the line the refusal names (no other conversion in this forward)
            out = out + (choice == expert)[:, None] * every[expert]
        return out


def test_a_trace_looping_over_a_value_shaped_tensor_is_refused_naming_the_loop():
    """``for expert in nonzero(...)`` was not among the conversions watched: the trace kept
    the example's experts silently, and an input routed to fewer failed in ONNX Runtime's
    Split at call time (a session-34 probe with DBRX)."""
    model = ait.Module(RoutedExperts().eval(), "experts",
                       strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    with pytest.raises(TraceWarningError, match=r"test_semantics_control_flow.py:\d+: for expert in hit:"):
        ait.tune(model, [torch.randn(4) for _ in range(6)], ignore_failing_modules=False)
    assert model.ait_state is ModuleState.PASSTHROUGH


class CompareBranch(torch.nn.Module):
    """Branches on a comparison that answers a Python bool without a traced node."""

    def __init__(self, how: str):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.how = how

    def forward(self, x, mask):
        zeros = torch.zeros_like(mask)
        if self.how == "torch.equal":
            skip = torch.equal(mask, zeros)
        elif self.how == "torch.allclose":
            skip = torch.allclose(mask, zeros)
        elif self.how == "Tensor.equal":
            skip = mask.equal(zeros)
        elif self.how == "torch.is_nonzero":
            skip = not torch.is_nonzero(mask.sum() > 0)
        else:
            skip = mask.detach().numpy().sum() == 0
        return x if skip else self.linear(x) * mask


@pytest.mark.parametrize("how", ["torch.equal", "torch.allclose", "Tensor.equal", "torch.is_nonzero", "Tensor.numpy"])
def test_trace_export_of_a_branch_on_a_comparison_of_values_is_refused(how):
    """``torch.equal`` / ``allclose`` / ``is_nonzero`` / ``.numpy()`` were not among the
    conversions watched and leave no TracerWarning: the trace of samples with an all-ones
    mask returned ``linear(x) * 0`` for a zero mask where eager returns x, silently (a
    session-35 probe, through FirstWinsStrategy([dynamo, trace]))."""
    model = ait.Module(CompareBranch(how).eval(), "compare",
                       strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    samples = [(torch.randn(8), torch.ones(8)) for _ in range(4)]
    with pytest.raises(TraceWarningError, match=rf"\({how} of a value computed from the inputs\)"):
        ait.tune(model, samples, ignore_failing_modules=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    x = torch.randn(2, 8)
    torch.testing.assert_close(model(x, torch.zeros(2, 8)), x)


class DataRead(torch.nn.Module):
    """Old-style code: values read through ``.data``, weights too."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = torch.nn.functional.linear(x, self.linear.weight.data, self.linear.bias)  # a weight's .data: fine
        peak = h.data.abs().max()
        if peak > 10:
            h = h * (10 / peak)
        return h


def test_trace_export_of_a_value_read_through_data_is_refused_and_a_weights_is_not():
    """``h.data`` is a tensor the tracer does not follow: ``peak = h.data.abs().max(); if peak >
    10`` left no TracerWarning, and the trace of small samples served a 10x larger output for a
    large input, silently, through FirstWinsStrategy([dynamo, trace]) (a session-37 probe).
    A weight's ``.data`` (the same value on every input) is no conversion."""
    model = ait.Module(DataRead().eval(), "data-read",
                       strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    with pytest.raises(TraceWarningError, match=r"peak = h\.data\.abs\(\)\.max\(\)  \(Tensor\.data of a value") as refused:
        ait.tune(model, [torch.randn(4) for _ in range(4)], ignore_failing_modules=False)
    assert "self.linear.weight.data" not in str(refused.value)
    assert "data" not in vars(torch.Tensor)  # the watch is gone after the export
    x = 100 * torch.randn(2, 4)
    torch.testing.assert_close(model(x), model.ait_module(x))
