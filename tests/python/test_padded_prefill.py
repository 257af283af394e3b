"""Decoder LLM prefill with padded rows tunes: outputs at padded positions (attention_mask
== 0) are undefined by the model's contract and are left out of the correctness check,
derived from a keyword input named attention_mask or declared with valid_positions."""

from __future__ import annotations

import pytest
import torch
from decoder_models import padded_prefill_batches, tiny_decoder
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState

transformers = pytest.importorskip("transformers")


def _tune(inner, name, **kwargs) -> ait.Module:
    model = ait.Module(inner, name, strategy=cpu_strategy(use_dynamo=True, tune_provider_options=False))
    ait.tune(model, padded_prefill_batches, batch_sizes=[2, 3], ignore_failing_modules=False,
             disable_external_logging=True, progress=False, **kwargs)
    return model


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_padded_prefill_tunes_with_padded_positions_left_out(kind):
    inner = tiny_decoder(kind)
    model = _tune(inner, f"padded-{kind}")
    assert model.ait_state is ModuleState.TUNED
    assert all("ONNXRuntimeBackend" in b for b in model.ait_backends.values()), model.ait_backends
    (report,) = model.ait_reports.values()
    # the report names how many positions the check left out, per sample
    assert "positions undefined by attention_mask" in report.to_json()
    # valid positions match eager; the padded ones are whatever the graph computes
    batch = padded_prefill_batches(3)[0]
    with torch.no_grad():
        expected = inner(**batch).logits
        actual = model(**batch).logits
    valid = batch["attention_mask"].bool()
    torch.testing.assert_close(actual[valid], expected[valid], atol=1e-4, rtol=1e-4)



def test_every_position_compared_rejects_the_padded_batch():
    """valid_positions=False compares padding too: the outputs there differ from eager's
    (undefined), so every candidate is rejected, as before masks were derived."""
    with pytest.raises(Exception, match="every candidate differs from eager|elements beyond"):
        _tune(tiny_decoder("llama"), "padded-llama-all", valid_positions=False)


class _MaskNamedOtherwise(torch.nn.Module):
    """A user's wrapper whose padding mask argument is not called ``attention_mask``."""

    def __init__(self, llm):
        super().__init__()
        self.llm = llm

    def forward(self, ids, mask):
        return self.llm(input_ids=ids, attention_mask=mask, use_cache=False).logits


def test_a_mask_named_otherwise_is_pointed_to_when_every_candidate_differs():
    """The padded positions' errors read as "every candidate differs from eager PyTorch" with
    no word of padding when the wrapper's mask is named ``mask`` (a session-36 probe);
    the refusal now names the input and the option, and the option makes the tune pass."""
    def batches(size):
        (batch,) = padded_prefill_batches(size)
        return [{"ids": batch["input_ids"], "mask": batch["attention_mask"]}]

    inner = _MaskNamedOtherwise(tiny_decoder("llama")).eval()
    model = ait.Module(inner, "mask-named-otherwise", strategy=cpu_strategy(use_dynamo=True, tune_provider_options=False))
    with pytest.raises(ait.NumericMismatchError, match=r"input 'mask' looks like a padding mask.*valid_positions='mask'"):
        ait.tune(model, batches, batch_sizes=[2], ignore_failing_modules=False, disable_external_logging=True,
                 progress=False)
    declared = ait.Module(inner, "mask-named-declared",
                          strategy=cpu_strategy(use_dynamo=True, tune_provider_options=False))
    ait.tune(declared, batches, batch_sizes=[2], ignore_failing_modules=False, disable_external_logging=True,
             progress=False, valid_positions="mask")
    assert declared.ait_state is ModuleState.TUNED


def test_declared_valid_positions_callable_is_used():
    seen = []

    def valid(arguments, outputs):
        seen.append(sorted(k for k, v in arguments.items() if isinstance(v, torch.Tensor)))
        return arguments["attention_mask"] != 0

    model = _tune(tiny_decoder("llama"), "padded-llama-declared", valid_positions=valid)
    assert model.ait_state is ModuleState.TUNED
    assert seen and all(names == ["attention_mask", "input_ids"] for names in seen), seen
    (report,) = model.ait_reports.values()
    assert "positions undefined by valid_positions" in report.to_json()


def test_a_valid_positions_function_that_raises_is_named_with_the_graph_it_ran_for():
    """A bare ZeroDivisionError came out of ait.tune, naming neither the function nor the module."""
    def broken(arguments, outputs):
        return 1 / 0

    with pytest.raises(ZeroDivisionError, match=r"padded-llama-broken.*the valid_positions function raised "
                                                r"ZeroDivisionError: division by zero"):
        _tune(tiny_decoder("llama"), "padded-llama-broken", valid_positions=broken)


def test_bad_valid_positions_option_is_a_type_error():
    with pytest.raises(TypeError, match="valid_positions"):
        ait.tune(lambda **k: None, [{"x": torch.ones(2)}], valid_positions=3)


