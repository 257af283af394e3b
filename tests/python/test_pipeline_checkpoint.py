"""ait.save / ait.load of an object holding several ait.Modules: one directory, one
manifest, a section per module under its object path; structure mismatches refused and
nothing changed on any error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import aitune
import aitune.torch as ait
from aitune import _core
from torch_models import MLP, SmallCNN, cpu_strategy


class TwoStage:
    """A pipeline-like plain object: an attribute and a list item."""

    def __init__(self):
        torch.manual_seed(0)
        self.encoder = MLP(16, 32, 16).eval()
        self.heads = [MLP(16, 32, 8).eval()]

    def __call__(self, x):
        return self.heads[0](self.encoder(x))


class OtherStage(TwoStage):
    pass


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tuned TwoStage saved once: (checkpoint path, input, tuned outputs)."""
    root = tmp_path_factory.mktemp("pipeline-checkpoint")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AITUNE_CACHE_DIR", str(root / "cache"))
        ait.enable_performance_validation(False)
        pipeline = TwoStage()
        pipeline.encoder = ait.Module(pipeline.encoder, "encoder", strategy=cpu_strategy())
        pipeline.heads[0] = ait.Module(pipeline.heads[0], "head", strategy=cpu_strategy())
        ait.tune(pipeline, [torch.randn(16)], ignore_failing_modules=False)
        x = torch.randn(2, 16)
        with torch.no_grad():
            outputs = pipeline(x)
        path = ait.save(pipeline, root / "two-stage")
    return path, x, outputs


def copy_of(saved, tmp_path) -> Path:
    return Path(shutil.copytree(saved[0], tmp_path / "copy"))


def test_load_restores_every_module_at_its_object_path(saved):
    path, x, outputs = saved
    assert sorted(p.name for p in path.iterdir()) == ["modules", "pipeline.json"]
    assert {p.suffix for p in path.rglob("*") if p.is_file()} <= {".json", ".onnx", ".data"}  # nothing pickled
    manifest = json.loads((path / "pipeline.json").read_text())
    assert [(m["path"], m["name"], m["directory"]) for m in manifest["modules"]] == [
        ("encoder", "encoder", "modules/encoder"), ("heads.0", "head", "modules/heads.0")]
    fresh = TwoStage()
    torch.nn.init.zeros_(fresh.encoder.fc1.weight)  # the graphs carry the tuned weights
    assert ait.load(fresh, path, disable_external_logging=False) is fresh  # as AITune's scripts call it
    assert isinstance(fresh.encoder, ait.Module) and fresh.encoder.ait_name == "encoder"
    assert isinstance(fresh.heads[0], ait.Module) and fresh.heads[0].ait_state is ait.ModuleState.TUNED
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), outputs)


class _EncoderDecoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = MLP(16, 32, 16)
        self.decoder = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Dropout(0.5))

    def forward(self, x):
        return self.decoder(self.encoder(x))


def test_loading_a_pipeline_into_modules_in_training_mode_says_so(tmp_path, monkeypatch, caplog):
    """A model built fresh is in training mode; ait.load put the tuned encoder in eval but
    the decoder's Dropout ran around it, silently (a T5 generated other tokens). Now named."""
    import logging

    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    model = _EncoderDecoder().eval()
    model.encoder = ait.Module(model.encoder, "encoder", strategy=cpu_strategy())
    ait.tune(model, [torch.randn(16)], ignore_failing_modules=False, performance_validation=False)
    path = ait.save(model, tmp_path / "encoder-decoder")

    def warnings_of(fresh) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="aitune"):
            ait.load(fresh, path)
        return [r.getMessage() for r in caplog.records if "training mode" in r.getMessage()]

    (warning,) = warnings_of(_EncoderDecoder())
    assert "but _EncoderDecoder is in training mode" in warning and ".eval() on it" in warning
    assert not warnings_of(_EncoderDecoder().eval())
    fresh = _EncoderDecoder()
    fresh.encoder.eval()
    fresh.training = False
    (warning,) = warnings_of(fresh)  # only the decoder trains
    assert warning.startswith("ait.load: the loaded ait.Modules run in the mode they were tuned in, but "
                              "_EncoderDecoder.decoder is in training mode")


def test_an_existing_ait_module_at_a_saved_path_is_loaded_into(saved):
    fresh = TwoStage()
    wrapper = ait.Module(fresh.encoder, "encoder", strategy=cpu_strategy())
    fresh.encoder = wrapper
    ait.load(fresh, saved[0])
    assert fresh.encoder is wrapper and wrapper.ait_state is ait.ModuleState.TUNED


def test_a_missing_module_is_refused_and_nothing_changes(saved):
    fresh = TwoStage()
    fresh.heads = []
    encoder = fresh.encoder
    with pytest.raises(ait.PipelineStructureError, match=r"'heads\.0' \(a .*MLP\) is missing"):
        ait.load(fresh, saved[0])
    assert fresh.encoder is encoder and not isinstance(fresh.encoder, ait.Module)


def test_an_extra_ait_module_is_refused(saved):
    fresh = TwoStage()
    fresh.extra = ait.Module(MLP(), "extra", strategy=cpu_strategy())
    with pytest.raises(ait.PipelineStructureError, match="ait.Module 'extra' at 'extra' is not in the checkpoint"):
        ait.load(fresh, saved[0])
    assert not isinstance(fresh.encoder, ait.Module) and not isinstance(fresh.heads[0], ait.Module)


