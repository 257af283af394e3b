"""ONNX Runtime from its PyPI wheel: the engine loads the wheel's library, `import
onnxruntime` (its own, separate ONNX Runtime) works next to aitune in one process, and
`aitune doctor` says which wheel, version and CUDA library folders it uses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aitune import _core, _ort_wheel

TESTS = Path(__file__).resolve().parent


def _env(**extra: str) -> dict:
    """The environment of a child process, without the overrides of the search."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("AITUNE_ORT_LIBRARY", "AITUNE_ORT_PROVIDERS_DIR", "AITUNE_CUDA_LIBRARY_DIRS")}
    env.update(extra)
    return env


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter (a process loads ONNX Runtime once)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=_env(**env), cwd=TESTS, timeout=300)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _doctor(**env: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "aitune.cli", "doctor"], capture_output=True, text=True,
                          env=_env(**env), timeout=300)
    assert proc.returncode == 0, f"doctor failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


WHEEL = _ort_wheel.find()
needs_wheel = pytest.mark.skipif(not WHEEL["library"], reason="no onnxruntime wheel with libonnxruntime here")


def test_finding_the_wheel_does_not_import_onnxruntime():
    out = _python("""
        import sys, aitune
        print(sorted(m for m in sys.modules if m == "onnxruntime" or m.startswith("onnxruntime.")))
    """).stdout
    assert out.strip() == "[]"


@needs_wheel
def test_the_wheel_found_is_an_installed_distribution_with_its_library():
    assert WHEEL["distribution"] in _ort_wheel.DISTRIBUTIONS
    import importlib.metadata

    assert WHEEL["version"] == importlib.metadata.version(WHEEL["distribution"])
    library = Path(WHEEL["library"])
    assert library.parent == Path(WHEEL["capi_dir"]) and library.parent.name == "capi"
    assert library.name == f"libonnxruntime.so.{WHEEL['version']}"


@needs_wheel
def test_the_loader_picks_the_wheels_library():
    out = _python("""
        import json
        from aitune import _core
        rt = _core.OrtRuntime.load()
        print(json.dumps({"library": rt.library_path, "version": rt.version, "wheel": rt.wheel.distribution,
                          "wheel_version": rt.wheel.version, "search": _core.OrtRuntime.search_paths()}))
    """).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert os.path.samefile(got["library"], WHEEL["library"]), got
    assert got["search"][0] == WHEEL["library"], "the wheel goes before the compiled-in default and the system"
    assert got["search"][-1] == "libonnxruntime.so.1"
    assert (got["wheel"], got["wheel_version"]) == (WHEEL["distribution"], WHEEL["version"])
    assert got["version"] == WHEEL["version"]


@needs_wheel
def test_aitune_ort_library_goes_before_the_wheel(tmp_path):
    copy = tmp_path / "elsewhere" / "libonnxruntime.so.1"
    copy.parent.mkdir()
    shutil.copy(WHEEL["library"], copy)
    out = _python("""
        from aitune import _core
        print(_core.OrtRuntime.load().library_path)
    """, AITUNE_ORT_LIBRARY=str(copy)).stdout
    assert os.path.samefile(out.strip().splitlines()[-1], copy)


