"""ait.Module(..., dynamic_shapes=...): input axes declared to take extents beyond the
recorded ones. The tuned graph accepts the declared range, the dynamo export proves itself
valid over it (a shape-dependent branch is refused, never specialised silently), and the
ranges survive a save and load."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch.export import Dim
from torch_models import cpu_strategy

import aitune
import aitune.torch as ait
from aitune.torch import ModuleState
from aitune.torch.backend.onnx_runtime_backend import NumericMismatchError
from aitune.torch.export import ExportError, TraceWarningError


class Encoder(torch.nn.Module):
    """Token ids and their mask, as a transformer encoder takes them."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.mix = torch.nn.Linear(8, 8)

    def forward(self, input_ids, attention_mask):
        hidden = self.mix(self.embed(input_ids)) * attention_mask.unsqueeze(-1)
        return {"hidden": hidden, "pooled": hidden.sum(1) / attention_mask.sum(1, keepdim=True)}


def _tokens(length: int) -> dict:
    return {"input_ids": torch.randint(0, 50, (length,)), "attention_mask": torch.ones(length, dtype=torch.long)}


def _call(model, batch: int, length: int):
    inputs = {k: v.expand(batch, -1).clone() for k, v in _tokens(length).items()}
    with torch.no_grad():
        return model(**inputs), inputs


