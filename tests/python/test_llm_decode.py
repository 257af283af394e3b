"""examples/llm_decode.py: a tiny Llama's prefill and decode step (KV cache as tensors,
DecodeStep) tuned on the CPU provider with in_place_outputs generate the same greedy
tokens as transformers' generate, for one prompt and a left-padded batch of two; the tuned
steps compute what the eager DecodeStep computes and return the very cache tensors they
were given, updated in place."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import onnx
import pytest
import torch
from decoder_models import FAMILIES, data_fed_host_inputs, tiny_decoder

pytest.importorskip("transformers")

import aitune.torch as ait  # noqa: E402
from aitune.torch import ModuleState  # noqa: E402
from aitune.torch.decode_step import DecodeStep, empty_cache, greedy_generate  # noqa: E402

_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llm_decode.py"


def _example():
    spec = importlib.util.spec_from_file_location("llm_decode", _EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tuned_steps_generate_the_greedy_tokens_of_transformers(tmp_path):
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
    _check_in_place_step(example, model, decode)
    # The checkpoint keeps the choice: a loaded decode step updates its caches in place too.
    ait.save(decode, tmp_path / "decode.ait")
    loaded = ait.load(ait.Module(DecodeStep(model), "llm-decode"), tmp_path / "decode.ait")
    assert all("updates in place: input_key_cache_0" in b for b in loaded.ait_backends.values()), loaded.ait_backends
    _check_in_place_step(example, model, loaded)


def test_a_tuned_qwen2_decode_step_updates_its_caches_in_place():
    """A tiny Qwen2's decode step alone, tuned on one recorded step of the shapes
    _check_in_place_step calls it with."""
    import transformers

    from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    example = _example()
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=example.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)).eval()
    cache_len = example.PROMPT_LEN + example.NEW_TOKENS
    keys, values = empty_cache(model, 2, cache_len)
    sample = {"input_ids": torch.tensor([[3], [4]]), "attention_mask": torch.ones(2, cache_len, dtype=torch.long),
              "position_ids": torch.tensor([[6], [6]]), "cache_position": torch.tensor([6]), "key_cache": keys,
              "value_cache": values}
    decode = ait.Module(DecodeStep(model), "qwen2-decode", strategy=ait.OneBackendStrategy(ONNXRuntimeBackend(
        ONNXRuntimeBackendConfig(execution_provider=ONNXExecutionProvider.CPU, in_place_outputs=True,
                                 tune_provider_options=False))))
    ait.tune(decode, lambda size: [sample], batch_sizes=[2], ignore_failing_modules=False,
             performance_validation=False, progress=False)
    assert all("updates in place: input_key_cache_0" in b for b in decode.ait_backends.values()), decode.ait_backends
    _check_in_place_step(example, model, decode)


def _check_in_place_step(example, model, decode):
    """One decode step through the tuned module: the eager DecodeStep's logits and caches,
    written into the tensors passed (the same objects come back)."""
    cache_len = example.PROMPT_LEN + example.NEW_TOKENS
    generator = torch.Generator().manual_seed(1)
    keys, values = (tuple(torch.randn(t.shape, generator=generator) for t in half)
                    for half in empty_cache(model, 2, cache_len))
    mask = torch.ones(2, cache_len, dtype=torch.long)
    mask[:, cache_len - 3:] = 0
    step = (torch.tensor([[5], [7]]), mask, torch.tensor([[8], [8]]), torch.tensor([cache_len - 4]))
    with torch.no_grad():
        eager_logits, eager_keys, eager_values = DecodeStep(model)(*step, keys, values)
        logits, new_keys, new_values = decode(*step, keys, values)
    torch.testing.assert_close(logits, eager_logits, rtol=1e-4, atol=1e-4)
    for passed, returned, eager in zip(keys + values, new_keys + new_values, eager_keys + eager_values, strict=True):
        assert returned is passed and returned.data_ptr() == passed.data_ptr()
        torch.testing.assert_close(passed, eager, rtol=1e-4, atol=1e-4)


def test_decode_step_writes_only_its_cache_slot():
    example = _example()
    model = example.tiny_llama()
    step = DecodeStep(model)
    keys, values = empty_cache(model, 2, 8)
    keys = tuple(t + 1 for t in keys)  # a cache already holding something everywhere
    values = tuple(t + 1 for t in values)
    mask = torch.ones(2, 8, dtype=torch.long)
    with torch.no_grad():
        logits, new_keys, new_values = step(torch.tensor([[5], [7]]), mask, torch.tensor([[3], [3]]),
                                            torch.tensor([3]), keys, values)
    assert logits.shape == (2, 1, example.VOCAB)
    assert len(new_keys) == len(keys) == model.config.num_hidden_layers and len(new_values) == len(values)
    untouched = [i for i in range(8) if i != 3]
    for old, new in zip(keys + values, new_keys + new_values, strict=True):
        assert new.shape == old.shape
        assert torch.equal(new[:, :, untouched], old[:, :, untouched])
        assert not torch.equal(new[:, :, 3], old[:, :, 3])
        assert torch.equal(old, torch.ones_like(old))  # eagerly the inputs are not written in place


def test_a_decode_step_that_writes_in_place_returns_the_caches_it_was_given_updated(caplog):
    """DecodeStep(write_in_place=True), for a bare torch.compile with static caches: the
    same logits as the default step, the caches it returns are the tensors passed, written
    at this step's slot only; greedy generation with it (and compiled, the caches marked as
    static addresses) gives the default step's tokens; ait.tune keeps it eager, saying why."""
    example = _example()
    model = example.tiny_llama()
    keys, values = empty_cache(model, 2, 8)
    keys = tuple(t + 1 for t in keys)
    values = tuple(t + 1 for t in values)
    mask = torch.ones(2, 8, dtype=torch.long)
    call = (torch.tensor([[5], [7]]), mask, torch.tensor([[3], [3]]), torch.tensor([3]))
    with torch.no_grad():
        logits, new_keys, new_values = DecodeStep(model)(*call, keys, values)
        in_place = DecodeStep(model, write_in_place=True)
        logits_in_place, out_keys, out_values = in_place(*call, keys, values)
    torch.testing.assert_close(logits_in_place, logits, atol=0, rtol=0)
    for given, out, expected in zip(keys + values, out_keys + out_values, new_keys + new_values, strict=True):
        assert out is given  # the passed tensor itself, written in place
        assert torch.equal(given, expected)  # what the default step returns as a new tensor

    batch = _family_prompts(2)
    with torch.no_grad():
        reference = greedy_generate(DecodeStep(model), DecodeStep(model), model, batch["input_ids"],
                                    batch["attention_mask"], 5)
        written = DecodeStep(model, write_in_place=True)
        assert torch.equal(greedy_generate(written, written, model, batch["input_ids"], batch["attention_mask"], 5),
                           reference)
        compiled = torch.compile(DecodeStep(model, write_in_place=True))

        def step(input_ids, attention_mask, position_ids, cache_position, key_cache, value_cache):
            for t in (*key_cache, *value_cache):
                torch._dynamo.mark_static_address(t, guard=False)
            return compiled(input_ids, attention_mask, position_ids, cache_position, key_cache, value_cache)

        assert torch.equal(greedy_generate(step, step, model, batch["input_ids"], batch["attention_mask"], 5),
                           reference)

    tuned = ait.Module(DecodeStep(model, write_in_place=True), "in-place-step")
    keys, values = empty_cache(model, 2, 8)
    names = ("input_ids", "attention_mask", "position_ids", "cache_position", "key_cache", "value_cache")
    batch = dict(zip(names, (*call, keys, values), strict=True))
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.tune(tuned, lambda size: [batch], batch_sizes=[2], disable_external_logging=True)
    assert "stays eager" in caplog.text and "changed its input ['key_cache'][0]" in caplog.text


