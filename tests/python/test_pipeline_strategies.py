"""strategies= on ait.Module / ait.wrap: a decoder with a static cache, tuned through a
generate-like loop, gets one strategy for its prefill graph and another for its decode
step."""

from __future__ import annotations

import pytest
import torch

import aitune.torch as ait
from pipeline_models import TinyStaticCacheDecoder, generate
from torch_models import cpu_strategy


def prompts():
    generator = torch.Generator().manual_seed(3)
    return [{"input_ids": torch.randint(0, 32, (5,), generator=generator)} for _ in range(2)]


def is_decode_step(graph) -> bool:
    return "input_cache_position" in graph.input_names


def tune_decoder(strategies):
    torch.manual_seed(0)
    decoder = TinyStaticCacheDecoder().eval()
    ids = torch.stack([p["input_ids"] for p in prompts()])
    expected = generate(decoder, ids)
    model = ait.Module(decoder, "decoder", strategies=strategies)
    ait.tune(lambda input_ids: generate(model, input_ids), prompts(), ignore_failing_modules=False)
    return model, ids, expected


def test_prefill_and_decode_step_are_tuned_by_the_strategies_a_mapping_selects():
    prefill = cpu_strategy()  # dynamo export
    decode = cpu_strategy(use_dynamo=False)  # trace export
    model, ids, expected = tune_decoder({is_decode_step: decode, lambda g: not is_decode_step(g): prefill})
    prefill_graph, decode_graph = model.ait_graphs
    assert not is_decode_step(prefill_graph) and is_decode_step(decode_graph)
    backends = model.ait_backends
    assert "use_dynamo=False" not in backends[prefill_graph.key]
    assert "use_dynamo=False" in backends[decode_graph.key]
    assert torch.equal(generate(model, ids), expected)


def test_a_list_gives_graph_i_strategies_i_in_recording_order():
    model, ids, expected = tune_decoder([cpu_strategy(use_dynamo=False), cpu_strategy()])
    prefill_graph, decode_graph = model.ait_graphs
    assert "use_dynamo=False" in model.ait_backends[prefill_graph.key]
    assert "use_dynamo=False" not in model.ait_backends[decode_graph.key]
    assert torch.equal(generate(model, ids), expected)


def test_a_graph_key_selects_too_and_a_graph_without_a_strategy_is_named():
    decoder = TinyStaticCacheDecoder().eval()
    model = ait.Module(decoder, "decoder", strategies={0: cpu_strategy()})
    run = lambda input_ids: generate(model, input_ids)  # noqa: E731
    ait.tune(run, prompts(), dry_run=True)
    decode_key = model.ait_graphs[1].key
    with pytest.raises(ValueError, match=rf"graph \[1\] {decode_key} .*no selector matches it"):
        ait.tune(run, prompts(), ignore_failing_modules=False)
    assert model.ait_state is ait.ModuleState.PASSTHROUGH

    model = ait.Module(TinyStaticCacheDecoder().eval(), "decoder2",
                       strategies={0: cpu_strategy(), decode_key: cpu_strategy(use_dynamo=False)})
    ait.tune(lambda input_ids: generate(model, input_ids), prompts(), ignore_failing_modules=False)
    assert "use_dynamo=False" in model.ait_backends[decode_key]


def test_too_few_strategies_and_bad_arguments_are_refused():
    model = ait.Module(TinyStaticCacheDecoder().eval(), "decoder", strategies=[cpu_strategy()])
    with pytest.raises(ValueError, match="recorded 2 graphs but strategies lists 1"):
        ait.tune(lambda input_ids: generate(model, input_ids), prompts(), ignore_failing_modules=False)
    with pytest.raises(ValueError, match="either strategy or strategies"):
        ait.Module(TinyStaticCacheDecoder(), strategy=cpu_strategy(), strategies=[cpu_strategy()])
    with pytest.raises(TypeError, match=r"strategies\[1\] must be a TuneStrategy"):
        ait.Module(TinyStaticCacheDecoder(), strategies=[cpu_strategy(), "fast"])
    with pytest.raises(TypeError, match="keys select graphs"):
        ait.Module(TinyStaticCacheDecoder(), strategies={1.5: cpu_strategy()})