def test_fused_candidate_is_judged_on_the_padded_batch():
    """The ort_fusions candidate (onnxscript's optimize_for_ort: SkipSimplifiedLayerNormalization
    for the RMSNorms) is checked on the padded samples too, and matches eager where defined."""
    import json

    model = ait.Module(tiny_decoder("llama"), "padded-llama-fused", strategy=cpu_strategy(use_dynamo=True))
    ait.tune(model, padded_prefill_batches, batch_sizes=[2, 3], ignore_failing_modules=False,
             disable_external_logging=True, progress=False)
    (report,) = model.ait_reports.values()
    (fused,) = [c for c in json.loads(report.to_json())["candidates"] if c.get("transform") == "ort_fusions"]
    assert fused["fused_operators"].get("SkipSimplifiedLayerNormalization", 0) > 0, fused
    assert fused["status"] in ("selected", "not chosen"), fused
    assert fused["correctness"]["passed"] and fused["correctness"]["max_abs_error"] < 1e-4
    assert all("positions undefined by attention_mask" in s["sample"] for s in fused["correctness"]["samples"])


def test_derived_mask_covers_only_outputs_with_more_dims():
    """A [batch, hidden] pooled output whose hidden size equals the sequence length is not
    masked by position; [batch, seq, vocab] logits are."""
    from aitune.torch.valid_positions import masks_for

    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]])
    logits, pooled = torch.zeros(2, 4, 8), torch.zeros(2, 4)
    masks, source = masks_for(None, {"attention_mask": mask}, [logits, pooled], "test")
    assert source == "attention_mask"
    assert masks[1] is None and torch.equal(masks[0], mask)
    assert masks_for(None, {"input_ids": mask}, [logits], "test") is None  # nothing to derive from
    declared, _ = masks_for(lambda arguments, outputs: mask, {}, [logits, pooled], "test")
    assert all(m is not None for m in declared)  # a declared mask covers outputs of its shape
    with pytest.raises(ValueError, match="no tensor argument 'padding'"):
        masks_for("padding", {"attention_mask": mask}, [logits], "test")


@pytest.mark.parametrize("mask, expected", [
    (torch.tensor([[0.0, -1e4, 0.0]]), [[1, 0, 1]]),              # additive: 0 attends
    (torch.tensor([[0.0, float("-inf"), 0.0]]), [[1, 0, 1]]),
    (torch.tensor([[1.0, 0.0, 1.0]]), [[1, 0, 1]]),               # a 0/1 mask as float
    (torch.zeros(1, 3), None),                                     # additive, no padding: all compared
    (torch.zeros(1, 3, dtype=torch.long), None),                   # pads every position: no real batch
    (torch.tensor([[0.5, -1.0, 0.0]]), None),                      # neither: nothing left out on a guess
])
def test_derived_mask_is_read_by_its_values(mask, expected):
    """An attention_mask is a 0/1 mask or an additive one (0 attends, negative pads); read as
    0/1, an additive mask without padding left every position out and the check compared
    nothing."""
    from aitune.torch.valid_positions import masks_for

    found = masks_for(None, {"attention_mask": mask}, [torch.zeros(1, 3, 2)], "test")
    if expected is None:
        assert found is None
    else:
        assert found[0][0].tolist() == expected


def test_declared_mask_that_leaves_everything_out_is_refused():
    from aitune.torch.valid_positions import masks_for

    with pytest.raises(ValueError, match="marks no position as defined"):
        masks_for("pad", {"pad": torch.zeros(2, 3)}, [torch.zeros(2, 3, 4)], "test")
    with pytest.raises(ValueError, match="marks no position as defined"):
        masks_for(lambda arguments, outputs: torch.zeros(2, 3), {}, [torch.zeros(2, 3, 4)], "test")


class _AdditiveMaskBranch(torch.nn.Module):
    """An additive attention_mask ([B, S], 0 attends) and a branch on the data, which the
    trace exporter bakes in."""

    def __init__(self):
        super().__init__()
        self.o = torch.nn.Linear(8, 8)

    def forward(self, x, attention_mask):
        h = torch.softmax(x @ x.transpose(1, 2) + attention_mask[:, None, :], -1) @ x
        return self.o(h) if x.sum() > 0 else -self.o(h)


def test_an_additive_attention_mask_without_padding_still_checks_every_position():
    """Read as a 0/1 mask, an all-zero additive mask left every position out: a trace that
    baked the other branch passed the check (2.3 off eager on the samples it was tuned on)."""
    from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    torch.manual_seed(0)
    trace = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu", use_dynamo=False,
                                                       allow_trace_warnings=True))
    model = ait.Module(_AdditiveMaskBranch().eval(), "additive-mask",
                       strategy=ait.FirstWinsStrategy([trace, ait.TorchEagerBackend()]))
    samples = [{"x": sign * torch.ones(5, 8) + 0.1 * torch.randn(5, 8), "attention_mask": torch.zeros(5)}
               for sign in (1.0, 1.0, -1.0, -1.0)]
    ait.tune(lambda **kw: model(**kw), samples, disable_external_logging=True, progress=False,
             performance_validation=False)
    (report,) = model.ait_reports.values()
    assert {c.status for c in report.candidates} == {"incorrect"}, report.summary_table()
    assert "undefined by attention_mask" not in report.summary_table()


