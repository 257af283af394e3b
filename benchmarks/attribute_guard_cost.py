"""What the watch of plain Python values costs a routed call (baked_attributes.py): the
C++ half's check alone (``TorchDispatch.attributes_clear``), with CPython's dict version
tags (one read per instance dict) and, for comparison, with every value looked up (what a
Python without the tags does, and what a call pays once after a write to a watched dict:
here a write to an attribute not watched before every check), on models built from configs with random weights. CPU only, no tuning.

    python benchmarks/attribute_guard_cost.py
"""

from __future__ import annotations

import time

import transformers

from aitune.torch.baked_attributes import AttributeWatch
from aitune.torch.dispatch import new_dispatch


def _models():
    yield "Llama, 8 layers", transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2))
    yield "BERT, 12 layers", transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=12, num_attention_heads=4))
    yield "ResNet-50", transformers.ResNetModel(transformers.ResNetConfig(depths=[3, 4, 6, 3]))


def _us_per_call(fn, calls: int = 20000) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    print(f"{'model':<18} {'dicts':>6} {'values':>7} {'tags (us)':>10} {'each value (us)':>16}")
    for name, model in _models():
        watch = AttributeWatch(model)
        dispatch = new_dispatch(model, training=False)
        dispatch.watch_attributes(watch.watched())
        assert dispatch.attributes_clear()
        tags = _us_per_call(dispatch.attributes_clear)
        owner = vars(model)
        count = iter(range(10**9))

        def write_then_check():
            owner["unwatched"] = next(count)  # a write to a watched dict: its tag moves, the values stay
            return dispatch.attributes_clear()

        each = _us_per_call(write_then_check, 2000)
        dicts = len({id(entry.owner) for entry in watch.entries})
        print(f"{name:<18} {dicts:>6} {len(watch.entries):>7} {tags:>10.2f} {each:>16.2f}")


if __name__ == "__main__":
    main()