def test_a_changed_class_is_refused(saved):
    fresh = TwoStage()
    fresh.heads[0] = SmallCNN()
    with pytest.raises(ait.PipelineStructureError, match=r"'heads\.0' was a .*MLP, is a .*SmallCNN"):
        ait.load(fresh, saved[0])
    assert not isinstance(fresh.encoder, ait.Module)


def test_a_module_built_with_another_config_is_refused(saved, tmp_path):
    # same class at the saved path, other sizes: the tuned graphs would silently compute
    # the saved model, not the one built
    fresh = TwoStage()
    fresh.encoder = MLP(16, 64, 16).eval()
    with pytest.raises(ait.PipelineStructureError,
                       match=r"'encoder' has other parameter or buffer shapes .*'fc1.weight' was \[32, 16\], "
                             r"is \[64, 16\]"):
        ait.load(fresh, saved[0])
    assert not isinstance(fresh.encoder, ait.Module) and not isinstance(fresh.heads[0], ait.Module)
    path = copy_of(saved, tmp_path)
    manifest = json.loads((path / "pipeline.json").read_text())
    manifest["modules"][0]["tensor_shapes"] = {"fc1.weight": "32x16"}
    (path / "pipeline.json").write_text(json.dumps(manifest))
    with pytest.raises(aitune.CheckpointCorruptError, match=r"modules\[0\]\.tensor_shapes"):
        ait.load(TwoStage(), path)
    for entry in manifest["modules"]:  # a checkpoint written before the shapes were recorded loads
        del entry["tensor_shapes"]
    (path / "pipeline.json").write_text(json.dumps(manifest))
    assert isinstance(ait.load(TwoStage(), path).encoder, ait.Module)


def test_another_object_class_is_refused(saved):
    fresh = OtherStage()
    with pytest.raises(ait.PipelineStructureError, match="saved from a .*TwoStage, this is a .*OtherStage"):
        ait.load(fresh, saved[0])
    assert not isinstance(fresh.encoder, ait.Module)