class TextAndImage(torch.nn.Module):
    """Text tokens under an attention_mask and image tokens of the same count: both outputs
    are [batch, 5, 16]. The exported graph is wrong on the last two image tokens (on purpose)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.text = torch.nn.Linear(16, 16)
        self.patches = torch.nn.Linear(12, 16)

    def forward(self, input_ids, attention_mask, pixels):
        text = self.text(self.embed(input_ids)) * attention_mask[..., None]
        image = self.patches(pixels)
        if torch.compiler.is_exporting():
            image = torch.cat([image[:, :3], image[:, 3:] * 3.0], 1)
        return {"text": text, "image": image}


def test_the_text_mask_leaves_out_no_positions_of_outputs_its_tokens_do_not_reach():
    """Matched by shape alone, the text's attention_mask left the image tokens at the text's
    padded positions out of the check: a graph 3x off on them passed whenever every sample
    was padded (a CLIP, a session-35 probe). Eager run once with other tokens at the padded
    positions tells the outputs they reach (text) from those they do not (image)."""
    torch.manual_seed(0)

    def sample():
        mask = torch.ones(5, dtype=torch.long)
        mask[-2:] = 0
        return {"input_ids": torch.randint(1, 50, (5,)), "attention_mask": mask, "pixels": torch.randn(5, 12)}

    model = ait.Module(TextAndImage().eval(), "text-image", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ait.NumericMismatchError, match=r"output_image: .* beyond"):
        ait.tune(lambda **kw: model(**kw), [sample() for _ in range(3)], ignore_failing_modules=False,
                 progress=False, performance_validation=False)


class _ZeroedAtPadding(torch.nn.Module):
    """``forward(x, attention_mask)`` returning ``fc(x) * mask``: zeros at the padded positions
    whatever x holds, which eager defines. The exported graph ignores the mask (on purpose)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, attention_mask):
        h = self.fc(x)
        return h if torch.compiler.is_exporting() else h * attention_mask[..., None]


def test_outputs_a_floating_input_at_the_padding_does_not_reach_are_checked_there():
    """Without input_ids nothing was changed at the padded positions to see whether they reach
    an output: the mask left the zeros eager defines there out of the check, and a graph that
    ignored the mask (0.71 off there) passed (a session-37 probe). The floating input laid out
    as the mask is changed there now."""
    torch.manual_seed(0)
    samples = []
    for i in range(4):
        mask = torch.ones(6)
        mask[4 - i % 2:] = 0
        samples.append({"x": torch.randn(6, 8), "attention_mask": mask})
    model = ait.Module(_ZeroedAtPadding().eval(), "zeroed-at-padding",
                       strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ait.NumericMismatchError, match=r"output_0: .* beyond"):
        ait.tune(lambda **kw: model(**kw), samples, ignore_failing_modules=False, progress=False,
                 performance_validation=False)


def test_the_cropped_probe_sample_keeps_a_valid_position_in_every_left_padded_row():
    """aitune's cropped sample (a recorded sample cut to a length between the recorded ones) kept
    the first positions: a left-padded row became all padding, and next-token logits
    (``logits_to_keep=1``, [batch, 1, vocab]), compared on every row, were refused for every
    candidate on that undefined row (a session-37 probe). The crop keeps the last positions there."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                                      initializer_range=0.2)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # a trained pad embedding is not the zero row padding_idx gives at init
        model.model.embed_tokens.weight[0].normal_(0, 0.2)

    def sample(batch, length):
        generator = torch.Generator().manual_seed(batch * 100 + length)
        ids = torch.randint(2, 256, (batch, length), generator=generator)
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[0, :2] = 0
        ids[mask == 0] = 0
        return {"input_ids": ids, "attention_mask": mask, "use_cache": False, "logits_to_keep": 1}

    # a sequence range below the recorded lengths, as docs/decoders.md advises: the crop goes there
    batch, seq = torch.export.Dim("batch", min=1, max=4), torch.export.Dim("seq", min=2, max=32)
    tuned = ait.Module(model, "crop-keep1", strategy=cpu_strategy(use_dynamo=True, tune_provider_options=False),
                       dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}})
    ait.tune(tuned, lambda size: [sample(size, 8 - size)], batch_sizes=[1, 2, 3], disable_external_logging=True,
             progress=False, performance_validation=False, ignore_failing_modules=False)
    assert tuned.ait_state is ModuleState.TUNED
    (report,) = tuned.ait_reports.values()
    import json

    checked = [s["sample"] for c in json.loads(report.to_json())["candidates"] for s in c["correctness"]["samples"]]
    assert any("aitune's probe" in name for name in checked)  # the crop was checked, not skipped
