"""Tiny decoder-only language models from configs (random weights) for the decoder tests:
Llama, Qwen2 and other families with grouped key-value heads, small enough to export in
seconds."""

from __future__ import annotations

import torch

VOCAB = 256

#: Families beyond Llama / Qwen2, each with what could trip a fusion or the decode step:
#: Mistral / Phi3 (one sliding window for every layer), Gemma (scaled embeddings, 1 + w
#: norms, a head size apart from hidden / heads), Gemma2 (attention and logit soft-capping,
#: alternating sliding / full layers), Gemma3 (q / k norms, local rotary), Qwen3 (q / k
#: norms), GPT-NeoX (partial rotary, LayerNorm, no grouped heads), OPT (learned positions).
#: "-window": a sliding window (4) shorter than the tests' sequences. Eager attention, which
#: adds the mask to its scores: Llama with ``attn_implementation="eager"``, GPT-J (partial
#: interleaved rotary), MPT (ALiBi over the key slots).
FAMILIES = ("mistral", "mistral-window", "phi3", "phi3-window", "gemma", "gemma2", "gemma2-window",
            "gemma2-softcap", "gemma3", "gemma3-window", "qwen3", "qwen3-window", "gpt-neox", "opt",
            "llama-eager", "gptj", "mpt")


def tiny_decoder(kind: str) -> torch.nn.Module:
    """A 2-layer ``kind`` causal LM, hidden 64, 4 query / 2 key-value heads where the family
    groups them: "llama", "qwen2" (the default initialisation) or one of FAMILIES
    (weights drawn with std 0.2, so attention is far from uniform and a dropped or wrong
    mask shows in the outputs)."""
    import transformers as t

    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(**common)).eval()
    if kind == "qwen2":
        return t.Qwen2ForCausalLM(t.Qwen2Config(**common)).eval()
    common["initializer_range"] = 0.2
    family, _, variant = kind.partition("-")
    window = {"sliding_window": 4} if variant == "window" else {}
    if kind == "phi3-longrope":  # Phi-3-mini-128k's rotary: the factors switch past 4 positions
        config = t.Phi3Config(**{**common, "max_position_embeddings": 64}, pad_token_id=0, eos_token_id=1,
                              bos_token_id=1, original_max_position_embeddings=4,
                              rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8,
                                            "long_factor": [2.0] * 8})
    elif kind == "llama-yarn":  # yarn rotary: cos / sin scaled by its attention factor (1.14 at factor 4)
        config = t.LlamaConfig(**common, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 32})
    elif family == "mistral":
        config = t.MistralConfig(**common, **window)
    elif kind == "phi3-partial":  # rotary over half of each head (Phi-4-mini's partial_rotary_factor 0.75)
        config = t.Phi3Config(**common, pad_token_id=0, eos_token_id=1, bos_token_id=1, partial_rotary_factor=0.5)
    elif family == "phi3":
        config = t.Phi3Config(**common, pad_token_id=0, eos_token_id=1, bos_token_id=1, **window)
    elif family == "gemma":
        config = t.GemmaConfig(**common, head_dim=16)
    elif family == "gemma2":
        config = t.Gemma2Config(**common, head_dim=16, **window)
        if variant == "softcap":  # eager attention applies the soft-capping (SDPA ignores it)
            config.attn_logit_softcapping = 2.0
    elif family == "gemma3":
        config = t.Gemma3TextConfig(**common, head_dim=16, **window)  # 2 layers: both sliding
    elif family == "qwen3":
        config = t.Qwen3Config(**common, head_dim=16, **(dict(use_sliding_window=True, max_window_layers=1, **window)
                                                          if window else {}))
    elif kind == "llama-eager":
        config = t.LlamaConfig(**common)
    elif kind == "gptj":
        config = t.GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, rotary_dim=8,
                              initializer_range=0.2, bos_token_id=1, eos_token_id=1)
    elif kind == "mpt":
        config = t.MptConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_seq_len=128,
                             initializer_range=0.2)
    elif kind == "mixtral":  # mixture of experts: transformers' default grouped_mm experts (a custom op)
        config = t.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
    elif kind == "gpt-neox":
        del common["num_key_value_heads"]
        config = t.GPTNeoXConfig(**common)
    elif family == "opt":
        config = t.OPTConfig(vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                             max_position_embeddings=128, word_embed_proj_dim=64, init_std=0.2)
    else:
        raise ValueError(f"unknown decoder kind {kind!r}: llama, qwen2 or one of {FAMILIES}")
    extra = {"attn_implementation": "eager"} if variant in ("softcap", "eager") else {}
    return t.AutoModelForCausalLM.from_config(config, **extra).eval()


#: Inputs ONNX Runtime's CUDA kernels read in host memory (their kernel definitions'
#: OrtMemTypeCPUInput), by operator: a value computed from a graph input's data that feeds
#: one is copied to the host on every call, and keeps the graph from running as a CUDA graph.
HOST_INPUTS = {
    "Range": (0, 1, 2), "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4),
    "ConstantOfShape": (0,), "Unsqueeze": (1,), "Squeeze": (1,), "TopK": (1,), "OneHot": (1,),
    "Resize": (1, 2, 3), "Pad": (1, 2, 3), "Split": (1,), "GroupQueryAttention": (6,),
}


def data_fed_host_inputs(path) -> list[str]:
    """``node:input`` of each host-memory input (HOST_INPUTS) whose value depends on a graph
    input's data (reached through anything but Shape / Size, which read only shapes)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    producer = {out: node for node in graph.node for out in node.output}
    inputs = {i.name for i in graph.input}
    memo: dict[str, bool] = {}

    def from_data(name: str) -> bool:
        if name not in memo:
            memo[name] = False
            node = producer.get(name)
            if node is None:
                memo[name] = name in inputs
            elif node.op_type not in ("Shape", "Size"):
                memo[name] = any(from_data(i) for i in node.input if i)
        return memo[name]

    return [f"{node.name or node.op_type}:{index}" for node in graph.node
            for index in HOST_INPUTS.get(node.op_type, ()) if index < len(node.input) and node.input[index]
            and from_data(node.input[index])]


def padded_prefill_batches(batch_size: int) -> list[dict]:
    """One keyword prefill batch per size (``ait.tune``'s samples callable): its rows
    left-padded, right-padded and unpadded in turn, length 8."""
    generator = torch.Generator().manual_seed(batch_size)
    length = 8
    ids = torch.randint(0, VOCAB, (batch_size, length), generator=generator)
    mask = torch.ones(batch_size, length, dtype=torch.long)
    for row in range(batch_size):
        if row % 3 == 0:
            mask[row, :3] = 0  # left padding
        elif row % 3 == 1:
            mask[row, -2:] = 0  # right padding
    return [{"input_ids": ids, "attention_mask": mask, "use_cache": False}]
