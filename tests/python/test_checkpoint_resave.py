"""Saving a loaded module back over the checkpoint it was loaded from: again and again, via
another path, with external data; the loaded module keeps computing; a source whose
content changed is refused with nothing replaced (docs/checkpoints.md, *Saving a loaded
module*)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import onnx
import pytest
import torch
from torch_models import MLP, cpu_strategy, saved_tuned_mlp

import aitune
import aitune.torch as ait
from aitune import _core


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One tuned MLP saved once (performance validation off: a second or two)."""
    return saved_tuned_mlp(tmp_path_factory.mktemp("resave"))


def _copy(saved, tmp_path: Path, name: str = "a") -> Path:
    path = tmp_path / name
    shutil.copytree(saved[0], path)
    return path


def _load(path: Path) -> ait.Module:
    return ait.load(ait.Module(MLP().eval(), "mlp"), path)


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _assert_clean(parent: Path) -> None:
    """No staging or set-aside directory left beside the checkpoints."""
    assert not [p.name for p in parent.iterdir() if p.name.startswith(".")]


def test_a_loaded_module_saves_over_its_own_checkpoint_again_and_again(saved, tmp_path):
    _, x, expected = saved
    path = _copy(saved, tmp_path)
    loaded = _load(path)
    for _ in range(3):
        ait.save(loaded, path)
        assert torch.equal(loaded(x), expected)  # its sessions survive their files' replacement
        assert torch.equal(_load(path)(x), expected)
    _assert_clean(tmp_path)


def test_saved_to_a_new_path_then_over_the_original_then_over_both_again(saved, tmp_path):
    _, x, expected = saved
    original = _copy(saved, tmp_path)
    loaded = _load(original)
    for target in (tmp_path / "b", original, original, tmp_path / "b"):
        ait.save(loaded, target)
        assert torch.equal(_load(target)(x), expected)
    assert torch.equal(loaded(x), expected)
    _assert_clean(tmp_path)


def _to_external_data(path: Path) -> str:
    """Rewrites the checkpoint's model with its weights in an external data file beside it
    (what a model past protobuf's 2 GB limit has) and the manifest to match; returns the
    data file's relative path."""
    manifest = _manifest(path)
    (graph,) = manifest["graphs"]
    model_file = path / graph["model"]
    model = onnx.load(str(model_file))
    data_name = model_file.name + ".data"
    onnx.save(model, str(model_file), save_as_external_data=True, all_tensors_to_one_file=True,
              location=data_name, size_threshold=0)
    data_rel = f"{Path(graph['model']).parent.as_posix()}/{data_name}"
    graph["artifacts"] = [a for a in graph["artifacts"] if a["path"] != data_rel] + [{"path": data_rel}]
    for artifact in graph["artifacts"]:
        content = (path / artifact["path"]).read_bytes()
        artifact["size"], artifact["sha256"] = len(content), hashlib.sha256(content).hexdigest()
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return data_rel


def _mappings_of(inode: int) -> list[str]:
    """The lines of this process's memory map (Linux) mapping the file with ``inode``."""
    return [line for line in Path("/proc/self/maps").read_text().splitlines()
            if len(line.split()) > 5 and line.split()[4] == str(inode)]


def test_external_data_saved_over_its_own_checkpoint_keeps_the_session_computing(saved, tmp_path):
    _, x, expected = saved
    path = _copy(saved, tmp_path)
    data_rel = _to_external_data(path)
    loaded = _load(path)
    data_before = (path / data_rel).stat().st_ino
    mapped = _mappings_of(data_before)  # ONNX Runtime 1.31 on Linux maps external data (MAP_PRIVATE)
    for _ in range(2):
        ait.save(loaded, path)
        assert (path / data_rel).stat().st_ino != data_before  # a new file: the old one is gone
        # The session still maps the removed file (valid on Linux until unmapped) or holds a
        # copy; either way it computes what it loaded.
        assert len(_mappings_of(data_before)) == len(mapped)
        assert all(line.endswith("(deleted)") for line in _mappings_of(data_before))
        assert torch.equal(loaded(x), expected)
        assert data_rel in {a["path"] for a in _manifest(path)["graphs"][0]["artifacts"]}
        assert torch.equal(_load(path)(x), expected)
    _assert_clean(tmp_path)


