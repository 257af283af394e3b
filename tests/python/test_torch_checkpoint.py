"""ait.save / ait.load: round trips in a fresh process, nested structures, every kind of
damage (typed error, module unchanged), atomic save, device_map, CUDA when present."""

from __future__ import annotations

import enum
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from torch_models import MLP, DictModel, NestedModel, cpu_strategy

import aitune
import aitune.torch as ait
from aitune import _core
from aitune.torch import ModuleState

TESTS = Path(__file__).resolve().parent


# -- helpers ------------------------------------------------------------------------------


def _tune(inner: torch.nn.Module, name: str, samples, **tune_kwargs) -> tuple[ait.Module, float]:
    model = ait.Module(inner, name, strategy=cpu_strategy())
    start = time.perf_counter()
    ait.tune(model, samples, disable_external_logging=True, ignore_failing_modules=False, **tune_kwargs)
    assert model.ait_state is ModuleState.TUNED
    return model, time.perf_counter() - start


def _flat(tree) -> dict[str, torch.Tensor]:
    """Tensor leaves by key path, for comparing nested outputs leaf by leaf."""
    return {pytree.keystr(path): leaf for path, leaf in pytree.tree_flatten_with_path(tree)[0]
            if isinstance(leaf, torch.Tensor)}


def _assert_identical(actual, expected) -> None:
    actual, expected = _flat(actual), _flat(expected)
    assert list(actual) == list(expected)
    for key in expected:
        assert torch.equal(actual[key].cpu(), expected[key].cpu()), key


