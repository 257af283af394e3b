"""Where tuning artefacts live: <cache>/<module>/<graph>/<backend key>/run-<pid>-<random>/.

Several processes may tune modules of the same name with one cache directory at once:
each tune writes into a directory of its own (``tune_dir``) that its process holds
locked while it lives, so what a tune exports and then reads back is what it wrote.
Directories of processes that died are removed by the next tune of that graph and
backend (lock and pid decide, never age); ``aitune cache list|clean`` lists and removes
them too (docs/checkpoints.md, "Many processes, one cache")."""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from aitune import _core

MODULE_NAME_FILE = ".module_name"  # the module's name, recorded and checked
RUN_PREFIX = "run-"  # tune_dir's prefix; src/cli/cache.cpp knows it too
_MAX_ENCODED = 200  # a directory name stays well under the usual 255 bytes

# The run directories this process holds, locked until it exits (their sessions may be
# saved at any time: ait.save copies the model a session was created from).
_held: list = []


@atexit.register
def _release_held() -> None:
    """At exit the locks go (a sweep of a later process takes the directories) and the
    engine objects with them, before the interpreter tears the extension down."""
    while _held:
        _held.pop().release()


# What a file system says when it cannot take what is written: the cache's location is the
# problem (full, over quota, read-only, a file where a directory belongs), not the model.
# ENOENT and EISDIR: a directory of the cache removed while a tune wrote into it, or a
# directory where one of its files belongs (both seen as raw FileNotFoundError /
# IsADirectoryError from a tune).
_FILE_SYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                                 errno.EIO, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ENOENT,
                                 errno.EISDIR})


# Those that say where a write went, not what was written: the only ones looked for in the
# causes of another library's error (torch's exporter may have handled an EEXIST or ENOTDIR
# of its own on the way to a failure that is the model's).
WRITE_REFUSALS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


def file_system_error(error: BaseException, errnos: frozenset = _FILE_SYSTEM_ERRNOS) -> OSError | None:
    """The file system's refusal (an errno of ``errnos``) among ``error`` and its causes
    (torch's exporter wraps the OSError of its write), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and not isinstance(error, _core.AituneError) and error.errno in errnos:
            return error
        error = error.__cause__ or error.__context__
    return None


def io_error(what: str, path: Path, error: OSError) -> _core.AituneIOError:
    """``AituneIOError`` naming what could not be written where, and why."""
    why = error.strerror or str(error)
    if error.filename and os.fspath(error.filename) != os.fspath(path):
        why += f" ('{os.fsdecode(error.filename)}')"
    return _core.AituneIOError(
        f"aitune cache: cannot write {what} in '{path}': {why}; the cache needs a writable directory with free "
        f"space: fix that or set AITUNE_CACHE_DIR to another (now {cache_root()})")


@contextlib.contextmanager
def writing(what: str, path: Path) -> Iterator[None]:
    """Turns the file system's refusal inside the block into ``io_error``."""
    try:
        yield
    except OSError as error:
        if (refusal := file_system_error(error)) is None:
            raise
        raise io_error(what, path, refusal) from error


def cache_root() -> Path:
    """``$AITUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/aitune``, else ``~/.cache/aitune``."""
    return Path(_core.default_cache_root())


def encode_name(name: str) -> str:
    """A module name as one directory name, injectively: ``A-Z a-z 0-9 . -`` stay (a
    leading ``.`` does not), every other byte of its UTF-8 becomes ``_XX`` (``_`` too),
    so ``coll/x`` (``coll_2Fx``) and ``coll_x`` (``coll_5Fx``) differ. A name whose
    encoding is too long for a directory name keeps a prefix and a sha256 of the whole
    name (``~`` marks it; no short encoding has one), and the name is recorded beside
    (``MODULE_NAME_FILE``) and checked."""
    out = []
    for i, byte in enumerate(name.encode("utf-8", "surrogatepass")):
        char = chr(byte)
        keep = char.isascii() and (char.isalnum() or char == "-" or (char == "." and i > 0))
        out.append(char if keep else f"_{byte:02X}")
    encoded = "".join(out) or "_"
    if len(encoded) > _MAX_ENCODED:
        encoded = encoded[:100] + "~" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return encoded


def module_dir(module_name: str) -> Path:
    """The module's directory in the cache (created), its name recorded in it; a
    directory that records another name (a hash collision, a directory someone else
    made) or a record that is no name (a directory, bytes that are not UTF-8) is an
    ``InvalidArgumentError``.

    The record is published whole: written to a temporary file and linked to its name
    (``link`` never replaces), so a process reading it while another creates it never
    sees it half written. An empty record (what a process killed between ``open`` and
    ``write`` left before records were published so) is taken over: only this name maps
    to this directory (``encode_name`` is injective)."""
    path = cache_root() / encode_name(module_name)
    recorded = path / MODULE_NAME_FILE
    with writing(f"the directory of ait.Module '{module_name}'", path):
        path.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(recorded) or _recorded_name(recorded, module_name) == "":
            _publish_name(path, recorded, module_name)
    found = _recorded_name(recorded, module_name)
    if found != module_name:
        raise _core.InvalidArgumentError(
            f"aitune cache: the directory {path} for ait.Module '{module_name}' belongs to the module '{found}' "
            f"(see {recorded}); remove it or use another AITUNE_CACHE_DIR"
        )
    return path


