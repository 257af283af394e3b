"""Issue 27 item 3: PyTorch's attention fast path (zeros at padded positions) does not
fail a correct graph: the reference is computed with the regular math the export captures."""

from __future__ import annotations

import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState


class PaddedEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=True)

    def forward(self, x, mask):
        return self.encoder(x, src_key_padding_mask=mask)


def _sample(i):
    mask = torch.zeros(6, dtype=torch.bool)
    mask[4 + i % 2:] = True  # the last positions are padding
    return {"x": torch.randn(6, 8), "mask": mask}


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_transformer_encoder_with_padding_mask_tunes(use_dynamo):
    inner = PaddedEncoder().eval()
    sample = _sample(0)
    with torch.no_grad():  # the fast path is what eager takes here: zeros where padded
        fast = inner(sample["x"][None], sample["mask"][None])
    assert torch.all(fast[0, 4:] == 0)
    enabled = torch.backends.mha.get_fastpath_enabled()
    model = ait.Module(inner, "padded", strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    ait.tune(model, [_sample(i) for i in range(4)], ignore_failing_modules=False, disable_external_logging=True)
    assert model.ait_state is ModuleState.TUNED
    assert torch.backends.mha.get_fastpath_enabled() is enabled  # restored
    x, mask = torch.randn(2, 6, 8), torch.zeros(2, 6, dtype=torch.bool)
    mask[:, 5:] = True
    with torch.no_grad():
        expected = inner(x, mask)
        actual = model(x, mask)
    valid = ~mask
    torch.testing.assert_close(actual[valid], expected[valid], atol=1e-4, rtol=1e-4)  # same where defined


class SeqFirstEncoder(torch.nn.Module):
    """batch_first=False: outputs are [seq, batch, d_model], the padding mask [batch, seq]."""

    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=True)

    def forward(self, x, src_key_padding_mask):
        return self.encoder(x, src_key_padding_mask=src_key_padding_mask)


def test_src_key_padding_mask_is_derived_for_batch_and_seq_first():
    from aitune.torch.valid_positions import masks_for

    padding = torch.tensor([[False, False, True], [False, True, True]])  # [batch 2, seq 3]
    batch_first, seq_first = torch.zeros(2, 3, 8), torch.zeros(3, 2, 8)
    masks, source = masks_for(None, {"src_key_padding_mask": padding}, [batch_first, seq_first, torch.zeros(2, 8)], "t")
    assert source == "src_key_padding_mask"
    assert torch.equal(masks[0], (~padding).to(torch.uint8)) and torch.equal(masks[1], (~padding).t().to(torch.uint8))
    assert masks[2] is None  # a pooled output: compared everywhere
    additive = torch.zeros(2, 3).masked_fill(padding, float("-inf"))  # a float mask: non-zero = padded
    assert torch.equal(masks_for(None, {"src_key_padding_mask": additive}, [batch_first], "t")[0][0], masks[0])
    square = torch.tensor([[False, True], [False, False]])  # batch == seq: only batch_first tells
    assert masks_for(None, {"src_key_padding_mask": square}, [torch.zeros(2, 2, 8)], "t") is None
    assert torch.equal(masks_for(None, {"src_key_padding_mask": square}, [torch.zeros(2, 2, 8)], "t", batch_first=False)[0][0],
                       (~square).t().to(torch.uint8))
    assert masks_for(False, {"src_key_padding_mask": padding}, [batch_first], "t") is None


def test_seq_first_encoder_with_src_key_padding_mask_reports_the_padded_positions():
    inner = SeqFirstEncoder().eval()
    model = ait.Module(inner, "padded-seq-first", strategy=cpu_strategy(tune_provider_options=False))
    samples = []
    for i in range(2):
        mask = torch.zeros(2, 6, dtype=torch.bool)
        mask[:, 4 + i:] = True
        samples.append({"x": torch.randn(6, 2, 8), "src_key_padding_mask": mask})
    ait.tune(model, lambda batch_size: samples, batch_sizes=[2], ignore_failing_modules=False, disable_external_logging=True,
             progress=False)
    assert model.ait_state is ModuleState.TUNED
    report = next(iter(model.ait_reports.values()))
    assert "positions undefined by src_key_padding_mask" in report.to_json()
    x, mask = torch.randn(6, 2, 8), torch.zeros(2, 6, dtype=torch.bool)
    mask[:, 5:] = True
    with torch.no_grad():
        expected, actual = inner(x, mask), model(x, mask)
    valid = (~mask).t()
    torch.testing.assert_close(actual[valid], expected[valid], atol=1e-4, rtol=1e-4)