# A fresh interpreter: another seed (so another initialisation), exporting and tuning
# forbidden, the call's tensors from an .npz file, its outputs written back to one.
CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {tests!r})
    import numpy as np
    import torch
    import torch.utils._pytree as pytree
    import aitune.torch as ait
    import aitune.torch.backend.onnx_runtime_backend as ort_backend
    import aitune.torch.export
    import torch_models

    def forbidden(*args, **kwargs):
        raise AssertionError("a loaded module must not export or tune")

    aitune.torch.export.export_onnx = forbidden
    ort_backend.export.export_onnx = forbidden
    torch.onnx.export = forbidden
    ait.tune = forbidden

    torch.manual_seed(12345)
    model = ait.Module(getattr(torch_models, {cls!r})().eval(), {name!r}).to({module_device!r})
    with np.load({inputs!r}, allow_pickle=False) as data:
        t = {{k: torch.from_numpy(data[k]).to({input_device!r}) for k in data.files}}
    with torch.no_grad():
        before = {call}
    start = time.perf_counter()
    ait.load(model, {checkpoint!r}, device_map={device_map!r})
    load_s = time.perf_counter() - start
    model.ait_module.forward = forbidden  # the loaded backend runs, not PyTorch
    with torch.no_grad():
        out = {call}
    flat = {{pytree.keystr(p): v.detach().cpu().numpy() for p, v in pytree.tree_flatten_with_path(out)[0]
             if isinstance(v, torch.Tensor)}}
    before = {{pytree.keystr(p): v.detach().cpu().numpy() for p, v in pytree.tree_flatten_with_path(before)[0]
               if isinstance(v, torch.Tensor)}}
    np.savez({outputs!r}, **flat)
    print(json.dumps({{
        "load_s": load_s,
        "state": model.ait_state.value,
        "eager_differed": any(not np.array_equal(before[k], flat[k]) for k in flat),
        "output_types": [type(v).__name__ for v in pytree.tree_flatten(out, is_leaf=lambda x: x is not out)[0]],
        "output_spec": str(pytree.tree_flatten(out)[1]),
        "backends": model.ait_backends,
    }}))
    """
)


def _run_fresh(tmp_path: Path, checkpoint: Path, cls: str, name: str, tensors: dict[str, torch.Tensor], call: str,
               device_map=None, device: str = "cpu") -> tuple[dict[str, torch.Tensor], dict]:
    inputs, outputs = tmp_path / "inputs.npz", tmp_path / "outputs.npz"
    np.savez(inputs, **{k: v.detach().cpu().numpy() for k, v in tensors.items()})
    code = CHILD.format(tests=str(TESTS), cls=cls, name=name, inputs=str(inputs), outputs=str(outputs), call=call,
                        checkpoint=str(checkpoint), device_map=device_map, module_device=device, input_device=device)
    env = {**os.environ, "AITUNE_CACHE_DIR": str(tmp_path / "child-cache")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout.strip().splitlines()[-1])
    with np.load(outputs, allow_pickle=False) as data:
        flat = {k: torch.from_numpy(data[k]) for k in data.files}
    # Nothing was exported or tuned in the child: its cache directory stayed empty.
    child_cache = tmp_path / "child-cache"
    assert not child_cache.exists() or not any(child_cache.rglob("*"))
    return flat, info


# -- round trips ----------------------------------------------------------------------------


def test_round_trip_in_a_fresh_process_into_a_differently_initialised_module(tmp_path):
    torch.manual_seed(0)
    model, tune_s = _tune(MLP().eval(), "mlp", [torch.randn(16) for _ in range(4)], batch_sizes=[1, 4])
    x = torch.randn(3, 16)
    with torch.no_grad():
        expected = model(x)
    checkpoint = ait.save(model, tmp_path / "mlp.ait")
    assert checkpoint == tmp_path / "mlp.ait" and (checkpoint / "manifest.json").is_file()

    flat, info = _run_fresh(tmp_path, checkpoint, "MLP", "mlp", {"x": x}, "model(t['x'])")
    assert info["state"] == "tuned"
    assert info["eager_differed"], "the fresh module must be initialised differently"
    assert torch.equal(flat[""], expected)
    print(f"\nMLP: tune {tune_s:.2f} s, load in a fresh process {info['load_s'] * 1e3:.1f} ms "
          f"({100 * info['load_s'] / tune_s:.1f} % of tuning)")


def test_the_manifest_holds_config_spec_structure_and_report(tmp_path):
    torch.manual_seed(0)
    model, _ = _tune(MLP().eval(), "mlp", [torch.randn(16) for _ in range(2)])
    (graph,) = model.ait_graphs
    ait.save(model, tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert manifest["module_name"] == "mlp"
    (saved,) = manifest["graphs"]
    assert saved["key"] == graph.key
    assert saved["backend_config"]["provider"] == "cpu"
    assert [t["name"] for t in saved["graph_spec"]["inputs"]] == ["input_x"]
    structure = saved["structure"]
    assert structure["inputs"]["leaves"] == [{"tensor": "input_x", "dtype": "float32", "rank": 2}]
    assert structure["outputs"]["leaves"] == [{"tensor": "output_0"}]
    assert structure["order"] == [0]
    assert pytree.treespec_loads(json.dumps(structure["inputs"]["treespec"])) == pytree.tree_flatten({"x": 0})[1]
    paths = {a["path"] for a in saved["artifacts"]}
    assert f"graphs/{graph.key}/model_raw.onnx" in paths
    report = json.loads((tmp_path / "ckpt" / "graphs" / graph.key / "tune_report.json").read_text())
    assert report["winner"] == json.loads(model.ait_reports[graph.key].to_json())["winner"]
    meta = manifest["metadata"]["aitune.torch"]
    assert meta["module_class"] == "torch_models.MLP" and "sections" not in meta
    assert meta["format_version"] == 4  # every graph in the manifest's graphs, under its backend's section
    assert (saved["backend"], saved["section"]) == ("onnxruntime", None)

    loaded = ait.load(ait.Module(MLP().eval(), "mlp"), tmp_path / "ckpt")
    assert loaded.ait_reports[graph.key].winner == report["winner"]
    assert loaded.ait_backends == model.ait_backends
    assert [g.key for g in loaded.ait_graphs] == [graph.key]


def test_nested_inputs_and_outputs_round_trip_in_a_fresh_process(tmp_path):
    torch.manual_seed(0)
    samples = [{"pair": (torch.randn(8), torch.randn(8)), "extra": {"bias": [torch.randn(4)]}, "mode": mode}
               for mode in ("sum", "diff")]
    model, _ = _tune(NestedModel().eval(), "nested", samples)
    assert len(model.ait_graphs) == 2  # the two modes are two graphs
    tensors = {"a": torch.randn(2, 8), "b": torch.randn(2, 8), "bias": torch.randn(2, 4)}
    call = "model((t['a'], t['b']), {'bias': [t['bias']]}, mode='diff')"
    with torch.no_grad():
        expected = model((tensors["a"], tensors["b"]), {"bias": [tensors["bias"]]}, mode="diff")
    ait.save(model, tmp_path / "nested.ait")

    flat, info = _run_fresh(tmp_path, tmp_path / "nested.ait", "NestedModel", "nested", tensors, call)
    assert info["eager_differed"]
    assert info["output_spec"] == str(pytree.tree_flatten(expected)[1])
    assert info["output_types"] == ["Tensor", "list", "Features", "str"]
    assert list(flat) == list(_flat(expected))
    for key, value in _flat(expected).items():
        assert torch.equal(flat[key], value), key


def test_dict_input_and_dataclass_output_round_trip(tmp_path):
    torch.manual_seed(0)
    model, _ = _tune(DictModel().eval(), "dict", [{"inputs": {"image": torch.randn(12), "meta": torch.randn(4)}}])
    batch = {"image": torch.randn(2, 12), "meta": torch.randn(2, 4)}
    with torch.no_grad():
        expected = model(batch)
    ait.save(model, tmp_path / "dict.ait")
    loaded = ait.load(ait.Module(DictModel().eval(), "dict"), tmp_path / "dict.ait")
    loaded.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a loaded module")
    total, features = loaded(batch)
    assert type(features).__name__ == "Features"
    _assert_identical((total, features), expected)


def test_a_graph_kept_eager_is_restored_as_eager(tmp_path):
    from aitune.torch.backend.torch_eager import EagerGraph

    torch.manual_seed(0)
    inner = NestedModel().eval()
    model, _ = _tune(inner, "nested", [{"pair": (torch.randn(8), torch.randn(8)), "extra": {"bias": [torch.randn(4)]},
                                        "mode": mode} for mode in ("sum", "diff")])
    # As if performance validation had kept eager for the "diff" graph.
    identity, (graph, _) = next((i, e) for i, e in model._ait_tuned.items() if "diff" in graph_constants(e[0]))
    model._ait_tuned[identity] = (graph, EagerGraph(graph, note="eager was faster"))
    ait.save(model, tmp_path / "ckpt")
    graphs = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())["graphs"]
    (eager,) = [g for g in graphs if g["backend"] == "eager"]  # one manifest: a section per backend
    assert (eager["key"], eager["section"], eager["model"]) == (graph.key, {"note": "eager was faster"}, "")
    assert [g["backend"] for g in graphs].count("onnxruntime") == 1
    with pytest.raises(aitune.BackendUnavailableError, match="eager"):  # the engine loads it, runs only its own
        _core.Checkpoint.load(str(tmp_path / "ckpt")).create_session(graph.key)

    torch.manual_seed(7)
    fresh_inner = NestedModel().eval()
    loaded = ait.load(ait.Module(fresh_inner, "nested"), tmp_path / "ckpt")
    backends = loaded.ait_backends
    assert backends[graph.key] == "TorchEagerBackend (eager was faster)"
    a, b, bias = torch.randn(2, 8), torch.randn(2, 8), torch.randn(2, 4)
    with torch.no_grad():
        out = loaded((a, b), {"bias": [bias]}, mode="diff")  # runs the (new) PyTorch weights
        _assert_identical(out, fresh_inner((a, b), {"bias": [bias]}, mode="diff"))


def graph_constants(graph) -> list:
    return [leaf for leaf in graph._inputs.template if leaf is not None]


def test_a_loaded_module_can_be_saved_again(tmp_path):
    torch.manual_seed(0)
    model, _ = _tune(MLP().eval(), "mlp", [torch.randn(16) for _ in range(2)])
    x = torch.randn(2, 16)
    expected = model(x)
    ait.save(model, tmp_path / "first")
    loaded = ait.load(ait.Module(MLP().eval(), "mlp"), tmp_path / "first")
    ait.save(loaded, tmp_path / "second")
    again = ait.load(ait.Module(MLP().eval(), "mlp"), tmp_path / "second")
    assert torch.equal(again(x), expected)
    ait.save(again, tmp_path / "second")  # over the checkpoint it was loaded from
    assert torch.equal(ait.load(ait.Module(MLP().eval(), "mlp"), tmp_path / "second")(x), expected)


# -- what cannot be saved --------------------------------------------------------------------


def test_saving_an_untuned_module_is_a_state_error(tmp_path):
    model = ait.Module(MLP().eval(), "mlp", strategy=cpu_strategy())
    with pytest.raises(aitune.StateError, match=r"'mlp' is INIT.*ait\.tune"):
        ait.save(model, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(TypeError, match="takes an ait.Module"):
        ait.save(MLP(), tmp_path / "ckpt")


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


class EnumArgument(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, mode=Mode.FAST):
        return self.fc(x) * (2 if mode is Mode.SLOW else 1)


def test_an_enum_default_is_saved_by_class_and_member_and_loads(tmp_path):
    """An Enum default of forward (a non-tensor leaf of the graph) is saved by its module,
    class and member name; ait.load finds the class among the imported modules, and a call
    with another member is not the saved graph's (it raises, as before saving)."""
    model, _ = _tune(EnumArgument().eval(), "enum", [torch.randn(4)])
    ait.save(model, tmp_path / "ckpt")
    inner = EnumArgument().eval()
    inner.load_state_dict(model.ait_module.state_dict())
    loaded = ait.load(ait.Module(inner, "enum"), tmp_path / "ckpt")
    assert loaded.ait_state is ait.ModuleState.TUNED
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.allclose(loaded(x), inner(x), atol=1e-5)
        assert torch.allclose(loaded(x, Mode.FAST), inner(x), atol=1e-5)
        with pytest.raises(ait.GraphNotRecordedError):
            loaded(x, Mode.SLOW)


MainMode = enum.Enum("MainMode", {"FAST": 1}, module="__main__")


class MainEnumArgument(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, mode=MainMode.FAST):
        return self.fc(x)


