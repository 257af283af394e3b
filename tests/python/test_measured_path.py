"""The latency a candidate is chosen by is measured through the code a user's call of the
tuned module runs (issue 28): the module's dispatch, its C++ route, the call form
(keywords) and the output structure (ModelOutput) included."""

from __future__ import annotations

import dataclasses
import json

import pytest

import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune import _core
from aitune.torch import dispatch, flatten

transformers_utils = __import__("transformers.utils", fromlist=["ModelOutput"])


@dataclasses.dataclass
class EncoderOutput(transformers_utils.ModelOutput):
    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None


class KeywordEncoder(torch.nn.Module):
    """Called as Hugging Face encoders are: keywords, a trailing **kwargs, a ModelOutput."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(40, 16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden = self.fc(self.embed(input_ids)) * attention_mask.unsqueeze(-1)
        return EncoderOutput(last_hidden_state=hidden, pooler_output=hidden.mean(1))


class _Counting:
    """A TorchDispatch that counts the calls made through it (``__call__``: how ait.Module
    calls its dispatch) and otherwise is the dispatch itself."""

    calls = 0

    def __init__(self, real):
        object.__setattr__(self, "real", real)

    def __call__(self, module, args, kwargs):
        _Counting.calls += 1
        return self.real(module, args, kwargs)

    def __len__(self):
        return len(self.real)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_candidates_are_measured_through_the_modules_own_dispatch(monkeypatch):
    general = []
    real_flatten = flatten.flatten_arguments
    monkeypatch.setattr(flatten, "flatten_arguments", lambda arguments: general.append(1) or real_flatten(arguments))
    real_new = dispatch.new_dispatch
    monkeypatch.setattr(dispatch, "new_dispatch", lambda module, *state: _Counting(real_new(module, *state)))
    _Counting.calls = 0

    profile = _core.ProfileConfig()  # exactly warmup + one window of calls per candidate
    profile.warmup_calls, profile.window_calls, profile.stable_windows, profile.max_windows = 2, 5, 1, 1
    profile.time_cap_s = 600
    model = ait.Module(KeywordEncoder().eval(), "measured-path",
                       strategy=cpu_strategy(use_dynamo=False, tune_provider_options=True))
    ids, mask = torch.randint(0, 40, (6,)), torch.ones(6, dtype=torch.int64)
    ait.tune(model, [{"input_ids": ids, "attention_mask": mask}] * 2, profile_config=profile)

    (report,) = model.ait_reports.values()
    measured = [c for c in report.candidates if c.p50_us is not None and c.p50_us > 0]
    assert len(measured) >= 2, report.summary_table()
    # Every timed call of every candidate went through the dispatch's C++ __call__, as a
    # user's call does, and was served there (one general-path call per candidate: the
    # first, which adds the route); the final round's too (a warm-up window and
    # final_round_windows windows of 5 calls per finalist).
    finalists = [c for c in measured if c.first_p50_us is not None]
    assert _Counting.calls == 7 * len(measured) + (1 + profile.final_round_windows) * 5 * len(finalists)
    assert len(general) == len(measured)

    batch = dict(input_ids=torch.randint(0, 40, (2, 6)), attention_mask=torch.ones(2, 6, dtype=torch.int64))
    with torch.no_grad():
        out = model(**batch)  # the general path once: adds the route
        before, served_before = _Counting.calls, len(general)
        again = model(**batch)
    assert _Counting.calls == before + 1 and len(general) == served_before  # the same code as the measurement
    assert isinstance(again, EncoderOutput) and torch.equal(again.last_hidden_state, out.last_hidden_state)


def test_the_final_round_measures_near_equal_candidates_again_and_keeps_their_first_profile():
    """select's final round: ONNX Runtime's CPU variants of a tiny MLP (near-equal; the
    margin takes them all) are measured again, interleaved, through the module's call; the
    report keeps each finalist's first measurement beside the final one."""
    from torch_models import MLP

    profile = _core.ProfileConfig()
    profile.warmup_calls, profile.window_calls, profile.stable_windows, profile.max_windows = 2, 5, 1, 1
    profile.final_round_margin, profile.final_round_windows, profile.final_round_max = 1000.0, 2, 4
    model = ait.Module(MLP(hidden=16).eval(), "final-round",
                       strategy=cpu_strategy(use_dynamo=False, tune_provider_options=True))
    ait.tune(model, [torch.randn(4, 16)] * 2, profile_config=profile)

    (report,) = model.ait_reports.values()
    candidates = json.loads(report.to_json())["candidates"]
    measured = [c for c in candidates if c["profile"] is not None]
    assert len(measured) >= 2, report.summary_table()
    for c, result in zip(candidates, report.candidates):
        if c["profile"] is None:
            assert c["first_profile"] is None
            continue
        first, final = c["first_profile"], c["profile"]
        assert first is not None, c["name"]
        assert final["stop_reason"] == "final round" and final["windows"] == 2 and final["measured_calls"] == 10
        assert first["stop_reason"] != "final round" and first["measured_calls"] == 5
        assert result.first_p50_us == first["host_us"]["p50"] and result.p50_us == final["host_us"]["p50"]
    # Ranked by the final round's p50 (the first-ranked is kept or, slower than eager, not).
    (first,) = [r for r in report.candidates if r.status in ("selected", "slower than eager")]
    assert first.p50_us == min(c["profile"]["host_us"]["p50"] for c in measured)
    # Said where a person looks: the decision, the summary table (first p50 beside the final
    # one) and the report page, under each finalist's chart.
    assert f"final round that measured the {len(measured)} fastest again" in report.decision
    # eager measured again beside them: speed-ups against it compare one moment's figures
    data = json.loads(report.to_json())
    assert data["eager_first_profile"] is not None and data["eager"]["stop_reason"] == "final round"
    assert data["eager_first_profile"]["stop_reason"] != "final round"
    assert report.summary_table().count(" (first ") == len(measured)
    assert report.to_html().count("measured again in the final round") == len(measured)

    off = _core.ProfileConfig()
    off.final_round_windows = 0
    off.validate()
    for field in ("final_round_margin", "final_round_windows", "final_round_max"):
        bad = _core.ProfileConfig()
        setattr(bad, field, -1)
        with pytest.raises(_core.InvalidArgumentError, match=field):
            bad.validate()


