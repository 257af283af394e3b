"""Whole pipelines as AITune users tune them: ait.inspect, ait.wrap, ait.tune through the
pipeline, ait.save / ait.load of the whole object (issue 29), on a diffusers-style
pipeline (tiny CLIP text encoder + UNet2DConditionModel from configs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import aitune.torch as ait
from aitune import _core
from pipeline_models import TinyDiffusionPipeline, prompt_samples
from torch_models import cpu_strategy

HERE = Path(__file__).resolve().parent


def batches():
    samples = prompt_samples()
    return samples, samples[0]["input_ids"][None], torch.stack([s["input_ids"] for s in samples])


def test_the_seven_lines_on_a_diffusers_pipeline(tmp_path):
    pytest.importorskip("diffusers", reason="diffusers is not installed (scripts/setup.sh installs it)")
    input_data, batch1, batch2 = batches()
    pipeline = TinyDiffusionPipeline()
    expected1, expected2 = pipeline(batch1), pipeline(batch2)

    modules_info = ait.inspect(pipeline, input_data, number_of_iterations=2, warmup_iterations=1)
    ranked = modules_info.get_modules()
    assert [m.object_path for m in ranked] == ["unet", "text_encoder"]  # the UNet first; no submodule listed
    assert ranked[0].execution_count == 2 * pipeline.steps and ranked[1].execution_count == 2
    assert ranked[0].parent is pipeline and ranked[0].name == "unet"
    assert "unet" in modules_info.table() and "UNet2DConditionModel" in modules_info.table()
    modules = modules_info.get_modules(limit=2)
    unet, text_encoder = pipeline.unet, pipeline.text_encoder

    pipeline = ait.wrap(pipeline, modules, strategy=cpu_strategy())
    assert isinstance(pipeline.unet, ait.Module) and pipeline.unet.ait_module is unet
    assert isinstance(pipeline.text_encoder, ait.Module) and pipeline.text_encoder.ait_module is text_encoder
    assert pipeline.unet.ait_name == "unet"

    def call_wrapper(input_ids):
        pipeline(input_ids)

    ait.tune(call_wrapper, input_data, dry_run=True)
    assert pipeline.unet.ait_state is ait.ModuleState.RECORDING
    ait.tune(call_wrapper, input_data, batch_sizes=[1, 2], ignore_failing_modules=False, disable_external_logging=True)
    assert pipeline.unet.ait_state is ait.ModuleState.TUNED and pipeline.text_encoder.ait_state is ait.ModuleState.TUNED
    assert all("ONNXRuntimeBackend" in b for b in pipeline.unet.ait_backends.values())
    torch.testing.assert_close(pipeline(batch1), expected1, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pipeline(batch2), expected2, atol=1e-4, rtol=1e-4)

    checkpoint = tmp_path / "pipeline.ait"
    assert ait.save(pipeline, checkpoint) == checkpoint.absolute()
    manifest = json.loads((checkpoint / "pipeline.json").read_text())
    assert [m["path"] for m in manifest["modules"]] == ["text_encoder", "unet"]
    for entry in manifest["modules"]:  # each section is a single-module checkpoint the C++ engine loads
        section = _core.Checkpoint.load(str(checkpoint / entry["directory"]))
        assert section.manifest.module_name == entry["name"]

    np.save(tmp_path / "expected1.npy", expected1.numpy())
    np.save(tmp_path / "expected2.npy", expected2.numpy())
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        import numpy as np, torch
        import aitune.torch as ait
        from pipeline_models import TinyDiffusionPipeline, prompt_samples
        fresh_pipeline = TinyDiffusionPipeline()
        for model in (fresh_pipeline.unet, fresh_pipeline.text_encoder):  # other weights: the graphs carry theirs
            torch.nn.init.normal_(next(model.parameters()))
        pipeline = ait.load(fresh_pipeline, {str(checkpoint)!r})
        assert pipeline.unet.ait_state is ait.ModuleState.TUNED and pipeline.text_encoder.ait_state is ait.ModuleState.TUNED
        samples = prompt_samples()
        batch1, batch2 = samples[0]["input_ids"][None], torch.stack([s["input_ids"] for s in samples])
        for batch, name in ((batch1, "expected1.npy"), (batch2, "expected2.npy")):
            expected = torch.from_numpy(np.load({str(tmp_path)!r} + "/" + name))
            torch.testing.assert_close(pipeline(batch), expected, atol=1e-4, rtol=1e-4)
        print("reproduced")
    """)
    env = dict(os.environ, AITUNE_CACHE_DIR=str(tmp_path / "fresh-cache"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "reproduced" in result.stdout


class PromptPipeline:
    """Takes prompts as strings (a str or a list of them, as diffusers pipelines do) and
    tokenizes them itself: its samples hold no tensor."""

    def __init__(self):
        from torch_models import MLP

        torch.manual_seed(0)
        self.encoder = MLP(8, 16, 4).eval()

    def __call__(self, prompt):
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        tokens = torch.tensor([[float(ord(c) % 7) for c in (p + " " * 8)[:8]] for p in prompts])
        with torch.no_grad():
            return self.encoder(tokens)


def test_prompt_samples_are_batched_as_lists_of_strings():
    """Samples that hold only strings (AITune's pipeline samples, ``[{"prompt": ...}]``)
    make a batch of b as a list of b strings, as AITune's collator does: before, a batch
    of 2 was the one string (non-tensor values are constants), so ait.tune ran the pipeline
    at batch 1 under batch size 2 and tuned batch 1 only, saying nothing; a call with two
    prompts then failed."""
    from aitune.torch.dataset import iterate_calls

    samples = [{"prompt": "a cat"}, {"prompt": "a dog"}, {"prompt": "a cow"}]
    calls = list(iterate_calls(samples, [1, 2]))
    assert [kwargs["prompt"] for _, _, kwargs in calls] == [["a cat"], ["a dog"], ["a cow"], ["a cat", "a dog"]]
    # a sample that is a bare string is one argument, the list of the batch's strings
    assert list(iterate_calls(["a cat", "a dog"], [1, 2])) == [
        (1, (["a cat"],), {}), (1, (["a dog"],), {}), (2, (["a cat", "a dog"],), {})]
    # where samples hold tensors, a string stays a constant of the graph, as documented
    mixed = list(iterate_calls([{"x": torch.zeros(2), "mode": "b"}] * 2, [2]))
    assert mixed[0][2]["mode"] == "b" and mixed[0][2]["x"].shape == (2, 2)

    pipeline = PromptPipeline()
    expected = pipeline(["a cow", "a hen"])
    pipeline = ait.wrap(pipeline, ait.inspect(pipeline, samples, number_of_iterations=1, warmup_iterations=0)
                        .get_modules(), strategy=cpu_strategy())
    ait.tune(lambda prompt: pipeline(prompt), samples)
    assert pipeline.encoder.ait_graphs[0].graph_spec().batch_sizes == [1, 2]
    torch.testing.assert_close(pipeline(["a cow", "a hen"]), expected, atol=1e-5, rtol=1e-5)


def test_modules_called_on_another_thread_while_tuning_are_named(caplog):
    """A pipeline that calls its modules on a thread pool: ait.tune records the calls made
    on the thread running func (its recording is a context variable, which worker threads
    do not see), and said "func called no ait.Module: wrap the modules", though they were
    wrapped. The refusal names the modules called on another thread and what to do; where
    func's thread called others, the ones left untuned are named in a warning."""
    from concurrent.futures import ThreadPoolExecutor

    from torch_models import MLP

    pool = ThreadPoolExecutor(1)
    text = ait.Module(MLP(8, 16, 4).eval(), "thread-text", strategy=cpu_strategy())
    image = ait.Module(MLP(8, 16, 4).eval(), "thread-image", strategy=cpu_strategy())
    samples = [{"a": torch.randn(8), "b": torch.randn(8)} for _ in range(2)]

    def on_the_pool(a, b):
        return pool.submit(text, a).result() + pool.submit(image, b).result()

    with pytest.raises(ValueError, match=r"called on another thread than the one running func") as raised:
        ait.tune(on_the_pool, samples)
    assert "'thread-text'" in str(raised.value) and "'thread-image'" in str(raised.value)

    def text_here_image_on_the_pool(a, b):
        return text(a) + pool.submit(image, b).result()

    with caplog.at_level("WARNING", logger="aitune"):
        ait.tune(text_here_image_on_the_pool, samples)
    pool.shutdown()
    assert text.ait_state is ait.ModuleState.TUNED and image.ait_state is not ait.ModuleState.TUNED
    assert any("'thread-image'" in r.getMessage() and "another thread" in r.getMessage() for r in caplog.records)


class StreamingPipeline:
    """Yields one output per step, as a streaming pipeline does: calling it runs nothing
    until the generator it returns is iterated."""

    def __init__(self):
        from torch_models import MLP

        torch.manual_seed(0)
        self.encoder = MLP(8, 16, 4).eval()

    def __call__(self, x, steps=2):
        with torch.no_grad():
            for _ in range(steps):
                yield self.encoder(x)


def test_a_pipeline_returning_a_generator_is_named_and_a_consuming_function_tunes_it():
    """ait.inspect of a pipeline that returns a generator listed no module at all (the
    generator was never iterated, so nothing ran), silently: get_modules() was [] and
    ait.wrap wrapped nothing; ait.tune of it, its modules wrapped, said "wrap the modules".
    Both now say that it returned a generator and how to consume it; ait.inspect refuses an
    empty result with the modules it found (an inference_function calling modules obj does
    not hold)."""
    from torch_models import MLP

    pipeline = StreamingPipeline()
    samples = [torch.randn(8) for _ in range(2)]
    with pytest.raises(ValueError, match=r"none of the 4 nn.Modules found .* ran.*returned a generator.*list\(") as e:
        ait.inspect(pipeline, samples, number_of_iterations=1, warmup_iterations=0)
    assert "StreamingPipeline" in str(e.value)
    elsewhere = MLP(8, 16, 4).eval()
    with pytest.raises(ValueError, match=r"StreamingPipeline does not hold \(found: 'encoder', 'encoder.fc1'"):
        ait.inspect(pipeline, samples, inference_function=elsewhere, number_of_iterations=1, warmup_iterations=0)

    def consume(x):
        return list(pipeline(x))

    info = ait.inspect(pipeline, samples, inference_function=consume, number_of_iterations=1, warmup_iterations=0)
    assert [m.object_path for m in info.get_modules()] == ["encoder"] and info.get_modules()[0].execution_count == 2
    ait.wrap(pipeline, info.get_modules(), strategy=cpu_strategy())
    with pytest.raises(ValueError, match=r"func called no ait.Module: func returned a generator"):
        ait.tune(pipeline, samples)
    assert pipeline.encoder.ait_state is ait.ModuleState.INIT
    x = torch.stack(samples)
    expected = [pipeline.encoder.ait_module(x)]
    ait.tune(consume, samples)
    assert pipeline.encoder.ait_state is ait.ModuleState.TUNED
    torch.testing.assert_close(consume(x)[:1], expected, atol=1e-5, rtol=1e-5)


class TimestepDenoiser(torch.nn.Module):
    """A denoiser taking its timestep as a Python number or a tensor."""

    def __init__(self):
        super().__init__()
        from torch_models import MLP

        self.net = MLP(9, 16, 8)

    def forward(self, sample, t):
        t = torch.as_tensor(t, dtype=sample.dtype).reshape(1, 1).expand(sample.shape[0], 1)
        return self.net(torch.cat([sample, t], dim=-1))


class LoopPipeline:
    def __init__(self, as_tensor):
        torch.manual_seed(0)
        self.denoiser = TimestepDenoiser().eval()
        self.as_tensor = as_tensor

    def __call__(self, sample, steps=4):
        with torch.no_grad():
            for step in range(steps):  # the timestep changes every step
                t = 999.0 - 250.0 * step
                sample = sample - 0.1 * self.denoiser(sample, torch.tensor(t) if self.as_tensor else t)
            return sample


def test_a_python_number_that_changes_every_call_is_named_while_recording(caplog):
    """A pipeline's loop passing its timestep to a wrapped module as a Python float
    recorded one graph per step (a number is a constant of the graph), each exported and
    tuned on its own, and the tuned pipeline failed with GraphNotRecordedError at another
    step count, with no word while tuning. ait.tune now warns when a number alone made
    three or more graphs, naming the module, the argument and its values, and saying to
    pass a tensor; two values (two modes) and a tensor timestep are not warned about."""
    samples = [torch.randn(8) for _ in range(2)]
    pipeline = LoopPipeline(as_tensor=False)
    pipeline.denoiser = ait.Module(pipeline.denoiser, "loop-denoiser", strategy=cpu_strategy())
    with caplog.at_level("WARNING", logger="aitune"):
        ait.tune(pipeline, samples, dry_run=True)
    assert len(pipeline.denoiser.ait_graphs) == 4
    warned = [r.getMessage() for r in caplog.records if "differ only in the Python number" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "'loop-denoiser': 4 graphs" in warned[0] and "['t'] (249.0, 499.0, 749.0, 999.0)" in warned[0]
    assert "pass it as a tensor" in warned[0]

    for as_tensor, steps, graphs in ((False, 2, 2), (True, 4, 1)):
        caplog.clear()
        pipeline = LoopPipeline(as_tensor=as_tensor)
        pipeline.denoiser = ait.Module(pipeline.denoiser, f"loop-denoiser-{as_tensor}", strategy=cpu_strategy())
        with caplog.at_level("WARNING", logger="aitune"):
            ait.tune(lambda sample: pipeline(sample, steps=steps), samples, dry_run=True)
        assert len(pipeline.denoiser.ait_graphs) == graphs
        assert not [r for r in caplog.records if "differ only in the Python number" in r.getMessage()]


class CountingHead(torch.nn.Module):
    """Counts its calls in a plain attribute: state an export cannot keep, unless declared harmless."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.fc(x)


class CountingPipeline:
    def __init__(self):
        self.head = CountingHead().eval()

    def __call__(self, x):
        return self.head(x)


def test_wrap_gives_each_module_its_harmless_attributes_by_name():
    """ait.wrap had no harmless_attributes, so a pipeline module counting its calls could
    not be tuned through ait.wrap (its ait.Module had to be built by hand)."""
    pipeline = CountingPipeline()
    samples = [torch.randn(8) for _ in range(2)]
    modules = ait.inspect(pipeline, samples, number_of_iterations=1, warmup_iterations=0).get_modules()
    with pytest.raises(ValueError, match="harmless_attributes names 'tail'"):
        ait.wrap(pipeline, modules, strategy=cpu_strategy(), harmless_attributes={"tail": ["calls"]})
    assert not isinstance(pipeline.head, ait.Module)  # nothing wrapped on a refusal
    ait.wrap(pipeline, modules, strategy=cpu_strategy(), harmless_attributes={"head": ["calls"]})
    ait.tune(pipeline, samples, ignore_failing_modules=False)
    assert pipeline.head.ait_state is ait.ModuleState.TUNED


class SlottedPipeline:
    """A pipeline class that keeps its modules in ``__slots__`` (no instance __dict__)."""

    __slots__ = ("encoder", "head")

    def __init__(self):
        self.encoder = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 4)

    def __call__(self, x):
        return self.head(self.encoder(x))


def test_a_pipeline_holding_its_modules_in_slots_is_inspected_wrapped_saved_and_loaded(tmp_path):
    """ait.inspect said "SlottedPipeline holds no torch.nn.Module", and ait.save of one whose
    modules were wrapped by hand and tuned said it held no ait.Module (a session-36 probe):
    the walk reads ``__slots__`` too."""
    torch.manual_seed(0)
    pipeline = SlottedPipeline()
    data = [torch.randn(8) for _ in range(3)]
    found = ait.inspect(pipeline, data, number_of_iterations=1, warmup_iterations=0).get_modules()
    assert {info.name for info in found} == {"encoder", "head"}
    ait.wrap(pipeline, found, strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(lambda x: pipeline(x), data, progress=False, performance_validation=False)
    assert isinstance(pipeline.head, ait.Module) and pipeline.head.ait_state is ait.ModuleState.TUNED
    x = torch.randn(1, 8)
    with torch.no_grad():
        expected = pipeline(x)
    ait.save(pipeline, tmp_path / "slots.ait")
    torch.manual_seed(0)
    loaded = ait.load(SlottedPipeline(), tmp_path / "slots.ait")
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected)
