"""Decoder LLM prefill with padded rows tunes: outputs at padded positions (attention_mask
== 0) are undefined by the model's contract and are left out of the correctness check,
derived from a keyword input named attention_mask or declared with valid_positions."""

from __future__ import annotations

import pytest
import torch
from decoder_models import VOCAB, tiny_decoder
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState

transformers = pytest.importorskip("transformers")


def _padded_batches(batch_size: int):
    """One batch per size, its rows left-padded, right-padded and unpadded in turn."""
    generator = torch.Generator().manual_seed(batch_size)
    length = 8
    ids = torch.randint(0, VOCAB, (batch_size, length), generator=generator)
    mask = torch.ones(batch_size, length, dtype=torch.long)
    for row in range(batch_size):
        if row % 3 == 0:
            mask[row, :3] = 0  # left padding
        elif row % 3 == 1:
            mask[row, -2:] = 0  # right padding
    return [{"input_ids": ids, "attention_mask": mask, "use_cache": False}]


def _tune(inner, name, **kwargs) -> ait.Module:
    model = ait.Module(inner, name, strategy=cpu_strategy(use_dynamo=True, tune_provider_options=False))
    ait.tune(model, _padded_batches, batch_sizes=[2, 3], ignore_failing_modules=False,
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
    batch = _padded_batches(3)[0]
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


def test_bad_valid_positions_option_is_a_type_error():
    with pytest.raises(TypeError, match="valid_positions"):
        ait.tune(lambda **k: None, [{"x": torch.ones(2)}], valid_positions=3)


def test_fused_candidate_is_judged_on_the_padded_batch():
    """The ort_fusions candidate (onnxscript's optimize_for_ort: SkipSimplifiedLayerNormalization
    for the RMSNorms) is checked on the padded samples too, and matches eager where defined."""
    import json

    model = ait.Module(tiny_decoder("llama"), "padded-llama-fused", strategy=cpu_strategy(use_dynamo=True))
    ait.tune(model, _padded_batches, batch_sizes=[2, 3], ignore_failing_modules=False,
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
