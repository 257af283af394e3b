"""The tune report as a page: rendered by the engine from the JSON (Python and
`aitune report` alike), opened in headless Chromium and checked for its sections and values."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aitune import _core
from report_page import CHROMIUM, dump_dom, screenshot


def _profile(p50: float, spread: float) -> dict:
    return {"batch_size": 4, "throughput": 4e6 / p50, "stable": True, "stop_reason": "stable",
            "host_us": {"count": 200, "mean": p50 * 1.02, "std": spread / 4, "min": p50 - spread / 3, "max": p50 + spread,
                        "p50": p50, "p90": p50 + spread / 3, "p95": p50 + spread / 2, "p99": p50 + spread * 0.8}}


def _output(name: str, error: float, atol: float, passed: bool, **extra) -> dict:
    return {"name": name, "passed": passed, "failure": "" if passed else f"12 of 80 elements beyond atol={atol}",
            "dtype": "float32", "shape": [4, 20], "atol": atol, "rtol": atol, "max_abs_error": error,
            "max_rel_error": error * 3, "mismatched": 0 if passed else 12, **extra}


def _candidate(name: str, precision: str, status: str, outputs: list[dict], p50: float | None, **extra) -> dict:
    return {"name": name, "backend": "ONNXRuntimeBackend", "group": 0, "precision": precision, "status": status,
            "reason": "" if status == "passed" else "sample 0 (batch 4): logits: 12 of 80 elements beyond tolerance",
            "correctness": {"passed": status == "passed", "samples": [{"sample": "sample 0 (batch 4)",
                                                                       "passed": status == "passed",
                                                                       "outputs": outputs}]},
            "profile": _profile(p50, p50 * 0.3) if p50 else None, "speedup_vs_eager": 900 / p50 if p50 else 0, **extra}


def _report() -> dict:
    divergence = {"reference": "eager PyTorch's module outputs", "compared": 17, "skipped": 2,
                  "first": {"module": "model.layers.1.self_attn.o_proj", "node": "node_linear_11", "op_type": "Add",
                            "value": "linear_11", "max_abs_error": 0.84, "mismatched": 60, "atol": 1e-4, "rtol": 1e-4,
                            "failure": "60 of 64 elements beyond atol=1e-4"},
                  "summary": "first diverges in model.layers.1.self_attn.o_proj (node node_linear_11, Add, value "
                             "linear_11): 60 of 64 elements beyond atol=1e-4"}
    return {
        "graph": "tiny-lm/g0", "strategy": "MaxThroughputStrategy", "eager_label": "eager", "eager": _profile(900, 200),
        "winner": "cpu[intra_op_threads=2]", "decision": "cpu[intra_op_threads=2]: the fastest correct candidate",
        "tuning_s": 12.5, "batch_search": None, "performance_validation": False, "min_speedup": 1.0,
        "candidates": [
            _candidate("cpu", "fp32", "passed", [_output("logits", 3e-6, 1e-4, True, eager_error=None)], 640),
            _candidate("cpu[intra_op_threads=2]", "fp32", "passed",
                       [_output("logits", 8e-6, 1e-4, True, calibrated_ratio=0.61)], 410,
                       first_profile=_profile(455, 120)),  # measured again in the final round
            _candidate("cpu+fp16", "fp16", "passed", [_output("logits", 4e-3, 1e-2, True, cosine=0.99991)], 520),
            _candidate("cpu+ort_fusions", "fp32", "incorrect", [_output("logits", 0.84, 1e-4, False)], None,
                       divergence=divergence),
        ],
    }


def _cli() -> str | None:
    beside = Path(sys.executable).parent / "aitune"
    return str(beside) if beside.exists() else shutil.which("aitune")


def test_the_page_has_every_section_and_the_fields_the_report_carries():
    page = _core.tune_report_html(json.dumps(_report()))
    assert page.startswith("<!DOCTYPE html>")
    for section in ('id="summary"', 'id="frontier"', 'id="candidates"', 'id="divergence"'):
        assert section in page
    assert "<svg" in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page  # nothing fetched from the network
    # Per-output fields the renderer does not know (another tool's) are shown as they are.
    assert "calibrated_ratio" in page and "0.61" in page and "cosine" in page
    assert page.count('class="candidate"') == 4
    # Markup in names is text, never markup.
    hostile = _report()
    hostile["candidates"][0]["name"] = "<script>alert(1)</script>"
    assert "<script>" not in _core.tune_report_html(json.dumps(hostile))


def test_candidates_drawn_on_one_spot_share_one_label():
    """Three candidates of equal speed and error were drawn on one spot with their numbers
    printed over each other ("2" over "1" over "3"); they now share one label."""
    report = _report()
    for candidate in report["candidates"][:3]:
        candidate["profile"] = _profile(500, 100)
        candidate["correctness"]["samples"][0]["outputs"] = [_output("logits", 3e-6, 1e-4, True)]
    page = _core.tune_report_html(json.dumps(report))
    labels = re.findall(r'<text class="point-label"[^>]*>([^<]*)</text>', page)
    assert labels == ["1, 2, 3"], labels


def test_the_chart_numbers_each_point_as_its_card_is_numbered():
    """The chart and its legend numbered candidates by latency, the cards in report order:
    point "1" was another candidate than card "1." (a session-36 probe). One numbering now."""
    report = _report()
    report["candidates"][0]["profile"] = _profile(900, 100)  # the first card, the slowest point
    page = _core.tune_report_html(json.dumps(report))
    cards = dict(re.findall(r'<h3>(\d+)\. ([^<]*)', page))
    legend = dict(re.findall(r'<li value="(\d+)">([^<]*)', page))
    assert legend and all(cards[number] == name.strip() for number, name in legend.items()), (cards, legend)
    first = report["candidates"][0]["name"]
    assert legend.get("1") == first, legend


def test_bad_reports_are_refused_by_name():
    with pytest.raises(ValueError, match="not valid JSON"):
        _core.tune_report_html("{")
    with pytest.raises(ValueError, match="no \"candidates\" array"):
        _core.tune_report_html(json.dumps({"graph": "g"}))


@pytest.mark.skipif(_cli() is None, reason="the aitune CLI is not installed in this environment")
def test_aitune_report_writes_the_page_that_chromium_renders(tmp_path):
    report = tmp_path / "tune_report.json"
    report.write_text(json.dumps(_report()))
    page = tmp_path / "page.html"
    done = subprocess.run([_cli(), "report", str(report), "-o", str(page)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert page.read_text() == _core.tune_report_html(report.read_text())
    default = subprocess.run([_cli(), "report", str(report)], capture_output=True, text=True, timeout=60)
    assert default.returncode == 0 and (tmp_path / "tune_report.html").exists()
    # a page that cannot be written says why (it said only "cannot write the page")
    for target, why in ((tmp_path / "no-such-dir" / "x.html", "No such file or directory"),
                        (tmp_path, "Is a directory")):
        refused = subprocess.run([_cli(), "report", str(report), "-o", str(target)], capture_output=True, text=True,
                                 timeout=60)
        assert refused.returncode != 0 and f"cannot write the page '{target}': {why}" in refused.stderr, refused.stderr
        assert not list(tmp_path.glob("*.partial"))
    (tmp_path / "bad.json").write_text("[]")
    bad = subprocess.run([_cli(), "report", str(tmp_path / "bad.json")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "bad.json" in bad.stderr
    # A checkpoint directory with one graph: its report (was "the tune report is not valid JSON")
    graph = tmp_path / "checkpoint" / "graphs" / "graph_a"
    graph.mkdir(parents=True)
    (graph / "tune_report.json").write_text(report.read_text())
    one = subprocess.run([_cli(), "report", str(tmp_path / "checkpoint"), "-o", str(tmp_path / "one.html")],
                         capture_output=True, text=True, timeout=60)
    assert one.returncode == 0, one.stderr
    assert (tmp_path / "one.html").read_text() == page.read_text()
    # a file of the checkpoint is never written over (-o manifest.json made it unloadable)
    manifest = tmp_path / "checkpoint" / "manifest.json"
    manifest.write_text('{"format": "aitune-checkpoint"}')
    over = subprocess.run([_cli(), "report", str(tmp_path / "checkpoint"), "-o", str(manifest)],
                          capture_output=True, text=True, timeout=60)
    assert over.returncode == 2 and "refusing to write the page into the checkpoint" in over.stderr, over.stderr
    assert manifest.read_text() == '{"format": "aitune-checkpoint"}'
    (tmp_path / "checkpoint" / "graphs" / "graph_b").mkdir()
    (tmp_path / "checkpoint" / "graphs" / "graph_b" / "tune_report.json").write_text(report.read_text())
    two = subprocess.run([_cli(), "report", str(tmp_path / "checkpoint")], capture_output=True, text=True, timeout=60)
    assert two.returncode == 2 and "holds the reports of 2 graphs" in two.stderr and "graph_b" in two.stderr, two.stderr

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it): the page was not opened")
    dom = dump_dom(page, tmp_path / "profile")
    summary, rest = dom.split('id="frontier"', 1)
    assert "cpu[intra_op_threads=2]" in summary.split('id="summary"', 1)[1]  # the winner
    frontier, rest = rest.split('id="candidates"', 1)
    assert frontier.count("<circle") == 3  # the measured candidates; the incorrect one was never measured
    assert 'class="frontier"' in frontier  # the frontier line joins the non-dominated ones
    candidates, divergence = rest.split('id="divergence"', 1)
    assert candidates.count('class="latency"') == 3 and "not measured" in candidates
    # the finalist measured again says so under its chart, with its first p50; the others do not
    assert candidates.count("measured again in the final round") == 1
    assert "first p50 455" in candidates.split('id="candidate-2"', 1)[0].split('id="candidate-1"', 1)[1]
    assert candidates.count('class="accuracy"') == 4 and "calibrated_ratio" in candidates
    assert "model.layers.1.self_attn.o_proj" in divergence and "node_linear_11" in divergence
    png = screenshot(page, tmp_path / "profile", tmp_path / "page.png")
    assert png.stat().st_size > 10_000


def test_one_stalled_call_does_not_flatten_every_latency_chart(tmp_path):
    """One candidate's max of 12 ms beside p50s near 8 us set the shared scale to 12 ms:
    every p50-p90 box and eager's dashed line became a pixel. The scale now ends at the
    largest p99 (at most 4x the largest p90), and the cut whisker ends in an arrowhead."""
    report = _report()
    report["eager"] = _profile(9, 2)
    for candidate, p50 in zip(report["candidates"][:3], (8, 7, 6), strict=True):
        candidate["profile"] = _profile(p50, 2)
        candidate.pop("first_profile", None)
    report["candidates"][0]["profile"]["host_us"]["max"] = 12080.0
    page = _core.tune_report_html(json.dumps(report))
    boxes = [float(w) for w in re.findall(r'<rect x="[^"]+" y="10" width="([^"]+)" height="20"', page)]
    assert len(boxes) == 3 and min(boxes) > 10, boxes  # were 1.5 px each
    assert page.count('class="beyond"') == 1 and "max 1.21e+04 us, beyond the scale" in page
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it): the page was not opened")
    (tmp_path / "stalled.html").write_text(page)
    png = screenshot(tmp_path / "stalled.html", tmp_path / "profile", tmp_path / "stalled.png")
    assert png.stat().st_size > 10_000


def test_many_long_shape_conditions_fold_away_behind_the_short_ones(tmp_path):
    """Swin's export carries twenty conditions of up to 900 characters: written in one cell,
    comma-joined, they filled a screen and hid the two that say which sizes the graph takes.
    They are one per line now, the short ones first, the rest folded ("14 more, longer")."""
    short = ["(x.shape[3] % 4) == 0", "(x.shape[2] % 4) == 0"]
    long = [f"({' + '.join(['(x.shape[3] // 4)'] * (20 + i))}) != {i}" for i in range(14)]
    report = _report()
    report["shape_conditions"] = [long[0], *short, *long[1:]]
    page = _core.tune_report_html(json.dumps(report))
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/setup.sh installs it): the page was not opened")
    (tmp_path / "conditions.html").write_text(page)
    dom = dump_dom(tmp_path / "conditions.html", tmp_path / "profile")
    cell = re.search(r'<td id="shape_conditions">(.*?)</td>', dom, re.S).group(1)
    shown, _, folded = cell.partition("<details>")
    assert re.findall(r"<code>([^<]*)</code>", shown) == short, shown  # shortest first, long ones not shown
    assert "<summary>14 more, longer</summary>" in folded and folded.count("<code>") == 14
    png = screenshot(tmp_path / "conditions.html", tmp_path / "profile", tmp_path / "conditions.png", "1200,700")
    assert png.stat().st_size > 10_000


@pytest.mark.skipif(_cli() is None, reason="the aitune CLI is not installed in this environment")
def test_the_default_page_of_a_pipeline_sections_report_goes_beside_the_pipeline(tmp_path):
    """A module section of a pipeline checkpoint is a checkpoint inside a checkpoint: the page
    went beside the section, so inside the pipeline's directory, where the next save over the
    pipeline removed it (a session-37 probe)."""
    section = tmp_path / "pipe.ait" / "modules" / "enc"
    graph = section / "graphs" / "graph_x"
    graph.mkdir(parents=True)
    (tmp_path / "pipe.ait" / "pipeline.json").write_text("{}")
    (section / "manifest.json").write_text(json.dumps({"format": "aitune-checkpoint"}))
    report = graph / "tune_report.json"
    report.write_text(json.dumps(_report()))
    done = subprocess.run([_cli(), "report", str(report)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    page = tmp_path / "pipe.ait.enc.graph_x.tune_report.html"
    assert page.exists(), (done.stdout, sorted(p.name for p in tmp_path.rglob("*.html")))
    assert not list((tmp_path / "pipe.ait").rglob("*.html"))
