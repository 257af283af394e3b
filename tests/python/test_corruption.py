"""The corruption suite (issue 17): the probes that broke aitune, rebuilt as tests. Each
hostile checkpoint, header or command line must give its typed error (or exit code) and
leave the process healthy: the next good load in the same interpreter still works."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch_models import MLP, saved_tuned_mlp

import aitune
import aitune.torch as ait
from aitune import _core


def _cli(*args: str) -> subprocess.CompletedProcess:
    """The `aitune` command line in a separate process (a crash is an exit code, not ours)."""
    return subprocess.run([sys.executable, "-m", "aitune.cli", *map(str, args)], capture_output=True, text=True,
                          errors="backslashreplace", timeout=300)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _write_manifest(path: Path, manifest: dict) -> None:
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One tuned MLP saved once, with a sample input and its output; tests damage copies."""
    return saved_tuned_mlp(tmp_path_factory.mktemp("pristine"))


@pytest.fixture
def damaged(pristine, tmp_path) -> Path:
    path = tmp_path / "damaged"
    shutil.copytree(pristine[0], path)
    return path


def _still_healthy(pristine) -> None:
    """After a refused load, a good checkpoint still loads and runs in this interpreter."""
    path, x, expected = pristine
    module = ait.load(ait.Module(MLP().eval(), "mlp"), path)
    with torch.no_grad():
        assert torch.equal(module(x), expected)


def _refused(pristine, path: Path, match: str) -> None:
    for load in (lambda: ait.load(ait.Module(MLP().eval(), "mlp"), path), lambda: _core.Checkpoint.load(str(path))):
        with pytest.raises(aitune.CheckpointCorruptError, match=match):
            load()
    _still_healthy(pristine)


# -- external data written value-first ------------------------------------------------------


def _external_data_model(directory: Path) -> Path:
    """y = x @ w with w (4x4) in external data beside the model, its location entries
    then rewritten value-first (valid protobuf, the same model for ONNX Runtime)."""
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = directory / "model.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
              size_threshold=0)
    data = path.read_bytes()
    key = b"\x0a\x08location"
    start = data.index(key + b"\x12")
    length = data[start + len(key) + 1]  # "weights.bin": a one-byte length
    value = data[start + len(key): start + len(key) + 2 + length]
    path.write_bytes(data[:start] + value + key + data[start + len(key) + len(value):])
    assert key + b"\x12" not in path.read_bytes()
    return path


def test_unlisted_external_data_written_value_first_is_refused(tmp_path, pristine):
    source = _external_data_model(tmp_path)
    ckpt = tmp_path / "ckpt"
    graph = _core.CheckpointGraph(key="g", backend_config=_core.OnnxSessionConfig())
    saved = _core.Checkpoint.save(str(ckpt), _core.CheckpointManifest(module_name="m", graphs=[graph]),
                                  {"graphs/g/model.onnx": str(source)})
    assert sorted(a.path for a in saved.graphs[0].artifacts) == ["graphs/g/model.onnx", "graphs/g/weights.bin"]
    # The forger drops the data file from the manifest and puts other weights there.
    manifest = _manifest(ckpt)
    manifest["graphs"][0]["artifacts"] = [a for a in manifest["graphs"][0]["artifacts"]
                                          if a["path"] != "graphs/g/weights.bin"]
    _write_manifest(ckpt, manifest)
    (ckpt / "graphs/g/weights.bin").write_bytes(np.full(16, 7, dtype=np.float32).tobytes())
    with pytest.raises(aitune.CheckpointCorruptError, match="weights.bin.*not an artifact"):
        _core.Checkpoint.load(str(ckpt))
    result = _cli("inspect", ckpt)
    assert result.returncode == 5, result.stdout + result.stderr
    assert "verified" not in result.stdout
    _still_healthy(pristine)


# -- deep nesting, RecursionError, an empty graph list ----------------------------------------