def test_a_pipeline_saved_from_a_script_names_the_main_module_trap(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    manifest = json.loads((path / "pipeline.json").read_text())
    manifest["object_class"] = "__main__.TwoStage"
    manifest["modules"][0]["module_class"] = "__main__.MLP"
    (path / "pipeline.json").write_text(json.dumps(manifest))
    with pytest.raises(ait.PipelineStructureError) as error:
        ait.load(TwoStage(), path)
    message = str(error.value)
    assert "this is a test_pipeline_checkpoint.TwoStage; a class defined in the script that ran ait.save" in message
    assert "'encoder' was a __main__.MLP, is a torch_models.MLP; a class defined in the script" in message


def test_a_damaged_section_puts_every_module_back(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    (model,) = (path / "modules" / "heads.0").rglob("*.onnx")
    model.write_bytes(model.read_bytes() + b"tampered")
    fresh = TwoStage()
    encoder = ait.Module(fresh.encoder, "encoder", strategy=cpu_strategy())
    fresh.encoder = encoder
    head = fresh.heads[0]
    with pytest.raises(aitune.CheckpointCorruptError, match="the file was changed"):
        ait.load(fresh, path)
    # the encoder section loaded first, then the head's failed: the encoder is as it was
    assert encoder.ait_state is ait.ModuleState.INIT and encoder.ait_graphs == []
    assert fresh.heads[0] is head and not isinstance(head, ait.Module)


def test_a_section_manifest_that_differs_from_the_pipeline_manifest_is_corrupt(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    section = path / "modules" / "encoder" / "manifest.json"
    section.write_text(section.read_text().replace('"encoder"', '"renamed"'))
    fresh = TwoStage()
    with pytest.raises(aitune.CheckpointCorruptError, match="manifest.json sha256"):
        ait.load(fresh, path)
    assert not isinstance(fresh.encoder, ait.Module)


def test_a_newer_or_foreign_manifest_is_corrupt(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    manifest = json.loads((path / "pipeline.json").read_text())
    (path / "pipeline.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(aitune.CheckpointCorruptError, match="newer aitune"):
        ait.load(TwoStage(), path)
    (path / "pipeline.json").write_text(json.dumps({**manifest, "modules": [{"path": "encoder"}]}))
    with pytest.raises(aitune.CheckpointCorruptError, match=r"modules\[0\]\.name"):
        ait.load(TwoStage(), path)


def test_what_is_not_a_pipeline_checkpoint_is_named_as_what_it_is(saved, tmp_path):
    """A probe's messages: format_version 1.0 blamed a newer aitune; a pipeline checkpoint
    missing pipeline.json, and a plain file, were "not a pipeline checkpoint, and a
    single-module checkpoint loads into an nn.Module"; a symbolic link to a checkpoint was
    "not an aitune checkpoint"; an empty path meant the current directory."""
    path = copy_of(saved, tmp_path)
    manifest = json.loads((path / "pipeline.json").read_text())
    (path / "pipeline.json").write_text(json.dumps({**manifest, "format_version": 1.0}))
    with pytest.raises(aitune.CheckpointCorruptError, match=r"format_version must be an integer, got 1\.0"):
        ait.load(TwoStage(), path)
    (path / "pipeline.json").unlink()
    with pytest.raises(aitune.CheckpointCorruptError, match="has no pipeline.json"):
        ait.load(TwoStage(), path)
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    with pytest.raises(aitune.InvalidArgumentError, match="is a file, not a checkpoint directory"):
        ait.load(TwoStage(), plain)
    with pytest.raises(aitune.InvalidArgumentError, match="the path is empty"):
        ait.load(TwoStage(), "")
    pipeline = ait.load(TwoStage(), saved[0])
    link = tmp_path / "link.ait"
    link.symlink_to(saved[0], target_is_directory=True)
    with pytest.raises(aitune.InvalidArgumentError, match="is a symbolic link .*save to the directory it points to"):
        ait.save(pipeline, link)
    with pytest.raises(aitune.InvalidArgumentError, match="the path is empty"):
        ait.save(pipeline, "")


def test_save_is_atomic_and_refuses_what_it_cannot_save(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    pipeline = TwoStage()
    ait.load(pipeline, path)

    def fail_at_third(relative, count):
        if count == 3:
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        ait.save(pipeline, path, on_file_written=fail_at_third)
    assert {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()} == before
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temporary left
    with pytest.raises(aitune.InvalidArgumentError, match="overwrite=False"):
        ait.save(pipeline, path, overwrite=False)
    other = tmp_path / "not-a-checkpoint"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(aitune.InvalidArgumentError, match="not an aitune checkpoint"):
        ait.save(pipeline, other)
    assert (other / "notes.txt").read_text() == "mine"
    # was: a bare FileExistsError from mkdir (the single-module save: AituneIOError)
    with pytest.raises(aitune.AituneIOError, match="notes.txt"):
        ait.save(pipeline, other / "notes.txt" / "inside")
    with pytest.raises(TypeError, match="holds no ait.Module"):
        ait.save(TwoStage(), tmp_path / "empty")
    untuned = TwoStage()
    untuned.encoder = ait.Module(untuned.encoder, "encoder", strategy=cpu_strategy())
    # (a module the tuning data never reached: the message says so, not only "tune it", a probe)
    with pytest.raises(aitune.StateError, match="'encoder' .* is INIT, not TUNED: no call reached it while ait.tune "
                                                "ran"):
        ait.save(untuned, tmp_path / "untuned")
    assert not (tmp_path / "untuned").exists()


def test_a_single_module_checkpoint_loads_into_a_plain_module(saved, tmp_path):
    pipeline = TwoStage()
    ait.load(pipeline, saved[0])
    single = ait.save(pipeline.encoder, tmp_path / "encoder")  # an ait.Module: the single-module format
    assert (single / "manifest.json").is_file() and not (single / "pipeline.json").exists()
    plain = MLP(16, 32, 16).eval()
    loaded = ait.load(plain, single)
    assert isinstance(loaded, ait.Module) and loaded.ait_module is plain and loaded.ait_name == "encoder"
    assert loaded.ait_state is ait.ModuleState.TUNED
    with pytest.raises(aitune.InvalidArgumentError, match="single-module checkpoint loads into an nn.Module"):
        ait.load(TwoStage(), single)
    with pytest.raises(ait.PipelineStructureError):  # a pipeline checkpoint into a module of another build
        ait.load(MLP(), saved[0])


class SharedHead:
    """One Linear reachable from two places (``head`` and ``inner.shared``), called through
    both at different shapes: a pipeline sharing a module between two stages."""

    def __init__(self):
        torch.manual_seed(0)
        self.head = torch.nn.Linear(16, 16).eval()
        self.inner = type("Inner", (), {})()
        self.inner.encoder = MLP(16, 32, 16).eval()
        self.inner.shared = self.head

    def __call__(self, x):
        with torch.no_grad():
            y = self.inner.shared(self.inner.encoder(x))
            return self.head(y[:, 0])  # another rank: another graph


def test_a_shared_module_is_wrapped_saved_and_loaded_at_every_place(tmp_path, caplog):
    pipeline = SharedHead()
    samples = [torch.randn(3, 16) for _ in range(2)]
    x = torch.stack(samples)
    expected = pipeline(x)
    info = ait.inspect(pipeline, samples, number_of_iterations=1, warmup_iterations=0)
    assert sorted(m.object_path for m in info.get_modules()) == ["head", "inner.encoder"]
    (head,) = [m for m in info.get_modules() if m.object_path == "head"]
    assert head.execution_count == 2  # through both places
    ait.wrap(pipeline, info.get_modules(), strategy=cpu_strategy())
    assert isinstance(pipeline.head, ait.Module) and pipeline.inner.shared is pipeline.head
    ait.tune(lambda x: pipeline(x), samples, ignore_failing_modules=False)
    assert len(pipeline.head.ait_graphs) == 2  # the calls through inner.shared were recorded and tuned too
    torch.testing.assert_close(pipeline(x), expected)
    path = ait.save(pipeline, tmp_path / "shared")
    assert [m["path"] for m in json.loads((path / "pipeline.json").read_text())["modules"]] == ["head", "inner.encoder"]
    assert json.loads((path / "pipeline.json").read_text())["modules"][0]["aliases"] == ["inner.shared"]
    with caplog.at_level("WARNING", logger="aitune"):
        fresh = ait.load(SharedHead(), path)
    assert isinstance(fresh.head, ait.Module) and fresh.inner.shared is fresh.head
    assert fresh.head.ait_state is ait.ModuleState.TUNED
    torch.testing.assert_close(fresh(x), expected)
    assert "several places" not in caplog.text
    # built with a copy where the saved object shared the module: that place stays eager,
    # which the load said nothing of (a pipeline half tuned)
    unshared = SharedHead()
    unshared.inner.shared = torch.nn.Linear(16, 16).eval()
    unshared.inner.shared.load_state_dict(unshared.head.state_dict())
    with caplog.at_level("WARNING", logger="aitune"):
        ait.load(unshared, path)
    assert not isinstance(unshared.inner.shared, ait.Module)
    assert "here 'inner.shared' (the module of 'head' when saved) holds another module" in caplog.text, caplog.text


def test_a_shared_module_wrapped_twice_by_hand_loads_into_a_fresh_pipeline(tmp_path):
    # two ait.Modules over one Linear, one per place: both saved, both found again on load
    pipeline = SharedHead()
    pipeline.head = ait.Module(pipeline.head, "head", strategy=cpu_strategy())
    pipeline.inner.shared = ait.Module(pipeline.inner.shared, "shared", strategy=cpu_strategy())
    samples = [torch.randn(3, 16)]
    ait.tune(lambda x: pipeline(x), samples, ignore_failing_modules=False)
    x = torch.stack(samples)
    expected = pipeline(x)
    path = ait.save(pipeline, tmp_path / "twice")
    assert sorted(m["path"] for m in json.loads((path / "pipeline.json").read_text())["modules"]) == [
        "head", "inner.shared"]
    fresh = ait.load(SharedHead(), path)
    assert fresh.head.ait_name == "head" and fresh.inner.shared.ait_name == "shared"
    assert fresh.head.ait_module is fresh.inner.shared.ait_module
    torch.testing.assert_close(fresh(x), expected)
    one = SharedHead()  # one ait.Module at both places cannot take two sections
    one.head = one.inner.shared = ait.Module(one.head, "head", strategy=cpu_strategy())
    with pytest.raises(ait.PipelineStructureError, match="'inner.shared' holds the ait.Module 'head' of another"):
        ait.load(one, path)
    assert one.head.ait_state is ait.ModuleState.INIT


class _Encoder(torch.nn.Module):
    def __init__(self, proj):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.proj = proj

    def forward(self, x):
        return self.proj(torch.relu(self.fc(x)))


class EncoderSharingItsProjection:
    """``proj`` called by the pipeline and by its encoder (the same module); which place
    ait.inspect finds first follows the order the attributes were assigned in."""

    def __init__(self, encoder_first: bool):
        torch.manual_seed(0)
        proj = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval()
        if encoder_first:
            self.encoder = _Encoder(proj).eval()
            self.proj = proj
        else:
            self.proj = proj
            self.encoder = _Encoder(proj).eval()

    def __call__(self, x):
        with torch.no_grad():
            return self.proj(self.encoder(x))


@pytest.mark.parametrize("encoder_first", [False, True])
def test_inspect_then_wrap_of_a_module_an_encoder_shares_works_in_either_order(tmp_path, caplog, encoder_first):
    """Assigned encoder first, ait.inspect named the shared module 'encoder.proj' (inside the
    encoder) and ait.wrap refused its own output; the wrapper now goes where the pipeline
    calls it. The encoder's calls of it are in the encoder's graph: ait.tune no longer warns
    that they are direct calls that will not run tuned."""
    pipeline = EncoderSharingItsProjection(encoder_first)
    samples = [torch.randn(8) for _ in range(3)]
    x = torch.randn(2, 8)
    expected = pipeline(x)
    info = ait.inspect(pipeline, samples, number_of_iterations=2, warmup_iterations=1)
    ait.wrap(pipeline, info.get_modules(), strategy=cpu_strategy(tune_provider_options=False))
    assert isinstance(pipeline.proj, ait.Module) and isinstance(pipeline.encoder, ait.Module)
    assert not isinstance(pipeline.encoder.ait_module.proj, ait.Module)  # the encoder's graph holds it
    with caplog.at_level("WARNING", logger="aitune"):
        ait.tune(lambda x: pipeline(x), samples, ignore_failing_modules=False, progress=False)
    assert "called directly" not in caplog.text, caplog.text
    assert pipeline.proj.ait_state is pipeline.encoder.ait_state is ait.ModuleState.TUNED
    torch.testing.assert_close(pipeline(x), expected)
    path = ait.save(pipeline, tmp_path / "shared-proj")
    fresh = ait.load(EncoderSharingItsProjection(encoder_first), path)
    assert isinstance(fresh.proj, ait.Module)
    torch.testing.assert_close(fresh(x), expected)


class KeyedHeads:
    def __init__(self, key):
        torch.manual_seed(0)
        self.main = torch.nn.Linear(8, 8).eval()
        self.heads = {key: torch.nn.Linear(8, 8).eval()}
        self.key = key

    def __call__(self, x):
        with torch.no_grad():
            return self.main(x) + self.heads[self.key](x)


@pytest.mark.parametrize("key", ["v1.2", 3.5])
def test_a_module_under_a_dict_key_with_no_object_path_is_refused_not_left_out(tmp_path, key):
    """A TUNED ait.Module under heads['v1.2'] (or heads[3.5]) was left out of the checkpoint
    without a word: loaded, the head ran eagerly."""
    pipeline = KeyedHeads(key)
    pipeline.main = ait.Module(pipeline.main, "main", strategy=cpu_strategy(tune_provider_options=False))
    pipeline.heads[key] = ait.Module(pipeline.heads[key], "head", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(lambda x: pipeline(x), [torch.randn(8)], ignore_failing_modules=False, progress=False)
    assert pipeline.heads[key].ait_state is ait.ModuleState.TUNED
    with pytest.raises(ait.PipelineStructureError, match=rf"ait.Module 'head' at heads\[{key!r}\], a dict key that "
                       "has no object path"):
        ait.save(pipeline, tmp_path / "keyed")
    assert not (tmp_path / "keyed").exists()


class _Link:
    """One level of a deep chain of plain objects."""

    def __init__(self, inner):
        self.inner = inner


class DeepHead:
    def __init__(self, depth: int):
        torch.manual_seed(0)
        self.main = torch.nn.Linear(8, 8).eval()
        self.chain = torch.nn.Linear(8, 8).eval()
        for _ in range(depth):
            self.chain = _Link(self.chain)

    def head_place(self):
        link = self
        while isinstance(getattr(link, "chain", None) if link is self else link.inner, _Link):
            link = link.chain if link is self else link.inner
        return link

    def head(self):
        place = self.head_place()
        return place.chain if place is self else place.inner

    def __call__(self, x):
        with torch.no_grad():
            return self.main(x) + self.head()(x)


def test_a_module_deeper_than_the_walk_is_refused_not_left_out(tmp_path):
    """A TUNED ait.Module 70 levels down was left out of the checkpoint without a word: loaded,
    it ran eagerly (a session-37 probe)."""
    pipeline = DeepHead(70)
    pipeline.main = ait.Module(pipeline.main, "main", strategy=cpu_strategy(tune_provider_options=False))
    place = pipeline.head_place()
    place.inner = ait.Module(place.inner, "deep-head", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(lambda x: pipeline(x), [torch.randn(8)], ignore_failing_modules=False, progress=False)
    assert pipeline.head().ait_state is ait.ModuleState.TUNED
    with pytest.raises(ait.PipelineStructureError, match=r"ait.Module 'deep-head' at 'chain(\.inner){70}', 71 "
                       r"levels deep, deeper than a checkpoint's walk reaches \(64\)"):
        ait.save(pipeline, tmp_path / "deep")
    assert not (tmp_path / "deep").exists()


class TupleStages:
    def __init__(self):
        torch.manual_seed(0)
        self.stages = (torch.nn.Linear(8, 8).eval(), torch.nn.Linear(8, 8).eval())

    def __call__(self, x):
        with torch.no_grad():
            return self.stages[1](self.stages[0](x))


def test_a_module_in_a_tuple_is_refused_at_save_not_at_every_load(tmp_path):
    """ait.save wrote 'stages.0' and 'stages.1' of a tuple, which every ait.load into a
    freshly built object then refused (a tuple item cannot be assigned)."""
    pipeline = TupleStages()
    pipeline.stages = tuple(ait.Module(m, f"stage{i}", strategy=cpu_strategy(tune_provider_options=False))
                            for i, m in enumerate(pipeline.stages))
    ait.tune(lambda x: pipeline(x), [torch.randn(8)], ignore_failing_modules=False, progress=False)
    with pytest.raises(ait.PipelineStructureError, match=r"'stages.0' \(ait.Module 'stage0'\) is an item of a tuple"):
        ait.save(pipeline, tmp_path / "tuple")
    assert not (tmp_path / "tuple").exists()


def test_a_load_during_a_concurrent_save_never_mixes_two_versions(saved, tmp_path, monkeypatch):
    # another process saves a pipeline of other weights to the path after the first section
    # was loaded: the load must not keep the encoder of one version and the head of the next
    from aitune.torch import checkpoint as module_checkpoint

    path = copy_of(saved, tmp_path)
    other = TwoStage()
    with torch.no_grad():
        for p in other.encoder.parameters():
            p.add_(0.5)
    other.encoder = ait.Module(other.encoder, "encoder", strategy=cpu_strategy())
    other.heads[0] = ait.Module(other.heads[0], "head", strategy=cpu_strategy())
    ait.tune(other, [torch.randn(16)], ignore_failing_modules=False)
    x = saved[1]
    with torch.no_grad():
        other_outputs = other(x)
    assert not torch.allclose(other_outputs, saved[2])
    real_load, sections_loaded = module_checkpoint.load, []

    def load_then_overwritten(module, section, device_map=None):
        result = real_load(module, section, device_map)
        sections_loaded.append(section)
        if len(sections_loaded) == 1:
            ait.save(other, path)  # swapped in between the two sections
        return result

    monkeypatch.setattr(module_checkpoint, "load", load_then_overwritten)
    fresh = ait.load(TwoStage(), path)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), other_outputs)  # the new version, whole
    assert len(sections_loaded) == 4  # the first attempt's two, then both again from the new version


def test_staging_is_owned_while_saving_and_a_dead_saves_is_swept_by_the_next(saved, tmp_path):
    import fcntl
    import os
    import subprocess
    import sys

    pipeline = ait.load(TwoStage(), saved[0])
    target = tmp_path / "ck"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = [tmp_path / f".ck.tmp-{dead.pid}-killed", tmp_path / f".ck.old-{dead.pid}-killed"]
    for directory in left:  # what a save killed mid-way leaves
        (directory / "modules").mkdir(parents=True)
    locked_by_others = []

    def staging_is_locked(relative, count):
        if count == 1:
            (staging,) = [p for p in tmp_path.glob(".ck.tmp-*") if p not in left]
            fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked_by_others.append(False)
            except BlockingIOError:
                locked_by_others.append(True)
            finally:
                os.close(fd)

    ait.save(pipeline, target, on_file_written=staging_is_locked)
    assert locked_by_others == [True]  # another process's sweep keeps it, whatever its pid
    assert not any(directory.exists() for directory in left)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_a_save_racing_another_first_save_to_the_path_replaces_it(saved, tmp_path, monkeypatch):
    import os

    from aitune.torch import pipeline_checkpoint

    pipeline = ait.load(TwoStage(), saved[0])
    target = tmp_path / "ck"
    real_rename, raced = os.rename, []

    def another_save_first(src, dst):
        if Path(dst) == target and not raced:  # between the save's look at the path and its rename
            raced.append(shutil.copytree(saved[0], target))
            (target / "from-the-other-save").write_text("")
        return real_rename(src, dst)

    monkeypatch.setattr(pipeline_checkpoint.os, "rename", another_save_first)
    ait.save(pipeline, target)
    assert raced and not (target / "from-the-other-save").exists()  # replaced, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    with torch.no_grad():
        torch.testing.assert_close(ait.load(TwoStage(), target)(saved[1]), saved[2])
    raced.clear()  # with overwrite=False the other save's checkpoint stays, as if it had been there first
    other = tmp_path / "other"
    target = other / "ck"
    with pytest.raises(aitune.InvalidArgumentError, match="overwrite=False"):
        ait.save(pipeline, target, overwrite=False)
    assert raced and (target / "from-the-other-save").exists() and sorted(p.name for p in other.iterdir()) == ["ck"]


class Box:
    def __init__(self, inner):
        self.inner = inner


class DeepPipeline:
    """Its module nine plain objects deep: found by ait.inspect(max_depth=12) only."""

    def __init__(self):
        torch.manual_seed(0)
        chain = MLP().eval()
        for _ in range(8):
            chain = Box(chain)
        self.chain = chain

    def module(self):
        chain = self.chain
        while isinstance(chain, Box):
            chain = chain.inner
        return chain

    def __call__(self, x):
        with torch.no_grad():
            return self.module()(x)


def test_a_module_wrapped_deeper_than_eight_levels_is_saved_and_loaded(tmp_path):
    # was: ait.save found no ait.Module (or left the deep ones out), ait.load left them eager
    pipeline = DeepPipeline()
    info = ait.inspect(pipeline, [torch.randn(16)], number_of_iterations=1, warmup_iterations=0, max_depth=12)
    assert [m.object_path for m in info.get_modules()] == ["chain" + ".inner" * 8]
    ait.wrap(pipeline, info.get_modules(), strategy=cpu_strategy())
    ait.tune(lambda x: pipeline(x), [torch.randn(16)], ignore_failing_modules=False)
    x = torch.randn(2, 16)
    expected = pipeline(x)
    path = ait.save(pipeline, tmp_path / "deep")
    assert [m["path"] for m in json.loads((path / "pipeline.json").read_text())["modules"]] == ["chain" + ".inner" * 8]
    fresh = ait.load(DeepPipeline(), path)
    assert isinstance(fresh.module(), ait.Module) and fresh.module().ait_state is ait.ModuleState.TUNED
    torch.testing.assert_close(fresh(x), expected)


def test_a_module_kept_eager_is_saved_with_the_pipeline_and_loads_eager(tmp_path):
    """Performance validation keeping one small module eager (routine on the CPU) must not
    make the pipeline unsaveable: that module's section holds its eager graphs."""
    pipeline = TwoStage()
    pipeline.encoder = ait.Module(pipeline.encoder, "encoder", strategy=cpu_strategy(tune_provider_options=False))
    pipeline.heads[0] = ait.Module(pipeline.heads[0], "head", strategy=ait.OneBackendStrategy(ait.TorchEagerBackend()))
    ait.tune(pipeline, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False)
    assert list(pipeline.heads[0].ait_backends.values()) == ["TorchEagerBackend"]
    x = torch.randn(2, 16)
    with torch.no_grad():
        outputs = pipeline(x)
    path = ait.save(pipeline, tmp_path / "one-eager")
    fresh = TwoStage()
    ait.load(fresh, path)
    assert fresh.heads[0].ait_state is ait.ModuleState.TUNED
    assert list(fresh.heads[0].ait_backends.values()) == ["TorchEagerBackend"]
    assert "ONNXRuntimeBackend" in next(iter(fresh.encoder.ait_backends.values()))
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), outputs)
    with pytest.raises(aitune.InvalidArgumentError, match="every graph of ait.Module 'head' runs eagerly"):
        ait.save(pipeline.heads[0], tmp_path / "head-alone")  # alone, it has nothing to save
    every = TwoStage()
    every.encoder = ait.Module(every.encoder, "encoder", strategy=ait.OneBackendStrategy(ait.TorchEagerBackend()))
    every.heads[0] = ait.Module(every.heads[0], "head", strategy=ait.OneBackendStrategy(ait.TorchEagerBackend()))
    ait.tune(every, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False)
    with pytest.raises(aitune.InvalidArgumentError, match="every graph of every ait.Module .* runs eagerly"):
        ait.save(every, tmp_path / "all-eager")
    assert not (tmp_path / "all-eager").exists()


class CountingMLP(MLP):
    """Updates a buffer in forward: the ONNX export refuses it, so its tune fails."""

    def __init__(self):
        super().__init__(16, 32, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return super().forward(x)


def test_a_module_whose_tune_failed_is_refused_naming_why_and_the_way_out(tmp_path):
    """ait.tune (ignore_failing_modules, the default) leaves such a module eager; the save's
    refusal said 'tune it before saving', which cannot help: it names the failure instead."""
    pipeline = TwoStage()
    pipeline.encoder = ait.Module(pipeline.encoder, "encoder", strategy=cpu_strategy(tune_provider_options=False))
    pipeline.heads[0] = ait.Module(CountingMLP().eval(), "head", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(pipeline, [torch.randn(16) for _ in range(2)])
    assert pipeline.heads[0].ait_state is ait.ModuleState.PASSTHROUGH
    with pytest.raises(aitune.StateError) as error:
        ait.save(pipeline, tmp_path / "failed")
    message = str(error.value)
    assert "'heads.0' (ait.Module 'head') is PASSTHROUGH: its tuning failed" in message, message
    assert "forward changes the module's state (calls)" in message, message
    assert "put the module it wraps back in its place" in message and "tune it (ait.tune)" not in message, message
    assert not (tmp_path / "failed").exists()
    with pytest.raises(aitune.StateError, match=r"its tuning failed \(ExportError: .*forward changes the module's"):
        ait.save(pipeline.heads[0], tmp_path / "head-alone")  # the single-module save names it too
    pipeline.heads[0] = pipeline.heads[0].ait_module  # the way out the message names
    ait.save(pipeline, tmp_path / "without-it")


def test_eager_fallback_is_given_through_wrap_and_load(tmp_path):
    # was: ait.wrap and the pipeline ait.load had no eager_fallback, so a pipeline module
    # called with a batch size the tune never saw could only raise, while the error told
    # to use ait.Module(..., eager_fallback=True), which a pipeline user never calls
    pipeline = TwoStage()
    info = ait.inspect(pipeline, [torch.randn(16)], number_of_iterations=1, warmup_iterations=0)
    ait.wrap(pipeline, info.get_modules(), strategy=cpu_strategy(), eager_fallback=True)
    ait.tune(lambda x: pipeline(x), [torch.randn(16) for _ in range(2)], batch_sizes=[1, 2],
             ignore_failing_modules=False, performance_validation=False, progress=False)
    x3 = torch.randn(3, 16)  # a batch size the tune never saw
    with torch.no_grad():
        expected = TwoStage()(x3)
        with pytest.warns(RuntimeWarning, match="running eagerly"):
            torch.testing.assert_close(pipeline(x3), expected)
        path = ait.save(pipeline, tmp_path / "fallback")
        with pytest.raises(aitune.ShapeMismatchError) as error:
            ait.load(TwoStage(), path)(x3)
        assert "eager_fallback=True" in "\n".join(error.value.__notes__)
        lenient = ait.load(TwoStage(), path, eager_fallback=True)
        with pytest.warns(RuntimeWarning, match="running eagerly"):
            torch.testing.assert_close(lenient(x3), expected)


def test_aitune_run_of_a_section_runs_its_onnx_runtime_graph_and_names_eager_ones(tmp_path, monkeypatch):
    """A pipeline's section is a checkpoint of its own that `aitune run` runs (the docs
    say so). A module whose calls made two graphs, one kept eager, made `aitune run
    modules/<path>` refuse with "has 2 graphs; choose one with --graph", and a section of
    eager graphs only said the same, though no choice could run. The default is now the
    only ONNX Runtime graph; with none, the refusal says that its graphs run only in the
    Python front end."""
    import subprocess
    import sys

    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))

    class Ranks:
        def __init__(self):
            torch.manual_seed(0)
            self.encoder = MLP(16, 32, 16).eval()
            self.head = MLP(16, 32, 8).eval()

        def __call__(self, x):  # the encoder on [b, 16] and [b, 3, 16]: two graphs
            return self.head(self.encoder(x) + self.encoder(x[:, None].expand(-1, 3, -1)).mean(1))

    pipeline = Ranks()
    pipeline.encoder = ait.Module(pipeline.encoder, "encoder", strategies=[
        cpu_strategy(tune_provider_options=False), ait.OneBackendStrategy(ait.TorchEagerBackend())])
    pipeline.head = ait.Module(pipeline.head, "head", strategy=ait.OneBackendStrategy(ait.TorchEagerBackend()))
    ait.tune(pipeline, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False)
    path = ait.save(pipeline, tmp_path / "ranks")
    onnx_key, eager_key = (g.key for g in pipeline.encoder.ait_graphs)

    def run(section):
        return subprocess.run([sys.executable, "-m", "aitune.cli", "run", str(path / "modules" / section),
                               "--iterations", "1"], capture_output=True, text=True, timeout=300)

    encoder = run("encoder")
    assert encoder.returncode == 0, encoder.stderr
    assert f"graph '{onnx_key}'" in encoder.stdout
    head = run("head")
    assert head.returncode == 3  # BackendUnavailableError, as for --graph naming an eager graph (docs/checkpoints.md)
    assert "holds no graph this engine runs" in head.stderr and "(eager)" in head.stderr
    assert "Python front end" in head.stderr


def test_a_device_map_key_naming_no_module_is_refused_before_anything_loads(saved):
    """A pipeline's device_map with an entry for every module and one more (a typo of a
    module's name, 'haed') loaded and ignored that entry: the module the user meant to
    place was placed by its own entry, or refused only when it had none. A key naming no
    module of the load is refused, naming it and the modules, and nothing is loaded."""
    path, x, outputs = saved
    pipeline = TwoStage()
    with pytest.raises(aitune.InvalidArgumentError, match=r"device_map names 'haed', which is no ait.Module.*"
                                                          r"'encoder', 'head'"):
        ait.load(pipeline, path, device_map={"encoder": "cpu", "head": "cpu", "haed": "cpu"})
    assert not isinstance(pipeline.encoder, ait.Module) and not isinstance(pipeline.heads[0], ait.Module)
    ait.load(pipeline, path, device_map={"encoder": "cpu", "head": "cpu"})
    with torch.no_grad():
        torch.testing.assert_close(pipeline(x), outputs)


def test_a_module_saved_over_a_pipeline_checkpoint_replaces_it_as_the_reverse_does(saved, tmp_path):
    """A pipeline saved over a single-module checkpoint replaced it, but a single module
    saved over a pipeline checkpoint was refused as "a non-empty directory without
    manifest.json, so not an aitune checkpoint": both are aitune's, each replaces the other."""
    target = copy_of(saved, tmp_path)
    pipeline = TwoStage()
    ait.load(pipeline, target)
    ait.save(pipeline.encoder, target)
    assert (target / "manifest.json").is_file() and not (target / "pipeline.json").exists()
    loaded = ait.load(MLP(16, 32, 16).eval(), target)
    assert loaded.ait_state is ait.ModuleState.TUNED and loaded.ait_name == "encoder"
    other = TwoStage()
    ait.load(other, saved[0])  # (not `pipeline`: it reads its graphs from the checkpoint just replaced)
    ait.save(other, target)  # and back
    assert (target / "pipeline.json").is_file() and not (target / "manifest.json").exists()


class KeyedPipe:
    """A pipeline whose module sits under a long dict key."""

    def __init__(self, key: str):
        self.heads = {key: MLP().eval()}

    def __call__(self, x):
        with torch.no_grad():
            return sum(head(x) for head in self.heads.values())


def test_a_module_under_a_long_object_path_is_saved_and_loaded(tmp_path, monkeypatch):
    """The section directory took the object path whole: a 250-character dict key failed
    the save with "File name too long", naming a staging path (a session-35 probe)."""
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    key = "head-" + "x" * 245
    torch.manual_seed(0)
    pipe = KeyedPipe(key)
    data = [torch.randn(16) for _ in range(2)]
    ait.wrap(pipe, ait.inspect(pipe, data, number_of_iterations=1, warmup_iterations=0).get_modules(),
             strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(lambda x: pipe(x), data, performance_validation=False, disable_external_logging=True)
    path = ait.save(pipe, tmp_path / "pipe.ait")
    restored = KeyedPipe(key)
    restored.heads[key].load_state_dict(pipe.heads[key].ait_module.state_dict())
    ait.load(restored, path)
    assert isinstance(restored.heads[key], ait.Module) and restored.heads[key].ait_backends
    x = torch.randn(2, 16)
    torch.testing.assert_close(restored(x), pipe(x))


@pytest.mark.parametrize("appears", ["checkpoint", "user-folder", "user-file"])
def test_what_appears_at_the_path_during_a_save_is_never_replaced_against_the_rules(saved, tmp_path, appears):
    """Another process's checkpoint put at the path while ait.save(overwrite=False) wrote its
    staging directory was replaced, the save reporting success; a user's folder put there was
    swapped out and deleted (a session-36 probe: the path was judged only before the swap).
    What was swapped out is judged now: refused, and put back as it was."""
    pipeline = TwoStage()
    ait.load(pipeline, saved[0])
    target = tmp_path / "target.ait"

    def meanwhile(relative, count):
        if relative == "pipeline.json":  # the last file, just before the swap
            if appears == "checkpoint":
                shutil.copytree(saved[0], target)
            elif appears == "user-file":
                target.write_text("irreplaceable")
            else:
                (target / "photos").mkdir(parents=True)
                (target / "photos" / "precious.jpg").write_text("irreplaceable")

    before = None
    with pytest.raises(aitune.InvalidArgumentError,
                       match="overwrite=False" if appears == "checkpoint" else "not an aitune checkpoint"):
        ait.save(pipeline, target, overwrite=appears != "checkpoint", on_file_written=meanwhile)
    if appears == "checkpoint":
        before = {p.relative_to(saved[0]): p.read_bytes() for p in Path(saved[0]).rglob("*") if p.is_file()}
        assert {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    elif appears == "user-file":
        assert target.read_text() == "irreplaceable"
    else:
        assert (target / "photos" / "precious.jpg").read_text() == "irreplaceable"
        assert sorted(p.name for p in target.iterdir()) == ["photos"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left


def test_a_target_name_near_the_file_system_limit_saves_and_loads(saved, tmp_path):
    """A 244-byte name the file system takes was refused ("File name too long": the staging
    directory beside it adds ".tmp-<pid>-<random>"; 218 bytes was the longest, a session-36
    probe), for a pipeline and a single module alike."""
    pipeline = TwoStage()
    ait.load(pipeline, saved[0])
    x, expected = saved[1], saved[2]
    for what, obj in (("p", pipeline), ("m", pipeline.encoder)):
        target = tmp_path / (what + "x" * 250)  # 251 bytes
        ait.save(obj, target)
        assert target.is_dir()
    loaded = ait.load(TwoStage(), tmp_path / ("p" + "x" * 250))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # nothing left beside
