"""A branch of the model's code on a size is never baked into a graph silently.

``if x.shape[0] == 3:`` exported at a batch of 4 gives a graph of the other branch; tuned
with batches 1, 2 and 4, a call at 3 lies inside the recorded range and ran that graph,
~100x off, silently. torch.export notes such decisions (guards, runtime asserts); the
export keeps them as conditions of the graph's spec (shape_conditions.py), and every
session of it (this process's, a checkpoint's) refuses a call that violates one."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from report_page import CHROMIUM, dump_dom, screenshot
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune import _core
from aitune.torch import cache


class BatchBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x):
        y = self.linear(x)
        if x.shape[0] == 3:
            y = y * 100
        return y


class LengthBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x):
        y = self.linear(x)
        if x.shape[-2] % 3 == 0:
            y = y + 10
        return y


def _tuned_batch_branch(eager_fallback: bool = False, batch_sizes=(1, 2, 4)) -> ait.Module:
    torch.manual_seed(0)
    model = ait.Module(BatchBranch().eval(), "batch-branch", strategy=cpu_strategy(tune_provider_options=False),
                       eager_fallback=eager_fallback)
    ait.tune(model, [torch.randn(5, 6) for _ in range(4)], batch_sizes=list(batch_sizes),
             ignore_failing_modules=False, progress=False)
    return model


def test_a_batch_the_code_branches_on_is_refused_by_the_graph_not_computed_otherwise(caplog):
    with caplog.at_level(logging.INFO, logger="aitune"):
        model = _tuned_batch_branch()
    assert "ONNXRuntimeBackend" in next(iter(model.ait_backends.values()))
    assert "the exported graph holds where `input_x.shape[0] != 3`" in caplog.text
    for batch in (1, 2, 4):  # the recorded batches run the graph and match eager
        x = torch.randn(batch, 5, 6)
        torch.testing.assert_close(model(x), model.ait_module(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(_core.ShapeMismatchError, match=r"input_x \[3, 5, 6\] violate `input_x.shape\[0\] != 3`"):
        model(torch.randn(3, 5, 6))


def test_the_report_names_the_conditions_a_person_reads(tmp_path):
    _tuned_batch_branch()
    (graph_dir,) = [p for p in cache.module_dir("batch-branch").iterdir() if (p / "tune_report.json").exists()]
    report = json.loads((graph_dir / "tune_report.json").read_text())
    assert report["shape_conditions"] == ["input_x.shape[0] != 3"] and report["shape_conditions_left_out"] == []
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it): the page was not opened")
    page = graph_dir / "tune_report.html"
    summary = dump_dom(page, tmp_path / "profile").split('id="summary"', 1)[1].split("</section>", 1)[0]
    assert "<th>ONNX graphs hold where</th>" in summary
    assert '<td id="shape_conditions"><code>input_x.shape[0] != 3</code></td>' in summary
    screenshot(page, tmp_path / "profile", tmp_path / "report.png")


def test_with_eager_fallback_the_refused_batch_runs_eagerly_and_matches():
    model = _tuned_batch_branch(eager_fallback=True)
    x = torch.randn(3, 5, 6)
    with pytest.warns(RuntimeWarning, match=r"violate `input_x.shape\[0\] != 3`.*; running eagerly"):
        out = model(x)
    torch.testing.assert_close(out, model.ait_module(x))


def test_a_recorded_sample_on_the_other_side_is_checked_not_refused(caplog):
    """Recorded at 3 too, the condition is left out: the sample at 3 is checked against
    eager, which rejects the graph exported at 4, naming the branch it crossed."""
    with caplog.at_level(logging.INFO, logger="aitune"), \
            pytest.raises(ait.NumericMismatchError,
                          match=r"\(batch 3, across `input_x.shape\[0\] != 3` from the export's example\)"):
        _tuned_batch_branch(batch_sizes=(1, 3, 4))
    assert "a recorded sample takes the other side of `input_x.shape[0] != 3`" in caplog.text


def test_a_length_the_code_branches_on_modulo_is_refused_and_the_checkpoint_keeps_it(tmp_path):
    torch.manual_seed(0)
    model = ait.Module(LengthBranch().eval(), "length-branch", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4, 6), torch.randn(8, 6)], batch_sizes=[1], ignore_failing_modules=False,
             progress=False)
    for length in (4, 5, 7, 8):
        x = torch.randn(1, length, 6)
        torch.testing.assert_close(model(x), model.ait_module(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(_core.ShapeMismatchError, match=r"`\(input_x.shape\[1\] % 3\) != 0`"):
        model(torch.randn(1, 6, 6))

    ait.save(model, tmp_path / "length.ait")
    specs = [json.loads(path.read_text()) for path in (tmp_path / "length.ait").rglob("*.json")]
    saved = [c for text in specs for c in _conditions_in(text)]
    assert ["ne", ["mod", ["dim", "input_x", 1], 3], 0] in saved
    fresh = LengthBranch().eval()
    fresh.load_state_dict(model.ait_module.state_dict())
    loaded = ait.load(ait.Module(fresh, "length-branch"), tmp_path / "length.ait")
    x = torch.randn(1, 7, 6)
    torch.testing.assert_close(loaded(x), loaded.ait_module(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(_core.ShapeMismatchError, match=r"% 3\) != 0"):
        loaded(torch.randn(1, 6, 6))
    # `aitune inspect` says so beside the ranges, which alone suggested 6 was taken
    cli = Path(sys.executable).parent / "aitune"
    if cli.exists():
        shown = subprocess.run([str(cli), "inspect", str(tmp_path / "length.ait")], capture_output=True, text=True,
                               timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert "holds only where (input_x.shape[1] % 3) != 0" in shown.stdout, shown.stdout


def _conditions_in(value) -> list:
    """Every "conditions" list in a JSON document, at any depth."""
    if isinstance(value, dict):
        found = list(value.get("conditions", [])) if isinstance(value.get("conditions"), list) else []
        return found + [c for v in value.values() for c in _conditions_in(v)]
    if isinstance(value, list):
        return [c for v in value for c in _conditions_in(v)]
    return []


class MiddleBranch(torch.nn.Module):
    """A branch only lengths 6 and 7 take: torch.export narrows the length's range (not a
    guard) at the example of 8, and the recorded 4 is on the other side of that."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x):
        y = self.linear(x)
        if 6 <= x.shape[1] <= 7:
            y = y * 2
        return y


