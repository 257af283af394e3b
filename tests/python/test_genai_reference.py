"""benchmarks/genai_reference.py: ONNX Runtime GenAI's model builder graph of a tiny random
Llama, built offline and run by aitune's OnnxSession with each present written into its
past, computes the model: prefill logits equal transformers', and a decode step over a
DecodeStep cache gives DecodeStep's logits and writes this token's keys and values into
the very cache tensors passed (decoder.py's reference row stands on this)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
# The builder runs as `python -m onnxruntime_genai.models.builder` in a subprocess: looked up,
# not imported (its own onnxruntime must not load into this process). A host without it
# (the GPU image) skips, saying so, instead of erroring in the fixture.
if importlib.util.find_spec("onnxruntime_genai") is None:
    pytest.skip("onnxruntime-genai is not installed (scripts/setup.sh installs it): the builder's graph was not built",
                allow_module_level=True)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import genai_reference  # noqa: E402

from aitune.torch.decode_step import DecodeStep, empty_cache  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import transformers

    torch.manual_seed(0)
    # intermediate_size != vocab_size: where they are equal, the 0.18 builder writes other
    # weights as the LM head (its logits then differ by ~0.3; decoder.py's max_error shows it)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64)).eval()
    path, seconds = genai_reference.build(model, tmp_path_factory.mktemp("genai"), precision="fp32", provider="cpu")
    assert seconds > 0 and path.name == "model.onnx"
    return model, genai_reference.GenAIGraph(path, provider="cpu")


def test_the_builders_prefill_computes_the_models_logits(built):
    model, graph = built
    inputs = {"input_ids": torch.randint(0, 128, (2, 9)), "attention_mask": torch.ones(2, 9, dtype=torch.long)}
    with torch.no_grad():
        expected = model(**inputs, use_cache=False).logits
    torch.testing.assert_close(graph.run(graph.prefill_feeds(inputs)), expected, rtol=1e-4, atol=1e-4)


def test_the_builders_decode_step_writes_its_present_into_the_cache_passed(built):
    model, graph = built
    keys, values = empty_cache(model, 2, 16)
    generator = torch.Generator().manual_seed(3)
    for cache in keys + values:
        cache[:, :, :7] = torch.randn(cache[:, :, :7].shape, generator=generator)  # 7 slots written before
    mask = torch.zeros(2, 16, dtype=torch.long)
    mask[:, :8] = 1
    inputs = {"input_ids": torch.tensor([[5], [9]]), "attention_mask": mask, "position_ids": torch.tensor([[7], [7]]),
              "cache_position": torch.tensor([7]), "key_cache": keys, "value_cache": values}
    with torch.no_grad():
        logits, new_keys, new_values = DecodeStep(model)(**inputs)
    out = graph.run(graph.decode_feeds(inputs))
    torch.testing.assert_close(out, logits, rtol=1e-4, atol=1e-4)
    for passed, expected in zip(keys + values, new_keys + new_values, strict=True):  # slot 7 written in place
        torch.testing.assert_close(passed, expected, rtol=1e-5, atol=1e-5)

    mask[1, 3] = 0  # a gap: the graph counts the written slots from the mask, so it is refused
    with pytest.raises(genai_reference.GenAIUnavailable, match="gaps"):
        graph.decode_feeds(inputs)


def test_a_builder_that_cannot_run_says_why(tmp_path):
    import transformers

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=16)).eval()
    with pytest.raises(genai_reference.GenAIUnavailable, match=r"model builder failed \(exit"):
        genai_reference.build(model, tmp_path, precision="int3", provider="cpu")