def test_a_constant_a_checkpoint_cannot_describe_fails_the_save_before_writing(tmp_path):
    """An Enum defined in __main__ cannot be named by a checkpoint: refused, nothing written."""
    model, _ = _tune(MainEnumArgument().eval(), "enum-main", [torch.randn(4)])
    with pytest.raises(ait.CheckpointStructureError, match=r"Enum member .*MainMode.* defined in __main__"):
        ait.save(model, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()
    assert not list(tmp_path.glob(".ckpt.tmp-*"))


# -- damage: typed errors, the module unchanged --------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One tuned MLP saved once; each test damages its own copy."""
    root = tmp_path_factory.mktemp("pristine")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AITUNE_CACHE_DIR", str(root / "cache"))
        ait.enable_performance_validation(False)
        try:
            torch.manual_seed(0)
            model, _ = _tune(MLP().eval(), "mlp", [torch.randn(16) for _ in range(2)])
            x = torch.randn(2, 16)
            expected = model(x)
            ait.save(model, root / "ckpt")
        finally:
            ait.enable_performance_validation(True)
    return root / "ckpt", x, expected


@pytest.fixture(params=["fresh", "loaded"])
def target(request, pristine, tmp_path):
    """The module a damaged checkpoint is loaded into: one never tuned, or one that
    holds graphs loaded from a good checkpoint. Returns it and a check that it is unchanged."""
    path, x, expected = pristine
    inner = MLP().eval()
    module = ait.Module(inner, "mlp")
    if request.param == "loaded":
        good = tmp_path / "good"
        shutil.copytree(path, good)
        ait.load(module, good)
    before = (module.ait_state, list(module._ait_tuned.items()), list(module._ait_graphs.items()))

    def unchanged():
        assert (module.ait_state, list(module._ait_tuned.items()), list(module._ait_graphs.items())) == before
        with torch.no_grad():
            out = module(x)
        assert torch.equal(out, expected) if request.param == "loaded" else torch.equal(out, inner(x))

    return module, unchanged


@pytest.fixture
def damaged(pristine, tmp_path) -> Path:
    path = tmp_path / "damaged"
    shutil.copytree(pristine[0], path)
    return path


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _write_manifest(path: Path, manifest: dict) -> None:
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _largest_artifact(path: Path) -> tuple[str, Path]:
    artifacts = [a for g in _manifest(path)["graphs"] for a in g["artifacts"]]
    largest = max(artifacts, key=lambda a: a["size"])
    return largest["path"], path / largest["path"]


def _load_fails(target, path: Path, error: type, match: str) -> None:
    module, unchanged = target
    with pytest.raises(error, match=match):
        ait.load(module, path)
    unchanged()


def test_tampered_byte_is_a_sha256_mismatch(target, damaged):
    relative, file = _largest_artifact(damaged)
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))
    _load_fails(target, damaged, aitune.CheckpointCorruptError,
                rf"artifact '{relative}' has sha256 .*changed or damaged")


def test_truncated_file_is_reported(target, damaged):
    relative, file = _largest_artifact(damaged)
    file.write_bytes(file.read_bytes()[:-7])
    _load_fails(target, damaged, aitune.CheckpointCorruptError, rf"artifact '{relative}' is \d+ bytes.*\(truncated\)")


def test_missing_file_is_reported(target, damaged):
    relative, file = _largest_artifact(damaged)
    file.unlink()
    _load_fails(target, damaged, aitune.CheckpointCorruptError, rf"artifact '{relative}' is missing")


def test_missing_manifest_is_not_a_checkpoint(target, damaged):
    (damaged / "manifest.json").unlink()
    _load_fails(target, damaged, aitune.CheckpointCorruptError, r"has no manifest\.json")


def test_missing_checkpoint_directory_is_an_io_error(target, tmp_path):
    _load_fails(target, tmp_path / "nowhere", aitune.AituneIOError, r"does not exist")


def test_newer_manifest_format_version_is_refused(target, damaged):
    manifest = _manifest(damaged)
    manifest["format_version"] = _core.CHECKPOINT_FORMAT_VERSION + 1
    _write_manifest(damaged, manifest)
    _load_fails(target, damaged, aitune.CheckpointCorruptError, r"format_version 2.*newer|newer.*format_version")


@pytest.mark.parametrize("version, fields", [
    (2, {"eager_graphs": [], "compiled_graphs": []}),  # before the per-backend sections
    (3, {"sections": {"eager": []}}),  # the sections other than onnxruntime in the metadata
])
def test_version_2_and_3_checkpoints_still_load(target, damaged, version, fields):
    manifest = _manifest(damaged)
    manifest["metadata"]["aitune.torch"].update(format_version=version, **fields)
    _write_manifest(damaged, manifest)
    module, _ = target
    loaded = ait.load(module, damaged)
    assert [g.key for g in loaded.ait_graphs] == [g["key"] for g in manifest["graphs"]]


def test_an_unknown_metadata_section_is_refused(target, damaged):
    manifest = _manifest(damaged)
    manifest["metadata"]["aitune.torch"].update(format_version=3, sections={"tensorflow": []})
    _write_manifest(damaged, manifest)
    _load_fails(target, damaged, aitune.CheckpointCorruptError, r"metadata section 'tensorflow' is not one")


def test_an_unknown_manifest_section_is_refused(target, damaged):
    manifest = _manifest(damaged)
    manifest["graphs"][0]["backend"] = "tensorflow"  # the engine's loader refuses a section it does not know
    _write_manifest(damaged, manifest)
    _load_fails(target, damaged, aitune.CheckpointCorruptError, r"unknown backend 'tensorflow'.*torch_compile")


@pytest.mark.parametrize("key, value", [
    ("exported_hooks", {"fc1": 5}), ("exported_hooks", {"fc1": [5]}), ("exported_hooks", ["fc1"]),
    ("weights", "x"), ("held_tensors", {"scale": 3}), ("forward_code", 5), ("forward_code", {"MLP": 5}),
    ("submodule_classes", "x"), ("submodule_classes", {"fc1": 1}), ("attributes", {"scale": 1.5}),
])
def test_a_metadata_field_of_the_wrong_type_is_corrupt_and_changes_nothing(target, damaged, key, value):
    """An edited manifest's ``exported_hooks: {"fc1": 5}`` raised a bare TypeError after the module
    had taken the graphs over (left TUNED, a session-37 probe); ``weights: "x"`` and the like
    silently turned the weights, class and code checks off. Every field is checked before the
    module is touched."""
    manifest = _manifest(damaged)
    manifest["metadata"]["aitune.torch"][key] = value
    _write_manifest(damaged, manifest)
    _load_fails(target, damaged, aitune.CheckpointCorruptError, rf"metadata field '{key}'")


def test_a_module_whose_weights_are_on_the_meta_device_is_refused_unchanged(pristine):
    """A module built under ``torch.device("meta")`` (accelerate's init_empty_weights) raised
    torch's NotImplementedError ("Cannot copy out of meta tensor") from the weights digest, after
    the module had taken the graphs over: left TUNED, with no weights for any eager call."""
    with torch.device("meta"):
        inner = MLP()
    module = ait.Module(inner.eval(), "mlp")
    with pytest.raises(aitune.InvalidArgumentError, match=r"meta device.*fc1\.weight.*load_state_dict"):
        ait.load(module, pristine[0])
    assert module.ait_state is ModuleState.INIT and not module._ait_tuned


def test_a_failure_after_the_graphs_were_taken_over_puts_the_module_back(target, pristine, monkeypatch):
    """What ait.load does after the module took the graphs over (the warnings that compare
    weights, code and hooks) may still raise; the module is then put back as it was, not left
    half loaded."""
    from aitune.torch import checkpoint as module_checkpoint

    def broken(*args, **kwargs):
        raise RuntimeError("the code check broke")

    monkeypatch.setattr(module_checkpoint, "_warn_if_code_differs", broken)
    _load_fails(target, pristine[0], RuntimeError, "the code check broke")


