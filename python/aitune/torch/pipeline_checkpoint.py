"""ait.save / ait.load for any object holding ait.Modules (a pipeline, a parent nn.Module):
one checkpoint directory, with one section per ait.Module under its object path.

Layout::

    <path>/pipeline.json            the manifest: object class, and per module its object
                                    path, name, class, section directory, the sha256
                                    of the section's manifest.json and the shapes of its
                                    parameters and buffers (tensor_shapes)
    <path>/modules/<object path>/   each a complete single-module checkpoint
                                    (checkpoint.py: ONNX models, sha256 per file), which
                                    the C++ engine and ``aitune run`` load by themselves

Nothing is pickled; the whole directory is written beside the target and swapped in at
once (atomic); loading checks the structure of the object against the manifest before it
touches anything, and puts every module back as it was if any section fails to load.
An ``ait.Module`` given directly is saved and loaded as a single-module checkpoint.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from aitune import _core
from aitune.torch import checkpoint as module_checkpoint
from aitune.torch.checkpoint_structure import class_name, script_class_hint, shape_differences
from aitune.torch.module import Module, ModuleState
from aitune.torch.object_paths import MAX_DEPTH, find_ait_modules, find_modules, replaceable_aliases

logger = logging.getLogger("aitune")

MANIFEST = "pipeline.json"
MODULE_MANIFEST = "manifest.json"  # the single-module checkpoint's (docs/checkpoints.md)
FORMAT = "aitune-pipeline-checkpoint"
FORMAT_VERSION = 1
SECTIONS = "modules"
_MAX_MANIFEST_BYTES = 16 << 20


class PipelineStructureError(_core.InvalidArgumentError):
    """The object given to ``ait.load`` is not built like the one saved: a saved module is
    missing, an ait.Module is not in the checkpoint, or a module's class changed. Raised
    before anything is loaded; the object is unchanged. Raised by ``ait.save`` too, before
    anything is written, for an ait.Module a checkpoint could not hold or put back (under a
    dict key with no object path, or an item of a tuple)."""


# -- save ---------------------------------------------------------------------------------


#: The longest section directory name: file systems refuse names above 255 bytes, and the
#: save writes staging files beside it with suffixes of their own.
_MAX_SECTION_NAME = 120


def _section_directories(paths: list[str]) -> list[str]:
    """``modules/<object path>``, characters outside [A-Za-z0-9_.-] made ``_``, unique; a
    path longer than ``_MAX_SECTION_NAME`` is cut there and ends with a digest of the whole
    (a 250-character dict key failed the save with "File name too long"; the manifest maps
    each object path to its directory, so the name only has to be unique)."""
    taken, result = set(), []
    for path in paths:
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", path).strip(".") or "module"
        if len(base) > _MAX_SECTION_NAME:
            base = f"{base[:_MAX_SECTION_NAME - 17]}-{hashlib.sha256(path.encode()).hexdigest()[:16]}"
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}-{n}"
        taken.add(name)
        result.append(f"{SECTIONS}/{name}")
    return result


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_ours(path: Path) -> bool:
    """A directory holding an aitune checkpoint (pipeline or single module), or empty."""
    if not path.is_dir() or path.is_symlink():
        return False
    if not any(path.iterdir()):
        return True
    for name, key, value in ((MANIFEST, "format", FORMAT), (MODULE_MANIFEST, "format", "aitune-checkpoint")):
        try:
            if json.loads((path / name).read_text()).get(key) == value:
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swaps two directories in one step (Linux renameat2); False where it is not available."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _replace_directory(tmp: Path, target: Path, overwrite: bool = True) -> None:
    """Puts the finished ``tmp`` at ``target``: an atomic exchange where the file system
    has one (there is never a moment without a checkpoint at ``target``), else the old one
    renamed aside and put back if the second rename fails."""
    if not target.exists() or target.is_dir() and not any(target.iterdir()):
        try:
            os.rename(tmp, target)  # nothing there, or an empty directory
            _fsync_directory(target.parent)
            return
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        # another process saved a checkpoint there since the path was found free: replace
        # it as if it had been there from the start, or refuse as then
        if (refusal := _refusal_to_replace(target, target, overwrite)) is not None:
            raise refusal from None
    # What is replaced is judged once it is out of the way (a check before the swap would
    # leave a window: a second process's checkpoint, or a user's folder, put there meanwhile
    # was replaced despite overwrite=False and deleted, a session-36 probe): anything but
    # an aitune checkpoint, or any checkpoint under overwrite=False (the caller found the
    # path free), goes back where it was and the save is refused.
    if _exchange(tmp, target):
        if (refusal := _refusal_to_replace(tmp, target, overwrite)) is not None:
            _exchange(tmp, target)  # theirs back at target, ours at tmp again
            shutil.rmtree(tmp, ignore_errors=True)
            raise refusal
        shutil.rmtree(tmp)  # now the old checkpoint
    else:
        aside = target.parent / f"{_core.sibling_prefix(target.name, '.old-')}{os.getpid()}-{secrets.token_hex(8)}"
        os.rename(target, aside)
        if (refusal := _refusal_to_replace(aside, target, overwrite)) is not None:
            os.rename(aside, target)
            shutil.rmtree(tmp, ignore_errors=True)
            raise refusal
        try:
            os.rename(tmp, target)
        except BaseException:
            os.rename(aside, target)
            raise
        shutil.rmtree(aside)
    _fsync_directory(target.parent)


def _refusal_to_replace(old: Path, target: Path, overwrite: bool) -> Exception | None:
    """Why what is at ``old`` (what was at ``target``, or still is) must not be replaced, or
    None: anything but an aitune checkpoint or an empty directory (a file, a user's folder),
    or a checkpoint under ``overwrite=False``."""
    if not _is_ours(old):
        return _core.InvalidArgumentError(
            f"ait.save: '{target}' exists and is not an aitune checkpoint; refusing to replace it (put there by "
            "another process while this save was written)")
    if not overwrite and any(old.iterdir()):
        return _core.InvalidArgumentError(
            f"ait.save: '{target}' holds a checkpoint and overwrite=False (saved by another process meanwhile)")
    return None


def _tensor_shapes(module: torch.nn.Module) -> dict[str, list[int]]:
    """The shape of each parameter and buffer of the module, by name: what its config
    decided (a fresh module built with another hidden size differs here, not in its class)."""
    return {name: list(tensor.shape) for name, tensor in (*module.named_parameters(), *module.named_buffers())}


def _shape_differences(saved: Any, module: torch.nn.Module) -> str:
    """'' when ``module`` has the saved tensor shapes; else the first differences, named."""
    if not isinstance(saved, dict):
        return ""  # a checkpoint written before the shapes were recorded
    return shape_differences(saved, _tensor_shapes(module))


def _check_saveable(module: Module, where: str) -> None:
    if not module.ait_active:
        raise _core.StateError(
            f"ait.save: {where} is deactivated (its weights changed after tuning, or deactivate() was called): its "
            "graphs would compute the weights they were tuned with. Tune it again (ait.tune) to save graphs of the "
            "current weights; activate() only where the graphs' weights are the ones wanted")
    if module.ait_state is ModuleState.PASSTHROUGH:
        failure = module_checkpoint.tune_failure(module)
        if len(failure) > 600:
            failure = failure[:600] + " ..."
        raise _core.StateError(
            f"ait.save: {where} is PASSTHROUGH: its tuning failed ({failure}) and it runs eagerly, so a checkpoint "
            "has nothing of it to hold; put the module it wraps back in its place (its .ait_module) to save the "
            "others, or remove the cause and tune again"
        )
    if module.ait_state is ModuleState.INIT:
        # (a branch the tuning data never took: "tune it" read as if ait.tune had not run, a probe)
        raise _core.StateError(
            f"ait.save: {where} is INIT, not TUNED: no call reached it while ait.tune ran (the data given never took "
            "the path that calls it, or a method bypassed its forward), or it was never tuned; give ait.tune data "
            "that calls it, or put the module it wraps back in its place (its .ait_module) to save the others"
        )
    if module.ait_state is not ModuleState.TUNED:
        raise _core.StateError(
            f"ait.save: {where} is {module.ait_state.value.upper()}, not TUNED; tune it (ait.tune) before saving"
        )


#: How far ait.save looks past MAX_DEPTH for ait.Modules a checkpoint would leave out.
_DEEPER_LOOK = 4 * MAX_DEPTH


def _check_every_module_has_a_place(obj: Any, found: list, unaddressable: list) -> None:
    """Refuses (PipelineStructureError, before anything is written) an ait.Module that a
    checkpoint could not hold or put back: one under a dict key with no object path (a key
    with a dot, a float key: the walk does not reach it, so it was left out unsaid) or an item
    of a tuple (written, then refused by every ait.load: a freshly built object's tuple cannot
    take it)."""
    for where, value in unaddressable:
        held = [module for module, _ in find_ait_modules(value)]  # (value itself first, when it is one)
        if held:
            raise PipelineStructureError(
                f"ait.save: the {type(obj).__name__} holds ait.Module '{held[0].ait_name}' at {where}, a dict key "
                "that has no object path (a checkpoint names each module by its path: keys are strings without "
                "dots, or ints), so it would be left out of the checkpoint; hold it under such a key (nothing was "
                "saved)")
    # An ait.Module deeper than the walk looks (a chain of 70 wrappers) was left out, unsaid,
    # and the loaded pipeline ran it eagerly (a session-37 probe): looked for further, once.
    saved = {id(module) for module, _ in found}
    for module, location in find_ait_modules(obj, _DEEPER_LOOK):
        if id(module) not in saved:
            raise PipelineStructureError(
                f"ait.save: the {type(obj).__name__} holds ait.Module '{module.ait_name}' at '{location.path}', "
                f"{location.path.count('.') + 1} levels deep, deeper than a checkpoint's walk reaches ({MAX_DEPTH}), so "
                "it would be left out of the checkpoint and run eagerly after ait.load; hold it closer to the "
                "object (nothing was saved)")
    for module, location in found:
        if isinstance(location.parent, tuple):
            raise PipelineStructureError(
                f"ait.save: '{location.path}' (ait.Module '{module.ait_name}') is an item of a tuple, where ait.load "
                "cannot put an ait.Module into a freshly built object; hold the modules in a list (as ait.wrap "
                "asks), then save (nothing was saved)")


def save(obj: Any, path: str | os.PathLike, *, overwrite: bool = True,
         on_file_written: Callable[[str, int], None] | None = None) -> Path:
    """Saves every ait.Module that ``obj`` holds as one checkpoint directory at ``path``.

    ``obj``: an ait.Module (saved as a single-module checkpoint, as
    ``aitune.torch.checkpoint.save``), or any object holding ait.Modules: attributes of
    plain objects (a diffusers-style pipeline), children of an nn.Module, items of lists,
    dicts (keys: strings without dots, or ints), ModuleLists, ModuleDicts. Every one must be
    TUNED (and active); one in a tuple or under another dict key is refused
    (``PipelineStructureError``): ait.load could not put it back, or it would be left out.

    Written atomically: on any failure a checkpoint already at ``path`` stays as it was.
    ``overwrite=False`` refuses an existing checkpoint; what is not an aitune checkpoint
    (a file, a directory of other files) is never replaced.

    ``on_file_written(relative_path, files_written)`` after each file is flushed
    (progress; an exception raised there aborts the save).

    Returns the checkpoint directory. Raises ``aitune.StateError`` (a module not tuned),
    TypeError (no ait.Module in obj), ``aitune.InvalidArgumentError`` (a path that is not
    a checkpoint),
    and what the single-module save raises (``CheckpointStructureError``...).
    """
    if not os.fspath(path):
        raise _core.InvalidArgumentError("ait.save: the path is empty; name the checkpoint directory to write")
    if isinstance(obj, Module):
        _check_saveable(obj, f"ait.Module '{obj.ait_name}'")
        return module_checkpoint.save(obj, path, overwrite=overwrite, on_file_written=on_file_written)
    start = time.perf_counter()
    unaddressable: list = []  # the dict items the walk passes without an object path
    found = [(m, place) for m, place in find_modules(obj, MAX_DEPTH, unaddressable) if isinstance(m, Module)]
    if not found:
        raise TypeError(
            f"ait.save takes an ait.Module or an object holding ait.Modules; the {type(obj).__name__} holds no "
            "ait.Module (wrap the modules to tune with ait.wrap or ait.Module first)"
        )
    _check_every_module_has_a_place(obj, found, unaddressable)
    for module, location in found:
        _check_saveable(module, f"'{location.path}' (ait.Module '{module.ait_name}')")
    if not any(module_checkpoint.runs_a_graph(module) for module, _ in found):
        raise _core.InvalidArgumentError(
            f"ait.save: every graph of every ait.Module of the {type(obj).__name__} runs eagerly "
            f"({', '.join(repr(module.ait_name) for module, _ in found)}: see their ait_backends); a checkpoint needs "
            "at least one graph in ONNX Runtime or torch.compile, so there is nothing to save"
        )
    target = Path(path).absolute()
    if outer := _core.Checkpoint.enclosing_checkpoint(str(target)):
        raise _core.InvalidArgumentError(
            f"ait.save: refusing to save a checkpoint to '{target}': it lies inside the checkpoint '{outer}', and a "
            f"save over that one replaces its directory whole, removing this one; save it outside '{outer}' (beside it)"
        )
    if target.exists() or target.is_symlink():
        if target.is_symlink():
            raise _core.InvalidArgumentError(
                f"ait.save: '{target}' is a symbolic link (to '{os.readlink(target)}'); a save replaces its path "
                "whole, so save to the directory it points to instead")
        if not _is_ours(target):
            raise _core.InvalidArgumentError(
                f"ait.save: '{target}' exists and is not an aitune checkpoint; refusing to replace it"
            )
        if not overwrite and any(target.iterdir()):
            raise _core.InvalidArgumentError(f"ait.save: '{target}' holds a checkpoint and overwrite=False")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file on the way (FileExistsError, NotADirectoryError), no permission
        raise _core.AituneIOError(f"ait.save: cannot create the directory '{target.parent}': {error}") from None
    # the staging directory is owned (pid in its name, flock held) like the single-module
    # save's, so that saves of other processes sweep it only once this process is gone;
    # those of processes that died (a kill -9 mid-save) are swept here
    staging_prefix, aside_prefix = _core.sibling_prefix(target.name, ".tmp-"), _core.sibling_prefix(target.name, ".old-")
    for prefix in (staging_prefix, aside_prefix):
        _core.remove_stale_directories(str(target.parent), prefix)
    owned = _core.OwnedDirectory.create(str(target.parent), staging_prefix)
    tmp = Path(owned.path)
    try:
        sections = _section_directories([location.path for _, location in found])
        entries, written = [], 0

        def progress(section: str):
            def written_one(relative: str, _: int) -> None:
                nonlocal written
                written += 1
                if on_file_written is not None:
                    on_file_written(f"{section}/{relative}", written)
            return written_one

        for (module, location), section in zip(found, sections, strict=True):
            # a module kept eager (performance validation) is a section of eager graphs: the
            # pipeline loads as it was tuned, that module eager
            module_checkpoint.save(module, tmp / section, on_file_written=progress(section), eager_only=True)
            entries.append({
                "path": location.path,
                "name": module.ait_name,
                "module_class": class_name(type(module.ait_module)),
                "directory": section,
                "manifest_sha256": _sha256(tmp / section / MODULE_MANIFEST),
                "tensor_shapes": _tensor_shapes(module.ait_module),
                # the module's other places (one module shared): a load into an object that
                # holds another module there says so (it stays eager, unwrapped)
                "aliases": [alias.path for alias in location.aliases],
            })
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "object_class": class_name(type(obj)),
                    "torch_version": torch.__version__, "modules": entries}
        with open(tmp / MANIFEST, "w") as f:
            f.write(json.dumps(manifest, indent=2))
            f.flush()
            os.fsync(f.fileno())
        if on_file_written is not None:
            on_file_written(MANIFEST, written + 1)
        for directory in (tmp / SECTIONS, tmp):
            _fsync_directory(directory)
        _replace_directory(tmp, target, overwrite)
    except BaseException:
        owned.remove()
        raise
    owned.release()  # the lock went with the directory, now the checkpoint (or removed)
    logger.info("ait.save: %d ait.Modules of %s (%s) saved to %s in %.3f s", len(found), type(obj).__name__,
                ", ".join(location.path for _, location in found), target, time.perf_counter() - start)
    return target


# -- load ---------------------------------------------------------------------------------


def _corrupt(where: str, message: str) -> _core.CheckpointCorruptError:
    return _core.CheckpointCorruptError(f"{where}: {message}")


def _read_manifest(directory: Path) -> dict:
    where = f"ait.load: checkpoint '{directory}'"
    file = directory / MANIFEST
    try:
        if file.stat().st_size > _MAX_MANIFEST_BYTES:
            raise _corrupt(where, f"{MANIFEST} is larger than {_MAX_MANIFEST_BYTES} bytes")
        data = json.loads(file.read_text())
    except (ValueError, RecursionError, UnicodeDecodeError) as error:
        raise _corrupt(where, f"{MANIFEST} is not JSON: {error}") from None
    except OSError as error:
        raise _core.AituneIOError(f"{where}: cannot read {MANIFEST}: {error}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _corrupt(where, f"{MANIFEST} is not an aitune pipeline checkpoint manifest")
    version = data.get("format_version")
    if type(version) is not int:
        raise _corrupt(where, f"format_version must be an integer, got {version!r:.40}")
    if not 1 <= version <= FORMAT_VERSION:
        raise _corrupt(where, f"format_version {version!r} is not supported (this aitune reads 1..{FORMAT_VERSION})"
                              + ("; it was written by a newer aitune" if version > FORMAT_VERSION else ""))
    modules = data.get("modules")
    if not isinstance(modules, list) or not modules:
        raise _corrupt(where, "'modules' must be a non-empty list")
    paths = set()
    for i, entry in enumerate(modules):
        for field in ("path", "name", "module_class", "directory", "manifest_sha256"):
            if not isinstance(entry, dict) or not isinstance(entry.get(field), str) or not entry[field]:
                raise _corrupt(where, f"modules[{i}].{field} is missing or not a non-empty string")
        shapes = entry.get("tensor_shapes")
        if shapes is not None and not (isinstance(shapes, dict) and all(
                isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape) for shape in shapes.values())):
            raise _corrupt(where, f"modules[{i}].tensor_shapes must map names to lists of sizes")
        section = entry["directory"]
        parts = section.split("/")
        if len(parts) != 2 or parts[0] != SECTIONS or parts[1] in ("", ".", "..") or "\\" in section:
            raise _corrupt(where, f"modules[{i}].directory '{section}' is not {SECTIONS}/<name>")
        if entry["path"] in paths:
            raise _corrupt(where, f"modules[{i}].path '{entry['path']}' is listed twice")
        paths.add(entry["path"])
        aliases = entry.get("aliases", [])
        if not (isinstance(aliases, list) and all(isinstance(a, str) for a in aliases)):
            raise _corrupt(where, f"modules[{i}].aliases must be a list of object paths")
    if not isinstance(data.get("object_class"), str):
        raise _corrupt(where, "'object_class' is missing")
    return data


def _inner_class(module: torch.nn.Module) -> str:
    return class_name(type(module.ait_module if isinstance(module, Module) else module))


def _check_structure(obj: Any, manifest: dict, where: str) -> list[tuple[dict, Any, Any]]:
    """(entry, module now at its path, its location) per saved module; PipelineStructureError
    listing every difference otherwise."""
    problems = []
    if manifest["object_class"] != class_name(type(obj)):
        problems.append(f"it was saved from a {manifest['object_class']}, this is a {class_name(type(obj))}"
                        f"{script_class_hint(manifest['object_class'], class_name(type(obj)))}")
    found = {}
    for module, location in find_modules(obj, MAX_DEPTH):
        found[location.path] = (module, location)
        for alias in location.aliases:  # a shared module: a saved path may be any of its places
            found.setdefault(alias.path, (module, alias))
    saved_paths = {entry["path"] for entry in manifest["modules"]}
    plan = []
    for entry in manifest["modules"]:
        if entry["path"] not in found:
            problems.append(f"'{entry['path']}' (a {entry['module_class']}) is missing")
            continue
        module, location = found[entry["path"]]
        if _inner_class(module) != entry["module_class"]:
            problems.append(f"'{entry['path']}' was a {entry['module_class']}, is a {_inner_class(module)}"
                            f"{script_class_hint(entry['module_class'], _inner_class(module))}")
            continue
        shapes = _shape_differences(entry.get("tensor_shapes"), module.ait_module if isinstance(module, Module)
                                    else module)
        if shapes:
            problems.append(f"'{entry['path']}' has other parameter or buffer shapes (built with another "
                            f"config): {shapes}")
            continue
        if location.parent is None:
            problems.append(f"'{entry['path']}' is the object itself")
            continue
        if isinstance(location.parent, tuple) and not isinstance(module, Module):
            problems.append(f"'{entry['path']}' is an item of a tuple, where no ait.Module can be put")
            continue
        if isinstance(module, Module) and any(planned is module for _, planned, _ in plan):
            problems.append(f"'{entry['path']}' holds the ait.Module '{module.ait_name}' of another saved path; "
                            "the checkpoint has a module of its own for each")
            continue
        plan.append((entry, module, location))
    places: dict[int, list[str]] = {}
    for path, (module, _) in found.items():
        if isinstance(module, Module):
            places.setdefault(id(module), []).append(path)
    for path, (module, _) in found.items():
        if isinstance(module, Module) and path == places[id(module)][0] and not saved_paths & set(places[id(module)]):
            problems.append(f"ait.Module '{module.ait_name}' at '{path or '<the object>'}' is not in the checkpoint")
    if problems:
        raise PipelineStructureError(
            f"{where} does not fit this {type(obj).__name__}: " + "; ".join(problems)
            + f" (saved: {', '.join(sorted(saved_paths))}); nothing was loaded"
        )
    return plan


def _verify_section(directory: Path, entry: dict, where: str) -> Path:
    section = directory / entry["directory"]
    try:
        digest = _sha256(section / MODULE_MANIFEST)
    except OSError as error:
        raise _corrupt(where, f"section '{entry['directory']}' of '{entry['path']}' cannot be read: {error}") from None
    if digest != entry["manifest_sha256"]:
        raise _corrupt(where, f"section '{entry['directory']}' of '{entry['path']}': its {MODULE_MANIFEST} sha256 is "
                              f"{digest}, the manifest says {entry['manifest_sha256']}")
    return section


def _module_name(directory: Path) -> str:
    """The name a single-module checkpoint was saved under (its manifest's module_name)."""
    try:
        data = json.loads((directory / MODULE_MANIFEST).read_text())
        name = data.get("module_name") if isinstance(data, dict) else None
    except (OSError, ValueError, RecursionError, UnicodeDecodeError):
        name = None  # the checkpoint's own load says what is wrong
    return name if isinstance(name, str) and name else ""


class _Replaced(Exception):
    """The checkpoint directory was swapped for another version while it was being read."""


def _identity(directory: Path) -> tuple[int, int, int] | None:
    """Which directory the path names now: a save swaps in a new one, whose inode number
    may be the one of the version it removed a moment before (ext4), but not its ctime
    (a probe loaded one section of each of two saves, silently)."""
    try:
        st = os.stat(directory)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


def _say_own_eager_fallback_kept(module: Module, eager_fallback: bool) -> None:
    """``eager_fallback=True`` is for the modules a load wraps; an ait.Module loaded into keeps
    its own. Said, where they differ: it was ignored silently, and the GraphNotRecordedError of
    the next call not recorded advised passing it to ait.load (a session-37 probe)."""
    if eager_fallback and not module._ait_calls.eager_fallback:
        logger.warning("ait.load: eager_fallback=True applies to the modules this load wraps; ait.Module '%s' keeps "
                       "its own eager_fallback=False (calls no loaded graph covers are refused): build it with "
                       "ait.Module(..., eager_fallback=True) to run them eagerly", module.ait_name)


def _load_once(obj: Any, directory: Path, device_map: Any, identity, eager_fallback: bool = False) -> list:
    """One load of every section into ``obj``; on any error, or when the path was swapped
    for another version meanwhile (``_Replaced``: the sections read may be of two
    versions), every module is put back as it was and nothing is wrapped."""
    where = f"ait.load: checkpoint '{directory}'"
    manifest = _read_manifest(directory)
    plan = _check_structure(obj, manifest, where)
    if isinstance(device_map, Mapping):  # a key naming no module loaded (a typo) would place nothing, unsaid
        names = [module.ait_name if isinstance(module, Module) else entry["name"] for entry, module, _ in plan]
        if unknown := [key for key in device_map if key not in names]:
            raise _core.InvalidArgumentError(
                f"ait.load: device_map names {', '.join(map(repr, unknown))}, which is no ait.Module this load "
                f"loads; they are: {', '.join(map(repr, names))}; nothing was loaded")
    sections = [_verify_section(directory, entry, where) for entry, _, _ in plan]
    snapshots, installs = [], []
    try:
        for (entry, module, location), section in zip(plan, sections, strict=True):
            if isinstance(module, Module):
                _say_own_eager_fallback_kept(module, eager_fallback)
                snapshots.append(module_checkpoint.LoadSnapshot(module))
                module_checkpoint.load(module, section, device_map)
            else:
                training = [(m, m.training) for m in module.modules()]
                wrapper = Module(module, entry["name"], eager_fallback=eager_fallback)
                installs.append((location, wrapper, training))
                module_checkpoint.load(wrapper, section, device_map)
        if _identity(directory) != identity:
            raise _Replaced()
    except BaseException:
        for snapshot in snapshots:
            snapshot.restore()
        for _, _, training in installs:  # the plain modules were never replaced; their modes go back
            for m, mode in training:
                m.training = mode
        raise
    planned = {entry["path"] for entry, _, _ in plan}
    wrapped = [wrapper.ait_module for _, wrapper, _ in installs]
    for location, wrapper, _ in installs:
        location.replace(wrapper)
        for alias in replaceable_aliases(location, wrapped):  # the module's other places, as ait.wrap does
            if alias.path not in planned and alias.current() is wrapper.ait_module:
                alias.replace(wrapper)
    return plan


def load(obj: Any, path: str | os.PathLike, device_map: Any = None, disable_external_logging: bool = False,
         eager_fallback: bool = False) -> Any:
    """Loads a checkpoint written by ``ait.save`` into ``obj`` and returns it.

    - A pipeline checkpoint (``pipeline.json``) into a freshly built object of the same
      structure: every saved module is restored at its object path; a plain nn.Module
      there is wrapped in an ait.Module of the saved name, an ait.Module there is loaded
      into. Refused with ``PipelineStructureError`` before anything is loaded when the
      object differs (a saved module missing, an ait.Module not in the checkpoint, a
      changed class, another object class). A module the object holds at several places
      (shared) gets its wrapper at each, as ``ait.wrap`` puts it. When a section fails to load (damaged,
      ``CheckpointCorruptError``), every module is put back as it was and nothing is
      wrapped.
    - A single-module checkpoint into an ait.Module (``aitune.torch.checkpoint.load``), or
      into a plain nn.Module, which is then wrapped in an ait.Module of the saved name
      and the wrapper returned.

    ``device_map``: as ``aitune.torch.checkpoint.load`` (a device, or a dict of module
    name to device). ``eager_fallback``: of the ait.Modules this load wraps around plain
    modules (as ``ait.Module(..., eager_fallback=True)``: calls no loaded graph covers run
    eagerly with a warning instead of raising); an ait.Module already there keeps its own.
    ``disable_external_logging`` is accepted for AITune's scripts;
    loading exports nothing, so there is nothing to silence.
    """
    del disable_external_logging  # nothing external runs while loading
    if not os.fspath(path):
        raise _core.InvalidArgumentError("ait.load: the path is empty; name the checkpoint directory to read")
    directory = Path(path)
    if not (directory / MANIFEST).is_file():
        if isinstance(obj, Module):
            _say_own_eager_fallback_kept(obj, eager_fallback)
            return module_checkpoint.load(obj, directory, device_map)
        if isinstance(obj, torch.nn.Module):
            wrapper = Module(obj, _module_name(directory) or None, eager_fallback=eager_fallback)
            return module_checkpoint.load(wrapper, directory, device_map)
        if not directory.exists():
            raise _core.AituneIOError(f"ait.load: checkpoint '{directory}' does not exist")
        if not directory.is_dir():
            raise _core.InvalidArgumentError(f"ait.load: '{directory}' is a file, not a checkpoint directory")
        if (directory / MODULE_MANIFEST).is_file():
            raise _core.InvalidArgumentError(
                f"ait.load: '{directory}' holds one module: a single-module checkpoint loads into an nn.Module "
                f"(or an ait.Module), not a {type(obj).__name__}")
        raise _core.CheckpointCorruptError(
            f"ait.load: '{directory}' has no {MANIFEST}: it is not a pipeline checkpoint (or one missing its "
            f"manifest), and a single-module checkpoint loads into an nn.Module, not a {type(obj).__name__}"
        )
    start = time.perf_counter()
    for attempt in range(1, module_checkpoint.LOAD_ATTEMPTS + 1):
        identity = _identity(directory)
        try:
            plan = _load_once(obj, directory, device_map, identity, eager_fallback)
            break
        except _Replaced:
            pass
        except _core.AituneError:
            # files read after a concurrent save swapped the checkpoint in may belong to the
            # next version: only a failure of the version read from the start is the checkpoint's
            if identity is None or _identity(directory) == identity:
                raise
        if attempt == module_checkpoint.LOAD_ATTEMPTS:
            raise _core.AituneIOError(
                f"ait.load: checkpoint '{directory}' was replaced by concurrent saves {attempt} times while it was "
                "being loaded; load it when the saves are done"
            )
        logger.info("ait.load: '%s' was replaced by another save while loading; loading it again", directory)
    logger.info("ait.load: %d ait.Modules of %s loaded from %s in %.3f s", len(plan), type(obj).__name__, directory,
                time.perf_counter() - start)
    found = find_modules(obj, MAX_DEPTH)  # the object as loaded, for both warnings
    _warn_training_modules(obj, found, directory)
    _warn_unshared(obj, found, plan, directory)
    return obj


def _warn_unshared(obj: Any, found: list, plan: list, directory: Path) -> None:
    """Names the places where the saved object held the module of a saved path (one module
    shared, ``entry["aliases"]``) and the object loaded into holds another: that one is
    not wrapped and runs eagerly (a pipeline built with a copy there loaded silently half
    tuned)."""
    places: dict[str, Any] = {}
    for module, location in found:
        for place in (location, *location.aliases):
            places.setdefault(place.path, module)
    unshared = [f"'{alias}' (the module of '{entry['path']}' when saved)" for entry, _, _ in plan
                for alias in entry.get("aliases", []) if places.get(alias) is not places.get(entry["path"])]
    if unshared:
        logger.warning("ait.load: the %s saved in %s held one module at several places; here %s another module, "
                       "left as it is (eager, not loaded): share the module as when it was saved, or wrap and tune "
                       "that one too", type(obj).__name__, directory,
                       ", ".join(unshared[:5]) + (" hold" if len(unshared) > 1 else " holds"))


def _warn_training_modules(obj: Any, found: list, directory: Path) -> None:
    """Names the modules of a loaded pipeline left in training mode: each loaded ait.Module
    is put in the mode it was tuned in, but the code around them runs as the object is, and a
    freshly built model is in training mode (a T5 with its encoder tuned generated other
    tokens after the load: its decoder's Dropout ran). Said, not changed: the modes of the
    user's own modules are theirs to set."""
    inside = {id(m) for wrapper, _ in found if isinstance(wrapper, Module) for m in wrapper.modules()}
    owner = type(obj).__name__
    training = [(m, f"{owner}.{location.path}" if location.path else owner) for m, location in found
                if m.training and id(m) not in inside and any(not isinstance(c, Module) for c in m.modules())]
    below = {id(c) for m, _ in training for c in m.modules() if c is not m}
    top = [path for m, path in training if id(m) not in below]
    if top:
        logger.warning("ait.load: the loaded ait.Modules run in the mode they were tuned in, but %s %s in training "
                       "mode (a freshly built model is): Dropout and the like run there around them; call .eval() on "
                       "%s as before tuning (checkpoint %s)", ", ".join(top[:5]) +
                       (f" and {len(top) - 5} more" if len(top) > 5 else ""),
                       "is" if len(top) == 1 else "are", "it" if len(top) == 1 else "them", directory)