@pytest.mark.parametrize("where", ["metadata", "structure", "graph_spec", "backend_config"])
def test_manifest_nested_80000_deep_is_corrupt_not_a_crash(damaged, pristine, where):
    text = (damaged / "manifest.json").read_text()
    field = f'"{where}": '
    at = text.index(field) + len(field)
    (damaged / "manifest.json").write_text(text[:at] + "[" * 80000 + "]" * 80000 + ', "x": ' + text[at:])
    _refused(pristine, damaged, "nested deeper than")
    result = _cli("inspect", damaged)
    assert result.returncode == 5, result.stdout + result.stderr


def test_a_deep_tune_report_artifact_is_corrupt_not_a_recursion_error(damaged, pristine):
    manifest = _manifest(damaged)
    reports = [a for g in manifest["graphs"] for a in g["artifacts"] if a["path"].endswith("tune_report.json")]
    assert reports, "ait.save writes a tune report per graph"
    for artifact in reports:
        path = damaged / artifact["path"]
        path.write_text("[" * 100000 + "]" * 100000)  # consistent digest: only the depth is wrong
        artifact["size"], artifact["sha256"] = path.stat().st_size, _sha256(path)
    _write_manifest(damaged, manifest)
    with pytest.raises(aitune.CheckpointCorruptError, match="tune_report.json"):
        ait.load(ait.Module(MLP().eval(), "mlp"), damaged)
    _still_healthy(pristine)


def test_an_empty_graph_list_is_corrupt(damaged, pristine):
    manifest = _manifest(damaged)
    manifest["graphs"] = []
    _write_manifest(damaged, manifest)
    # The engine keeps a manifest without ONNX graphs (a front end may store only its own
    # decisions, e.g. torch.compile graphs); aitune.torch refuses one that restores nothing.
    with pytest.raises(aitune.CheckpointCorruptError, match="at least one graph"):
        ait.load(ait.Module(MLP().eval(), "mlp"), damaged)
    assert _core.Checkpoint.load(str(damaged)).graph_keys() == []
    _still_healthy(pristine)


# -- bytes that are not UTF-8 -----------------------------------------------------------------


@pytest.mark.parametrize("edit", [
    lambda text: text.replace(b'"module_name": "', b'"module_name": "\xff\xfe'),
    lambda text: text.replace(b'"format": "aitune-checkpoint"', b'"format": "aitune-\xc3\x28checkpoint"'),
    lambda text: text.replace(b'"graphs/', b'"graphs\x80/', 1),
    lambda text: b"\xff" * 64 + text,
])
def test_non_utf8_bytes_are_corrupt_not_unicode_decode_error(damaged, pristine, edit):
    path = damaged / "manifest.json"
    path.write_bytes(edit(path.read_bytes()))
    _refused(pristine, damaged, "manifest")


# -- unbounded numbers ------------------------------------------------------------------------


@pytest.mark.parametrize("key,value", [("intra_op_threads", 100000), ("intra_op_threads", 2**32 + 1),
                                       ("inter_op_threads", -5), ("intra_op_threads", 1.5),
                                       ("device_id", 2**40)])
def test_unbounded_backend_numbers_are_corrupt(damaged, pristine, key, value):
    manifest = _manifest(damaged)
    manifest["graphs"][0]["backend_config"][key] = value
    _write_manifest(damaged, manifest)
    _refused(pristine, damaged, key)


# -- the command line: hostile .npy files, numbers, output names ------------------------------


def _npy_v1(header: str, data: bytes) -> bytes:
    raw = header.encode("latin-1") + b"\n"
    return b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw + data


def _mlp_onnx(tmp_path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "relu.onnx")
    return tmp_path / "relu.onnx"