def _family_prompts(batch_size: int, length: int = 6) -> dict:
    """Prompts of ``length`` tokens (ids from 2: no family's pad or end token); every second
    row left-padded by 2."""
    generator = torch.Generator().manual_seed(batch_size)
    ids = torch.randint(2, 256, (batch_size, length), generator=generator)
    mask = torch.ones(batch_size, length, dtype=torch.long)
    mask[1::2, :2] = 0
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _greedy(*args):
    """greedy_generate with no end token, as _generate runs generate."""
    return greedy_generate(*args, eos_token_id=None)


def _generate(model, batch, new_tokens):
    return model.generate(**batch, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None,
                          min_new_tokens=new_tokens)[:, batch["input_ids"].shape[1]:]


@pytest.mark.parametrize("kind", FAMILIES)
def test_eager_decode_step_generates_the_greedy_tokens_of_each_family(kind):
    """DecodeStep over each family (tests/python/decoder_models.py) generates what
    transformers' greedy generate does, for one prompt and a left-padded batch of two,
    over 8 new tokens: 14 cache slots, past the sliding window (4) of the "-window"
    variants, which DecodeStep's mask must apply as transformers does (per layer kind
    where they alternate); OPT asks the cache for its length."""
    model = tiny_decoder(kind)
    for size in (1, 2):
        batch = _family_prompts(size)
        with torch.no_grad():
            ours = greedy_generate(DecodeStep(model), DecodeStep(model), model, batch["input_ids"],
                                   batch["attention_mask"], 8, eos_token_id=None)
            reference = _generate(model, batch, 8)
        assert torch.equal(ours, reference), (kind, size, ours, reference)