@needs_wheel
@pytest.mark.parametrize("order", ["onnxruntime_first", "aitune_first"])
def test_aitune_and_python_onnxruntime_work_in_one_process(order):
    """`import onnxruntime` brings ORT's Python module (its own copy of ONNX Runtime);
    aitune's engine loads the wheel's libonnxruntime. Both run the same model on the CPU,
    in either order, and agree with numpy."""
    out = _python(f"""
        import numpy as np, torch, tempfile, pathlib
        from onnx_models import mlp

        path, ref = mlp(pathlib.Path(tempfile.mkdtemp()) / "mlp.onnx")
        x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)

        def with_onnxruntime():
            import onnxruntime as ort
            s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            return s.run(None, {{"x": x}})[0], ort.__version__

        def with_aitune():
            from aitune import _core
            b = _core.OnnxSession.create(
                str(path), _core.OnnxSessionConfig(provider=_core.ExecutionProvider.CPU))
            (y,) = b.infer([torch.from_numpy(x)])
            return y.numpy(), _core.OrtRuntime.load().library_path

        if "{order}" == "onnxruntime_first":
            y_ort, ort_version = with_onnxruntime()
            y_ait, lib = with_aitune()
        else:
            y_ait, lib = with_aitune()
            y_ort, ort_version = with_onnxruntime()
        # ...and both still work after the other one ran.
        y_ort2, _ = with_onnxruntime()
        y_ait2, _ = with_aitune()
        for y in (y_ort, y_ait, y_ort2, y_ait2):
            np.testing.assert_allclose(y, ref(x), atol=1e-5, rtol=1e-5)
        print("ok", ort_version, lib)
    """).stdout
    last = out.strip().splitlines()[-1].split()
    assert last[0] == "ok"
    assert os.path.samefile(last[2], WHEEL["library"])


@pytest.mark.parametrize("order", ["onnxruntime_first", "aitune_first"])
def test_aitune_and_python_onnxruntime_gpu_both_on_cuda_in_one_process(order):
    """With the GPU wheel, `import onnxruntime` registers the CUDA provider library in its
    own ONNX Runtime, and aitune registers the same file in the wheel's libonnxruntime:
    both must run on CUDA in one process. Skipped unless both have CUDA here."""
    out = _python(f"""
        import sys, numpy as np, torch, tempfile, pathlib
        from onnx_models import mlp
        from aitune import _core
        if "{order}" == "aitune_first":  # aitune registers the CUDA provider before onnxruntime's import does
            _core.OrtRuntime.load().provider_status(_core.ExecutionProvider.CUDA)
        import onnxruntime as ort
        cuda = _core.OrtRuntime.load().provider_status(_core.ExecutionProvider.CUDA)
        if "CUDAExecutionProvider" not in ort.get_available_providers() or not cuda.available \\
                or not torch.cuda.is_available():
            print("skip", ort.__version__, ort.get_available_providers(), cuda.reason[:120])
            sys.exit(0)
        path, ref = mlp(pathlib.Path(tempfile.mkdtemp()) / "mlp.onnx")
        x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)

        def with_onnxruntime():
            s = ort.InferenceSession(str(path), providers=[("CUDAExecutionProvider", {{"use_tf32": "0"}})])
            assert s.get_providers()[0] == "CUDAExecutionProvider", s.get_providers()
            return s.run(None, {{"x": x}})[0]

        def with_aitune():
            b = _core.OnnxSession.create(str(path), _core.OnnxSessionConfig(
                provider=_core.ExecutionProvider.CUDA, provider_options={{"use_tf32": "0"}}))
            (y,) = b.infer([torch.from_numpy(x).cuda()])
            torch.cuda.synchronize()
            return torch.from_dlpack(y).cpu().numpy()

        first, second = (with_onnxruntime, with_aitune) if "{order}" == "onnxruntime_first" else (with_aitune, with_onnxruntime)
        ys = [first(), second(), first(), second()]
        for y in ys:
            np.testing.assert_allclose(y, ref(x), atol=1e-5, rtol=1e-5)
        print("ok")
    """).stdout
    last = out.strip().splitlines()[-1]
    if last.startswith("skip"):
        pytest.skip(f"needs CUDA in both ONNX Runtimes: {last}")
    assert last == "ok"


@needs_wheel
def test_doctor_names_the_wheel_and_where_it_looked():
    out = _doctor()
    lib = os.path.realpath(WHEEL["library"])
    assert f"ONNX Runtime {WHEEL['version']}: {lib}\n" in out, out
    assert f"from the Python package {WHEEL['distribution']} {WHEEL['version']} (" in out, out
    assert "CUDA libraries looked for in: " in out, out
    assert "cpu       available" in out, out
    assert "warning:" not in out, out