def test_newer_aitune_torch_structure_version_is_refused(target, damaged):
    manifest = _manifest(damaged)
    manifest["metadata"]["aitune.torch"]["format_version"] = 99
    _write_manifest(damaged, manifest)
    _load_fails(target, damaged, aitune.CheckpointCorruptError, r"metadata format_version 99 .*newer aitune")


@pytest.mark.parametrize(
    "bad_path, reason",
    [("/etc/hostname", "absolute"), ("graphs/{key}/../../../outside.data", r"'\.\.'")],
    ids=["absolute", "dotdot"],
)
def test_artifact_path_escaping_the_checkpoint_is_refused(target, damaged, bad_path, reason):
    manifest = _manifest(damaged)
    graph = manifest["graphs"][0]
    artifact = max(graph["artifacts"], key=lambda a: a["size"])
    artifact["path"] = bad_path.format(key=graph["key"])
    _write_manifest(damaged, manifest)
    _load_fails(target, damaged, aitune.CheckpointCorruptError, reason)


def test_symlink_leading_outside_is_refused_even_with_the_right_content(target, damaged, tmp_path):
    relative, file = _largest_artifact(damaged)
    outside = tmp_path / "outside.bin"
    shutil.copyfile(file, outside)  # same bytes: size and sha256 match, only the link is wrong
    file.unlink()
    file.symlink_to(outside)
    _load_fails(target, damaged, aitune.CheckpointCorruptError, r"symbolic link to .*outside the checkpoint")


def test_structure_of_another_module_class_is_refused(target, damaged):
    manifest = _manifest(damaged)
    manifest["metadata"]["aitune.torch"]["module_class"] = "torch_models.SmallCNN"
    _write_manifest(damaged, manifest)
    _load_fails(target, damaged, aitune.InvalidArgumentError,
                r"saved from a torch_models\.SmallCNN.*wraps a torch_models\.MLP")


@pytest.mark.parametrize("edit, says", [({"dtype": "int64"}, "int64 rank 2"), ({"rank": 3}, "float32 rank 3")],
                         ids=["dtype", "rank"])
def test_structure_tensor_disagreeing_with_the_graph_spec_is_corrupt(target, damaged, edit, says):
    """The structure's tensor leaves are the identity calls are matched by; one edited to
    another dtype or rank than the graph spec's loaded, and calls of that dtype were then
    refused by the session (those of the recorded one ran eagerly or were refused)."""
    manifest = _manifest(damaged)
    manifest["graphs"][0]["structure"]["inputs"]["leaves"][0].update(edit)
    _write_manifest(damaged, manifest)
    _load_fails(target, damaged, aitune.CheckpointCorruptError, rf"is {says}, but the graph spec takes float32")


def test_a_class_saved_from_a_script_names_the_main_module_trap(target, damaged):
    """A model class defined in the script that tuned it is saved as __main__.MLP; a loading
    script importing it from a module has another name for the same class: the refusal says
    why, and what to do."""
    manifest = _manifest(damaged)
    manifest["metadata"]["aitune.torch"]["module_class"] = "__main__.MLP"
    _write_manifest(damaged, manifest)
    _load_fails(target, damaged, aitune.InvalidArgumentError,
                r"saved from a __main__\.MLP.*wraps a torch_models\.MLP.*defined in the script that ran ait\.save")


def test_a_module_built_with_another_config_is_refused(pristine):
    """Same class, other parameter shapes (another hidden size): the graphs would compute a
    model the module cannot, and its own calls another one; refused as the pipeline load
    refuses it, naming the shapes, the module unchanged."""
    module = ait.Module(MLP(features=16, hidden=24).eval(), "mlp")
    with pytest.raises(aitune.InvalidArgumentError,
                       match=r"other parameter or buffer shapes \(built with another config\): "
                             r"'fc1.bias' was \[32\], is \[24\], 'fc1.weight' was \[32, 16\], is \[24, 16\]"):
        ait.load(module, pristine[0])
    assert module.ait_state is ait.ModuleState.INIT and not module._ait_tuned


def test_a_checkpoint_without_aitune_torch_metadata_is_refused(target, damaged):
    manifest = _manifest(damaged)
    manifest["metadata"] = {}
    _write_manifest(damaged, manifest)
    _load_fails(target, damaged, aitune.CheckpointCorruptError, r"not written by ait\.save")


def test_a_session_that_cannot_be_created_leaves_the_module_unchanged(target, damaged):
    manifest = _manifest(damaged)
    manifest["graphs"][0]["backend_config"]["provider_options"] = {"no_such_option": "1"}
    _write_manifest(damaged, manifest)
    module, unchanged = target
    with pytest.raises(aitune.AituneError, match=r"graph 'graph_"):
        ait.load(module, damaged)
    unchanged()


# -- loading runs no code ----------------------------------------------------------------------


@pytest.fixture
def marker_module(tmp_path, monkeypatch):
    """A module that, if imported, leaves a file behind: loading must never import it."""
    marker = tmp_path / "imported"
    (tmp_path / "aitune_evil_marker.py").write_text(
        f"import pathlib, enum\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "class E(enum.Enum):\n    A = 1\nclass D(dict):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    assert "aitune_evil_marker" not in sys.modules
    assert not marker.exists(), "loading a checkpoint imported a module"


def _structure_edit(path: Path, edit) -> None:
    manifest = _manifest(path)
    structure = manifest["graphs"][0]["structure"]
    edit(structure)
    _write_manifest(path, manifest)


@pytest.mark.parametrize(
    "edit, error, match",
    [
        # pytree's own loader would import the module of an enum held in a context.
        (lambda s: s["inputs"]["treespec"][1].update(
            context=json.dumps([{"__enum__": True, "fqn": "aitune_evil_marker:E", "name": "A"}])),
         aitune.CheckpointCorruptError, "enum object"),
        # pytree's loader imports a defaultdict's default_factory module.
        (lambda s: s["inputs"]["treespec"][1].update(
            type="collections.defaultdict",
            context={"default_factory_module": "aitune_evil_marker", "default_factory_name": "D",
                     "dict_context": ["x"]}),
         aitune.CheckpointCorruptError, "only builtin factories"),
        # A node type named after a module that is not imported.
        (lambda s: (s["inputs"]["treespec"][1].update(type="aitune_evil_marker.D"),
                    s["types"].update({"aitune_evil_marker.D": {"module": "aitune_evil_marker", "qualname": "D",
                                                                "kind": "dataclass"}})),
         aitune.InvalidArgumentError, "never imports code"),
        # A constant of a type that only pickle could describe.
        (lambda s: s["inputs"]["leaves"].__setitem__(0, {"type": "pickle", "value": "gASVAAAA"}),
         aitune.CheckpointCorruptError, "invalid constant"),
    ],
    ids=["enum-context", "defaultdict-factory", "unimported-type", "pickled-constant"],
)
def test_loading_never_imports_or_unpickles(target, damaged, marker_module, edit, error, match):
    _structure_edit(damaged, edit)
    _load_fails(target, damaged, error, match)


# -- atomic save ---------------------------------------------------------------------------------


def test_a_failing_write_mid_save_leaves_the_old_checkpoint_loadable(tmp_path):
    torch.manual_seed(0)
    old, _ = _tune(MLP().eval(), "mlp-old", [torch.randn(16) for _ in range(2)])
    torch.manual_seed(1)
    new, _ = _tune(MLP().eval(), "mlp-new", [torch.randn(16) for _ in range(2)])
    x = torch.randn(2, 16)
    old_out, new_out = old(x), new(x)
    assert not torch.equal(old_out, new_out)
    path = tmp_path / "ckpt"
    ait.save(old, path)
    before = _manifest(path)

    written = []

    class DiskFull(OSError):
        pass

    def fail_after_first(relative, count):
        written.append(relative)
        if count == 1:
            raise DiskFull("no space left on device (injected)")

    with pytest.raises(DiskFull, match="injected"):
        ait.save(new, path, on_file_written=fail_after_first)
    assert len(written) == 1
    assert _manifest(path) == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".ckpt.tmp-")]
    loaded = ait.load(ait.Module(MLP().eval(), "mlp"), path)
    assert torch.equal(loaded(x), old_out)

    ait.save(new, path)  # and a save that completes replaces it
    assert torch.equal(ait.load(ait.Module(MLP().eval(), "mlp"), path)(x), new_out)


