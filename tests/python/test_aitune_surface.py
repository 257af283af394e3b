"""The rest of the surface AITune's own functional tests use, each modelled on how those
tests use it: module.graph_specs and module.tune() after recording by calling,
module.deactivate(), MODULE_REGISTRY.clear(), DataLoaderFactory with a collate_fn,
ait.wrap of list items and of the object itself, ait.inspect's ranking."""

from __future__ import annotations

import pytest
import torch

import aitune
import aitune.torch as ait
from aitune.torch.module_registry import MODULE_REGISTRY
from torch_models import MLP, cpu_strategy


def test_record_by_calling_then_module_tune():
    # as AITune's 002_aitune_torch_wrap_module_resnet_test: call, graph_specs, tune, compare
    model = MLP().eval()
    data = torch.randn(2, 16)
    with torch.no_grad():
        expected = model(data)
    module = ait.Module(model, "functional-mlp")
    module(data)
    assert len(module.graph_specs) == 1
    spec = module.graph_specs[0]
    assert [t.name for t in spec.inputs] == ["input_x"] and [t.name for t in spec.outputs] == ["output_0"]
    module.tune(device="cpu", strategy=cpu_strategy(), dry_run=True)
    assert module.ait_state is ait.ModuleState.RECORDING  # a dry run tunes nothing
    module.tune(device="cpu", strategy=cpu_strategy(), dry_run=False)
    assert module.ait_state is ait.ModuleState.TUNED
    assert "ONNXRuntimeBackend" in next(iter(module.ait_backends.values()))
    torch.testing.assert_close(module(data), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="tuned already"):
        module.tune(strategy=cpu_strategy())


def test_module_tune_refuses_what_it_cannot_tune():
    module = ait.Module(MLP().eval(), "never-called", strategy=cpu_strategy())
    with pytest.raises(ValueError, match="has not recorded any calls"):
        module.tune()
    with pytest.raises(ValueError, match="has not recorded any calls"):
        module.graph_specs
    module(torch.randn(2, 16))
    with pytest.raises(ValueError, match=r"tune\(device='cuda'\) but its calls were recorded on 'cpu'"):
        module.tune(device="cuda")
    assert module.ait_state is ait.ModuleState.RECORDING


def test_deactivate_runs_the_module_eagerly_until_activate(tmp_path):
    inner = MLP().eval()
    module = ait.Module(inner, "deactivated", strategy=cpu_strategy())
    x = torch.randn(2, 16)
    eager_calls = []
    # A hook on a submodule, registered before tuning (one registered after tuning makes the
    # calls eager by itself, docs/onnxruntime-backend.md): it runs only where PyTorch runs
    # the module (hooks on the wrapped module itself run around the tuned graph too).
    next(iter(inner.children())).register_forward_hook(lambda *_: eager_calls.append(1))
    ait.tune(module, [torch.randn(16)])
    eager_calls.clear()
    module(x)
    assert eager_calls == []  # tuned: the graph serves the call
    module.deactivate()
    assert not module.ait_active and module.ait_state is ait.ModuleState.TUNED
    with torch.no_grad():
        torch.testing.assert_close(module(x), inner(x))
    assert len(eager_calls) == 2  # the proxied call and the reference both ran the PyTorch module
    with pytest.raises(aitune.StateError, match="deactivated"):
        ait.save(module, tmp_path / "ckpt")
    module.activate()
    eager_calls.clear()
    module(x)
    assert eager_calls == [] and module.ait_active
    ait.save(module, tmp_path / "ckpt")


def test_module_registry_holds_modules_by_name_until_cleared():
    # as AITune's tests: MODULE_REGISTRY.clear() between pipelines
    MODULE_REGISTRY.clear()
    first = ait.Module(MLP(), "registered-a")
    second = ait.Module(MLP(), "registered-b")
    assert MODULE_REGISTRY.get("registered-a") is first
    assert list(MODULE_REGISTRY.modules) == ["registered-a", "registered-b"]
    replacement = ait.Module(MLP(), "registered-a")
    assert MODULE_REGISTRY.get("registered-a") is replacement
    MODULE_REGISTRY.clear()
    assert len(MODULE_REGISTRY) == 0 and "registered-b" not in MODULE_REGISTRY
    with pytest.raises(ValueError, match="no ait.Module named 'registered-b'"):
        MODULE_REGISTRY.get("registered-b")
    del first, second, replacement


