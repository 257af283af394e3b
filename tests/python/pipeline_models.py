"""Tiny pipelines built from configs (random weights) for the pipeline tests and guide:
a diffusers-style text-to-image pipeline (CLIP text encoder + UNet2DConditionModel, a
few denoising steps in plain Python) and a decoder with a static KV cache driven by a
generate-like loop (prefill, then decode steps)."""

from __future__ import annotations

import torch


def tiny_text_encoder():
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                            num_attention_heads=2, max_position_embeddings=8, projection_dim=16,
                            bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return CLIPTextModel(config).eval()


def tiny_unet():
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=2, norm_num_groups=4,
    ).eval()


class TinyDiffusionPipeline:
    """A plain object holding its models as attributes, as diffusers pipelines do:
    ``pipeline(input_ids)`` encodes the prompt tokens, then denoises seeded latents."""

    def __init__(self, steps: int = 3):
        torch.manual_seed(0)
        self.text_encoder = tiny_text_encoder()
        self.unet = tiny_unet()
        self.steps = steps

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            text = self.text_encoder(input_ids, return_dict=False)[0]
            generator = torch.Generator().manual_seed(1)
            latents = torch.randn(input_ids.shape[0], 4, 8, 8, generator=generator)
            for step in range(self.steps):
                t = torch.tensor(999.0 - 333.0 * step)
                noise = self.unet(latents, t, encoder_hidden_states=text, return_dict=False)[0]
                latents = latents - 0.3 * noise
            return latents


def prompt_samples(n: int = 2) -> list[dict]:
    """Token ids of ``n`` prompts, one sample each (no batch axis)."""
    generator = torch.Generator().manual_seed(2)
    return [{"input_ids": torch.randint(0, 64, (8,), generator=generator)} for _ in range(n)]


class TinyStaticCacheDecoder(torch.nn.Module):
    """One attention layer over a static KV cache of ``max_length`` positions. Prefill
    (``forward(input_ids, k_cache, v_cache)``) writes positions 0..S-1; a decode step
    (``forward(input_ids, k_cache, v_cache, cache_position=...)``) writes one position.
    Returns logits and the updated caches."""

    def __init__(self, vocab: int = 32, dim: int = 16, max_length: int = 12):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, vocab)
        self.max_length = max_length

    def forward(self, input_ids, k_cache, v_cache, cache_position=None):
        x = self.embed(input_ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        length = input_ids.shape[1]
        positions = torch.arange(self.max_length, device=input_ids.device)
        if cache_position is None:  # prefill: positions 0..length-1
            write = (positions < length).to(k.dtype)[None, :, None]
            k_new = torch.nn.functional.pad(k, (0, 0, 0, self.max_length - length))
            v_new = torch.nn.functional.pad(v, (0, 0, 0, self.max_length - length))
            visible = positions[None, :] <= torch.arange(length, device=input_ids.device)[:, None]
        else:  # one token at cache_position
            write = (positions == cache_position).to(k.dtype)[None, :, None]
            k_new, v_new = k.expand(-1, self.max_length, -1), v.expand(-1, self.max_length, -1)
            visible = (positions <= cache_position)[None, :]
        k_cache = k_cache * (1 - write) + k_new * write
        v_cache = v_cache * (1 - write) + v_new * write
        scores = q @ k_cache.transpose(1, 2) / k.shape[-1] ** 0.5
        scores = scores.masked_fill(~visible[None], float("-inf"))
        return self.out(torch.softmax(scores, dim=-1) @ v_cache), k_cache, v_cache


def generate(model, input_ids: torch.Tensor, new_tokens: int = 3) -> torch.Tensor:
    """Greedy decoding with a static cache: one prefill call, then one call per token."""
    batch, length = input_ids.shape
    dim = model.embed.embedding_dim
    k_cache = torch.zeros(batch, model.max_length, dim)
    v_cache = torch.zeros(batch, model.max_length, dim)
    with torch.no_grad():
        logits, k_cache, v_cache = model(input_ids, k_cache, v_cache)
        tokens = [logits[:, -1].argmax(-1)]
        for i in range(new_tokens - 1):
            position = torch.tensor(length + i)
            logits, k_cache, v_cache = model(tokens[-1][:, None], k_cache, v_cache, cache_position=position)
            tokens.append(logits[:, -1].argmax(-1))
    return torch.stack(tokens, dim=1)
