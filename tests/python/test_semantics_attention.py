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
