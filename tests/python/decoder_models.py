"""Tiny decoder-only language models from configs (random weights) for the decoder tests:
a Llama or a Qwen2 with grouped key-value heads, small enough to export in seconds."""

from __future__ import annotations

import torch

VOCAB = 256


def tiny_decoder(kind: str) -> torch.nn.Module:
    """A 2-layer ``kind`` ("llama" or "qwen2") causal LM, hidden 64, 4 query / 2 key-value heads."""
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()
