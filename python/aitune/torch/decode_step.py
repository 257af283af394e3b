"""A causal LM's prefill and decode step as a module of plain tensors, the static KV cache
among its inputs and outputs (the cache writes exported as ScatterND), so ait.tune tunes a
generation loop's steps like any module; and the greedy loop that drives them."""

from __future__ import annotations

import inspect

from collections.abc import Callable
from typing import Any

import torch


class _TensorCache:
    """The KV cache as values of the graph, one key and one value tensor per layer
    ``[batch, kv_heads, cache_len, head_dim]``. ``update`` writes this step's keys and
    values at ``cache_position`` out of place (an in-place write to an input would be a
    mutation the exporters refuse) and hands back the layer's whole cache for attention.
    The write is ``index_put`` over (batch, head, slot) indices: it exports as one
    ScatterND whose data is the layer's cache input itself, the form an engine can run in
    place (``in_place_outputs``); ``index_copy`` along the slot axis exports as Transpose ->
    ScatterND -> Transpose, which it cannot. ``in_place``: ``index_put_`` into the given
    tensors themselves (DecodeStep's ``write_in_place``). Only what transformers' attention
    layers call is here."""

    def __init__(self, keys, values, cache_position: torch.Tensor, in_place: bool = False):
        self.keys, self.values = list(keys), list(values)
        self.cache_position = cache_position
        self.in_place = in_place

    def _written(self, cache: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        batch = torch.arange(cache.shape[0], device=cache.device)[:, None, None]
        heads = torch.arange(cache.shape[1], device=cache.device)[None, :, None]
        where = (batch, heads, self.cache_position[None, None, :])
        return cache.index_put_(where, states) if self.in_place else cache.index_put(where, states)

    def get_seq_length(self, layer_idx: int = 0) -> torch.Tensor:
        """The slots written before this step (OPT asks; as a tensor, as transformers'
        static layers answer, so an export does not specialise on it)."""
        return self.cache_position[0]

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        self.keys[layer_idx] = self._written(self.keys[layer_idx], key_states)
        self.values[layer_idx] = self._written(self.values[layer_idx], value_states)
        return self.keys[layer_idx], self.values[layer_idx]


def _refuse_unsupported(config) -> None:
    """NotImplementedError, naming why, for a model whose attention DecodeStep's mask and
    cache cannot express (before this, each crashed deep in the model or silently generated
    other tokens than ``generate``): GPT-Neo's local layers (a window of ``window_size``
    transformers applies to no 4-D mask it is given), ALiBi biases built from the 2-D
    padding mask (Bloom, Falcon with ``alibi``), keys and values of different head sizes
    (DeepSeek-V2 / V3's multi-head latent attention), and layers of different head sizes or
    counts (Gemma 4's ``global_head_dim``), which a cache of one shape cannot hold."""
    name = type(config).__name__
    if getattr(config, "num_attention_heads", None) is None:
        raise NotImplementedError(f"DecodeStep: {name} has no num_attention_heads: not an attention decoder whose "
                                  "keys and values a cache holds (a recurrent model: RWKV, Mamba, xLSTM)")
    local = sorted(set(getattr(config, "attention_layers", None) or ()) - {"global"})
    if local:
        raise NotImplementedError(f"DecodeStep: {name}'s {local} attention layers (a window of "
                                  f"{getattr(config, 'window_size', None)} slots) are not supported")
    if getattr(config, "model_type", None) == "bloom" or getattr(config, "alibi", False) is True:
        raise NotImplementedError(f"DecodeStep: {name}'s ALiBi position bias, built from a 2-D padding mask, is not "
                                  "supported (DecodeStep passes a 4-D mask over the cache's slots)")
    if getattr(config, "kv_lora_rank", None) is not None or (
            getattr(config, "v_head_dim", None) is not None and getattr(config, "qk_nope_head_dim", None) is not None):
        raise NotImplementedError(f"DecodeStep: {name}'s multi-head latent attention (keys and values of different "
                                  "head sizes) is not supported: the cache has one head size")
    # Gemma 4's config keeps per-layer values (full-attention layers have a head size of
    # their own) and refuses `config.head_dim` itself; a cache of one shape cannot hold them.
    try:
        layers = list(getattr(config, "per_layer_config", None) or ())
    except Exception:  # noqa: BLE001  (a config that cannot list its layers: nothing to compare)
        layers = []
    shapes = {(getattr(layer, "head_dim", None), getattr(layer, "num_key_value_heads", None)) for layer in layers}
    if len(shapes) > 1:
        raise NotImplementedError(f"DecodeStep: {name}'s layers differ in key/value head size or count "
                                  f"({sorted(shapes, key=str)} as (head_dim, num_key_value_heads)): the cache has one "
                                  "shape for every layer (Gemma 4's full-attention layers)")


def _refuse_without_cache(model: torch.nn.Module) -> None:
    """NotImplementedError for a model whose forward takes no ``past_key_values``: it keeps
    no key/value cache DecodeStep could pass (OpenAI GPT; RWKV and Mamba carry a state of
    their own), and a forward taking ``**kwargs`` would drop the cache silently (OpenAI GPT
    crashed on a size mismatch deep in its attention, a session-31 probe)."""
    parameters = inspect.signature(model.forward).parameters
    if "past_key_values" not in parameters:
        raise NotImplementedError(f"DecodeStep: {type(model).__name__}.forward takes no past_key_values: the model "
                                  "keeps no key/value cache a step could pass (DecodeStep steps transformers causal "
                                  "LMs with a KV cache)")


def _attention_layout(config) -> tuple[int | None, list[str] | None]:
    """The sliding window (None: every layer attends to the whole cache) and the per-layer
    attention kinds where they differ (None: one mask serves every layer). transformers
    builds no window into a 4-D mask it is given, so DecodeStep must: every layer slides
    (Mistral, Phi3 with ``sliding_window``), or "full_attention" and "sliding_attention"
    layers alternate (Gemma2 / Gemma3, Qwen3 with ``use_sliding_window``), which get one
    mask each in the dict such models accept. Other layer kinds are refused."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    kinds = set(types or ())
    unknown = kinds - {"full_attention", "sliding_attention"}
    if unknown:
        raise NotImplementedError(f"DecodeStep: layer kinds {sorted(unknown)} of {type(config).__name__} are not "
                                  "supported (full_attention and sliding_attention are)")
    if window is not None and not isinstance(window, int):
        raise TypeError(f"DecodeStep: {type(config).__name__}.sliding_window is {window!r}, not an int")
    if "sliding_attention" in kinds and window is None:
        raise ValueError(f"DecodeStep: {type(config).__name__} has sliding_attention layers but no sliding_window")
    if types is not None and kinds <= {"full_attention"}:
        return None, None  # every layer full (Qwen2 / Qwen3 without use_sliding_window)
    if types is not None and kinds == {"sliding_attention"}:
        return window, None
    return window, types


def _for_attention(model: torch.nn.Module, mask):
    """DecodeStep's boolean masks (True: visible) as the model's attention takes a 4-D mask
    it is given (transformers passes such a mask on as it is): SDPA takes booleans, but
    eager attention (GPT-J, MPT, XGLM, GPT-OSS's sinks, ``attn_implementation="eager"``)
    adds the mask to its scores, so a boolean there added 1 to the visible slots and
    hid nothing (prefill logits off by ~3, tokens unlike ``generate``'s). For eager the
    mask is additive: 0 where visible, the dtype's lowest value elsewhere, as transformers
    builds it."""
    if getattr(model.config, "_attn_implementation", None) != "eager":
        return mask
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)

    def additive(visible):
        return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(
            ~visible, torch.finfo(dtype).min)

    return {kind: additive(m) for kind, m in mask.items()} if isinstance(mask, dict) else additive(mask)


class DecodeStep(torch.nn.Module):
    """``forward(input_ids, attention_mask, position_ids, cache_position, key_cache,
    value_cache) -> (logits, key_cache, value_cache)``: S new tokens per sequence through
    ``model`` (a transformers causal LM), written at cache slots ``cache_position`` of a
    static cache: ``key_cache`` and ``value_cache`` are sequences of one tensor per layer
    ``[batch, kv_heads, cache_len, head_dim]``, returned as tuples of the same.

    - ``input_ids`` [B, S]: S = the prompt's length for prefill, 1 for a decode step.
    - ``attention_mask`` [B, cache_len]: 1 at the cache slots that hold a real token of the
      row once this step's tokens are written (a left-padded prompt's pads are 0).
    - ``position_ids`` [B, S]: each token's position in its own row (padding not counted).
    - ``cache_position`` [S] int64: the slots this step writes (the same for every row).

    Slot j is visible to the token written at slot ``cache_position[i]`` when the row's mask
    is 1 there and ``j <= cache_position[i]`` (and, in a layer with a sliding window W,
    ``j > cache_position[i] - W``, as transformers counts it). A query with no visible slot
    (a pad of a left-padded prompt) sees every slot instead, as transformers' own masks do:
    its output is undefined, but finite, so no NaN reaches the valid rows through the cache.
    Layer kinds other than full and sliding attention raise NotImplementedError.

    Eagerly the returned caches are new tensors. Tuned on ONNX Runtime with
    ``ONNXRuntimeBackendConfig(in_place_outputs=True)``, each returned cache is the tensor
    passed, updated in place (no copy of the cache per step): a caller uses the returned
    caches and must not expect the passed ones to stay as they were (docs/decoders.md).

    ``write_in_place=True``: the step writes into the passed caches itself and returns them
    (transformers' ``StaticCache`` writes its buffers so), for a bare ``torch.compile`` of
    the step with the caches marked as static addresses
    (``torch._dynamo.mark_static_address``), which CUDA graphs then update in place. Not
    for ``ait.tune``: its recording refuses a forward that changes its inputs in place (an
    ONNX graph cannot write its input back); tune the default step with
    ``in_place_outputs=True`` instead, on ONNX Runtime (``ONNXRuntimeBackendConfig``) and on
    torch.compile (``TorchCompileBackendConfig``, whose candidates then compile
    ``in_place_variant()``, this step with ``write_in_place=True``)."""

    def __init__(self, model: torch.nn.Module, write_in_place: bool = False):
        super().__init__()
        _refuse_unsupported(model.config)
        _refuse_without_cache(model)
        self.model = model
        self.write_in_place = bool(write_in_place)
        self.train(model.training)  # the wrapper is in the model's mode (an eval model exports as eval)

    def in_place_variant(self) -> DecodeStep:
        """The same step writing its caches in place (``write_in_place=True``), over the same
        model (no copy): what TorchCompileBackendConfig(in_place_outputs=True) compiles."""
        return self if self.write_in_place else DecodeStep(self.model, write_in_place=True)

    def forward(self, input_ids, attention_mask, position_ids, cache_position, key_cache, value_cache):
        slots = torch.arange(key_cache[0].shape[2], device=input_ids.device)
        earlier = slots[None, :] <= cache_position[:, None]  # [S, cache_len]

        def visible(slot_rule):
            seen = attention_mask.bool()[:, None, None, :] & slot_rule[None, None]
            # A row that sees no slot sees them all (no NaN from a softmax over nothing). Found by
            # a float sum, not `seen.any()`: ONNX Runtime's CUDA provider reduces that bool
            # `any` (ReduceMax) through cuDNN in double, 55 us of a 950 us decode step at batch
            # 8 on an H100 (benchmarks/winner_gap_probe.py); a float ReduceSum over the last
            # axis is its own row kernel. Exact in any float dtype (fp16 graphs included): a
            # sum of zeros and ones is 0 only where every one is 0.
            none = seen.to(torch.float32).sum(dim=-1, keepdim=True) == 0
            return seen | none  # [B, 1, S, cache_len]

        window, types = _attention_layout(self.model.config)
        if window is None:
            mask = visible(earlier)
        else:
            # transformers' sliding window over cache slots: slot j is seen from slot i when i - window < j <= i
            sliding = visible(earlier & (slots[None, :] > cache_position[:, None] - window))
            mask = sliding if types is None else {"full_attention": visible(earlier), "sliding_attention": sliding}
        mask = _for_attention(self.model, mask)
        cache = _TensorCache(key_cache, value_cache, cache_position, in_place=self.write_in_place)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
        return out.logits, tuple(cache.keys), tuple(cache.values)


def _cache_geometry(config) -> tuple[int, int, int]:
    """(layers, key/value heads, head size) of the decoder the cache serves. The decoder of
    an encoder-decoder family run as a causal LM (BartForCausalLM, MBart, Pegasus, Marian)
    keeps its own counts (``decoder_layers``, ``decoder_attention_heads``) beside the
    encoder's, which ``num_hidden_layers`` / ``num_attention_heads`` name there: a cache of
    the encoder's layer count crashed the step (IndexError) where the decoder had more."""
    layers = getattr(config, "decoder_layers", None) or config.num_hidden_layers
    heads = getattr(config, "decoder_attention_heads", None) or config.num_attention_heads
    # those encoder-decoder families have no grouped keys: one key head per query head
    grouped = None if getattr(config, "decoder_attention_heads", None) else getattr(config, "num_key_value_heads", None)
    kv_heads = grouped or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return layers, kv_heads, head_dim


def empty_cache(model: torch.nn.Module, batch_size: int, cache_len: int, dtype: torch.dtype | None = None,
                device: torch.device | str | None = None) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Zero key and value caches for a transformers causal LM's config: per layer one
    ``[batch, kv_heads, cache_len, head_dim]`` tensor each (DecodeStep's layout)."""
    config = model.config
    _refuse_unsupported(config)
    layers, kv_heads, head_dim = _cache_geometry(config)
    parameter = next(model.parameters())
    shape = (batch_size, kv_heads, cache_len, head_dim)
    dtype, device = dtype or parameter.dtype, device or parameter.device

    def zeros():
        return tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers))

    return zeros(), zeros()


def step_dynamic_shapes(model: torch.nn.Module, batch, cache, sequence=None) -> dict[str, dict[int, object]]:
    """``dynamic_shapes`` for ``ait.Module(DecodeStep(model), ..., dynamic_shapes=...)``, so that a
    tuned step takes other batch sizes and cache lengths than the recorded ones (and, for a
    prefill, other prompt lengths): ``batch``, ``cache`` and ``sequence`` are
    ``torch.export.Dim``s (or ints where fixed). With ``sequence``: the prefill's (S prompt
    tokens at slots ``cache_position``); without: the decode step's (one token). The caches
    are named per layer as the graph flattens them (``input_key_cache_0``, ...): axis 0 the
    batch, axis 2 the cache length; ``attention_mask`` spans the cache."""
    _refuse_unsupported(model.config)
    caches = {f"input_{kind}_cache_{i}": {0: batch, 2: cache}
              for kind in ("key", "value") for i in range(_cache_geometry(model.config)[0])}
    if sequence is None:
        return {"input_ids": {0: batch}, "attention_mask": {0: batch, 1: cache}, "position_ids": {0: batch},
                **caches}
    return {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: cache},
            "position_ids": {0: batch, 1: sequence}, "cache_position": {0: sequence}, **caches}


#: greedy_generate's default for ``eos_token_id`` and ``pad_token_id``: the model's own
#: generation config, as transformers' ``generate`` reads them.
FROM_MODEL: Any = "from the model's generation config"


def greedy_generate(prefill: Callable, decode: Callable, model: torch.nn.Module, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor, max_new_tokens: int, eos_token_id: Any = FROM_MODEL,
                    pad_token_id: Any = FROM_MODEL) -> torch.Tensor:
    """Greedy tokens [B, N] for a (left-padded) prompt through ``prefill`` and ``decode``
    (DecodeStep modules, tuned or not), as transformers' ``generate(do_sample=False)`` makes
    them: positions counted as it counts them (pads not counted); a row that emitted an end
    token (``eos_token_id``: an int, a list, or None for none) gets ``pad_token_id`` from then
    on (the first end token where the config has no pad token), and the loop stops when every
    row has ended, so N <= max_new_tokens. Both default to the model's generation config.
    The cache holds prompt + new tokens; each step passes the caches the previous one
    returned (the same tensors, updated in place, where the steps are tuned with
    ``in_place_outputs``)."""
    # 0 returned one token (the prefill's) and -1 failed deep in the model; transformers'
    # generate refuses both the same way
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if attention_mask.dim() == 2 and attention_mask.shape[-1] and bool((attention_mask[:, -1] == 0).any()):
        # each row's next token is read at its last position: a right-padded row read a pad's
        # logits and generated other tokens than generate, silently (a session-37 probe)
        rows = (attention_mask[:, -1] == 0).nonzero().flatten().tolist()
        raise ValueError(f"greedy_generate takes left-padded prompts: row(s) {rows[:8]} end with padding "
                         "(attention_mask 0 at the last position); pad on the left (tokenizer.padding_side = 'left')")
    ends, pad = _end_tokens(model, eos_token_id, pad_token_id, input_ids.device)
    batch, prompt_len = input_ids.shape
    cache_len = prompt_len + max_new_tokens
    device = input_ids.device
    mask = torch.zeros(batch, cache_len, dtype=torch.long, device=device)
    mask[:, :prompt_len] = attention_mask
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    keys, values = empty_cache(model, batch, cache_len, device=device)
    logits, keys, values = prefill(input_ids, mask, positions, torch.arange(prompt_len, device=device), keys, values)
    running = torch.ones(batch, 1, dtype=torch.bool, device=device)

    def next_token(logits: torch.Tensor) -> torch.Tensor:
        nonlocal running
        token = logits[:, -1].argmax(-1, keepdim=True)
        if ends is None:
            return token
        token = torch.where(running, token, pad)  # an ended row is padded, as generate pads it
        running = running & ~torch.isin(token, ends)
        return token

    token = next_token(logits)
    tokens = [token]
    position = positions[:, -1:]
    for step in range(max_new_tokens - 1):
        if ends is not None and not bool(running.any()):
            break  # every row ended: generate stops here too
        slot = prompt_len + step
        mask = mask.clone()  # a fresh input per step: a tune may keep the recorded ones
        mask[:, slot] = 1
        position = position + 1
        logits, keys, values = decode(token, mask, position, torch.tensor([slot], device=device), keys, values)
        token = next_token(logits)
        tokens.append(token)
    return torch.cat(tokens, dim=1)


def _end_tokens(model: torch.nn.Module, eos_token_id: Any, pad_token_id: Any,
                device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(end tokens as a 1-d tensor, or None for none; the pad token as a 0-d tensor)."""
    config = getattr(model, "generation_config", None) or getattr(model, "config", None)
    if eos_token_id is FROM_MODEL:
        eos_token_id = getattr(config, "eos_token_id", None)
    if pad_token_id is FROM_MODEL:
        pad_token_id = getattr(config, "pad_token_id", None)
    if eos_token_id is None or (isinstance(eos_token_id, (list, tuple)) and not eos_token_id):
        return None, None
    ends = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id), device=device)
    if pad_token_id is None:  # generate pads with the first end token then (and warns)
        pad_token_id = int(ends[0])
    return ends, torch.tensor(int(pad_token_id), device=device)