@needs_wheel
def test_doctor_reads_a_wheel_layout_of_a_library_named_by_path(tmp_path):
    """A C++-only process (no Python front end) pointed at a wheel's library: doctor reads
    the distribution from the *.dist-info beside it, warns when both ORT distributions are
    installed over one another, and looks for CUDA libraries in nvidia/*/lib beside it."""
    site = tmp_path / "site-packages"
    capi = site / "onnxruntime" / "capi"
    capi.mkdir(parents=True)
    lib = capi / Path(WHEEL["library"]).name
    shutil.copy(WHEEL["library"], lib)
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cudnn" / "lib").mkdir(parents=True)
    (site / f"onnxruntime_gpu-{WHEEL['version']}.dist-info").mkdir()
    out = _doctor(AITUNE_ORT_LIBRARY=str(lib))
    assert f"from the Python package onnxruntime-gpu {WHEEL['version']} ({capi})" in out, out
    dirs = out.split("CUDA libraries looked for in: ")[1].splitlines()[0]
    assert f"{site}/nvidia/cu13/lib, {site}/nvidia/cudnn/lib" in dirs, dirs
    assert "warning:" not in out, out

    (site / f"onnxruntime-{WHEEL['version']}.dist-info").mkdir()
    out = _doctor(AITUNE_ORT_LIBRARY=str(lib))
    assert "warning: both onnxruntime" in out and "uninstall both and install one" in out, out


def test_both_distributions_installed_are_reported_by_the_finder(tmp_path):
    site = tmp_path / "site-packages"
    (site / "onnxruntime" / "capi").mkdir(parents=True)
    (site / "onnxruntime" / "__init__.py").write_text("")
    (site / "onnxruntime" / "capi" / "libonnxruntime.so.1.31.1").write_text("")
    (site / "onnxruntime" / "capi" / "libonnxruntime.so.1.30.0").write_text("")
    for dist, name in (("onnxruntime", "onnxruntime"), ("onnxruntime_gpu", "onnxruntime-gpu")):
        info = site / f"{dist}-1.31.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.31.1\n")
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    out = _python(f"""
        import json, sys
        sys.path.insert(0, {str(site)!r})
        from aitune import _ort_wheel
        print(json.dumps(_ort_wheel.find()))
    """).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert found["capi_dir"] == str(site / "onnxruntime" / "capi")
    assert found["library"] == str(site / "onnxruntime" / "capi" / "libonnxruntime.so.1.31.1"), "the newest"
    assert (found["distribution"], found["version"]) == ("onnxruntime-gpu", "1.31.1")
    assert "both onnxruntime-gpu 1.31.1 and onnxruntime 1.31.1" in found["warning"]
    assert str(site / "nvidia" / "cu13" / "lib") in found["cuda_library_dirs"]


@pytest.mark.parametrize("last", ["onnxruntime", "onnxruntime-gpu"])
def test_with_both_distributions_the_library_on_disk_names_its_owner(tmp_path, last):
    """Both wheels write onnxruntime/capi/libonnxruntime.so.1.31.1; their RECORDs hold the
    sha256 of their own copy, so the finder tells whose bytes will load."""
    import base64
    import hashlib

    site = tmp_path / "site-packages"
    capi = site / "onnxruntime" / "capi"
    capi.mkdir(parents=True)
    (site / "onnxruntime" / "__init__.py").write_text("")
    builds = {"onnxruntime": b"CPU build of the core", "onnxruntime-gpu": b"CUDA build of the core"}
    (capi / "libonnxruntime.so.1.31.1").write_bytes(builds[last])  # the wheel installed last
    for name, data in builds.items():
        info = site / f"{name.replace('-', '_')}-1.31.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.31.1\n")
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        (info / "RECORD").write_text(f"onnxruntime/capi/libonnxruntime.so.1.31.1,sha256={digest},{len(data)}\n"
                                     f"{info.name}/RECORD,,\n")
    out = _python(f"""
        import json, sys
        sys.path.insert(0, {str(site)!r})
        from aitune import _ort_wheel
        print(json.dumps(_ort_wheel.find()))
    """).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert found["distribution"] == last
    assert f"the library here is {last}'s" in found["warning"]
    assert ("CPU build" in found["warning"]) == (last == "onnxruntime"), found["warning"]
    assert "uninstall both and install one" in found["warning"]


