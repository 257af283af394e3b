"""The latency a candidate is chosen by is measured through the code a user's call of the
tuned module runs (issue 28): the module's dispatch, its C++ route, the call form
(keywords) and the output structure (ModelOutput) included."""

from __future__ import annotations

import dataclasses

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
    monkeypatch.setattr(dispatch, "new_dispatch", lambda module, training: _Counting(real_new(module, training)))
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
    # first, which adds the route).
    assert _Counting.calls == 7 * len(measured)
    assert len(general) == len(measured)

    batch = dict(input_ids=torch.randint(0, 40, (2, 6)), attention_mask=torch.ones(2, 6, dtype=torch.int64))
    with torch.no_grad():
        out = model(**batch)  # the general path once: adds the route
        before, served_before = _Counting.calls, len(general)
        again = model(**batch)
    assert _Counting.calls == before + 1 and len(general) == served_before  # the same code as the measurement
    assert isinstance(again, EncoderOutput) and torch.equal(again.last_hidden_state, out.last_hidden_state)


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