def test_tuned_steps_of_alternating_sliding_window_layers_generate_the_greedy_tokens():
    """A Gemma2 with a sliding window shorter than the cache (its layers alternate sliding
    and full attention: one mask each, passed as transformers' dict of masks): prefill and
    decode step tuned on the CPU provider, in place, generate generate's tokens."""
    from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    model = tiny_decoder("gemma2-window")
    strategy = ait.OneBackendStrategy(ONNXRuntimeBackend(ONNXRuntimeBackendConfig(
        execution_provider=ONNXExecutionProvider.CPU, in_place_outputs=True, tune_provider_options=False)))
    prefill = ait.Module(DecodeStep(model), "gemma2-window-prefill", strategy=strategy)
    decode = ait.Module(DecodeStep(model), "gemma2-window-decode", strategy=strategy)
    ait.tune(lambda input_ids, attention_mask: _greedy(prefill, decode, model, input_ids, attention_mask, 8),
             lambda size: [_family_prompts(size)], batch_sizes=[1, 2], ignore_failing_modules=False,
             performance_validation=False, disable_external_logging=True, progress=False)
    for module in (prefill, decode):
        assert all("ONNXRuntimeBackend" in b for b in module.ait_backends.values()), module.ait_backends
    for size in (1, 2):
        batch = _family_prompts(size)
        with torch.no_grad():
            ours = _greedy(prefill, decode, model, batch["input_ids"], batch["attention_mask"], 8)
            reference = _generate(model, batch, 8)
        assert torch.equal(ours, reference), (size, ours, reference)


