"""Many processes, one cache (issue 31): a tune keeps what it wrote, module names map to
distinct directories, loads are consistent under concurrent saves, what dead processes
left is swept, the console script takes any bytes, --samples stays inside its directory,
input names may hold '='."""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import aitune
import aitune.torch as ait
from aitune import _core
from aitune.torch import cache
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig
from onnx_models import mlp
from torch_models import MLP

TESTS = Path(__file__).resolve().parent


def _cli() -> str:
    """The installed console script (python/aitune/cli.py), not the native binary."""
    beside = Path(sys.executable).parent / "aitune"
    return str(beside) if beside.exists() else shutil.which("aitune")


def _strategy():
    config = ONNXRuntimeBackendConfig(execution_provider="cpu", tune_provider_options=False,
                                      transformer_fusions=False, use_dynamo=False)
    return ait.OneBackendStrategy(backend=ONNXRuntimeBackend(config))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# -- 2: injective cache directories -----------------------------------------------------


def test_module_names_map_to_distinct_directories(cache_dir):
    names = ["coll/x", "coll_x", "coll x", "coll%x", ".hidden", "_hidden", "a" * 400, "a" * 401, "é", "e"]
    dirs = [cache.module_dir(n) for n in names]
    assert len(set(dirs)) == len(names)
    assert all(d.parent == cache_dir for d in dirs)  # never escapes the cache
    assert all(len(d.name) <= 255 for d in dirs)
    assert (cache.module_dir("coll/x") / cache.MODULE_NAME_FILE).read_text() == "coll/x"


def test_a_directory_recording_another_name_is_refused(cache_dir):
    path = cache.module_dir("mine")
    (path / cache.MODULE_NAME_FILE).write_text("someone else")
    with pytest.raises(_core.InvalidArgumentError, match="belongs to the module 'someone else'"):
        cache.module_dir("mine")


def test_an_empty_name_record_left_by_a_killed_process_is_taken(cache_dir):
    """A process killed between creating ``.module_name`` and writing it (or one still
    writing it while another process of that name reads it) left it empty: every later
    tune of that name was refused ("belongs to the module ''")."""
    path = cache_dir / "mlp"
    path.mkdir(parents=True)
    (path / cache.MODULE_NAME_FILE).write_bytes(b"")
    assert cache.module_dir("mlp") == path
    assert (path / cache.MODULE_NAME_FILE).read_text() == "mlp"
    assert [p.name for p in path.iterdir()] == [cache.MODULE_NAME_FILE]  # no temporary file left


def test_a_name_is_recorded_on_a_file_system_without_hard_links(cache_dir, monkeypatch):
    import errno

    def no_links(src, dst, *args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))

    monkeypatch.setattr(os, "link", no_links)
    path = cache.module_dir("coll/x")
    assert (path / cache.MODULE_NAME_FILE).read_text() == "coll/x"
    assert cache.module_dir("coll/x") == path
    assert [p.name for p in path.iterdir()] == [cache.MODULE_NAME_FILE]


def test_what_a_kill_while_recording_a_name_left_is_swept(cache_dir):
    path = cache_dir / "mlp"
    dead = path / f"run-{_dead_pid()}-0123"
    dead.mkdir(parents=True)
    (dead / cache.MODULE_NAME_FILE).write_text("ml")
    assert cache.module_dir("mlp") == path and not dead.exists()
    live = cache.tune_dir("other", "graph_0", "backend_0")
    held = cache.staging_dir(cache_dir / "other")
    mine = held.__enter__()  # this process writing a name record while the module is cleared
    cache.clear_module("other")
    assert mine.is_dir() and live.is_dir()
    held.__exit__(None, None, None)
    assert not mine.exists()


@pytest.mark.parametrize("record", ["directory", "not utf-8"])
def test_an_unreadable_name_record_is_an_invalid_argument_naming_it(cache_dir, record):
    path = cache_dir / "mlp"
    path.mkdir(parents=True)
    if record == "directory":
        (path / cache.MODULE_NAME_FILE).mkdir()
    else:
        (path / cache.MODULE_NAME_FILE).write_bytes(b"\xff\xfe")
    with pytest.raises(_core.InvalidArgumentError, match=r"\.module_name"):
        cache.module_dir("mlp")


