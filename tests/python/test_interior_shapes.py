"""A graph accepts every shape inside the range its samples spanned, so every candidate is
also checked at a shape between the recorded ones (a recorded sample cropped on its
dynamic axes): an export that holds only at the recorded shapes (torch.export decided a
shape-dependent branch on the example; the ONNX graph keeps no guard) is refused instead of
returning other outputs there."""

from __future__ import annotations

import json

import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState
from aitune import _core
from aitune.torch.backend.onnx_runtime_backend import NumericMismatchError


class WindowSums(torch.nn.Module):
    """Sums windows of 4, padding the sequence to a multiple of 4 first, and doubles the
    sums where it had to pad (a branch on the size, as Swin's window padding has)."""

    def forward(self, x):
        width = x.shape[-1]
        pad = (4 - width % 4) % 4
        sums = torch.nn.functional.pad(x, (0, pad)).reshape(x.shape[0], -1, 4).sum(-1)
        if pad > 0:
            sums = sums * 2
        return sums


def test_a_graph_wrong_between_the_recorded_shapes_is_refused_naming_the_crop():
    # the trace exporter keeps no condition on sizes: the crop alone finds the baked branch
    model = ait.Module(WindowSums().eval(), "window-sums",
                       strategy=cpu_strategy(tune_provider_options=False, use_dynamo=False, allow_trace_warnings=True))
    samples = [torch.randn(8), torch.randn(16)]  # both multiples of 4: the export never pads
    with pytest.raises(NumericMismatchError, match=r"input_x \[\d+, 9\]\) is a recorded sample cropped"):
        ait.tune(model, samples, ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    # the failed tune's report stays readable: every candidate, and why each failed
    # (ait_reports was empty after a failure, the reasons in the log alone; a probe)
    (report,) = model.ait_reports.values()
    assert [c.status for c in report.candidates] == ["incorrect"], report.summary_table()
    assert "aitune's probe" in report.candidates[0].reason and report.decision == "no candidate passed its checks"
    x = torch.randn(1, 9)
    torch.testing.assert_close(model(x), WindowSums()(x))  # eager: padded and doubled


@pytest.mark.parametrize("eager_fallback", [False, True])
def test_a_crop_across_a_condition_the_export_found_leaves_the_graph_refusing_those_sizes(eager_fallback):
    """torch.export keeps the branch as a condition (width % 4 == 0): the crop to 9 lands
    across it, and the graph refuses 9 instead of failing the tune there (it stayed eager
    before). The crop's check in the report says it was not run through the graph."""
    model = ait.Module(WindowSums().eval(), "window-sums", strategy=cpu_strategy(tune_provider_options=False),
                       eager_fallback=eager_fallback)
    ait.tune(model, [torch.randn(8), torch.randn(16)], ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.TUNED
    (report,) = [json.loads(r.to_json()) for r in model.ait_reports.values()]
    (crop,) = [s for s in report["candidates"][0]["correctness"]["samples"] if "not_run" in s]
    assert "aitune's probe" in crop["sample"] and "% 4" in crop["not_run"] and crop["passed"]
    assert any("% 4" in c for c in report["shape_conditions"])
    x = torch.randn(2, 12)  # a multiple of 4 between the recorded sizes: the graph's
    model.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a size the graph holds")
    torch.testing.assert_close(model(x), WindowSums()(x))
    del model.ait_module.forward
    x = torch.randn(2, 9)
    if eager_fallback:
        torch.testing.assert_close(model(x), WindowSums()(x))  # padded and doubled, eagerly
    else:
        with pytest.raises(_core.ShapeMismatchError, match=r"input_x \[2, 9\] violate"):
            model(x)


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


def test_a_graph_right_between_the_recorded_shapes_tunes_and_runs_there():
    inner = Scaled().eval()
    model = ait.Module(inner, "scaled", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(2, 8), torch.randn(2, 16)], ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.TUNED
    (graph,) = model.ait_graphs
    assert [list(s.inputs[0].shape) for s in graph.samples][-1] == [2, 2, 9]  # the crop, checked with the rest
    x = torch.randn(1, 2, 11)
    model.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a tuned module")
    with torch.no_grad():
        torch.testing.assert_close(model(x), inner.conv(x), atol=1e-5, rtol=1e-5)


class PadsToMultiple(torch.nn.Module):
    """Pads the sequence to a multiple of 4 and returns how much it padded, a Python int
    (as Swin-style code does)."""

    def forward(self, x):
        pad = (-x.shape[-2]) % 4
        return torch.nn.functional.pad(x, (0, 0, 0, pad)), pad


def test_a_number_returned_that_differs_between_the_recorded_shapes_is_refused_naming_it():
    """Recorded at lengths 4 and 8 (pad 0 both times), the graph took every length in
    4..8 and returned pad 0 at 5, 6 and 7, where eager pads 3, 2 and 1: the crop to 5 saw
    the other value, but its error was swallowed. A graph returns the recorded Python
    values at every size of its range, so the tune is refused naming the output and the
    crop, and the module stays eager (the right pad at every length)."""
    model = ait.Module(PadsToMultiple().eval(), "pads", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ValueError, match=r"(?s)input_x \[\d+, 5, 2\].*output \[1\]: int 0 .* int 3"):
        ait.tune(model, [torch.randn(4, 2), torch.randn(8, 2)], ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    for seq in (4, 5, 6, 7, 8):
        x = torch.randn(1, seq, 2)
        with torch.no_grad():
            assert model(x)[1] == PadsToMultiple()(x)[1] == (-seq) % 4


class FlagsBatchOfThree(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x), x.shape[0] == 3


def test_a_flag_returned_that_differs_at_a_batch_between_the_recorded_ones_is_refused_naming_it():
    """The crop leaves the batch axis alone: recorded at batches 2 and 4 (flag False both
    times), the graph took batch 3 and returned False there, where eager says True. Forward
    runs at batch 3 too, and the tune is refused naming it; the module stays eager."""
    model = ait.Module(FlagsBatchOfThree().eval(), "flags-3", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ValueError, match=r"(?s)input_x \[3, 4\].*output \[1\]: bool False .* bool True"):
        ait.tune(model, [torch.randn(4) for _ in range(8)], batch_sizes=[2, 4], ignore_failing_modules=False,
                 progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    with torch.no_grad():
        assert [model(torch.randn(b, 4))[1] for b in (2, 3, 4)] == [False, True, False]