def test_a_model_file_replaced_since_tuning_is_not_saved(tmp_path):
    torch.manual_seed(0)
    first, _ = _tune(MLP().eval(), "mlp", [torch.randn(16) for _ in range(2)])
    torch.manual_seed(1)
    second, _ = _tune(MLP().eval(), "mlp", [torch.randn(16) for _ in range(2)])  # same name: its own directory
    ait.save(second, tmp_path / "second")
    ((_, tuned),) = first._ait_tuned.values()
    model = Path(tuned.session.model_path)
    os.replace(tmp_path / "second" / "graphs" / next((tmp_path / "second" / "graphs").iterdir()).name / model.name,
               model)  # something else rewrote this tune's file
    with pytest.raises(aitune.StateError, match=r"was replaced or written since the session was created"):
        ait.save(first, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_weights_written_into_the_model_files_external_data_since_tuning_are_not_saved(tmp_path):
    """Only the graph file's identity was checked: the weights' file beside it
    (``model_raw.onnx.data``), rewritten at the same size, was copied into the checkpoint,
    which then loaded TUNED and computed another model (5.2 off), silently."""
    tuned_module, _ = _tune(MLP().eval(), "mlp", [torch.randn(16) for _ in range(2)])
    ((_, tuned),) = tuned_module._ait_tuned.values()
    data = Path(tuned.session.model_path + ".data")
    assert data.is_file()  # the exporter keeps the weights beside the graph
    weights = np.fromfile(data, dtype=np.float32)
    (weights * -3).tofile(data)
    with pytest.raises(aitune.StateError, match=r"external data \(the weights\) was replaced or written"):
        ait.save(tuned_module, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_overwrite_false_refuses_an_existing_checkpoint(tmp_path, pristine):
    path = tmp_path / "ckpt"
    shutil.copytree(pristine[0], path)
    loaded = ait.load(ait.Module(MLP().eval(), "mlp"), path)
    with pytest.raises(aitune.InvalidArgumentError, match="overwrite is off"):
        ait.save(loaded, path, overwrite=False)


# -- device_map -----------------------------------------------------------------------------------


@pytest.mark.parametrize("device_map", ["cpu", torch.device("cpu"), {"mlp": "cpu"}, {"mlp": None}])
def test_device_map_cpu(pristine, device_map):
    path, x, expected = pristine
    loaded = ait.load(ait.Module(MLP().eval(), "mlp"), path, device_map=device_map)
    ((_, tuned),) = loaded._ait_tuned.values()
    assert tuned.session.device == "cpu" and tuned.session.config.provider == _core.ExecutionProvider.CPU
    assert torch.equal(loaded(x), expected)


@pytest.mark.parametrize(
    "device_map, error, match",
    [
        ({"other": "cpu"}, aitune.InvalidArgumentError, r"no entry for ait.Module 'mlp' \(its keys: 'other'\)"),
        ("mps", aitune.InvalidArgumentError, r"'cpu' or 'cuda\[:N\]', not 'mps'"),
        ("gpu-please", aitune.InvalidArgumentError, "is not a device"),
        (3, TypeError, "device_map must be None, a device"),
    ],
)
def test_bad_device_map_is_refused_before_anything_loads(target, pristine, device_map, error, match):
    module, unchanged = target
    with pytest.raises(error, match=match):
        ait.load(module, pristine[0], device_map=device_map)
    unchanged()


def test_device_map_overrides_follow_the_documented_rules():
    from aitune.torch.checkpoint import _overrides

    cpu = _core.OnnxSessionConfig(provider=_core.ExecutionProvider.CPU)
    assert _overrides(cpu, None).provider is None
    to_cpu = _overrides(_core.OnnxSessionConfig(provider_options={"use_tf32": "0"}), torch.device("cpu"))
    assert to_cpu.provider == _core.ExecutionProvider.CPU and to_cpu.provider_options is None
    if not torch.cuda.is_available():  # with CUDA the stream is added too (see the CUDA test)
        to_cuda = _overrides(cpu, torch.device("cuda", 1))
        assert to_cuda.provider == _core.ExecutionProvider.CUDA and to_cuda.device_id == 1
        assert to_cuda.provider_options == {"use_tf32": "0"}


def _cuda_ready() -> bool:
    status = _core.OrtRuntime.load().provider_status(_core.ExecutionProvider.CUDA)
    return torch.cuda.is_available() and status.available


needs_cuda = pytest.mark.skipif(not _cuda_ready(), reason="CUDA execution provider or CUDA device unavailable")


@needs_cuda
def test_saved_on_cpu_loads_on_cuda_with_device_map(pristine):
    path, x, expected = pristine
    loaded = ait.load(ait.Module(MLP().eval(), "mlp"), path, device_map="cuda:0")
    ((_, tuned),) = loaded._ait_tuned.values()
    config = tuned.session.config
    assert config.provider == _core.ExecutionProvider.CUDA and config.device_id == 0
    assert config.provider_options["use_tf32"] == "0"
    assert tuned.session.device == "cuda:0"
    out = loaded(x.cuda())
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), expected, atol=1e-4, rtol=1e-4)


