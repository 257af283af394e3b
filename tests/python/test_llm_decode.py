"""examples/llm_decode.py: a tiny Llama's prefill and decode step (KV cache as tensors,
DecodeStep) tuned on the CPU provider generate the same greedy tokens as transformers'
generate, for one prompt and a left-padded batch of two."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from aitune.torch import ModuleState  # noqa: E402
from aitune.torch.decode_step import DecodeStep, empty_cache, greedy_generate  # noqa: E402

_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llm_decode.py"


def _example():
    spec = importlib.util.spec_from_file_location("llm_decode", _EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tuned_steps_generate_the_greedy_tokens_of_transformers():
    example = _example()
    model = example.tiny_llama()
    prefill, decode = example.tune_steps(model)
    for module in (prefill, decode):
        assert module.ait_state is ModuleState.TUNED
        assert all("ONNXRuntimeBackend" in b for b in module.ait_backends.values()), module.ait_backends
    for size in (1, 2):
        batch = example.prompts(size)
        with torch.no_grad():
            ours = greedy_generate(prefill, decode, model, batch["input_ids"], batch["attention_mask"],
                                   example.NEW_TOKENS)
            reference = model.generate(**batch, max_new_tokens=example.NEW_TOKENS, do_sample=False, pad_token_id=0)
        assert torch.equal(ours, reference[:, example.PROMPT_LEN:]), (ours, reference)


def test_decode_step_writes_only_its_cache_slot():
    example = _example()
    model = example.tiny_llama()
    step = DecodeStep(model)
    keys, values = empty_cache(model, 2, 8)
    keys, values = keys + 1, values + 1  # a cache already holding something everywhere
    mask = torch.ones(2, 8, dtype=torch.long)
    with torch.no_grad():
        logits, new_keys, new_values = step(torch.tensor([[5], [7]]), mask, torch.tensor([[3], [3]]),
                                            torch.tensor([3]), keys, values)
    assert logits.shape == (2, 1, example.VOCAB)
    assert new_keys.shape == keys.shape and new_values.shape == values.shape
    untouched = [i for i in range(8) if i != 3]
    assert torch.equal(new_keys[:, :, :, untouched], keys[:, :, :, untouched])
    assert not torch.equal(new_keys[:, :, :, 3], keys[:, :, :, 3])
    assert torch.equal(keys, torch.ones_like(keys))  # the inputs are not written in place
