"""A causal LM's prefill and decode step as a module of plain tensors, the static KV cache
among its inputs and outputs (the cache writes exported as ScatterND), so ait.tune tunes a
generation loop's steps like any module; and the greedy loop that drives them."""

from __future__ import annotations

from collections.abc import Callable

import torch


class _TensorCache:
    """The KV cache as values of the graph: ``update`` writes this step's keys and values at
    ``cache_position`` out of place (``index_copy``: ScatterND in ONNX; an in-place write to
    an input would be a mutation the exporters refuse) and hands back the layer's whole
    cache for attention. Only what transformers' attention layers call is here."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, cache_position: torch.Tensor):
        self.keys, self.values = list(keys.unbind(0)), list(values.unbind(0))
        self.cache_position = cache_position

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        self.keys[layer_idx] = self.keys[layer_idx].index_copy(2, self.cache_position, key_states)
        self.values[layer_idx] = self.values[layer_idx].index_copy(2, self.cache_position, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack(self.keys), torch.stack(self.values)


class DecodeStep(torch.nn.Module):
    """``forward(input_ids, attention_mask, position_ids, cache_position, key_cache,
    value_cache) -> (logits, key_cache, value_cache)``: S new tokens per sequence through
    ``model`` (a transformers causal LM), written at cache slots ``cache_position`` of a
    static cache ``[layers, batch, kv_heads, cache_len, head_dim]``.

    - ``input_ids`` [B, S]: S = the prompt's length for prefill, 1 for a decode step.
    - ``attention_mask`` [B, cache_len]: 1 at the cache slots that hold a real token of the
      row once this step's tokens are written (a left-padded prompt's pads are 0).
    - ``position_ids`` [B, S]: each token's position in its own row (padding not counted).
    - ``cache_position`` [S] int64: the slots this step writes (the same for every row).

    Slot j is visible to the token written at slot ``cache_position[i]`` when the row's mask
    is 1 there and ``j <= cache_position[i]``. A query with no visible slot (a pad of a
    left-padded prompt) sees every slot instead, as transformers' own masks do: its output
    is undefined, but finite, so no NaN reaches the valid rows through the cache."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, cache_position, key_cache, value_cache):
        slots = torch.arange(key_cache.shape[3], device=input_ids.device)
        visible = attention_mask.bool()[:, None, None, :] & (slots[None, :] <= cache_position[:, None])[None, None]
        visible = visible | ~visible.any(dim=-1, keepdim=True)  # [B, 1, S, cache_len]
        cache = _TensorCache(key_cache, value_cache, cache_position)
        out = self.model(input_ids=input_ids, attention_mask=visible, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        keys, values = cache.stacked()
        return out.logits, keys, values


def empty_cache(model: torch.nn.Module, batch_size: int, cache_len: int, dtype: torch.dtype | None = None,
                device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero key and value caches ``[layers, batch, kv_heads, cache_len, head_dim]`` for a
    transformers causal LM's config."""
    config = model.config
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    parameter = next(model.parameters())
    shape = (config.num_hidden_layers, batch_size, kv_heads, cache_len, head_dim)
    dtype, device = dtype or parameter.dtype, device or parameter.device
    return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)


def greedy_generate(prefill: Callable, decode: Callable, model: torch.nn.Module, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy tokens [B, max_new_tokens] for a (left-padded) prompt through ``prefill`` and
    ``decode`` (DecodeStep modules, tuned or not), positions counted as transformers'
    ``generate`` counts them (pads not counted). The cache holds prompt + new tokens."""
    batch, prompt_len = input_ids.shape
    cache_len = prompt_len + max_new_tokens
    device = input_ids.device
    mask = torch.zeros(batch, cache_len, dtype=torch.long, device=device)
    mask[:, :prompt_len] = attention_mask
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    keys, values = empty_cache(model, batch, cache_len, device=device)
    logits, keys, values = prefill(input_ids, mask, positions, torch.arange(prompt_len, device=device), keys, values)
    token = logits[:, -1].argmax(-1, keepdim=True)
    tokens = [token]
    position = positions[:, -1:]
    for step in range(max_new_tokens - 1):
        slot = prompt_len + step
        mask = mask.clone()  # a fresh input per step: a tune may keep the recorded ones
        mask[:, slot] = 1
        position = position + 1
        logits, keys, values = decode(token, mask, position, torch.tensor([slot], device=device), keys, values)
        token = logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
    return torch.cat(tokens, dim=1)