@needs_cuda
def test_saved_on_gpu_loads_in_a_new_process_identical(tmp_path):
    from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    torch.manual_seed(0)
    inner = MLP().eval().cuda()
    model = ait.Module(inner, "mlp", strategy=ait.OneBackendStrategy(
        ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda"))))
    start = time.perf_counter()
    ait.tune(model, [torch.randn(16, device="cuda") for _ in range(4)], ignore_failing_modules=False)
    tune_s = time.perf_counter() - start
    assert model.ait_state is ModuleState.TUNED
    x = torch.randn(2, 16, device="cuda")
    with torch.no_grad():
        expected = model(x)
    ait.save(model, tmp_path / "gpu.ait")
    saved = _manifest(tmp_path / "gpu.ait")["graphs"][0]["backend_config"]
    assert saved["provider"] == "cuda" and "user_compute_stream" not in saved["provider_options"]

    flat, info = _run_fresh(tmp_path, tmp_path / "gpu.ait", "MLP", "mlp", {"x": x}, "model(t['x'])", device="cuda")
    assert info["state"] == "tuned"
    assert torch.equal(flat[""], expected.cpu())
    print(f"\nMLP on CUDA: tune {tune_s:.2f} s, load in a fresh process {info['load_s'] * 1e3:.1f} ms")


# -- the module loaded into holds other weights -------------------------------------------


def test_loading_into_a_module_with_other_weights_says_so(tmp_path, monkeypatch, caplog):
    """The ONNX graphs compute with the checkpoint's weights, eager fallbacks and compile /
    eager graphs with the module's: a module with other weights would be two models, so
    ait.load warns, naming the tensors. Same weights (or a checkpoint from before the
    digest was stored): nothing said."""
    import logging

    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    inner = MLP().eval()
    model = ait.Module(inner, "weights-mlp", strategy=cpu_strategy())
    ait.tune(model, [torch.randn(16) for _ in range(2)], disable_external_logging=True, performance_validation=False)
    path = ait.save(model, tmp_path / "ckpt")

    def load_into(module_weights) -> list[str]:
        fresh = MLP().eval()
        if module_weights is not None:
            fresh.load_state_dict(module_weights)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="aitune"):
            ait.load(ait.Module(fresh, "weights-mlp"), path)
        return [r.getMessage() for r in caplog.records if "differ from those checkpoint" in r.getMessage()]

    (warning,) = load_into(None)  # a freshly initialised MLP
    assert "ait.Module 'weights-mlp'" in warning and "fc1.weight" in warning and "load_state_dict" in warning
    assert load_into(inner.state_dict()) == []
    changed = {k: v.clone() for k, v in inner.state_dict().items()}
    changed["fc2.bias"][0] += 0.01
    (warning,) = load_into(changed)
    assert "(1 of 4 tensors: fc2.bias)" in warning
    manifest = _manifest(path)
    del manifest["metadata"]["aitune.torch"]["weights"]  # written before the digest existed
    _write_manifest(path, manifest)
    assert load_into(None) == []


class _HeldTensors(torch.nn.Module):
    """Tensors forward reads that the state dict leaves out, built from constructor
    arguments: a non-persistent buffer (a rotary inv_freq), a tensor attribute and a numpy array."""

    def __init__(self, base: float = 10000.0, shift: float = 0.0, gain: float = 1.0):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("inv_freq", 1.0 / (torch.tensor(base) ** (torch.arange(4) / 4)), persistent=False)
        self.shift = torch.full((4,), shift)
        self.gain = np.full(4, gain, dtype=np.float32)

    def forward(self, x):
        return torch.sin(self.fc(x) * self.inv_freq) * torch.from_numpy(self.gain) + self.shift


def test_loading_into_a_module_with_other_tensors_outside_its_state_dict_says_so(tmp_path, monkeypatch, caplog):
    """A non-persistent buffer or a tensor attribute is not in the state dict, so the
    weights digest did not see it: a module built with another base loaded silently and
    computed another model (its ONNX graph holds the saved inv_freq; 0.1 off eager).
    ait.load now warns, naming the tensor; the same module: nothing said."""
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    inner = _HeldTensors().eval()
    model = ait.Module(inner, "held-tensors", strategy=cpu_strategy())
    ait.tune(model, [torch.randn(4) for _ in range(2)], disable_external_logging=True, performance_validation=False)
    path = ait.save(model, tmp_path / "ckpt")

    def load_into(fresh) -> list[str]:
        return _load_warnings(fresh, inner, "held-tensors", path, caplog, "outside its state dict")

    assert load_into(_HeldTensors().eval()) == []
    (warning,) = load_into(_HeldTensors(base=500.0).eval())
    assert "ait.Module 'held-tensors'" in warning and "(inv_freq)" in warning and "tune it again" in warning
    (warning,) = load_into(_HeldTensors(shift=1.0).eval())
    assert "(shift)" in warning
    (warning,) = load_into(_HeldTensors(gain=2.0).eval())  # was silent: 2.15 off eager
    assert "(gain)" in warning
    manifest = _manifest(path)
    del manifest["metadata"]["aitune.torch"]["held_tensors"]  # written before they were stored
    _write_manifest(path, manifest)
    assert load_into(_HeldTensors(base=500.0).eval()) == []


def _load_warnings(fresh, inner, name: str, path, caplog, about: str) -> list[str]:
    """The warnings about ``about`` that ait.load gives loading checkpoint ``path`` into
    ``fresh`` with ``inner``'s weights (as ait.Module ``name``)."""
    import logging

    fresh.load_state_dict(inner.state_dict())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.load(ait.Module(fresh, name), path)
    return [r.getMessage() for r in caplog.records if about in r.getMessage()]


def _head_class(body: str) -> type:
    """A class ``Head`` of module ``edited_head`` whose forward returns ``body``: the same
    name, parameters and submodules, the code as edited between a save and a load."""
    namespace = {"torch": torch, "__name__": "edited_head"}
    exec(f"class Head(torch.nn.Module):\n"
         f"    def __init__(self):\n        super().__init__()\n        self.fc = torch.nn.Linear(4, 4)\n"
         f"    def forward(self, x):\n        return {body}\n", namespace)
    return namespace["Head"]


def _saved_and_loader(cls: type, name: str, tmp_path, caplog):
    """``cls()`` tuned and saved: (the checkpoint, load_into(other class) -> the "code of"
    warnings ait.load gives loading it into that class with the same weights)."""
    torch.manual_seed(0)
    inner = cls().eval()
    model = ait.Module(inner, name, strategy=cpu_strategy())
    ait.tune(model, [torch.randn(4) for _ in range(2)], disable_external_logging=True, performance_validation=False)
    path = ait.save(model, tmp_path / "ckpt")

    def load_into(other: type) -> list[str]:
        return _load_warnings(other().eval(), inner, name, path, caplog, "code of")

    return path, load_into


def test_loading_into_a_class_whose_forward_was_edited_says_so(tmp_path, monkeypatch, caplog):
    """A forward edited from relu to 2 * tanh, loaded into: names, weights and shapes all
    matched, and the module computed two models silently (1.88 off eager). ait.load warns."""
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    first, edited = _head_class("torch.relu(self.fc(x))"), _head_class("2 * torch.tanh(self.fc(x))")
    path, load_into = _saved_and_loader(first, "edited-head", tmp_path, caplog)
    assert _manifest(path)["metadata"]["aitune.torch"]["forward_code"]["edited_head.Head"].startswith("bytecode:")

    assert load_into(_head_class("torch.relu(self.fc(x))")) == []  # the same code, another class object
    (warning,) = load_into(edited)
    assert "the code of edited_head.Head differs" in warning and "Tune it again" in warning
    # a class with source (this file's): digested from it; torch's own classes are left out
    assert set(ait_forward_code(_HeldTensors())) == {f"{__name__}._HeldTensors"}
    assert ait_forward_code(_HeldTensors())[f"{__name__}._HeldTensors"].startswith("source:")


def _helper_head_class(helper: str) -> type:
    """A class ``Head`` of module ``edited_helper`` whose forward calls ``act``, a function of
    its module, edited between a save and a load (the class's own code unchanged)."""
    namespace = {"torch": torch, "__name__": "edited_helper"}
    exec(f"def act(y):\n    return {helper}\n"
         "class Head(torch.nn.Module):\n"
         "    def __init__(self):\n        super().__init__()\n        self.fc = torch.nn.Linear(4, 4)\n"
         "    def forward(self, x):\n        return act(self.fc(x))\n", namespace)
    return namespace["Head"]


def test_loading_into_a_class_whose_helper_function_was_edited_says_so(tmp_path, monkeypatch, caplog):
    """forward calls ``act()``, a function beside the class, edited from relu to tanh
    between ait.save and ait.load: the class's code digest matched, and the module computed
    two models silently (0.54 off eager in a session-31 probe)."""
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    path, load_into = _saved_and_loader(_helper_head_class("torch.relu(y)"), "edited-helper", tmp_path, caplog)
    assert set(_manifest(path)["metadata"]["aitune.torch"]["forward_code"]) == {"edited_helper.Head",
                                                                                 "edited_helper.act"}

    assert load_into(_helper_head_class("torch.relu(y)")) == []
    (warning,) = load_into(_helper_head_class("torch.tanh(y)"))
    assert "the code of edited_helper.act differs" in warning


def ait_forward_code(module):
    from aitune.torch.forward_code import forward_code_digest

    return forward_code_digest(module)


def test_loading_compiled_graphs_into_other_weights_says_what_they_run(tmp_path, monkeypatch, caplog):
    """Without ONNX Runtime graphs nothing computes with the checkpoint's weights: the
    warning says the loaded module runs its own (one model) and that the tune chose and
    checked its graphs with others, not that the module would be two models."""
    import logging

    from aitune.torch.backend import TorchCompileBackend, TorchCompileBackendConfig

    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = ait.Module(MLP().eval(), "compiled-weights-mlp", strategy=ait.OneBackendStrategy(
        TorchCompileBackend(TorchCompileBackendConfig(mode="default"))))
    ait.tune(model, [torch.randn(16) for _ in range(2)], disable_external_logging=True, performance_validation=False)
    path = ait.save(model, tmp_path / "ckpt")
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.load(ait.Module(MLP().eval(), "compiled-weights-mlp"), path)
    (warning,) = [r.getMessage() for r in caplog.records if "differ from those checkpoint" in r.getMessage()]
    assert "Its graphs (torch.compile) run the module's own weights" in warning and "tune it again" in warning
    assert "ONNX Runtime" not in warning and "not one model" not in warning


def test_the_weights_digest_sees_permutations_and_holds_non_finite_values():
    from aitune.torch.weight_changes import digest_differences, weight_values_digest

    torch.manual_seed(0)
    module = MLP()
    module.register_buffer("mask", torch.tensor([0.0, float("-inf"), float("nan")]))
    digest = weight_values_digest(module)
    json.loads(json.dumps(digest, allow_nan=False))  # strict JSON: what the manifest holds
    assert digest_differences(digest, json.loads(json.dumps(digest))) == []
    permuted = MLP()
    permuted.load_state_dict(module.state_dict(), strict=False)
    permuted.register_buffer("mask", module.mask.clone())
    with torch.no_grad():
        permuted.fc1.weight.copy_(permuted.fc1.weight.flip(0))  # same sums, other values
    assert digest_differences(digest, weight_values_digest(permuted)) == ["fc1.weight"]
    assert digest_differences(digest, weight_values_digest(MLP().double())) != []


def test_the_weights_digest_sees_two_rows_swapped_away_from_its_sampled_values():
    """A vocabulary remapped by two rows of an embedding keeps every sum and (rows 3 and 5 of
    64) every sampled value: the digest's order-weighted row and column sums still differ.
    Old checkpoints' entries (no order sums) are still compared by what they hold."""
    from aitune.torch.weight_changes import digest_differences, weight_values_digest

    torch.manual_seed(0)
    table = torch.nn.Embedding(64, 8)
    digest = weight_values_digest(table)
    remapped = torch.nn.Embedding(64, 8)
    with torch.no_grad():
        remapped.weight.copy_(table.weight[[0, 1, 2, 5, 4, 3, *range(6, 64)]])
    assert digest_differences(digest, weight_values_digest(remapped)) == ["weight"]
    swapped_columns = torch.nn.Embedding(64, 8)
    with torch.no_grad():
        swapped_columns.weight.copy_(table.weight[:, [0, 1, 2, 4, 3, 5, 6, 7]])
    assert digest_differences(digest, weight_values_digest(swapped_columns)) == ["weight"]
    same = torch.nn.Embedding(64, 8)
    same.load_state_dict(table.state_dict())
    assert digest_differences(digest, weight_values_digest(same)) == []
    old = {name: entry[:-2] for name, entry in digest.items()}  # written before the order sums
    assert digest_differences(old, weight_values_digest(same)) == []
    assert digest_differences(old, weight_values_digest(torch.nn.Embedding(64, 8))) == ["weight"]


class _Activated(torch.nn.Module):
    """Its activation chosen by a constructor argument: no weight tells the two apart."""

    def __init__(self, act: str = "tanh"):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.act = torch.nn.Tanh() if act == "tanh" else torch.nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))