@pytest.mark.parametrize("kind", ["llama", "gemma2-window"])
def test_a_decode_step_with_its_caches_in_place_fuses_group_query_attention_over_the_cache(kind, tmp_path):
    """With in_place_outputs, the decode step's attention over the cache it just wrote
    fuses into GroupQueryAttention with the cache as its shared past / present
    (decoder_fusions.CachedGroupQueryAttention): the fused candidate passes the check on
    every recorded step of the greedy generations (logits and whole caches, a left-padded
    row; gemma2-window: sliding and full layers, past the window) and the tuned steps
    generate generate's tokens. The prefill (6 new tokens a row) keeps MultiHeadAttention,
    and without in_place_outputs the decode step does too (GQA's present would hold no
    slot past this step's)."""
    import json

    import onnx_ir as ir

    from aitune.torch import decoder_fusions
    from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    model = tiny_decoder(kind)
    strategy = ait.OneBackendStrategy(ONNXRuntimeBackend(ONNXRuntimeBackendConfig(
        execution_provider=ONNXExecutionProvider.CPU, in_place_outputs=True)))
    prefill = ait.Module(DecodeStep(model), f"{kind}-gqa-prefill", strategy=strategy)
    decode = ait.Module(DecodeStep(model), f"{kind}-gqa-decode", strategy=strategy)
    ait.tune(lambda input_ids, attention_mask: _greedy(prefill, decode, model, input_ids, attention_mask, 8),
             lambda size: [_family_prompts(size)], batch_sizes=[1, 2], ignore_failing_modules=False,
             performance_validation=False, disable_external_logging=True, progress=False)

    def fused(module):
        (report,) = module.ait_reports.values()
        (candidate,) = [c for c in json.loads(report.to_json())["candidates"] if c.get("transform") == "ort_fusions"]
        return candidate

    step = fused(decode)
    assert step["fused_operators"].get("GroupQueryAttention") == 2, step["fused_operators"]
    assert step["correctness"]["passed"] and len(step["correctness"]["samples"]) >= 8, step["correctness"]
    assert "GroupQueryAttention" not in fused(prefill)["fused_operators"], fused(prefill)["fused_operators"]
    for size in (1, 2):
        batch = _family_prompts(size)
        with torch.no_grad():
            ours = _greedy(prefill, decode, model, batch["input_ids"], batch["attention_mask"], 8)
        assert torch.equal(ours, _generate(model, batch, 8)), (size, ours)
    # rotary's cos / sin come from this call's position ids, not from a table sized by their
    # largest value (copied to the host on every call, and no CUDA graph: H100, session 17)
    (fused_file,) = Path(os.environ["AITUNE_CACHE_DIR"]).glob(f"{kind}-gqa-decode/**/model_fused.onnx")
    assert data_fed_host_inputs(fused_file) == []
    assert step["fused_operators"].get("RotaryEmbedding") == 4, step["fused_operators"]
    (exported,) = (Path(p) for p in Path(os.environ["AITUNE_CACHE_DIR"]).glob(f"{kind}-gqa-decode/**/model_raw.onnx"))
    unshared, counts = decoder_fusions.optimize_for_ort(ir.load(str(exported)))
    attention = [node.op_type for node in unshared.graph if node.op_type.endswith("Attention")]
    assert counts.get("cached_gqa", 0) == 0 and attention == ["MultiHeadAttention"] * 2, (counts, attention)


def test_a_decode_step_at_one_static_batch_size_fuses_rotary_from_its_position_ids(tmp_path):
    """Recorded at one batch size (2: every shape static, as decoder.py's decode cases),
    the exporter folds rotary's ``inv_freq.expand(B, -1, 1)`` into a constant [2, E, 1],
    which onnxscript's rule refused (no RotaryEmbedding at batch 8 on the H100, session 17);
    and the cos / sin tables come from the step's position ids without a value copied to
    the host (onnxscript's table is sized by ReduceMax(position_ids)). The fused step still
    generates generate's tokens."""
    import json

    from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    model = tiny_decoder("llama")
    strategy = ait.OneBackendStrategy(ONNXRuntimeBackend(ONNXRuntimeBackendConfig(
        execution_provider=ONNXExecutionProvider.CPU, in_place_outputs=True)))
    prefill = ait.Module(DecodeStep(model), "static-prefill", strategy=strategy)
    decode = ait.Module(DecodeStep(model), "static-decode", strategy=strategy)
    batch = _family_prompts(2)
    ait.tune(lambda input_ids, attention_mask: _greedy(prefill, decode, model, input_ids, attention_mask, 4),
             lambda size: [batch], batch_sizes=[2], ignore_failing_modules=False, performance_validation=False,
             disable_external_logging=True, progress=False)
    (report,) = decode.ait_reports.values()
    (fused,) = [c for c in json.loads(report.to_json())["candidates"] if c.get("transform") == "ort_fusions"]
    assert fused["fused_operators"].get("RotaryEmbedding") == 4, fused["fused_operators"]
    assert fused["fused_operators"].get("GroupQueryAttention") == 2, fused["fused_operators"]
    assert fused["correctness"]["passed"], fused["correctness"]
    (fused_file,) = Path(os.environ["AITUNE_CACHE_DIR"]).glob("static-decode/**/model_fused.onnx")
    assert data_fed_host_inputs(fused_file) == []
    # The mask's "row sees no slot" is a float ReduceSum, not a bool `any` (ReduceMax, which
    # the CUDA provider runs through cuDNN in double: 55 us a step at batch 8, H100)
    reductions = sorted({node.op_type for node in onnx.load(str(fused_file), load_external_data=False).graph.node
                         if node.op_type.startswith("Reduce")})
    assert reductions == ["ReduceSum"], reductions
    with torch.no_grad():
        ours = _greedy(prefill, decode, model, batch["input_ids"], batch["attention_mask"], 4)
    assert torch.equal(ours, _generate(model, batch, 4)), ours