class CeilBranch(MiddleBranch):
    def forward(self, x):
        y = self.linear(x)
        if math.ceil(x.shape[1] / 2) == 4:  # lengths 7 and 8
            y = y * 100
        return y


class FloatBranch(MiddleBranch):
    def forward(self, x):
        y = self.linear(x)
        if x.shape[1] * 0.5 == 3.0:  # length 6, a condition with no integer form
            y = y * 100
        return y


def _tuned_lengths(cls, lengths) -> ait.Module:
    torch.manual_seed(0)
    model = ait.Module(cls().eval(), cls.__name__, strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(n, 6) for n in lengths], batch_sizes=[1], ignore_failing_modules=False,
             progress=False)
    return model


def _conditions(model: ait.Module) -> list[str]:
    """The conditions of the tuned ONNX Runtime graph's session."""
    ((_, tuned),) = model._ait_tuned.values()
    return [str(c) for c in tuned.session.graph_spec.conditions]


def _served_lengths(model: ait.Module, lengths) -> list[int]:
    """The lengths the tuned graph serves (matching eager there); those it refuses are left out."""
    served = []
    for length in lengths:
        x = torch.randn(1, length, 6)
        try:
            out = model(x)
        except _core.ShapeMismatchError:
            continue
        torch.testing.assert_close(out, model.ait_module(x), rtol=1e-4, atol=1e-4)
        served.append(length)
    return served


def test_a_branch_in_the_middle_of_the_recorded_range_is_refused_there():
    """Exported at 8 and recorded at 4 too: captured again at 4, the same graph holds where
    ``len <= 5``; 6 and 7 (1.03 and 1.19 off eager before) are refused."""
    model = _tuned_lengths(MiddleBranch, (4, 8))
    assert _served_lengths(model, range(4, 9)) == [4, 5, 8]
    assert _conditions(model) == ["(input_x.shape[1] >= 8) or (input_x.shape[1] <= 5)"]


def test_ceil_of_a_size_divided_is_an_exact_condition():
    model = _tuned_lengths(CeilBranch, (4, 9))  # 7 and 8 were ~200 off eager, silently
    assert _served_lengths(model, range(4, 10)) == [4, 5, 6, 9]
    assert "ceildiv(input_x.shape[1], 2) != 4" in _conditions(model)


def test_a_condition_with_no_integer_form_pins_its_axis_to_the_checked_sizes(caplog):
    with caplog.at_level(logging.WARNING, logger="aitune"):
        model = _tuned_lengths(FloatBranch, (4, 9))  # 6 was 131 off eager, silently
    assert "`Ne(0.5*ToFloat(input_x.shape[1]), 3.0)" in caplog.text and "cannot evaluate per call" in caplog.text
    served = _served_lengths(model, range(4, 10))
    assert 6 not in served and {4, 9} <= set(served)


def test_with_a_declared_length_a_branch_on_the_undeclared_batch_is_a_condition_not_a_refusal():
    """The ranges declared (the length) are proven by torch.export; a decision on the batch,
    which aitune spans itself, was refused as if the declared ranges were wrong."""
    from torch.export import Dim

    torch.manual_seed(0)
    model = ait.Module(BatchBranch().eval(), "declared-batch-branch", strategy=cpu_strategy(tune_provider_options=False),
                       dynamic_shapes={"x": {1: Dim("seq", min=2, max=64)}})
    ait.tune(model, [torch.randn(n, 6) for n in (4, 4, 8, 8)], batch_sizes=[1, 2, 4], ignore_failing_modules=False,
             progress=False)
    assert _conditions(model) == ["input_x.shape[0] != 3"]
    for batch, length in ((1, 10), (2, 33), (4, 50)):
        x = torch.randn(batch, length, 6)
        torch.testing.assert_close(model(x), model.ait_module(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(_core.ShapeMismatchError, match=r"`input_x.shape\[0\] != 3`"):
        model(torch.randn(3, 20, 6))


def test_an_extent_with_no_linear_form_is_unreadable_not_a_failed_export():
    """``sympy.Poly`` raises on ``s // 2 + 1``: such an extent is one aitune cannot read (and
    says so), never an exception out of the export."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    from aitune.torch import shape_conditions

    s = sympy.Symbol("s0", integer=True, positive=True)
    with pytest.raises(shape_conditions._Unreadable):
        shape_conditions._derived(["dim", "input_x", 1], FloorDiv(s, 2) + 1, {})
    assert shape_conditions._derived(["dim", "input_x", 1], 2 * s + 1, {}) == \
        ["eq", ["mod", ["add", ["dim", "input_x", 1], -1], 2], 0]