def _recorded_name(recorded: Path, module_name: str) -> str:
    """The name ``recorded`` holds; ``InvalidArgumentError`` when it holds none."""
    try:
        return recorded.read_bytes().decode("utf-8", "surrogatepass")
    except (UnicodeDecodeError, IsADirectoryError) as error:
        raise _core.InvalidArgumentError(
            f"aitune cache: {recorded}, the record of which module the directory belongs to, holds no module name "
            f"({error}); remove that directory (it is not ait.Module '{module_name}''s as aitune made it) or use "
            f"another AITUNE_CACHE_DIR") from None


# What link() says on a file system that has no hard links (FAT, some network and FUSE ones).
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK})


def _publish_name(path: Path, recorded: Path, module_name: str) -> None:
    """``recorded`` holding ``module_name``, or left as another process made it first. The
    name is written in a run directory of this process (``staging_dir``: what a kill
    leaves there is swept)."""
    with staging_dir(path) as staging:
        tmp = staging / MODULE_NAME_FILE
        tmp.write_bytes(module_name.encode("utf-8", "surrogatepass"))
        try:
            os.link(tmp, recorded)
        except FileExistsError:  # another process's, whole; or an empty one left by a crash
            if recorded.is_file() and recorded.stat().st_size == 0:
                os.replace(tmp, recorded)
        except OSError as error:
            if error.errno not in _NO_HARD_LINKS:
                raise
            # A file system without hard links: created in place; a reader that sees it
            # empty meanwhile takes it over with the same name (module_dir).
            try:
                with open(recorded, "xb") as f:
                    f.write(module_name.encode("utf-8", "surrogatepass"))
            except FileExistsError:
                pass


def tune_dir(module_name: str, graph_key: str, backend_key: str) -> Path:
    """A new directory for one tune of one graph by one backend, owned by this process
    (locked until it exits). Run directories of processes that are gone are removed
    first."""
    parent = module_dir(module_name) / graph_key / backend_key
    with writing("a tune directory", parent):
        parent.mkdir(parents=True, exist_ok=True)
    _core.remove_stale_directories(str(parent), RUN_PREFIX)
    owned = _owned_run_directory(parent)
    _held.append(owned)
    return Path(owned.path)


def _owned_run_directory(parent: Path):
    """``OwnedDirectory`` of a run in ``parent``; the engine's refusal (a cache another user
    made, read-only for this one) as the cache's refusal, saying what to do."""
    try:
        return _core.OwnedDirectory.create(str(parent), RUN_PREFIX)
    except _core.AituneIOError as error:
        raise _core.AituneIOError(
            f"aitune cache: {error}; the cache needs a writable directory with free space: fix that or set "
            f"AITUNE_CACHE_DIR to another (now {cache_root()})") from error


def clear_module(module_name: str) -> None:
    """Removes the module's cached artefacts, except the run directories that live
    processes (this one included) hold: their sessions may still be saved."""
    path = cache_root() / encode_name(module_name)
    if not path.is_dir():
        return
    _core.remove_stale_directories(str(path), RUN_PREFIX)
    for graph in (entry for entry in _entries(path) if entry.is_dir() and not entry.name.startswith(RUN_PREFIX)):
        _core.remove_stale_directories(str(graph), RUN_PREFIX)
        for entry in _entries(graph):
            if entry.name.startswith(RUN_PREFIX):
                continue  # a live process's report being written (staging_dir)
            if not entry.is_dir():
                _unlink(entry)
                continue
            _core.remove_stale_directories(str(entry), RUN_PREFIX)
            for inner in _entries(entry):
                if inner.name.startswith(RUN_PREFIX):
                    continue  # held by a live process (the stale ones are gone)
                shutil.rmtree(inner, ignore_errors=True) if inner.is_dir() else _unlink(inner)
            _remove_if_empty(entry)
        _remove_if_empty(graph)


def _entries(path: Path) -> list[Path]:
    """The entries of ``path``; none when another process removed it meanwhile (two
    processes clearing one module at once)."""
    try:
        return list(path.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _unlink(path: Path) -> None:
    """Removes the file ``path``; one gone meanwhile, or a directory another process made
    there meanwhile (a tune's), stays as it is."""
    try:
        path.unlink()
    except (FileNotFoundError, IsADirectoryError):
        pass


def _remove_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:  # not empty: a live process's run directory is inside
        pass


@contextlib.contextmanager
def staging_dir(parent: Path) -> Iterator[Path]:
    """A run directory of this process in ``parent`` (created) while the block runs, for
    files to be renamed into ``parent``: ``clear_module`` and ``aitune cache clean`` leave
    it while this process lives, and sweep it once it died. Those of dead processes are
    removed first."""
    parent.mkdir(parents=True, exist_ok=True)
    _core.remove_stale_directories(str(parent), RUN_PREFIX)
    owned = _owned_run_directory(parent)
    try:
        yield Path(owned.path)
    finally:
        owned.remove()


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A scratch directory ``<system temp>/<prefix><pid>-<random>`` owned by this process
    while the block runs, removed after it. Those a process that died left behind (a
    kill -9 during ``ait.save``) are removed first; a live process's never are."""
    parent = tempfile.gettempdir()
    _core.remove_stale_directories(parent, prefix)
    owned = _core.OwnedDirectory.create(parent, prefix)
    try:
        yield Path(owned.path)
    finally:
        owned.remove()