# -- 1: a tune reads back only what it wrote --------------------------------------------


def test_two_modules_of_one_name_keep_their_own_weights(tmp_path):
    """The second tune of a name used to overwrite the first one's model in the shared
    cache directory (ait.save then refused, or another process's weights were saved)."""
    first, second = MLP().eval(), MLP().eval()
    a = ait.Module(first, "shared", strategy=_strategy())
    b = ait.Module(second, "shared", strategy=_strategy())
    ait.tune(a, torch.randn(16))
    ait.tune(b, torch.randn(16))
    ait.save(a, tmp_path / "a")
    ait.save(b, tmp_path / "b")
    x = torch.randn(2, 16)
    loaded_a = ait.load(ait.Module(MLP().eval(), "shared"), tmp_path / "a")
    loaded_b = ait.load(ait.Module(MLP().eval(), "shared"), tmp_path / "b")
    with torch.no_grad():
        torch.testing.assert_close(loaded_a(x), first(x), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(loaded_b(x), second(x), rtol=1e-4, atol=1e-5)


def test_run_directories_of_dead_processes_are_swept(cache_dir):
    parent = cache.module_dir("m") / "graph_0" / "backend_0"
    parent.mkdir(parents=True)
    dead = parent / f"run-{_dead_pid()}-0123"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "model_raw.onnx").write_bytes(b"x" * 100)
    # one its maker was killed in before naming it (OwnedDirectory.create: made pending, locked, renamed)
    pending = parent / f".pending-run-{_dead_pid()}-4567"
    pending.mkdir()
    os.utime(pending, (time.time() - 120, time.time() - 120))  # older than any maker takes to name it
    # A fresh one may be a maker's between its mkdir and its lock (in another pid namespace):
    # kept until it is a minute old.
    fresh = parent / f".pending-run-{_dead_pid()}-8901"
    fresh.mkdir()
    mine = cache.tune_dir("m", "graph_0", "backend_0")
    assert not dead.exists() and not pending.exists() and mine.is_dir()
    assert fresh.is_dir()
    assert list(parent.glob(".pending-*")) == [fresh], list(parent.iterdir())  # ours were named
    # Our own run directory survives the next tune's sweep, and clear_module.
    other = cache.tune_dir("m", "graph_0", "backend_0")
    cache.clear_module("m")
    assert mine.is_dir() and other.is_dir() and mine != other


def test_a_tune_writing_its_report_survives_another_process_clearing_the_module(cache_dir, monkeypatch):
    """``ait.tune(..., clear_cache=True)`` in one process removed the temporary report
    file another process of that module name was writing (any file of a graph's
    directory went): that tune failed with a FileNotFoundError and stayed eager. The
    other process's clear is made to happen right then."""
    replace, cleared = os.replace, []

    def clear_then_replace(src, dst, *args, **kwargs):
        if Path(dst).name.startswith("tune_report") and not cleared:
            cache.clear_module("shared")  # what the other process does, at this moment
            cleared.append(Path(src))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", clear_then_replace)
    model = ait.Module(MLP().eval(), "shared", strategy=_strategy())
    ait.tune(model, torch.randn(16))
    assert cleared, "the report was not written with os.replace"
    assert model.__dict__.get("_ait_failure") is None, model.__dict__["_ait_failure"]
    report = next(cache_dir.glob("shared/*/tune_report.json"))
    assert report.is_file() and report.with_suffix(".html").is_file()
    assert not list(cache_dir.rglob(".tune_report-*")) and not list(cache_dir.glob("shared/*/run-*"))