def test_decode_step_refuses_attention_layer_kinds_it_cannot_mask():
    """A layer kind other than full or sliding attention (Llama4's chunked attention, a
    linear-attention layer) would need a mask DecodeStep does not build: a typed error
    naming the kinds, not a silently wrong step."""
    import transformers

    config = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = transformers.Qwen3ForCausalLM(config).eval()
    model.config.layer_types = ["full_attention", "chunked_attention"]
    keys, values = empty_cache(model, 1, 4)
    with pytest.raises(NotImplementedError, match=r"\['chunked_attention'\] of Qwen3Config"):
        DecodeStep(model)(torch.tensor([[3]]), torch.ones(1, 4, dtype=torch.long), torch.tensor([[0]]),
                          torch.tensor([0]), keys, values)


def _refused_config(kind: str):
    import transformers

    small = dict(vocab_size=64, hidden_size=32, num_attention_heads=2)
    if kind == "gpt-neo-local":
        return transformers.GPTNeoConfig(**small, num_layers=2, attention_types=[[["global", "local"], 1]],
                                         window_size=4)
    if kind == "gemma4-global-head":  # full-attention layers with a head size of their own
        if not hasattr(transformers, "Gemma4TextConfig"):
            pytest.skip("this transformers has no Gemma 4")
        return transformers.Gemma4TextConfig(**small, intermediate_size=64, num_hidden_layers=2, num_key_value_heads=1,
                                             head_dim=16, global_head_dim=32, sliding_window=4,
                                             layer_types=["sliding_attention", "full_attention"],
                                             vocab_size_per_layer_input=64, hidden_size_per_layer_input=8)
    if kind == "bloom":
        return transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=2)
    if kind == "falcon-alibi":
        return transformers.FalconConfig(**small, num_hidden_layers=1, alibi=True, new_decoder_architecture=False)
    if kind == "openai-gpt":  # no cache at all: crashed on a size mismatch in its attention (session 31)
        return transformers.OpenAIGPTConfig(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    if kind == "rwkv":  # a recurrent state, no attention heads: crashed on a missing config attribute
        return transformers.RwkvConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                                       intermediate_size=64, context_length=32)
    return transformers.DeepseekV3Config(**small, intermediate_size=64, num_hidden_layers=1, num_key_value_heads=2,
                                         q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                         v_head_dim=16, head_dim=8, first_k_dense_replace=1, n_group=1,
                                         topk_group=1)


@pytest.mark.parametrize("kind,why", [("gpt-neo-local", r"\['local'\] attention layers"),
                                      ("bloom", "ALiBi"), ("falcon-alibi", "ALiBi"),
                                      ("deepseek-v3", "multi-head latent attention"),
                                      ("openai-gpt", "takes no past_key_values"),
                                      ("gemma4-global-head", "layers differ in key/value head size"),
                                      ("rwkv", "no num_attention_heads")])
def test_decode_step_refuses_attention_it_cannot_mask_or_cache(kind, why):
    """GPT-Neo's local layers (a window transformers applies to no 4-D mask it is given:
    DecodeStep's tokens differed from generate's), ALiBi built from the 2-D padding mask
    (Bloom, Falcon: crashed in the model, "too many values to unpack") and keys and values
    of different head sizes (DeepSeek's latent attention: crashed in the cache write):
    refused, naming what, both by DecodeStep and by empty_cache."""
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_refused_config(kind)).eval()
    with pytest.raises(NotImplementedError, match=why):
        DecodeStep(model)
    if kind != "openai-gpt":  # (its config is an attention decoder's: the cache's shape is known)
        with pytest.raises(NotImplementedError, match=why):
            empty_cache(model, 1, 4)


