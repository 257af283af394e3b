"""Greedy generation through a tuned prefill and a tuned decode step (KV cache as tensors,
one per layer, updated in place: ``in_place_outputs=True``) of a tiny random Llama on the
CPU provider, checked token for token against transformers' ``generate(do_sample=False)``,
for one prompt and a left-padded batch of two.

    python examples/llm_decode.py
"""
from __future__ import annotations

import json

import torch
import transformers

import aitune.torch as ait
from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig
from aitune.torch.decode_step import DecodeStep, greedy_generate

VOCAB = 256
PROMPT_LEN = 6
NEW_TOKENS = 6


def tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config).eval()


def prompts(batch_size: int) -> dict:
    """Prompts of PROMPT_LEN tokens; every second row left-padded by 2 (pad id 0)."""
    generator = torch.Generator().manual_seed(batch_size)
    ids = torch.randint(1, VOCAB, (batch_size, PROMPT_LEN), generator=generator)
    mask = torch.ones(batch_size, PROMPT_LEN, dtype=torch.long)
    mask[1::2, :2] = 0
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}


def tune_steps(model: torch.nn.Module) -> tuple[ait.Module, ait.Module]:
    """A prefill and a decode step, each an ait.Module over DecodeStep, tuned by recording
    greedy generations of batches of 1 and 2 prompts. Both write the caches they are given
    in place (in_place_outputs): each step returns the very tensors it was passed."""
    strategy = ait.OneBackendStrategy(ONNXRuntimeBackend(ONNXRuntimeBackendConfig(
        execution_provider=ONNXExecutionProvider.CPU, use_dynamo=True, in_place_outputs=True)))
    # (provider-option tuning on: its candidates include ONNX Runtime's fusions, GroupQueryAttention
    # over the decode step's cache among them; with it off, one plain candidate is tried)
    prefill = ait.Module(DecodeStep(model), "llm-prefill", strategy=strategy)
    decode = ait.Module(DecodeStep(model), "llm-decode", strategy=strategy)

    def generate(input_ids, attention_mask):
        return greedy_generate(prefill, decode, model, input_ids, attention_mask, NEW_TOKENS)

    # performance_validation off: on a model this small the point is the tuned path, not speed
    ait.tune(generate, lambda size: [prompts(size)], batch_sizes=[1, 2], ignore_failing_modules=False,
             performance_validation=False, disable_external_logging=True, progress=False)
    return prefill, decode


def main() -> None:
    model = tiny_llama()
    prefill, decode = tune_steps(model)
    for name, module in (("prefill", prefill), ("decode", decode)):
        (report,) = module.ait_reports.values()
        fused = [c for c in json.loads(report.to_json())["candidates"] if c.get("transform") == "ort_fusions"]
        print(f"{name}: {list(module.ait_backends.values())}; fused operators "
              f"{fused[0]['fused_operators'] if fused else 'none'}")
    for size in (1, 2):
        batch = prompts(size)
        with torch.no_grad():
            ours = greedy_generate(prefill, decode, model, batch["input_ids"], batch["attention_mask"], NEW_TOKENS)
            reference = model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        reference = reference[:, PROMPT_LEN:]
        print(f"batch {size}: tuned {ours.tolist()} generate {reference.tolist()}")
        assert torch.equal(ours, reference), "tuned steps differ from transformers' greedy generate"


if __name__ == "__main__":
    main()