def test_loading_into_a_module_built_with_another_weightless_submodule_is_refused(tmp_path):
    """Saved with Tanh, loaded into the same class built with ReLU and the same weights: the
    class at the saved path and every weight shape matched, so it loaded, and the ONNX graph
    went on computing Tanh (0.87 off the ReLU model), silently."""
    torch.manual_seed(0)
    saved = _Activated("tanh").eval()
    model = ait.Module(saved, "activated", strategy=cpu_strategy())
    ait.tune(model, [torch.randn(16) for _ in range(2)], disable_external_logging=True, performance_validation=False)
    ait.save(model, tmp_path / "ckpt")
    other = _Activated("relu").eval()
    other.load_state_dict(saved.state_dict())
    with pytest.raises(aitune.InvalidArgumentError, match=r"other submodules.*act: torch\.nn\.modules\.activation\."
                                                          r"Tanh saved, torch\.nn\.modules\.activation\.ReLU here"):
        ait.load(ait.Module(other, "activated"), tmp_path / "ckpt")
    same = _Activated("tanh").eval()
    same.load_state_dict(saved.state_dict())
    loaded = ait.load(ait.Module(same, "activated"), tmp_path / "ckpt")
    x = torch.randn(2, 16)
    torch.testing.assert_close(loaded(x), saved(x), atol=1e-5, rtol=1e-5)


def test_a_checkpoint_records_the_weights_its_graphs_were_tuned_with(tmp_path, caplog):
    """Weights written where ait.Module does not look (``p.data.copy_``), then ait.save: the
    checkpoint recorded the module's weights at save time, so ait.load warned a module
    holding the weights the graphs compute and not one holding the new weights (0.54 off
    eager, silently). It records the tuned weights and says so at save; a load and save
    again keeps them."""
    import logging

    torch.manual_seed(0)
    inner = MLP().eval()
    tuned_weights = {k: v.clone() for k, v in inner.state_dict().items()}
    model = ait.Module(inner, "weights-after", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(16) for _ in range(2)], disable_external_logging=True, performance_validation=False)
    with torch.no_grad():
        for p in inner.parameters():
            p.data.copy_(torch.randn_like(p))
    new_weights = {k: v.clone() for k, v in inner.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="aitune"):
        path = ait.save(model, tmp_path / "ckpt")
    assert any("changed since its graphs were tuned (4 of 4 tensors" in r.getMessage() for r in caplog.records)

    def warnings_loading(weights, source=path):
        fresh = MLP().eval()
        fresh.load_state_dict(weights)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="aitune"):
            loaded = ait.load(ait.Module(fresh, "weights-after"), source)
        return loaded, [r.getMessage() for r in caplog.records if "differ from those checkpoint" in r.getMessage()]

    assert len(warnings_loading(new_weights)[1]) == 1  # the graphs compute other weights: told
    loaded, said = warnings_loading(tuned_weights)
    assert said == []
    again = ait.save(loaded, tmp_path / "again")
    assert len(warnings_loading(new_weights, again)[1]) == 1 and warnings_loading(tuned_weights, again)[1] == []