def test_clearing_a_module_another_process_clears_at_once(cache_dir, monkeypatch):
    """Two processes' ``clear_cache=True`` on one module: a graph directory the other
    process removed between this one's listing and its visit raised FileNotFoundError
    (about 40 of 400 clears with two processes), failing that tune. The other process's
    removal is made to happen right then."""
    for graph in ("graph_0", "graph_1"):
        (cache.module_dir("m") / graph / "backend_0" / "sub").mkdir(parents=True)
        (cache_dir / "m" / graph / "tune_report.json").write_text("{}")
    sweep = _core.remove_stale_directories

    def other_process_clears_first(parent, prefix):
        if Path(parent).parent == cache_dir / "m":
            shutil.rmtree(parent)  # the other process removed this graph's directory meanwhile
        return sweep(parent, prefix)

    monkeypatch.setattr(_core, "remove_stale_directories", other_process_clears_first)
    cache.clear_module("m")
    assert sorted(p.name for p in (cache_dir / "m").iterdir()) == [cache.MODULE_NAME_FILE]


# -- 3: loads during overwrites ---------------------------------------------------------

_WRITER = textwrap.dedent("""
    import sys
    from aitune import _core
    target, models, rounds = sys.argv[1], sys.argv[2:4], int(sys.argv[4])
    for i in range(rounds):
        manifest = _core.CheckpointManifest(module_name=f"v{i % 2}", graphs=[_core.CheckpointGraph(key="g")])
        _core.Checkpoint.save(target, manifest, {"graphs/g/model_raw.onnx": models[i % 2]})
""")


def test_loads_during_overwrites_never_report_corruption(tmp_path):
    small, _ = mlp(tmp_path / "small.onnx", width_in=16, seed=1)
    large, _ = mlp(tmp_path / "large.onnx", width_in=4096, seed=2)  # another size: a mix shows
    target = tmp_path / "ck"
    manifest = _core.CheckpointManifest(module_name="v0", graphs=[_core.CheckpointGraph(key="g")])
    _core.Checkpoint.save(str(target), manifest, {"graphs/g/model_raw.onnx": str(small)})
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(target), str(small), str(large), "300"])
    loads = 0
    try:
        while writer.poll() is None:
            checkpoint = _core.Checkpoint.load(str(target))  # CheckpointCorruptError on main
            loads += 1
            expected = {"v0": small, "v1": large}[checkpoint.manifest.module_name]
            assert checkpoint.manifest.graphs[0].artifacts[0].size == expected.stat().st_size
    finally:
        writer.wait()
    assert writer.returncode == 0 and loads >= 3
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


# -- 4: debris of dead processes ----------------------------------------------------------

_KILLED_SAVE = textwrap.dedent("""
    import os, signal, sys
    from aitune import _core
    manifest = _core.CheckpointManifest(module_name="m", graphs=[_core.CheckpointGraph(key="g")])
    def die(path, count):
        os.kill(os.getpid(), signal.SIGKILL)   # mid-save, as a crash would
    _core.Checkpoint.save(sys.argv[1], manifest, {"graphs/g/model_raw.onnx": sys.argv[2]},
                          _core.CheckpointSaveOptions(on_file_written=die))
""")