def test_a_source_whose_content_changed_is_refused_and_nothing_is_replaced(saved, tmp_path):
    _, x, expected = saved
    path = _copy(saved, tmp_path)
    loaded = _load(path)
    ait.save(loaded, path)  # the loaded module's files are now the new checkpoint's
    before = _manifest(path)
    model_rel = before["graphs"][0]["model"]
    # Something else rewrites the model file (another model, a new inode) under the module.
    other = onnx.load(str(path / model_rel))
    for init in other.graph.initializer:
        if init.raw_data:
            init.raw_data = bytes(len(init.raw_data))
    replacement = tmp_path / "other.onnx"
    onnx.save(other, str(replacement))
    os.replace(replacement, path / model_rel)
    tampered = (path / model_rel).read_bytes()
    with pytest.raises(aitune.StateError, match=rf"{model_rel}.*{path / model_rel}.*changed") as caught:
        ait.save(loaded, path)
    assert str(path) in str(caught.value)
    assert _manifest(path) == before  # nothing replaced: the checkpoint is the one it was
    assert (path / model_rel).read_bytes() == tampered
    with pytest.raises(aitune.StateError, match="changed"):
        ait.save(loaded, tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere").exists()
    assert torch.equal(loaded(x), expected)  # the module still runs what it loaded
    _assert_clean(tmp_path)


def test_a_removed_checkpoint_cannot_be_saved_from_and_says_what_to_do(saved, tmp_path):
    _, x, expected = saved
    path = _copy(saved, tmp_path)
    loaded = _load(path)
    shutil.rmtree(path)
    with pytest.raises(aitune.StateError, match=r"no longer exists.*load the module again"):
        ait.save(loaded, path)
    assert not path.exists()
    assert torch.equal(loaded(x), expected)


def test_expected_sha256_is_checked_on_the_bytes_copied(saved, tmp_path):
    """The engine's side: CheckpointSaveOptions.expected_sha256, straight through _core."""
    source = _core.Checkpoint.load(str(saved[0]))
    manifest = source.manifest
    (graph,) = manifest.graphs
    files = {a.path: source.artifact_path(a.path) for a in graph.artifacts}
    digests = {a.path: a.sha256 for a in graph.artifacts}
    target = tmp_path / "c"  # (save fills the artifacts in again)

    def save(expected):
        options = _core.CheckpointSaveOptions(expected_sha256=expected)
        return _core.Checkpoint.save(str(target), manifest, files, options)

    save({graph.model: digests[graph.model]})  # the content it should have: saved
    before = _manifest(target)
    wrong = {graph.model: "0" * 64}
    with pytest.raises(aitune.StateError, match=rf"'{graph.model}'.*{files[graph.model]}.*changed.*{target}"):
        save(wrong)
    assert _manifest(target) == before
    save({"graphs/nope/x.onnx": "0" * 64})  # a path it does not write is not checked
    # That save succeeded and wrote a new manifest (its 'created' second may differ):
    # the refused save below must leave *this* one in place.
    before = _manifest(target)
    with pytest.raises(aitune.InvalidArgumentError, match="not a sha256"):
        save({graph.model: "ABC"})
    assert _manifest(target) == before
    _assert_clean(tmp_path)


def test_a_loaded_pipeline_saves_over_its_own_checkpoint_again(tmp_path, monkeypatch):
    from test_pipeline_checkpoint import TwoStage

    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    ait.enable_performance_validation(False)
    try:
        pipeline = TwoStage()
        pipeline.encoder = ait.Module(pipeline.encoder, "encoder", strategy=cpu_strategy())
        pipeline.heads[0] = ait.Module(pipeline.heads[0], "head", strategy=cpu_strategy())
        ait.tune(pipeline, [torch.randn(16)], ignore_failing_modules=False)
    finally:
        ait.enable_performance_validation(True)
    x = torch.randn(2, 16)
    with torch.no_grad():
        expected = pipeline(x)
    path = ait.save(pipeline, tmp_path / "pipe")
    loaded = TwoStage()
    ait.load(loaded, path)
    for target in (path, path, tmp_path / "other", path):
        ait.save(loaded, target)
        again = TwoStage()
        ait.load(again, target)
        with torch.no_grad():
            assert torch.equal(loaded(x), expected)
            assert torch.equal(again(x), expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "other", "pipe"]


def test_a_checkpoint_inside_a_checkpoint_is_refused(saved, tmp_path):
    """Saved inside checkpoint A, it would be removed by the next save over A (which
    replaces A's directory whole): refused, naming both, before anything is written."""
    _, x, expected = saved
    path = _copy(saved, tmp_path)
    loaded = _load(path)
    for inner in (path / "sub", path / "graphs" / "new" / "deeper"):
        with pytest.raises(aitune.InvalidArgumentError, match=rf"'{inner}': it lies inside the checkpoint '{path}'"):
            ait.save(loaded, inner)
    assert sorted(p.name for p in path.iterdir()) == ["graphs", "manifest.json"]
    assert not (path / "graphs" / "new").exists()
    ait.save(loaded, path)  # and over A itself as before
    assert torch.equal(_load(path)(x), expected)
    _assert_clean(tmp_path)


def test_a_pipeline_inside_a_checkpoint_is_refused_and_a_checkpoint_inside_a_pipeline(saved, tmp_path):
    from test_pipeline_checkpoint import TwoStage

    path = _copy(saved, tmp_path)
    pipeline = TwoStage()
    pipeline.encoder = _load(path)
    with pytest.raises(aitune.InvalidArgumentError, match=rf"'{path / 'pipe'}': it lies inside the checkpoint"):
        ait.save(pipeline, path / "pipe")
    ait.save(pipeline, tmp_path / "pipe")
    with pytest.raises(aitune.InvalidArgumentError, match=rf"inside the checkpoint '{tmp_path / 'pipe'}'"):
        ait.save(pipeline.encoder, tmp_path / "pipe" / "modules" / "mine")
    assert sorted(p.name for p in path.iterdir()) == ["graphs", "manifest.json"]
    assert sorted(p.name for p in (tmp_path / "pipe" / "modules").iterdir()) == ["encoder"]


def test_a_directory_put_back_under_the_same_inode_number_is_another_version(saved, tmp_path):
    """On ext4 a save's new directory took the inode number of the version it had just
    removed: a load compared (device, inode) alone, took the next version's files for the
    one it had verified, and ran sessions mixing the two (outputs of neither model, silently;
    a probe). A rename away and back keeps the inode number and moves the ctime, as such a
    save does: the checkpoint is no longer current, a session made from it is refused, and a
    pipeline's identity differs."""
    from aitune.torch.pipeline_checkpoint import _identity

    path = _copy(saved, tmp_path)
    checkpoint = _core.Checkpoint.load(str(path))
    (key,) = checkpoint.graph_keys()
    before, inode = _identity(path), path.stat().st_ino
    assert checkpoint.is_current()
    time.sleep(0.01)
    path.rename(tmp_path / "away")
    (tmp_path / "away").rename(path)
    assert path.stat().st_ino == inode  # the same number, as the probe's saves got
    assert not checkpoint.is_current()
    assert _identity(path) != before
    with pytest.raises(aitune.AituneIOError, match=r"was replaced by another save since it was loaded.*load it again"):
        checkpoint.create_session(key)
    assert _core.Checkpoint.load(str(path)).create_session(key) is not None  # loaded again: current
