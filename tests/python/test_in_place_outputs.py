"""Sessions with in_place_outputs: an output that is a ScatterND of an input nothing else
reads is written into that input's buffer (the input updated in place, the output a view
of it); any other graph runs as before; declared aliases and overlapping inputs are
checked. Tiny ONNX graphs on the CPU provider."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import aitune
from aitune import _core

CACHE = [2, 3, 8, 4]  # [batch, heads, slots, head_dim]


def _config(in_place: bool = True, **aliases) -> _core.OnnxSessionConfig:
    config = _core.OnnxSessionConfig(provider=_core.ExecutionProvider.CPU)
    config.in_place_outputs = in_place
    config.output_aliases = aliases
    return config


def _cache_model(path, after: str = "") -> str:
    """present = ScatterND(past, slot indices, new) and total = ReduceSum(present).
    ``after``: "identity" puts an Identity after the ScatterND (present is no longer it),
    "reread" makes the graph read past again elsewhere (past + 1 as an output)."""
    past = helper.make_tensor_value_info("past", TensorProto.FLOAT, CACHE)
    indices = helper.make_tensor_value_info("indices", TensorProto.INT64, [2, 3, 1, 3])
    new = helper.make_tensor_value_info("new", TensorProto.FLOAT, [2, 3, 1, 4])
    scattered = "scattered" if after == "identity" else "present"
    nodes = [helper.make_node("Shape", ["past"], ["past_shape"]),  # reads only the shape
             helper.make_node("ScatterND", ["past", "indices", "new"], [scattered]),
             helper.make_node("ReduceSum", [scattered], ["total"], keepdims=0)]
    outputs = [helper.make_tensor_value_info("present", TensorProto.FLOAT, CACHE),
               helper.make_tensor_value_info("total", TensorProto.FLOAT, [])]
    initializers = []
    if after == "identity":
        nodes.append(helper.make_node("Identity", ["scattered"], ["present"]))
    if after == "reread":
        initializers.append(helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]))
        nodes.append(helper.make_node("Add", ["past", "one"], ["past_plus_one"]))
        outputs.append(helper.make_tensor_value_info("past_plus_one", TensorProto.FLOAT, CACHE))
    graph = helper.make_graph(nodes, "cache", [past, indices, new], outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return str(path)


def _inputs(slot: int = 5):
    generator = torch.Generator().manual_seed(slot)
    past = torch.randn(CACHE, generator=generator)
    b, h = torch.meshgrid(torch.arange(2), torch.arange(3), indexing="ij")
    indices = torch.stack([b, h, torch.full_like(b, slot)], dim=-1)[:, :, None, :].contiguous()
    new = torch.randn(2, 3, 1, 4, generator=generator)
    return past, indices, new


def _expected(past, new, slot: int = 5):
    present = past.clone()
    present[:, :, slot] = new[:, :, 0]
    return present


def test_a_scatternd_of_an_input_is_written_into_it(tmp_path):
    session = _core.OnnxSession.create(_cache_model(tmp_path / "m.onnx"), _config())
    assert list(session.output_aliases) == [0, -1]  # present -> past; total allocated
    past, indices, new = _inputs()
    expected = _expected(past, new)
    for _ in range(2):  # a rerun on the updated input gives the same results
        present, total = session.infer([past, indices, new])
        assert present.data_ptr() == past.data_ptr()
        torch.testing.assert_close(past, expected, rtol=0, atol=0)
        torch.testing.assert_close(total, expected.sum(), rtol=1e-6, atol=1e-5)


def test_without_the_option_or_for_any_other_graph_nothing_is_aliased(tmp_path):
    cases = [("plain", "", _config(in_place=False)), ("identity", "identity", _config()),
             ("reread", "reread", _config())]
    for name, after, config in cases:
        session = _core.OnnxSession.create(_cache_model(tmp_path / f"{name}.onnx", after), config)
        assert all(a == -1 for a in session.output_aliases), name
        past, indices, new = _inputs()
        before = past.clone()
        outputs = session.infer([past, indices, new])
        torch.testing.assert_close(past, before, rtol=0, atol=0)  # the input is left alone
        assert outputs[0].data_ptr() != past.data_ptr()
        torch.testing.assert_close(outputs[0], _expected(before, new), rtol=0, atol=0)
        if after == "reread":
            torch.testing.assert_close(outputs[2], before + 1)


def test_declared_aliases_are_checked_and_kept_in_the_config_json(tmp_path):
    path = _cache_model(tmp_path / "m.onnx", "identity")
    declared = _core.OnnxSession.create(path, _config(in_place=False, present="past"))
    assert list(declared.output_aliases) == [0, -1]  # the caller's word, where the graph does not say
    past, indices, new = _inputs()
    expected = _expected(past, new)
    present, _ = declared.infer([past, indices, new])
    assert present.data_ptr() == past.data_ptr()
    torch.testing.assert_close(past, expected, rtol=0, atol=0)
    with pytest.raises(aitune.InvalidArgumentError, match="no input 'nosuch'"):
        _core.OnnxSession.create(path, _config(present="nosuch"))
    with pytest.raises(aitune.InvalidArgumentError, match="'total' -> 'past'"):
        _core.OnnxSession.create(path, _config(total="past"))
    config = _config(present="past")
    assert _core.OnnxSessionConfig.from_json(config.to_json()) == config
    assert "in_place_outputs" not in json.loads(_config(in_place=False).to_json())  # unchanged JSON when off


def test_an_input_updated_in_place_may_not_share_memory_with_another(tmp_path):
    session = _core.OnnxSession.create(_cache_model(tmp_path / "m.onnx"), _config())
    past, indices, new = _inputs()
    shared = torch.zeros(past.numel() + 64)
    past_in_shared = shared[: past.numel()].view(CACHE)
    new_in_shared = shared[past.numel() - 8: past.numel() + 16].view(2, 3, 1, 4)  # overlaps past's end
    with pytest.raises(aitune.InvalidArgumentError, match="'past' is updated in place .* shares memory with input 'new'"):
        session.infer([past_in_shared, indices, new_in_shared])
    assert np.count_nonzero(shared.numpy()) == 0  # refused before anything ran


class _CacheWrite(torch.nn.Module):
    """Writes ``new`` [B, H, 1, D] at slot ``slot`` of ``cache`` [B, H, T, D] out of place and
    returns the cache and a sum over it: by index_put over (batch, head, slot) indices (one
    ScatterND of the input: aliased) or by index_copy along the slot axis (Transpose ->
    ScatterND -> Transpose: not)."""

    def __init__(self, by_index_put: bool):
        super().__init__()
        self.by_index_put = by_index_put

    def forward(self, cache, new, slot):
        if self.by_index_put:
            batch = torch.arange(cache.shape[0])[:, None, None]
            heads = torch.arange(cache.shape[1])[None, :, None]
            written = cache.index_put((batch, heads, slot[None, None, :]), new)
        else:
            written = cache.index_copy(2, slot, new)
        return written, (written * 2).sum(dim=(2, 3))


def test_a_tuned_module_updates_in_place_only_where_its_graph_allows():
    import aitune.torch as ait
    from torch_models import cpu_strategy

    for by_index_put in (True, False):
        module = ait.Module(_CacheWrite(by_index_put).eval(), f"cache-write-{by_index_put}",
                            strategy=cpu_strategy(in_place_outputs=True, tune_provider_options=False))
        samples = [{"cache": torch.randn(2, 3, 8, 4), "new": torch.randn(2, 3, 1, 4), "slot": torch.tensor([s])}
                   for s in (2, 5)]  # batches already: a factory's samples are not stacked
        ait.tune(module, lambda size: samples, batch_sizes=[2], ignore_failing_modules=False,
                 performance_validation=False, progress=False)
        (backend,) = module.ait_backends.values()
        assert "ONNXRuntimeBackend" in backend
        assert ("updates in place: input_cache" in backend) == by_index_put, backend
        (report,) = module.ait_reports.values()  # the report names what is updated in place
        (candidate,) = json.loads(report.to_json())["candidates"]
        assert candidate["in_place_outputs"] == ({"output_0": "input_cache"} if by_index_put else {})
        assert ("inputs cpu updates in place: input_cache (as output_0)" in report.summary_table()) == by_index_put
        cache, new, slot = torch.randn(2, 3, 8, 4), torch.randn(2, 3, 1, 4), torch.tensor([6])
        before = cache.clone()
        expected, expected_sum = _CacheWrite(by_index_put)(before, new, slot)
        with torch.no_grad():
            written, total = module(cache, new, slot)
        torch.testing.assert_close(written, expected, rtol=0, atol=0)
        torch.testing.assert_close(total, expected_sum)
        if by_index_put:
            assert written is cache  # the cache passed, updated in place
        else:
            assert written.data_ptr() != cache.data_ptr()
            torch.testing.assert_close(cache, before, rtol=0, atol=0)  # left alone


def test_the_in_place_note_is_said_once_after_saves_and_loads(tmp_path):
    """The backend's description was saved with its "updates in place: ..." note, and a load
    added the note again: twice after one load, three times after a second save and load."""
    import aitune.torch as ait
    from torch_models import cpu_strategy

    module = ait.Module(_CacheWrite(True).eval(), "cache-write",
                        strategy=cpu_strategy(in_place_outputs=True, tune_provider_options=False))
    samples = [{"cache": torch.randn(2, 3, 8, 4), "new": torch.randn(2, 3, 1, 4), "slot": torch.tensor([s])}
               for s in (2, 5)]
    ait.tune(module, lambda size: samples, batch_sizes=[2], ignore_failing_modules=False,
             performance_validation=False, progress=False)
    for round_trip in range(2):
        ait.save(module, tmp_path / f"saved-{round_trip}")
        module = ait.load(_CacheWrite(True).eval(), tmp_path / f"saved-{round_trip}")
        (backend,) = module.ait_backends.values()
        assert backend.count("updates in place") == 1, backend