def test_the_engine_got_the_python_packages():
    wheel, cuda_dirs = _core.OrtRuntime.python_packages()
    assert wheel.capi_dir == WHEEL["capi_dir"]
    assert (wheel.distribution, wheel.version) == (WHEEL["distribution"], WHEEL["version"])
    assert list(cuda_dirs) == WHEEL["cuda_library_dirs"]


def test_cuda_libraries_come_from_the_pip_packages_on_gpu_machines():
    rt = _core.OrtRuntime.load()
    status = rt.provider_status(_core.ExecutionProvider.CUDA)
    if not status.available:
        pytest.skip(f"CUDA provider unavailable here: {status.reason[:200]}")
    resolved = dict(line.split(": ", 1) for line in status.cuda_libraries)
    for soname in ("libcudart.so.13", "libcublas.so.13", "libcudnn.so.9", "libcuda.so.1"):
        assert soname in resolved, status.cuda_libraries
    if rt.cuda_library_dirs:
        folders = [os.path.realpath(d) for d in rt.cuda_library_dirs]
        for soname in ("libcudart.so.13", "libcudnn.so.9"):
            assert os.path.dirname(resolved[soname]) in folders, (soname, resolved[soname], folders)



_BRIDGES = textwrap.dedent("""
    import ctypes, os, shutil, sys, tempfile
    from aitune import _core
    bridge, first = sys.argv[1], sys.argv[2]
    root = tempfile.mkdtemp()
    paths = {d: os.path.join(root, d, os.path.basename(bridge)) for d in ("other", "ours")}
    for path in paths.values():
        os.makedirs(os.path.dirname(path))
        shutil.copy(bridge, path)
    if first == "other":  # another install's bridge, loaded RTLD_GLOBAL before aitune's
        ctypes.CDLL(paths["other"], mode=ctypes.RTLD_GLOBAL)
    print(_core.OrtRuntime.foreign_provider_bridge(paths["ours"]))
    ctypes.CDLL(paths["other"], mode=ctypes.RTLD_GLOBAL)  # after ours: providers still bind to ours
    print(_core.OrtRuntime.foreign_provider_bridge(paths["ours"]))
    print(_core.OrtRuntime.foreign_provider_bridge(os.path.join(root, "none", "missing.so")))
""")


@pytest.mark.parametrize("first", ["ours", "other"])
def test_another_onnx_runtimes_provider_bridge_loaded_first_is_named(first):
    """The GPU host's crash (sessions 24-25): the onnxruntime Python package of another install
    (the image's 1.30), imported first, loads its provider bridge RTLD_GLOBAL; aitune's 1.31.1
    CUDA provider then bound Provider_GetHost to it and jumped through a null slot in its
    Attention kernel (a segmentation fault). The engine finds the bridge a provider would bind
    to (and the CUDA and TensorRT providers are refused naming it); its own is no conflict.
    A fresh process each: the first bridge loaded RTLD_GLOBAL is the one providers bind to."""
    bridge = Path(_core.OrtRuntime.load().providers_dir) / "libonnxruntime_providers_shared.so"
    if not bridge.exists():
        pytest.skip(f"no provider bridge beside this ONNX Runtime ({bridge.parent})")
    done = subprocess.run([sys.executable, "-c", _BRIDGES, str(bridge), first], capture_output=True, text=True,
                          timeout=120, env=_env())
    assert done.returncode == 0, done.stderr
    at_first, after_other, missing = done.stdout.splitlines()
    if first == "ours":
        assert at_first == "None" and after_other == "None", done.stdout
    else:
        assert at_first.endswith("/other/libonnxruntime_providers_shared.so"), done.stdout
        assert after_other == at_first
    assert missing == "None"