@pytest.mark.parametrize("declared", [
    pytest.param(lambda: {"input_ids": {1: (1, 64)}, "attention_mask": {1: (1, 64)}}, id="ranges"),
    pytest.param(lambda: (lambda seq: {"input_input_ids": {1: seq}, "attention_mask": {1: seq}})(
        Dim("seq", min=1, max=64)), id="one-dim"),
])
def test_declared_sequence_range_runs_beyond_the_recorded_lengths_and_survives_a_load(declared, tmp_path):
    inner = Encoder().eval()
    model = ait.Module(inner, "encoder", strategy=cpu_strategy(tune_provider_options=False), dynamic_shapes=declared())
    ait.tune(lambda **kw: model(**kw), [_tokens(16), _tokens(16), _tokens(24), _tokens(24)],
             ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.TUNED
    (spec,) = model.graph_specs
    assert [str(t) for t in spec.inputs] == ["TensorSpec(input_input_ids: int64[b:1..2, 1..64])",
                                             "TensorSpec(input_attention_mask: int64[b:1..2, 1..64])"]
    assert "1..64" in str(spec.outputs[0])  # the hidden state's sequence axis follows the ids'
    model.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a tuned module")
    for length in (1, 5, 64):  # below, between and above what was recorded
        out, inputs = _call(model, 2, length)
        expected = Encoder.forward(inner, **inputs)
        torch.testing.assert_close(out["hidden"], expected["hidden"], atol=1e-5, rtol=1e-5)
    with pytest.raises(aitune.ShapeMismatchError, match=r"1\.\.64"):
        _call(model, 1, 65)
    # a call refused for its dtype lists the range the graph accepts, not the shapes recorded
    # (it read "shapes [1, 16] .. [2, 24]", as if the length were the reason)
    with pytest.raises(ait.GraphNotRecordedError,
                       match=r"input_input_ids: int64 rank 2 \(accepts \[1, 1\] \.\. \[2, 64\], declared\)"):
        with torch.no_grad():
            model(input_ids=torch.randint(0, 50, (1, 5)), attention_mask=torch.ones(1, 5, dtype=torch.bool))
    path = tmp_path / "encoder.ait"
    ait.save(model, path)
    loaded = ait.Module(Encoder().eval(), "encoder")  # no declaration: the saved spec carries the ranges
    loaded.load_state_dict(inner.state_dict())
    ait.load(loaded, path)
    out, inputs = _call(loaded, 1, 40)
    torch.testing.assert_close(out["hidden"], Encoder.forward(inner, **inputs)["hidden"], atol=1e-5, rtol=1e-5)


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return y * 2 if x.shape[1] > 32 else y  # another result past 32


def test_a_branch_on_a_declared_axis_is_refused_not_specialised():
    """torch.onnx.export's fallback capture would specialise the branch on the example (16)
    and the graph, accepting 1..64, would return y where eager returns 2y past 32."""
    model = ait.Module(Branchy().eval(), "branchy", strategy=cpu_strategy(tune_provider_options=False),
                       dynamic_shapes={"x": {1: (1, 64)}})
    with pytest.raises(ExportError, match=r"dynamic_shapes \(x\[1\] 1\.\.64\)[\s\S]*<= 32"):
        ait.tune(model, [torch.randn(16, 8), torch.randn(24, 8)], ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    x = torch.randn(1, 40, 8)
    torch.testing.assert_close(model(x), model.ait_module(x))


class ShortPath(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return y * 2 if x.shape[1] < 12 else y  # another result below 12


class LongPath(torch.nn.Module):
    def __init__(self, by_len: bool):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.by_len = by_len

    def forward(self, x):
        y = self.fc(x)
        length = len(x.transpose(0, 1)) if self.by_len else x.shape[1]
        return y * 2 if length > 32 else y  # another result past 32, beyond every recorded length


@pytest.mark.parametrize("model", [ShortPath, lambda: LongPath(False), lambda: LongPath(True)],
                         ids=["shape-below", "shape-above", "len-above"])
def test_the_trace_export_refuses_a_line_deciding_on_a_shape_over_a_declared_range(model, recwarn):
    """The trace exporter proves nothing over a range: the graph keeps the branch of the
    example's shape (16), and the check at the recorded shapes (and a crop) cannot see a
    branch past 32 (accepted before, the tuned module returned y where eager returns 2y at
    40). A line turning a shape into a Python value (a comparison, len()) is refused. The
    tracer's own TracerWarning about the shape comparison is not passed on."""
    model = ait.Module(model().eval(), "paths", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False),
                       dynamic_shapes={"x": {1: (4, 64)}})
    with pytest.raises(TraceWarningError, match=r"over the ranges declared in dynamic_shapes \(x\[1\] 4\.\.64\)"
                                          r"[\s\S]*test_dynamic_shapes\.py:\d+: (return y \* 2|length = len)"):
        ait.tune(model, [torch.randn(16, 8), torch.randn(16, 8)], ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    assert not [w for w in recwarn if issubclass(w.category, torch.jit.TracerWarning)], [str(w.message) for w in recwarn]


def test_a_trace_deciding_on_a_shape_over_a_declared_range_is_allowed_only_when_asked_and_logged(caplog):
    """allow_trace_warnings=True accepts the lines (a bound the tracer records, a branch
    alike over the range: transformers' BERT has both), logging them."""
    inner = ShortPath().eval()
    model = ait.Module(inner, "allowed", strategy=cpu_strategy(use_dynamo=False, allow_trace_warnings=True,
                                                               tune_provider_options=False),
                       dynamic_shapes={"x": {1: (12, 64)}})
    with caplog.at_level("WARNING", logger="aitune"):
        ait.tune(model, [torch.randn(16, 8), torch.randn(16, 8)], ignore_failing_modules=False, progress=False,
                 performance_validation=False)
    assert model.ait_state is ModuleState.TUNED
    assert "return y * 2 if x.shape[1] < 12 else y" in caplog.text and "allow_trace_warnings=True" in caplog.text


def test_the_trace_export_of_shape_free_code_is_checked_at_a_crop_and_runs_over_the_range():
    model = ait.Module(Encoder().eval(), "trace-encoder",
                       strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False),
                       dynamic_shapes={"input_ids": {1: (1, 64)}, "attention_mask": {1: (1, 64)}})
    ait.tune(lambda **kw: model(**kw), [_tokens(16), _tokens(16)], ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.TUNED
    (graph,) = model.ait_graphs
    assert graph.samples[-1].inputs[0].shape[1] == 8  # the crop to half the recorded 16
    out, inputs = _call(model, 2, 50)
    torch.testing.assert_close(out["hidden"], Encoder.forward(model.ait_module, **inputs)["hidden"])


def test_a_declaration_that_names_no_input_or_leaves_out_a_recorded_extent_is_a_value_error():
    typo = ait.Module(Encoder().eval(), "typo", strategy=cpu_strategy(tune_provider_options=False),
                      dynamic_shapes={"input_idz": {1: (1, 64)}})
    with pytest.raises(ValueError, match=r"'input_idz'.*inputs are: 'input_attention_mask', 'input_input_ids'"):
        ait.tune(lambda **kw: typo(**kw), [_tokens(16)], progress=False)
    assert typo.ait_state is ModuleState.INIT  # as it was, not left recording
    narrow = ait.Module(Encoder().eval(), "narrow", strategy=cpu_strategy(tune_provider_options=False),
                        dynamic_shapes={"input_ids": {1: (1, 8)}})
    with pytest.raises(ValueError, match=r"input_input_ids' axis 1 is declared 1\.\.8 but was recorded at 16\.\.16"):
        ait.tune(lambda **kw: narrow(**kw), [_tokens(16)], progress=False)


def test_two_batch_ranges_that_differ_are_refused_not_merged():
    """input_ids' batch declared 1..4 and attention_mask's 1..8: one axis of the graph, so
    the two ranges were merged into 1..8 and the declared 4 dropped without a word."""
    both = ait.Module(Encoder().eval(), "two_batches", strategy=cpu_strategy(tune_provider_options=False),
                      dynamic_shapes={"input_ids": {0: (1, 4)}, "attention_mask": {0: (1, 8)}})
    with pytest.raises(ValueError, match=r"batch axis is declared 1\.\.4 on input 'input_input_ids' and 1\.\.8 on "
                                         r"input 'input_attention_mask'.*declare one range"):
        ait.tune(lambda **kw: both(**kw), [_tokens(16)], batch_sizes=[1, 2], progress=False)
    assert both.ait_state is ModuleState.INIT


def test_an_axis_equal_to_a_declared_one_in_every_call_but_left_out_is_warned(caplog):
    """Only input_ids' sequence declared 1..64: attention_mask's, the same length in every
    call, kept 8..16, and a call at 40 was refused on the mask without any hint at tune."""
    model = ait.Module(Encoder().eval(), "one_of_two", strategy=cpu_strategy(tune_provider_options=False),
                       dynamic_shapes={"input_ids": {1: (1, 64)}})
    with caplog.at_level("WARNING", logger="aitune"):
        ait.tune(lambda **kw: model(**kw), [_tokens(8), _tokens(16)], progress=False, performance_validation=False)
    (line,) = [r.getMessage() for r in caplog.records if "had the same extent" in r.getMessage()]
    assert "declares input_input_ids[1] 1..64, but input_attention_mask[1]" in line and "8..16" in line, line
    # declared on both: no such warning
    caplog.clear()
    both = ait.Module(Encoder().eval(), "both_of_two", strategy=cpu_strategy(tune_provider_options=False),
                      dynamic_shapes={"input_ids": {1: (1, 64)}, "attention_mask": {1: (1, 64)}})
    with caplog.at_level("WARNING", logger="aitune"):
        ait.tune(lambda **kw: both(**kw), [_tokens(8), _tokens(16)], progress=False, performance_validation=False)
    assert not [r for r in caplog.records if "had the same extent" in r.getMessage()]


@pytest.mark.parametrize("declared, error, words", [
    ([1, 2], TypeError, "is a dict"),
    ({"x": (1, 64)}, TypeError, r"dynamic_shapes\['x'\] is a dict"),
    ({"x": {-1: (1, 4)}}, ValueError, "an axis is an int >= 0"),
    ({"x": {1: (8, 4)}}, ValueError, "max 4 is below min 8"),
    ({"x": {1: (1.5, 4)}}, TypeError, "min must be an int"),
    ({"x": {1: Dim.AUTO}}, TypeError, "leaves it to the export"),
    ({"x": {1: 64}}, TypeError, r"\(min, max\)"),
])
def test_a_malformed_declaration_is_refused_at_construction(declared, error, words):
    with pytest.raises(error, match=words):
        ait.Module(Branchy(), "bad", dynamic_shapes=declared)


def test_dim_dynamic_means_any_extent_from_one():
    model = ait.Module(Encoder().eval(), "dynamic", strategy=cpu_strategy(tune_provider_options=False),
                       dynamic_shapes={"input_ids": {0: Dim.DYNAMIC}})
    ait.tune(lambda **kw: model(**kw), [_tokens(6), _tokens(6)], ignore_failing_modules=False, progress=False)
    (spec,) = model.graph_specs
    assert str(spec.inputs[0]) == "TensorSpec(input_input_ids: int64[b:1.., 6])"
    assert str(spec.inputs[1]) == "TensorSpec(input_attention_mask: int64[b:1.., 6])"  # one batch for all
    out, inputs = _call(model, 300, 6)
    assert out["hidden"].shape == (300, 6, 8)


class Pipeline:
    """A plain object holding modules, as a diffusers or generation pipeline does."""

    def __init__(self):
        self.encoder = Encoder().eval()
        self.head = torch.nn.Linear(8, 2).eval()

    def __call__(self, input_ids, attention_mask):
        return self.head(self.encoder(input_ids, attention_mask)["pooled"])


def test_ait_wrap_declares_ranges_per_wrapped_module_and_refuses_a_name_of_none():
    pipeline = Pipeline()
    samples = [_tokens(16), _tokens(24)]
    modules = ait.inspect(pipeline, samples, number_of_iterations=1, warmup_iterations=0).get_modules()
    encoder = pipeline.encoder
    with pytest.raises(ValueError, match=r"'encodr', which is not a module wrapped here; the modules are: "):
        ait.wrap(pipeline, modules, strategy=cpu_strategy(tune_provider_options=False),
                 dynamic_shapes={"encodr": {"input_ids": {1: (1, 64)}}})
    assert pipeline.encoder is encoder  # nothing wrapped
    seq = Dim("seq", min=1, max=64)
    ait.wrap(pipeline, modules, strategy=cpu_strategy(tune_provider_options=False),
             dynamic_shapes={"encoder": {"input_ids": {1: seq}, "attention_mask": {1: seq}}})
    ait.tune(lambda **kw: pipeline(**kw), samples + samples, ignore_failing_modules=False, progress=False)
    assert "1..64" in str(pipeline.encoder.graph_specs[0].inputs[0])
    out, inputs = _call(pipeline, 2, 50)
    torch.testing.assert_close(out, pipeline.head.ait_module(Encoder.forward(encoder, **inputs)["pooled"]),
                               atol=1e-5, rtol=1e-5)


class EvenSizes(torch.nn.Module):
    """Halves and doubles its input as a UNet does, padding an odd size first (eagerly any
    size works; torch.export, given an even example, guards `size % 2 == 0`)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x):
        odd = x.shape[-1] % 2
        if odd:
            x = torch.nn.functional.pad(x, (0, 1))
        y = torch.nn.functional.interpolate(self.conv(torch.nn.functional.avg_pool2d(x, 2)), scale_factor=2.0)
        out = x + y
        return out[..., :-1] if odd else out


def test_a_derived_dim_declares_the_multiples_a_model_needs_and_the_graph_takes_only_those(caplog):
    inner = EvenSizes().eval()
    plain = ait.Module(EvenSizes().eval(), "even-plain", strategy=cpu_strategy(tune_provider_options=False),
                       dynamic_shapes={"x": {3: (8, 32)}})
    with pytest.raises(ExportError, match=r"% 2\) == 0[\s\S]*declare an axis the code needs a multiple of"):
        ait.tune(plain, [torch.randn(2, 4, 16), torch.randn(2, 4, 24)], ignore_failing_modules=False, progress=False)
    model = ait.Module(inner, "even", strategy=cpu_strategy(tune_provider_options=False),
                       dynamic_shapes={"x": {3: 2 * Dim("half", min=4, max=16)}})
    with caplog.at_level(logging.INFO, logger="aitune"):
        ait.tune(model, [torch.randn(2, 4, 16), torch.randn(2, 4, 24)], ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.TUNED
    # the derived Dim's symbol is read as the extent it stands for, not warned about as unknown
    assert "cannot check" not in caplog.text
    # `(input_x.shape[3] % 2) == 0` holds at every width the declared step accepts: the
    # spec says it, and the session has no condition to evaluate per call for it
    ((_, tuned),) = model._ait_calls.tuned.values()
    assert [str(c) for c in tuned.session.graph_spec.conditions] == []
    (spec,) = model.graph_specs
    assert str(spec.inputs[0]) == "TensorSpec(input_x: float32[b:1..2, 2, 4, 8..32 step 2])"
    (graph,) = model.ait_graphs
    assert graph.samples[-1].inputs[0].shape[-1] == 20  # the crop between 16 and 24, on the step
    model.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a tuned module")
    for width in (8, 10, 30, 32):
        x = torch.randn(1, 2, 4, width)
        with torch.no_grad():
            torch.testing.assert_close(model(x), EvenSizes.forward(inner, x), atol=1e-5, rtol=1e-5)
    with pytest.raises(aitune.ShapeMismatchError, match=r"8\.\.32 step 2"):
        model(torch.randn(1, 2, 4, 11))


class PerRowRotary(torch.nn.Module):
    """Angles from per-row positions by a batched matmul, as transformers' rotary computes
    them (a DecodeStep's position ids are [batch, S]): torch's matmul decomposition guards
    batch != 1 there."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.rand(4))

    def forward(self, x, position_ids):
        angles = self.inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1) @ position_ids[:, None, :].float()
        return x + torch.cat([angles.sin(), angles.cos()], dim=1).transpose(1, 2)


def test_a_guard_on_the_undeclared_batch_is_not_the_declared_axes_refusal():
    """Before, the export over the declared sequence range was refused for torch.export's
    guard `batch != 1` on the undeclared batch axis ('narrow the declared ranges'), so a
    DecodeStep declaring its cache range could not be tuned at all; the undeclared batch is
    now captured from 2, as torch.onnx.export's capture of it does, and the recorded
    batch-1 samples are checked like the others."""
    inner = PerRowRotary().eval()
    seq = Dim("seq", min=1, max=64)
    model = ait.Module(inner, "rotary", strategy=cpu_strategy(tune_provider_options=False),
                       dynamic_shapes={"x": {1: seq}, "position_ids": {1: seq}})
    samples = [{"x": torch.randn(6, 8), "position_ids": torch.arange(6) + start} for start in range(4)]
    ait.tune(lambda **kw: model(**kw), samples, ignore_failing_modules=False, progress=False)
    assert model.ait_state is ModuleState.TUNED
    assert str(model.graph_specs[0].inputs[0]) == "TensorSpec(input_x: float32[b:1..2, 1..64, 8])"
    model.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a tuned module")
    for batch in (1, 2):
        x, positions = torch.randn(batch, 40, 8), torch.arange(40 * batch).view(batch, 40)
        with torch.no_grad():
            torch.testing.assert_close(model(x=x, position_ids=positions), PerRowRotary.forward(inner, x, positions),
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch_sizes", [[1, 2], [2]])
def test_a_declared_batch_from_one_is_captured_from_two_where_batch_one_is_checked(batch_sizes):
    """A declared batch range 1..8 with per-row positions (a prefill given position_ids) was
    refused for torch.export's `batch != 1` guard, though the same graph with the batch left
    undeclared tuned. It is captured from 2 where a recorded sample of batch 1 checks the
    graph there against eager; without one the refusal stands and says to record one."""
    inner = PerRowRotary().eval()
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=1, max=64)
    model = ait.Module(inner, "rotary-batch", strategy=cpu_strategy(tune_provider_options=False),
                       dynamic_shapes={"x": {0: batch, 1: seq}, "position_ids": {0: batch, 1: seq}})
    samples = [{"x": torch.randn(6, 8), "position_ids": torch.arange(6) + start} for start in range(4)]
    if 1 not in batch_sizes:
        with pytest.raises(ExportError, match="record a sample of batch 1"):
            ait.tune(lambda **kw: model(**kw), samples, batch_sizes=batch_sizes, ignore_failing_modules=False,
                     progress=False)
        return
    ait.tune(lambda **kw: model(**kw), samples, batch_sizes=batch_sizes, ignore_failing_modules=False,
             progress=False)
    assert str(model.graph_specs[0].inputs[0]) == "TensorSpec(input_x: float32[b:1..8, 1..64, 8])"
    model.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a tuned module")
    for rows in (1, 5, 8):
        x, positions = torch.randn(rows, 40, 8), torch.arange(40 * rows).view(rows, 40)
        with torch.no_grad():
            torch.testing.assert_close(model(x=x, position_ids=positions), PerRowRotary.forward(inner, x, positions),
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("declared, top", [((1, 6), 6), (Dim.DYNAMIC, None)])
def test_the_maximum_batch_search_keeps_a_declared_batch_range(declared, top):
    """find_max_batch_size widens the batch range to the largest batch worth running: never
    past a declared maximum, and an unbounded declared range stays unbounded."""
    inner = torch.nn.Linear(8, 8).eval()
    model = ait.Module(inner, "batch-declared", strategy=cpu_strategy(tune_provider_options=False),
                       dynamic_shapes={"input": {0: declared}})
    ait.tune(model, [torch.randn(8) for _ in range(4)], batch_sizes=[1, 2], find_max_batch_size=True,
             max_batch_size=64, ignore_failing_modules=False, progress=False)
    (spec,) = model.graph_specs
    (report,) = model.ait_reports.values()
    search = json.loads(report.to_json())["batch_search"]
    if top is None:
        assert str(spec.inputs[0]) == "TensorSpec(input_input: float32[b:1.., 8])", spec.inputs[0]
        x = torch.randn(100, 8)
        with torch.no_grad():
            torch.testing.assert_close(model(x), inner(x), atol=1e-5, rtol=1e-5)
    else:
        assert search["max_batch"] <= top, search
        assert str(spec.inputs[0]) == "TensorSpec(input_input: float32[b:1..6, 8])", spec.inputs[0]
        with pytest.raises(aitune.ShapeMismatchError):
            model(torch.randn(7, 8))


class ValueBranch(torch.nn.Module):
    """A branch on the input's values, not on a declared axis (transformers' dynamic rotary
    does so: ``torch.max(position_ids) + 1 > max_seq_len_cached``)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        if x.max() > 100:  # the line the refusal names
            return -y
        return y


@pytest.mark.parametrize("declared", [{"x": {1: (1, 64)}}, None], ids=["declared", "recorded"])
def test_a_branch_on_the_values_is_refused_as_data_dependent_naming_its_line(declared):
    """Over declared ranges as over the recorded shapes: the refusal says the branch is on a
    tensor's value (torch.cond), not that the declared ranges are too wide, and names the
    model's line torch.export stopped at."""
    model = ait.Module(ValueBranch().eval(), "value-branch", strategy=cpu_strategy(tune_provider_options=False),
                       dynamic_shapes=declared)
    with pytest.raises(ExportError) as refused:
        ait.tune(model, [torch.randn(16, 8), torch.randn(24, 8)], ignore_failing_modules=False, progress=False)
    message = str(refused.value)
    assert "control flow on a tensor's value" in message and "torch.cond" in message, message
    assert "narrow the declared ranges" not in message, message
    assert "test_dynamic_shapes.py" in message and "in forward" in message, message
    assert model.ait_state is ModuleState.PASSTHROUGH


def test_a_refused_call_lists_each_axis_over_its_recorded_extents():
    """The recorded shapes were summed up as the first and last in sorted order:
    [1, 4, 8, 8] .. [2, 4, 12, 12] for samples whose last axis spans 8..16, a range the
    graph accepts (a session-35 probe)."""
    inner = torch.nn.Conv2d(4, 4, 3, padding=1).eval()
    model = ait.Module(inner, "conv-extents", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(4, h, w) for h, w in ((8, 8), (12, 12), (8, 16))], ignore_failing_modules=False,
             progress=False, performance_validation=False)
    with torch.no_grad():
        torch.testing.assert_close(model(torch.randn(1, 4, 8, 16)).shape, torch.Size([1, 4, 8, 16]))
        with pytest.raises(ait.GraphNotRecordedError, match=r"shapes \[1, 4, 8, 8\] \.\. \[2, 4, 12, 16\]"):
            model(torch.randn(1, 4, 8, 16, dtype=torch.float64))