@pytest.mark.parametrize("name,content", [
    ("spaces", _npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (" + " " * 30000 + "1, 4), }",
                       bytes(16))),
    ("long_descr", _npy_v1("{'descr': '" + "f" * 60000 + "', 'fortran_order': False, 'shape': (1, 4), }", bytes(16))),
    ("many_dims", _npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "1," * 20000 + "), }",
                          bytes(16))),
    ("huge_header", b"\x93NUMPY\x02\x00\xff\xff\xff\xff"),
    ("extra_key", _npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4), 'x': \"'shape': (1, 16)\"}",
                          bytes(64))),
])
def test_hostile_npy_inputs_exit_2(tmp_path, name, content):
    model = _mlp_onnx(tmp_path)
    (tmp_path / "x.npy").write_bytes(content)
    if name == "extra_key":
        with pytest.raises(ValueError):  # numpy refuses it too
            np.load(tmp_path / "x.npy")
    result = _cli("run", model, "--iterations", "1", "--input", f"x={tmp_path / 'x.npy'}")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "x.npy" in result.stderr and "internal error" not in result.stderr
    (tmp_path / "samples").mkdir()
    shutil.copy(tmp_path / "x.npy", tmp_path / "samples" / "x.npy")
    result = _cli("tune", model, "--provider", "cpu", "--quiet", "--time-cap", "0.2", "--samples", tmp_path / "samples")
    assert result.returncode == 2, result.stdout + result.stderr


@pytest.mark.parametrize("args", [
    ["run", "{model}", "--dim", "batch=1000000000"],
    ["run", "{model}", "--dim", "batch=99999999999999999999999"],
    ["run", "{model}", "--dim", "nosuch=3"],
    ["run", "{model}", "--device-id", "-7"],
    ["tune", "{model}", "--provider", "cpu", "--batch-sizes", "1000000000"],
    ["tune", "{model}", "--provider", "cpu", "--output-tolerance", "nosuch=1,1"],
    ["tune", "{model}", "--provider", "cpu", "--max-batch-size", "-5"],
    ["tune", "{model}", "--provider", "cpu", "--atol", "nan"],
    ["run", "{model}", "--no-such-option"],
])
def test_out_of_range_numbers_and_unknown_names_exit_2(tmp_path, args):
    model = _mlp_onnx(tmp_path)
    result = _cli(*[a.format(model=model) for a in args], "--iterations" if args[0] == "run" else "--quiet",
                  *(["1"] if args[0] == "run" else []))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "internal error" not in result.stderr


def test_output_names_that_are_paths_stay_inside_save_outputs(tmp_path):
    outputs = ["../../escaped_rel", str(tmp_path / "escaped_abs")]
    nodes = [helper.make_node("Relu", ["x"], [name]) for name in outputs]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in outputs])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "paths.onnx")
    # Through a checkpoint too: save accepts such names, run maps them to safe files.
    ckpt = tmp_path / "ckpt"
    def spec(name):
        return {"name": name, "dtype": "float32", "min_shape": [2], "max_shape": [2], "batch_axis": None}

    graph_spec = _core.GraphSpec.from_json(json.dumps({"inputs": [spec("x")], "outputs": [spec(n) for n in outputs]}))
    graph = _core.CheckpointGraph(key="g", graph_spec=graph_spec, backend_config=_core.OnnxSessionConfig())
    _core.Checkpoint.save(str(ckpt), _core.CheckpointManifest(module_name="m", graphs=[graph]),
                          {"graphs/g/model.onnx": str(tmp_path / "paths.onnx")})
    for i, source in enumerate([tmp_path / "paths.onnx", ckpt]):
        out = tmp_path / f"work{i}" / "a" / "out"
        result = _cli("run", source, "--provider", "cpu", "--iterations", "1", "--save-outputs", out)
        assert result.returncode == 0, result.stdout + result.stderr
        written = sorted(p.name for p in out.rglob("*"))
        assert len(written) == 2 and all(p.startswith("%") for p in written), written
        assert not list((tmp_path / f"work{i}").glob("escaped*")) and not list(tmp_path.glob("escaped*"))