class MixedCall(torch.nn.Module):
    def forward(self, x, pair=None, scale: float = 1.0, mode: str = "a", named=None):
        y = x * scale if mode == "a" else x - scale
        y = y if pair is None else y + pair[0] * pair[1]
        return y if named is None else y + named["a"] * named["b"]


def test_planned_replays_give_the_recorded_call_and_containers_keep_the_tree_replay():
    """Issue 28: a graph's replay of a call of tensors, tuples of tensors (a decode step's
    cache) and plain values is planned once (no pytree per call); it must give exactly what
    the tree replay gives, and a call with another container argument (a dict of tensors)
    keeps the tree replay."""
    from aitune.torch.backend import TorchEagerBackend

    model = ait.Module(MixedCall(), "mixed-call", strategy=ait.OneBackendStrategy(TorchEagerBackend()))
    x, a, b = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    ait.tune(model, [((x[i],), {"scale": 2.0, "mode": "b"}) for i in range(3)] +
             [((x[i],), {"pair": (a[i], b[i])}) for i in range(3)] +
             [((x[i],), {"named": {"a": a[i], "b": b[i]}}) for i in range(3)], batch_sizes=[3])
    constants, pair, named = model.ait_graphs
    for graph, tensors in ((constants, [x]), (pair, [x, a, b]), (named, [x, a, b])):
        args, kwargs = graph.call_arguments(tensors)
        want_args, want_kwargs = graph._replay(tensors)
        assert len(args) == len(want_args) and all(u is v for u, v in zip(args, want_args))
        assert kwargs.keys() == want_kwargs.keys()
        for k in kwargs:
            if k == "pair":
                assert type(kwargs[k]) is tuple and all(u is v for u, v in zip(kwargs[k], want_kwargs[k]))
            elif k == "named":
                assert kwargs[k].keys() == want_kwargs[k].keys()
                assert all(kwargs[k][n] is want_kwargs[k][n] for n in kwargs[k])
            else:
                assert kwargs[k] is want_kwargs[k] or kwargs[k] == want_kwargs[k]
    assert constants._replay_plan is not None and pair._replay_plan is not None and named._replay_plan is None
    args, kwargs = pair.call_arguments([x, a, b])
    assert kwargs["pair"][0] is a and kwargs["pair"][1] is b
    with torch.no_grad():
        torch.testing.assert_close(model(x, scale=2.0, mode="b"), x - 2.0)
        torch.testing.assert_close(model(x, pair=(a, b)), x + a * b)
        torch.testing.assert_close(model(x, named={"a": a, "b": b}), x + a * b)