def test_a_decode_step_tuned_on_torch_compile_in_place_writes_the_caches_it_is_given(caplog, tmp_path):
    """TorchCompileBackendConfig(in_place_outputs=True) compiles DecodeStep's in-place
    variant (the StaticCache route: caches written where they lie, marked as static
    addresses for CUDA graphs): the tuned step returns the passed caches' own storage,
    updated as the eager step computes them, the user is told which inputs it writes,
    the tune's samples are left as recorded (the candidate is judged and measured on
    copies), greedy generation with it gives generate's tokens, and a checkpoint keeps it
    in place. Without the flag the compiled step writes nothing it is given."""
    from aitune.torch.backend import TorchCompileBackend, TorchCompileBackendConfig

    example = _example()
    model = example.tiny_llama()
    cache_len = example.PROMPT_LEN + example.NEW_TOKENS
    keys, values = empty_cache(model, 2, cache_len)
    sample = {"input_ids": torch.tensor([[3], [4]]), "attention_mask": torch.ones(2, cache_len, dtype=torch.long),
              "position_ids": torch.tensor([[6], [6]]), "cache_position": torch.tensor([6]), "key_cache": keys,
              "value_cache": values}
    recorded = {name: tuple(t.clone() for t in sample[name]) for name in ("key_cache", "value_cache")}

    def tuned_step(in_place: bool) -> ait.Module:
        strategy = ait.OneBackendStrategy(TorchCompileBackend(TorchCompileBackendConfig(
            mode="default", in_place_outputs=in_place)))
        decode = ait.Module(DecodeStep(model), f"compiled-decode-{in_place}", strategy=strategy)
        with caplog.at_level(logging.WARNING, logger="aitune"):
            ait.tune(decode, lambda size: [sample], batch_sizes=[2], ignore_failing_modules=False,
                     performance_validation=False, disable_external_logging=True, progress=False)
        return decode

    caplog.clear()
    decode = tuned_step(True)
    assert all("in place" in b for b in decode.ait_backends.values()), decode.ait_backends
    assert "writes its outputs into inputs" in caplog.text and "key_cache" in caplog.text, caplog.text
    for name, tensors in recorded.items():  # the samples: not written by the candidate
        assert all(torch.equal(a, b) for a, b in zip(sample[name], tensors, strict=True)), name
    _check_compiled_step(example, model, decode, in_place=True)
    batch = example.prompts(2)
    with torch.no_grad():
        ours = greedy_generate(DecodeStep(model), decode, model, batch["input_ids"], batch["attention_mask"],
                               example.NEW_TOKENS)
        reference = model.generate(**batch, max_new_tokens=example.NEW_TOKENS, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, reference[:, example.PROMPT_LEN:]), (ours, reference)
    ait.save(decode, tmp_path / "decode.ait")
    loaded = ait.load(ait.Module(DecodeStep(model), "compiled-decode-loaded"), tmp_path / "decode.ait")
    assert all("in place" in b for b in loaded.ait_backends.values()), loaded.ait_backends
    _check_compiled_step(example, model, loaded, in_place=True)

    caplog.clear()
    _check_compiled_step(example, model, tuned_step(False), in_place=False)
    assert "writes its outputs into inputs" not in caplog.text