def test_staging_of_a_killed_save_is_removed_by_the_next_save_and_load(tmp_path):
    model, _ = mlp(tmp_path / "m.onnx")
    target = tmp_path / "out" / "ck"
    staged = []
    for attempt in range(2):
        died = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(target), str(model)])
        assert died.returncode == -signal.SIGKILL
        staged.append(set(target.parent.glob(".ck.tmp-*")))
    assert len(staged[0]) == 1  # what the kill left
    assert len(staged[1]) == 1 and staged[1] != staged[0]  # the next save swept it, then was killed too
    staged = list(staged[1])
    # A live owner's staging directory and one whose lock is held are kept.
    live = _core.OwnedDirectory.create(str(target.parent), ".ck.tmp-")
    locked = target.parent / f".ck.tmp-{_dead_pid()}-locked"
    locked.mkdir()
    fd = os.open(locked, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        manifest = _core.CheckpointManifest(module_name="m", graphs=[_core.CheckpointGraph(key="g")])
        _core.Checkpoint.save(str(target), manifest, {"graphs/g/model_raw.onnx": str(model)})
        assert not any(p.exists() for p in staged)
        assert Path(live.path).is_dir() and locked.is_dir()
    finally:
        os.close(fd)
        live.release()
    _core.Checkpoint.load(str(target))  # the next open sweeps what is no longer held
    assert Path(live.path).is_dir()  # this process is alive: its pid keeps it
    assert not locked.exists()


def test_save_scratch_of_a_dead_process_is_removed_and_the_cli_lists_and_cleans(tmp_path, monkeypatch, cache_dir):
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    monkeypatch.setenv("TMPDIR", str(scratch_root))
    dead = scratch_root / f"aitune-save-{_dead_pid()}-abc"
    dead.mkdir()
    (dead / "0-tune_report.json").write_text("{}")
    run_dir = cache.module_dir("m") / "g" / "b" / f"run-{_dead_pid()}-abc"
    run_dir.mkdir(parents=True)
    (run_dir / "model_raw.onnx").write_bytes(b"x" * 1000)

    listed = subprocess.run([_cli(), "cache", "list"], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert "module 'm'" in listed.stdout and str(dead) in listed.stdout and str(run_dir) in listed.stdout
    assert dead.exists() and run_dir.exists()  # list removes nothing
    cleaned = subprocess.run([_cli(), "cache", "clean"], capture_output=True, text=True)
    assert cleaned.returncode == 0, cleaned.stderr
    assert not dead.exists() and not run_dir.exists()
    assert "removed 2 stale directories" in cleaned.stdout

    # ait.save sweeps the system temp directory too.
    dead.mkdir()
    model = ait.Module(MLP().eval(), "m", strategy=_strategy())
    ait.tune(model, torch.randn(16))
    ait.save(model, tmp_path / "ck")
    assert not dead.exists()
    assert not list(scratch_root.glob("aitune-save-*"))


def test_cache_clean_on_a_read_only_cache_names_what_it_could_not_remove(tmp_path):
    """A read-only cache (a bind mount, in a user and mount namespace of its own): clean
    printed "removed 0 stale directories" and exited 0, the stale directory still there."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a read-only cache")
    root = tmp_path / "cache"
    stale = root / "m" / "g" / "b" / f"run-{_dead_pid()}-abc"
    stale.mkdir(parents=True)
    (stale / "model.onnx").write_bytes(b"x" * 100)
    script = (f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && "
              f"exec {shlex.quote(_cli())} cache clean --dir {root}")
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if "mount" in done.stderr and done.returncode != 0 and "could not remove" not in done.stderr:
        pytest.skip(f"cannot mount in a namespace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"aitune cache clean: could not remove {stale}: Read-only file system" in done.stderr, done.stderr
    assert stale.exists()


# -- 5: the console script takes any bytes -------------------------------------------------


_CHURN = textwrap.dedent("""
    import os, shutil, sys, time
    root, end = sys.argv[1], time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end and not os.path.exists(os.path.join(root, "..", "stop")):
        for j in range(40):
            os.makedirs(f"{root}/m{j:02d}/graph/backend", exist_ok=True)
        for j in range(40):
            shutil.rmtree(f"{root}/m{j:02d}", ignore_errors=True)
""")


def test_cache_clean_sweeps_the_whole_cache_while_other_processes_remove_directories(tmp_path):
    """``aitune cache clean`` walked the cache with one recursive iterator: a directory
    another process removed between its listing and its visit (a tune's clear_cache or
    sweep) ended the walk, so the rest of the cache was not looked at and its stale run
    directories stayed, with exit 0 (about 1 run in 3 while another process churns)."""
    root = tmp_path / "cache"
    root.mkdir()
    dead = 4194400  # above the kernel's PID_MAX_LIMIT (2^22): never a live process
    churn = subprocess.Popen([sys.executable, "-c", _CHURN, str(root), "60"])
    try:
        missed = []
        for attempt in range(20):
            stale = [root / name / "graph" / "backend" / f"run-{dead}-{attempt}" for name in ("z1", "z2")]
            for path in stale:
                path.mkdir(parents=True)
            done = subprocess.run([_cli(), "cache", "clean", "--dir", str(root)], capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, done.stdout + done.stderr
            missed += [str(p) for p in stale if p.exists()]
    finally:
        (tmp_path / "stop").touch()
        churn.wait(timeout=60)
    assert not missed, f"{len(missed)} stale directories left: {missed[:4]}"


def test_console_script_takes_non_utf8_file_names(tmp_path):
    model, _ = mlp(tmp_path / "m.onnx")
    latin1 = os.fsencode(tmp_path) + b"/caf\xe9.onnx"
    shutil.copy(model, latin1)
    done = subprocess.run([os.fsencode(_cli()), b"inspect", latin1], capture_output=True)
    assert done.returncode == 0, done.stderr
    assert b"caf\xe9.onnx" in done.stdout and b"TypeError" not in done.stderr


# -- 6 and 7: --samples containment, names with '=' -------------------------------------------


def _identity_model(path: Path, name: str) -> Path:
    graph = helper.make_graph([helper.make_node("Identity", [name], ["y"])], "id",
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


@pytest.mark.parametrize("name", ["../secret", "/ABS/secret", "link"])
def test_samples_never_read_outside_their_directory(tmp_path, name):
    secret = tmp_path / "secret.npy"
    np.save(secret, np.ones((2, 4), np.float32))
    samples = tmp_path / "samples"
    samples.mkdir()
    if name == "link":
        (samples / "link.npy").symlink_to(secret)
    name = name.replace("/ABS", str(tmp_path))
    model = _identity_model(tmp_path / "m.onnx", name)
    done = subprocess.run([_cli(), "tune", str(model), "--provider", "cpu", "--samples", str(samples),
                           "--quiet", "--time-cap", "0.1"], capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"model input '{name}'" in done.stderr and "outside" in done.stderr


def test_input_names_containing_equals_signs(tmp_path):
    model = _identity_model(tmp_path / "m.onnx", "a=b")
    x = tmp_path / "x=1.npy"
    np.save(x, np.full((2, 4), 3, np.float32))
    done = subprocess.run([_cli(), "run", str(model), "--input", f"a=b={x}", "--iterations", "1", "--warmup", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "input a=b: float32[2, 4]" in done.stdout
    unknown = subprocess.run([_cli(), "run", str(model), "--input", f"c={x}"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "'a=b'" in unknown.stderr


def test_a_sweep_in_another_pid_namespace_never_takes_a_directory_being_made(tmp_path):
    """A cache shared by containers: a sweeper in another pid namespace sees no process of
    the maker's pid, so only the directory's lock keeps it from the sweep. A directory of
    the swept form must therefore be locked from the moment it has that name; made by
    mkdir and then flock at its name, a sweep between the two removed it under its maker
    (who then held the lock of a deleted directory, or could not lock it at all)."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "--pid", "--fork", "true"],
                                                     capture_output=True).returncode != 0:
        pytest.skip("unshare --pid is not available here: no second pid namespace to sweep from")
    parent = tmp_path / "backend"
    parent.mkdir()
    sweeper = textwrap.dedent("""
        import os, sys, time
        from aitune import _core
        parent, stop = sys.argv[1], sys.argv[2]
        print("ready", flush=True)
        sweeps = 0
        while not os.path.exists(stop):
            _core.remove_stale_directories(parent, "run-")
            sweeps += 1
        print(sweeps, flush=True)
    """)
    stop = tmp_path / "stop"
    process = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", sweeper, str(parent), str(stop)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        lost, made = [], 0
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            try:
                owned = _core.OwnedDirectory.create(str(parent), "run-")
            except aitune.AituneIOError as e:  # removed between its mkdir and its lock
                lost.append(str(e))
                continue
            made += 1
            if not os.path.isdir(owned.path):  # removed before its maker held the lock
                lost.append(owned.path)
            owned.remove()
    finally:
        stop.touch()
        out, _ = process.communicate(timeout=60)
    sweeps = int(out.split()[-1])
    assert sweeps > 100 and made > 100, (sweeps, made)
    assert not lost, f"{len(lost)} of {made + len(lost)} directories swept while being made: {lost[:3]}"