def test_module_registry_does_not_keep_modules_alive():
    MODULE_REGISTRY.clear()
    ait.Module(MLP(), "dropped")
    import gc

    gc.collect()
    assert "dropped" not in MODULE_REGISTRY


class ListsModel(torch.nn.Module):
    """Takes a dict holding a list of tensors, which needs a custom collate."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, features):
        return self.fc(features[0] + features[1])


def collate_lists(samples):
    return {"features": [torch.stack([s["features"][i] for s in samples]) for i in range(2)]}


def test_dataloader_factory_with_a_collate_fn():
    # as AITune's dataloader tests: DataLoaderFactory(dataset, collate_fn=...).create_dataloader(batch_size=4)
    dataset = [{"features": [torch.randn(8), torch.randn(8)]} for _ in range(9)]
    factory = ait.DataLoaderFactory(dataset, collate_fn=collate_lists)
    batches = list(factory.create_dataloader(batch_size=4))
    assert len(batches) == 2 and batches[0]["features"][0].shape == (4, 8)
    small = ait.DataLoaderFactory(dataset[:1])  # default collate stacks; a small dataset fills a batch
    (batch,) = list(small.create_dataloader(batch_size=3))
    assert batch["features"][1].shape == (3, 8)

    module = ait.Module(ListsModel().eval(), "lists", strategy=cpu_strategy())
    ait.tune(module, factory, batch_sizes=[1, 2], max_num_batches_per_batch_size=1, ignore_failing_modules=False)
    (graph,) = module.ait_graphs
    assert graph.input_names == ["input_features_0", "input_features_1"]
    assert sorted(s.batch_size for s in graph.samples) == [1, 2]
    x = collate_lists(dataset[:2])
    with torch.no_grad():
        torch.testing.assert_close(module(**x), module.ait_module(**x))
    with pytest.raises(TypeError, match="sequence or map-style Dataset"):
        ait.DataLoaderFactory(iter(dataset))
    with pytest.raises(ValueError, match="positive int"):
        factory.create_dataloader(0)


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)])
        self.heads = torch.nn.ModuleDict({"small": torch.nn.Linear(16, 2)})

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.heads["small"](x)


def test_inspect_and_wrap_items_of_module_lists_and_dicts_and_the_object_itself():
    model = Blocks().eval()
    info = ait.inspect(model, [torch.randn(16)], number_of_iterations=2, warmup_iterations=0)
    (whole,) = info.get_modules()  # the submodules are part of the top module's time: not listed
    assert whole.object_path == "" and whole.parent is None and whole.execution_count == 2
    wrapped = ait.wrap(model, [whole], strategy=cpu_strategy())
    assert isinstance(wrapped, ait.Module) and wrapped.ait_module is model and wrapped.ait_name == "Blocks"

    class Pipeline:
        def __init__(self):
            self.model = Blocks().eval()

        def __call__(self, x):
            return self.model(x)

    pipeline = Pipeline()
    info = ait.inspect(pipeline, [torch.randn(16)], number_of_iterations=1, warmup_iterations=0)
    assert [m.object_path for m in info.get_modules()] == ["model"]
    children = [m for m in ait.inspect(pipeline, [torch.randn(16)], inference_function=lambda x: [
        b(x) for b in pipeline.model.blocks] + [pipeline.model.heads["small"](x)], number_of_iterations=1,
        warmup_iterations=0).get_modules()]
    assert sorted(m.object_path for m in children) == ["model.blocks.0", "model.blocks.1", "model.heads.small"]
    x = torch.randn(2, 16)
    with torch.no_grad():
        expected = pipeline(x)
    assert ait.wrap(pipeline, children, strategy=cpu_strategy()) is pipeline
    assert isinstance(pipeline.model.blocks[1], ait.Module) and pipeline.model.blocks[1].ait_name == "model.blocks.1"
    assert isinstance(pipeline.model.heads["small"], ait.Module)
    with torch.no_grad():
        torch.testing.assert_close(pipeline(x), expected)
    with pytest.raises(ValueError, match="is an ait.Module already"):
        ait.wrap(pipeline, children)


def test_inspect_refuses_bad_arguments():
    with pytest.raises(ValueError, match="number_of_iterations must be at least 1"):
        ait.inspect(MLP(), [torch.randn(16)], number_of_iterations=0)
    with pytest.raises(ValueError, match=r"holds no torch.nn.Module.*; a function's globals are not searched: .*"
                                         r"ait.inspect\(model, data, inference_function=fn\)"):
        ait.inspect(lambda x: x, [torch.randn(16)])
    info = ait.inspect(MLP(), [torch.randn(16)], number_of_iterations=1, warmup_iterations=0)
    with pytest.raises(ValueError, match="limit"):
        info.get_modules(limit=-1)


def test_a_strategy_switch_wins_for_the_graphs_it_tunes():
    # as AITune's scripts: strategy.enable_performance_validation(False); enable_find_max_batch_size(enable=False)
    strict = cpu_strategy()
    strict.enable_performance_validation(True, min_speedup=1e6)  # no candidate is a million times faster
    strict.enable_find_max_batch_size(enable=False)
    assert strict.option_overrides == {"performance_validation": True, "min_speedup": 1e6,
                                       "find_max_batch_size": False, "max_batch_size": 4096}
    module = ait.Module(MLP().eval(), "strict", strategy=strict)
    ait.tune(module, [torch.randn(16)], performance_validation=False, ignore_failing_modules=False)
    (report,) = module.ait_reports.values()
    assert report.winner is None and "slower than eager" in report.summary_table()
    loose = cpu_strategy()
    loose.enable_performance_validation(False)
    module = ait.Module(MLP().eval(), "loose", strategy=loose)
    ait.tune(module, [torch.randn(16)], performance_validation=True, min_speedup=1e6, ignore_failing_modules=False)
    assert next(iter(module.ait_reports.values())).winner is not None
    with pytest.raises(TypeError, match="must be a bool"):
        loose.enable_performance_validation("yes")


def test_modules_in_a_plain_list_attribute_of_a_module_are_found_and_wrapped():
    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = torch.nn.Linear(16, 16)
            self.experts = [torch.nn.Linear(16, 16)]  # not registered as a child

        def forward(self, x):
            return self.experts[0](self.gate(x))

    model = Experts().eval()
    info = ait.inspect(model, [torch.randn(16)], number_of_iterations=1, warmup_iterations=0,
                       inference_function=lambda x: model.experts[0](model.gate(x)))
    assert sorted(m.object_path for m in info.get_modules()) == ["experts.0", "gate"]
    expert = [m for m in info.get_modules() if m.object_path == "experts.0"]
    ait.wrap(model, expert, strategy=cpu_strategy())
    assert isinstance(model.experts[0], ait.Module) and model.experts[0].ait_name == "experts.0"


def test_modules_under_int_dict_keys_are_found_and_wrapped():
    # {0: model, 1: model}: as a pipeline keeps several ControlNets; was "holds no torch.nn.Module"
    class Pipeline:
        def __init__(self):
            self.models = {0: MLP().eval(), "0": MLP().eval(), 1: MLP().eval()}

        def __call__(self, x):
            return self.models[1](x) + self.models[0](x) + self.models["0"](x)

    pipeline = Pipeline()
    info = ait.inspect(pipeline, [torch.randn(16)], number_of_iterations=1, warmup_iterations=0)
    # the str "0" would have the int 0's path: the first key of a path is the one found
    assert sorted(m.object_path for m in info.get_modules()) == ["models.0", "models.1"]
    ait.wrap(pipeline, info.get_modules(), strategy=cpu_strategy())
    assert isinstance(pipeline.models[1], ait.Module) and pipeline.models[1].ait_name == "models.1"
    assert isinstance(pipeline.models[0], ait.Module) and not isinstance(pipeline.models["0"], ait.Module)


def test_inspect_refuses_a_max_depth_that_save_would_not_search():
    with pytest.raises(ValueError, match=r"max_depth must be an int within \[0, 64\]"):
        ait.inspect(MLP(), [torch.randn(16)], max_depth=65)


def test_a_module_also_held_inside_an_executed_one_is_not_listed_twice():
    # the pipeline holds the denoiser itself and a guidance wrapper around it, and calls
    # the wrapper only: the denoiser's calls are part of the wrapper's time
    class Guidance(torch.nn.Module):
        def __init__(self, denoiser):
            super().__init__()
            self.denoiser = denoiser

        def forward(self, x):
            return self.denoiser(x) * 2 - self.denoiser(torch.zeros_like(x))

    class Pipeline:
        def __init__(self):
            self.denoiser = MLP(16, 32, 16).eval()
            self.guidance = Guidance(self.denoiser)

        def __call__(self, x):
            return self.guidance(x) + self.denoiser(x)[:, :1]

    pipeline = Pipeline()
    info = ait.inspect(pipeline, [torch.randn(16)], number_of_iterations=2, warmup_iterations=0)
    by_path = {m.object_path: m for m in info.get_modules()}
    assert sorted(by_path) == ["denoiser", "guidance"]
    assert by_path["guidance"].execution_count == 2 and by_path["denoiser"].execution_count == 2  # its own calls only
    only_guidance = ait.inspect(pipeline, [torch.randn(16)], inference_function=lambda x: pipeline.guidance(x),
                                number_of_iterations=1, warmup_iterations=0)
    assert [m.object_path for m in only_guidance.get_modules()] == ["guidance"]
    assert only_guidance.share(only_guidance.get_modules()[0]) <= 1.0


def test_wrap_refuses_modules_inspected_in_another_object():
    """ait.wrap(b, ait.inspect(a, ...).get_modules()) wrapped a's modules in a and returned
    b untouched, saying nothing (the later ait.tune of b then said to wrap the modules);
    it must refuse, naming the module, and change neither object."""

    class Pipeline:
        def __init__(self):
            self.encoder, self.head = MLP().eval(), MLP(8, 16, 4).eval()

        def __call__(self, x):
            return self.head(self.encoder(x)[..., :8])

    inspected, other = Pipeline(), Pipeline()
    info = ait.inspect(inspected, [torch.randn(16)], number_of_iterations=1, warmup_iterations=0)
    with pytest.raises(ValueError, match=r"'(encoder|head)' \(a .*MLP\) .* not held by the Pipeline given") as raised:
        ait.wrap(other, info.get_modules(), strategy=cpu_strategy())
    assert "inspect" in str(raised.value)
    for pipeline in (inspected, other):
        assert not isinstance(pipeline.encoder, ait.Module) and not isinstance(pipeline.head, ait.Module)
    # the same object: wrapped
    assert ait.wrap(inspected, info.get_modules(), strategy=cpu_strategy()) is inspected
    assert isinstance(inspected.encoder, ait.Module) and isinstance(inspected.head, ait.Module)


def test_inspect_lists_modules_a_pipeline_runs_at_once_on_threads():
    """A two-tower pipeline running its towers on two threads at once: inspect counted a
    call as nested whenever any found module ran, on any thread, so the tower entered
    second was neither counted nor listed (it could not be chosen for ait.wrap). Nesting is
    per thread: each tower is listed with its calls."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    both_inside = threading.Barrier(2, timeout=10)

    class Tower(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            both_inside.wait()  # the two towers' forwards overlap
            return self.proj(x)

    class TwoTowers:
        def __init__(self):
            self.text, self.image, self.pool = Tower(), Tower(), ThreadPoolExecutor(2)

        def __call__(self, a, b):
            futures = self.pool.submit(self.text, a), self.pool.submit(self.image, b)
            return futures[0].result() @ futures[1].result().T

    pipeline = TwoTowers()
    info = ait.inspect(pipeline, [{"a": torch.randn(8), "b": torch.randn(8)}], number_of_iterations=3,
                       warmup_iterations=0)
    pipeline.pool.shutdown()
    assert sorted((m.object_path, m.execution_count) for m in info.get_modules()) == [("image", 3), ("text", 3)]
    # on one thread, a module inside another's forward is still part of that one's time
    assert [(m.object_path, m.execution_count) for m in ait.inspect(
        Blocks().eval(), [torch.randn(16)], number_of_iterations=2, warmup_iterations=0).get_modules()] == [("", 2)]


def test_a_module_whose_class_overrides_call_is_refused_naming_it():
    """Calls through ait.Module run forward and the hooks: a class's own ``__call__``
    (``super().__call__(x) * 2 + 1``) was skipped, tuned or not, 2.08 off eager, silently
    (a session-32 probe)."""

    class Doubled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.linear(x)

        def __call__(self, x):
            return super().__call__(x) * 2 + 1

    with pytest.raises(TypeError, match=r"Doubled overrides __call__, which calls through ait.Module would skip"):
        ait.Module(Doubled().eval(), "doubled")
