"""Model families a probe (session 16) tuned for the first time: BART, DeiT with its
distillation token, SegFormer, DINOv2, LeViT, DeBERTa-v2, Longformer, BigBird, Mamba,
HuBERT, AST, and inputs and outputs of unusual dtypes and layouts. What it found broken,
each with a test that failed before the fix; tiny random configurations, nothing is
downloaded."""

from __future__ import annotations

import logging

import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState

transformers = pytest.importorskip("transformers")


def _tune(inner: torch.nn.Module, name: str, samples, **kwargs) -> ait.Module:
    model = ait.Module(inner, name, strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, samples, ignore_failing_modules=False, disable_external_logging=True, progress=False,
             performance_validation=False, **kwargs)
    assert model.ait_state is ModuleState.TUNED
    assert all("ONNXRuntimeBackend" in b for b in model.ait_backends.values()), model.ait_backends
    return model


# -- transformers' own output-capturing hooks are not the user's hooks ---------------------


def test_transformers_output_capturing_hooks_are_not_named_as_the_users_hooks(caplog):
    """transformers 5 installs forward hooks on its layers the first time a call asks for
    hidden states (output_hidden_states=True, or a head such as SegFormer's that asks its
    base model): they only collect layer outputs into the ModelOutput, which the graph
    returns. Tuning warned that 'forward hooks on submodules' would lose their effects,
    naming install_output_capuring_hook, and told the user to move hooks they never
    registered. The hidden states still come back right; a hook of the user's on a
    submodule is still named."""
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    inner = transformers.BertModel(config).eval()
    samples = [{"input_ids": torch.randint(0, 100, (8,)), "output_hidden_states": True} for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="aitune"):
        model = _tune(inner, "bert-hidden-states", samples)
    assert "forward hooks on submodules" not in caplog.text, caplog.text
    call = {"input_ids": torch.randint(0, 100, (2, 8)), "output_hidden_states": True}
    with torch.no_grad():
        got, expected = model(**call), inner(**call)
    assert len(got.hidden_states) == len(expected.hidden_states) == 2
    for a, e in zip(got.hidden_states, expected.hidden_states):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)

    seen = []
    inner.encoder.layer[0].register_forward_hook(lambda *_: seen.append(1))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aitune"):
        _tune(inner, "bert-user-hook", samples)
    assert "forward hooks on submodules" in caplog.text and "encoder.layer.0: " in caplog.text
    assert "install_output_capuring_hook" not in caplog.text