def _check_compiled_step(example, model, decode, in_place: bool):
    """One decode step through ``decode``: the eager step's logits and caches; the caches it
    returns are the passed tensors' storage, written, when ``in_place``, and new tensors,
    the passed ones untouched, when not."""
    cache_len = example.PROMPT_LEN + example.NEW_TOKENS
    generator = torch.Generator().manual_seed(1)
    keys, values = (tuple(torch.randn(t.shape, generator=generator) for t in half)
                    for half in empty_cache(model, 2, cache_len))
    before = [t.clone() for t in keys + values]
    mask = torch.ones(2, cache_len, dtype=torch.long)
    step = (torch.tensor([[5], [7]]), mask, torch.tensor([[8], [8]]), torch.tensor([cache_len - 4]))
    with torch.no_grad():
        eager_logits, eager_keys, eager_values = DecodeStep(model)(*step, keys, values)
        logits, new_keys, new_values = decode(*step, keys, values)
    torch.testing.assert_close(logits, eager_logits, rtol=1e-4, atol=1e-4)
    for passed, old, returned, eager in zip(keys + values, before, new_keys + new_values, eager_keys + eager_values,
                                            strict=True):
        torch.testing.assert_close(returned, eager, rtol=1e-4, atol=1e-4)
        if in_place:
            assert returned.data_ptr() == passed.data_ptr() and returned.stride() == passed.stride()
            torch.testing.assert_close(passed, eager, rtol=1e-4, atol=1e-4)
        else:
            assert returned.data_ptr() != passed.data_ptr() and torch.equal(passed, old)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_an_in_place_compiled_decode_step_replays_cuda_graphs_on_the_caches_it_is_given():
    """On CUDA under reduce-overhead, the in-place compiled step of a generation loop runs
    as CUDA graphs (no cudagraph skip: the caches it writes are static inputs, written
    where they lie, not copied in) and generates generate's greedy tokens."""
    from torch._dynamo.utils import counters

    from aitune.torch.backend import TorchCompileBackend, TorchCompileBackendConfig

    example = _example()
    model = example.tiny_llama().cuda()
    cache_len = example.PROMPT_LEN + example.NEW_TOKENS
    keys, values = empty_cache(model, 2, cache_len)
    sample = {"input_ids": torch.tensor([[3], [4]], device="cuda"),
              "attention_mask": torch.ones(2, cache_len, dtype=torch.long, device="cuda"),
              "position_ids": torch.tensor([[6], [6]], device="cuda"), "cache_position": torch.tensor([6], device="cuda"),
              "key_cache": keys, "value_cache": values}
    decode = ait.Module(DecodeStep(model), "cuda-compiled-decode", strategy=ait.OneBackendStrategy(TorchCompileBackend(
        TorchCompileBackendConfig(mode="reduce-overhead", precisions=("fp32",), in_place_outputs=True))))
    ait.tune(decode, lambda size: [sample], batch_sizes=[2], ignore_failing_modules=False,
             performance_validation=False, disable_external_logging=True, progress=False)
    assert all("in place" in b for b in decode.ait_backends.values()), decode.ait_backends
    batch = {k: v.cuda() for k, v in example.prompts(2).items()}
    skips = counters["inductor"]["cudagraph_skips"]
    with torch.no_grad():
        ours = greedy_generate(DecodeStep(model), decode, model, batch["input_ids"], batch["attention_mask"],
                               example.NEW_TOKENS)
        reference = model.generate(**batch, max_new_tokens=example.NEW_TOKENS, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, reference[:, example.PROMPT_LEN:]), (ours, reference)
    assert counters["inductor"]["cudagraph_skips"] == skips


def test_steps_tuned_with_step_dynamic_shapes_generate_at_unrecorded_batches_and_lengths():
    """Tuned as the example tunes them, the steps took only the recorded shapes: a batch of
    3 or a prompt of 9 raised ShapeMismatchError, and the caches' names (input_key_cache_0,
    axes 0 and 2) were for the user to find. step_dynamic_shapes declares them."""
    from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig
    from aitune.torch.decode_step import step_dynamic_shapes

    example = _example()
    model = example.tiny_llama()
    batch = torch.export.Dim("batch", min=1, max=4)
    sequence = torch.export.Dim("sequence", min=2, max=32)
    cache = torch.export.Dim("cache", min=4, max=64)
    strategy = ait.OneBackendStrategy(ONNXRuntimeBackend(ONNXRuntimeBackendConfig(
        execution_provider=ONNXExecutionProvider.CPU, use_dynamo=True, in_place_outputs=True,
        tune_provider_options=False)))
    prefill = ait.Module(DecodeStep(model), "dyn-prefill", strategy=strategy,
                         dynamic_shapes=step_dynamic_shapes(model, batch, cache, sequence))
    decode = ait.Module(DecodeStep(model), "dyn-decode", strategy=strategy,
                        dynamic_shapes=step_dynamic_shapes(model, batch, cache))

    def generate(input_ids, attention_mask):
        return _greedy(prefill, decode, model, input_ids, attention_mask, 4)

    ait.tune(generate, lambda size: [_family_prompts(size, 6), _family_prompts(size, 9)], batch_sizes=[1, 2],
             ignore_failing_modules=False, performance_validation=False, progress=False)
    for size, length, new_tokens in ((3, 6, 4), (4, 11, 7), (1, 20, 5)):
        prompts = _family_prompts(size, length)
        with torch.no_grad():
            ours = _greedy(prefill, decode, model, prompts["input_ids"], prompts["attention_mask"], new_tokens)
        assert torch.equal(ours, _generate(model, prompts, new_tokens)), (size, length)
    assert prefill.ait_state is ModuleState.TUNED and decode.ait_state is ModuleState.TUNED