def test_the_weights_digest_takes_tensors_above_two_to_the_24_elements():
    """A float32 linspace rounded the last index of a 32000 x 2048 embedding up to its
    size: an IndexError on the CPU, a device-side assert that poisoned the CUDA context on
    the GPU (a Llama prefill's tune failed so on an H100). The picks are integers now, the
    last element included."""
    from aitune.torch.weight_changes import weight_values_digest

    module = torch.nn.Module()
    values = torch.zeros(32000 * 2048, dtype=torch.int8)
    values[-1] = 7
    module.register_buffer("table", values.view(32000, 2048))
    (entry,) = weight_values_digest(module).values()
    dtype, shape, total, magnitude, *picks, row_order, column_order = entry
    assert (dtype, shape, total, magnitude) == ("int8", [32000, 2048], 7.0, 7.0)
    assert len(picks) == 16 and picks[0] == 0 and picks[-1] == 7
    # the last row's weight times 7, and the last column's
    assert row_order == pytest.approx(7 * ((31999 * 0.6180339887498949) % 1))
    assert column_order == pytest.approx(7 * ((2047 * 0.6180339887498949) % 1))


def _tripled(module, inputs, output):
    return output * 3


def test_hooks_the_graphs_were_exported_with_are_recorded_and_compared(tmp_path, monkeypatch, caplog):
    """A forward hook on a submodule while the module is tuned runs inside the export, so the
    graph keeps its effect. Loaded in a fresh process into a module without the hook, the
    graph still applied it, 1.57 off eager and silent (a session-31 probe); saved after the
    hook was removed, nothing was said either. Both now warn, naming the submodule."""
    import logging

    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    inner = MLP().eval()
    handle = inner.fc1.register_forward_hook(_tripled)
    model = ait.Module(inner, "hooked", strategy=cpu_strategy())
    ait.tune(model, [torch.randn(16) for _ in range(2)], disable_external_logging=True, performance_validation=False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aitune"):
        path = ait.save(model, tmp_path / "with-hook")
    assert "(or its instance forward) differ" not in caplog.text
    handle.remove()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.save(model, tmp_path / "hook-removed")
    assert f"fc1: {__name__}._tripled -> none" in caplog.text

    def load_into(fresh) -> list[str]:
        return _load_warnings(fresh, inner, "hooked", path, caplog, "(or its instance forward) differ")

    (warning,) = load_into(MLP().eval())
    assert f"fc1: {__name__}._tripled -> none" in warning
    again = MLP().eval()
    again.fc1.register_forward_hook(_tripled)
    assert load_into(again) == []


class _CachedBias(torch.nn.Module):
    """A dict of tensors computed from a parameter on first use (timm LeViT's attention-bias
    cache): empty in a fresh module until its first eager call."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.cache = {}

    def forward(self, x):
        if "bias" not in self.cache:
            self.cache["bias"] = self.fc.bias.detach() * 2
        return self.fc(x) + self.cache["bias"]


def test_a_cache_not_filled_yet_in_the_module_loaded_into_is_no_difference(tmp_path, monkeypatch, caplog):
    """Watching the tensors of dict attributes made the save record the cache's item; a fresh
    module loaded into has an empty cache (filled on first use), which is no other model."""
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    inner = _CachedBias().eval()
    inner(torch.randn(1, 4))  # the cache filled, as a first call does
    model = ait.Module(inner, "cached", strategy=cpu_strategy())
    ait.tune(model, [torch.randn(4) for _ in range(2)], disable_external_logging=True, performance_validation=False)
    path = ait.save(model, tmp_path / "ckpt")

    def load_into(fresh) -> list[str]:
        return _load_warnings(fresh, inner, "cached", path, caplog, "outside its state dict")

    assert load_into(_CachedBias().eval()) == []
    other = _CachedBias().eval()
    other.cache = {"bias": torch.full((4,), 9.0)}
    (warning,) = load_into(other)
    assert "cache['bias']" in warning


class _Positives(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0)  # how many rows: the values decide, not the shapes


def test_an_output_extent_the_values_decide_stays_free_in_the_checkpoint(tmp_path, monkeypatch):
    """NonZero's count was saved fixed at (or ranged over) what the samples gave: the
    checkpoint, and the Triton config written from it, claimed output shapes the model does
    not keep (a probe's Range(0, n) got `dims: [5]`). The model names it with a symbol no
    input has: free."""
    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = ait.Module(_Positives().eval(), "positives", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(8) for _ in range(3)], batch_sizes=[1], progress=False,
             performance_validation=False, ignore_failing_modules=False)
    x = torch.randn(1, 8)
    assert torch.equal(model(x), _Positives()(x))
    ait.save(model, tmp_path / "ckpt")
    (graph,) = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())["graphs"]
    (output,) = graph["graph_spec"]["outputs"]
    assert (output["min_shape"], output["max_shape"]) == ([0, 2], [-1, 2]), output


def test_a_checkpoint_loaded_into_a_module_of_another_dtype_says_so(tmp_path, monkeypatch, caplog):
    """A float32 checkpoint loaded into the same weights made ``.half()`` said only that
    the weights differ and to load_state_dict them, which does not help (a session-35
    probe): the warning names the dtypes and says to convert the module."""
    import logging

    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    inner = MLP().eval()
    model = ait.Module(inner, "dtype-mlp", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(16) for _ in range(2)], disable_external_logging=True, performance_validation=False)
    path = ait.save(model, tmp_path / "ckpt")
    half = MLP().eval()
    half.load_state_dict(inner.state_dict())
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.load(ait.Module(half.half(), "dtype-mlp"), path)
    (warning,) = [r.getMessage() for r in caplog.records if "differ from those checkpoint" in r.getMessage()]
    assert "differ in dtype (float32 in the checkpoint, float16 here)" in warning, warning
    assert "module.to(torch.float32)" in warning, warning


def test_saving_a_module_loaded_into_other_weights_blames_no_write(tmp_path, monkeypatch, caplog):
    """Loaded into other weights (ait.load warns) and saved untouched, the save blamed "a
    write it does not watch (p.data)" that never happened, on every save (a session-35 probe)."""
    import logging

    monkeypatch.setenv("AITUNE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = ait.Module(MLP().eval(), "reloaded-mlp", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(16) for _ in range(2)], disable_external_logging=True, performance_validation=False)
    path = ait.save(model, tmp_path / "ckpt")
    loaded = ait.load(ait.Module(MLP().eval(), "reloaded-mlp"), path)
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.save(loaded, tmp_path / "again")
    (warning,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ait.save: the weights")]
    assert "as they did when it was loaded" in warning and "p.data" not in warning, warning


def test_eager_fallback_given_to_load_with_an_ait_module_is_said_to_be_its_own(pristine, caplog):
    """``ait.load(ait.Module(m, "mlp"), path, eager_fallback=True)``: the flag is for the modules
    a load wraps; the ait.Module keeps its own. It was ignored silently, and the next call not
    recorded was refused with advice to pass it to ait.load (a session-37 probe)."""
    import logging

    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.load(ait.Module(MLP().eval(), "mlp"), pristine[0], eager_fallback=True)
    assert "ait.Module 'mlp' keeps its own eager_fallback=False" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.load(ait.Module(MLP().eval(), "mlp", eager_fallback=True), pristine[0], eager_fallback=True)
    assert "keeps its own" not in caplog.text
