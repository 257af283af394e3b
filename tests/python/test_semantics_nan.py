"""Issue 27 item 6: an eager output that is NaN everywhere is named in a warning."""

from __future__ import annotations

import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState


class NaNHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return {"logits": self.linear(x) * float("nan"), "features": self.linear(x)}


def test_all_nan_output_tunes_with_a_warning_naming_it():
    model = ait.Module(NaNHead().eval(), "nan", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    with pytest.warns(RuntimeWarning, match=r"output_logits is NaN everywhere") as caught:
        ait.tune(model, [torch.randn(4) for _ in range(2)])
    assert not any("output_features" in str(w.message) for w in caught)
    assert sum("NaN everywhere" in str(w.message) for w in caught) == 1  # once, not per sample
    assert model.ait_state is ModuleState.TUNED  # NaN where eager has NaN matches: it tunes, but said