def test_greedy_generate_ends_rows_at_an_end_token_as_generate_does():
    """A probe's finding: greedy_generate decoded past the end token, so it was not
    generate(do_sample=False)'s tokens for a model that emits it (any real checkpoint). An
    ended row is padded, and the loop stops when every row has ended (a shorter result)."""
    example = _example()
    model = example.tiny_llama()
    batch = example.prompts(2)
    step = DecodeStep(model)
    with torch.no_grad():
        free = model.generate(**batch, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
        free = free[:, example.PROMPT_LEN:]
        for ends in ([int(free[0, 2])], [int(free[0, 1]), int(free[1, 1])]):  # one row ends; then both
            model.generation_config.eos_token_id = ends
            want = model.generate(**batch, max_new_tokens=6, do_sample=False, pad_token_id=0)[:, example.PROMPT_LEN:]
            got = greedy_generate(step, step, model, batch["input_ids"], batch["attention_mask"], 6, pad_token_id=0)
            assert torch.equal(got, want), (ends, got, want)
            if len(ends) == 1:
                assert (got[0, 3:] == 0).all() and got.shape[1] == 6  # row 0 padded after its end token
        assert want.shape[1] == 2  # both rows ended at the second token: generate stopped, and so did greedy_generate
        ignored = greedy_generate(step, step, model, batch["input_ids"], batch["attention_mask"], 6, eos_token_id=None)
        assert torch.equal(ignored, free)


@pytest.mark.parametrize("family", ["Bart", "MBart", "Pegasus", "Marian"])
def test_decode_step_caches_the_decoder_of_an_encoder_decoder_family_run_as_a_causal_lm(family):
    """BartForCausalLM and its kin name the encoder's counts num_hidden_layers and
    num_attention_heads; their decoder has its own (decoder_layers, decoder_attention_heads).
    A cache of the encoder's layer count crashed the step (IndexError) where the decoder had
    more layers. transformers' generate itself crashes on such a model, so the reference is
    the greedy loop without a cache."""
    import transformers

    config = getattr(transformers, f"{family}Config")(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=3, encoder_attention_heads=2,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        is_decoder=True, pad_token_id=1, decoder_start_token_id=2, eos_token_id=None)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config).eval()
    keys, _ = empty_cache(model, 2, 9)
    assert len(keys) == 3 and keys[0].shape == (2, 4, 9, 8)
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = _greedy(DecodeStep(model), DecodeStep(model), model, ids, torch.ones_like(ids), 4)
        sequence = ids
        for _ in range(4):
            token = model(input_ids=sequence, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, token], dim=1)
    assert torch.equal(ours, sequence[:, 5:]), (ours, sequence)


@pytest.mark.parametrize("count", [0, -1, 2.0, True])
def test_greedy_generate_refuses_a_count_that_is_no_positive_int(count):
    """max_new_tokens=0 returned one token (the prefill's) and -1 failed deep in the model (a
    session-36 probe); transformers' generate refuses them. Refused by name, before any step."""
    example = _example()
    model = example.tiny_llama()
    batch = example.prompts(1)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        greedy_generate(DecodeStep(model), DecodeStep(model), model, batch["input_ids"], batch["attention_mask"],
                        count)


def test_greedy_generate_refuses_a_right_padded_prompt():
    """A right-padded row's next token was read at its last position, a pad: other tokens than
    generate's, silently (a session-37 probe). Refused by name, before any step."""
    example = _example()
    model = example.tiny_llama()
    batch = example.prompts(2)
    mask = torch.ones_like(batch["attention_mask"])
    mask[1, -2:] = 0
    with pytest.raises(ValueError, match=r"takes left-padded prompts: row\(s\) \[1\] end with padding"):
        greedy_generate(DecodeStep(model), DecodeStep(model), model, batch["input_ids"], mask, 2)
