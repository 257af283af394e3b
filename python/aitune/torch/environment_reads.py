"""The process environment a forward reads, recorded while ait.tune records and watched
after: a tuned module never computes another model than its forward without saying so.

An export runs forward's Python once: ``x * float(os.environ.get("SCALE", "1"))`` becomes a
multiplication by the constant 1.0, ``if os.getenv("FAST_PATH"):`` a graph of one branch.
Once the variable changes (``os.environ["SCALE"] = "3"``), eager PyTorch computes another
model than the graph. The variables are found by reading, not by guessing from the code:
while ait.tune records a module, every key ``os.environ`` is asked for (``os.environ[k]``,
``.get``, ``in``, ``os.getenv``) on the recording thread, from code outside torch and aitune,
is kept (``recording_environment_reads``); forward's helpers and a library's code it calls
(transformers) count, torch's own reads of its settings do not.

They are watched like the plain attributes (baked_attributes.py): the C++ half compares the
object ``os.environ``'s own dict holds under each key (bytes on POSIX) by identity per call;
a variable set to another value, set where it was unset, or removed makes the calls run
eagerly, with a warning naming it, until it is back or the module is tuned again. A
checkpoint stores them as paths ``os.environ['SCALE']`` beside the attributes, and a module
loaded where one differs runs such calls eagerly too. Not seen: ``os.putenv`` (which
bypasses ``os.environ``) and reads of the whole mapping (``dict(os.environ)``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Iterator

#: Stands for "the variable is unset" in a checkpoint's values and in messages.
UNSET = "<unset>"
_PREFIX = "os.environ["

_lock = threading.Lock()
_active: list[tuple[int, set[str]]] = []  # (thread ident, the keys read) per recording under way
_original_getitem = None
#: Files whose frames are not the reader's: os and the mapping bases (get, __contains__).
_PLUMBING = {os.path.normcase(os.__file__), os.path.normcase(sys.modules["_collections_abc"].__file__)}


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """Folders whose reads are the libraries' own settings, not a model's (torch, aitune);
    found once, not per read."""
    import torch

    import aitune

    return tuple(os.path.dirname(os.path.normcase(m.__file__)) + os.sep for m in (torch, aitune))


def _reader_is_model_code() -> bool:
    """Whether the first frame outside os and the mapping bases is a model's code."""
    frame = sys._getframe(2)
    roots = _library_roots()
    while frame is not None:
        name = os.path.normcase(frame.f_code.co_filename)
        if name not in _PLUMBING:
            return not name.startswith(roots)
        frame = frame.f_back
    return False


def _recording_getitem(self, key):
    if isinstance(key, str):
        me = threading.get_ident()
        keeping = [keys for ident, keys in list(_active) if ident == me]
        if keeping and _reader_is_model_code():
            for keys in keeping:
                keys.add(key)
    return _original_getitem(self, key)


@contextlib.contextmanager
def recording_environment_reads(into: set[str]) -> Iterator[None]:
    """Adds to ``into`` each environment variable model code reads on this thread inside
    the block (``os.environ`` asked for it, present or not). Nests, and threads record
    their own reads only."""
    global _original_getitem
    entry = (threading.get_ident(), into)
    with _lock:
        if not _active:
            _original_getitem = type(os.environ).__getitem__
            type(os.environ).__getitem__ = _recording_getitem
        _active.append(entry)
    try:
        yield
    finally:
        with _lock:
            _active.remove(entry)
            if not _active:
                type(os.environ).__getitem__ = _original_getitem


def environment_path(key: str) -> str:
    """The path a variable is named by in messages and checkpoints: ``os.environ['SCALE']``."""
    return f"{_PREFIX}{key!r}]"


def environment_key(path: str) -> str | None:
    """The variable ``path`` names (``environment_path``), or None for another path."""
    if not (path.startswith(_PREFIX) and path.endswith("]")):
        return None
    inner = path[len(_PREFIX):-1]
    if len(inner) < 2 or inner[0] not in "'\"" or inner[-1] != inner[0]:
        return None
    import ast

    try:
        key = ast.literal_eval(inner)
    except (ValueError, SyntaxError):
        return None
    return key if isinstance(key, str) else None


def environment_slot(key: str) -> tuple[dict, object]:
    """(the dict ``os.environ`` keeps its values in, the key it keeps ``key`` under): what
    the C++ half compares per call (``os.environ["K"] = v`` stores a new object there)."""
    return os.environ._data, os.environ.encodekey(key)  # noqa: SLF001  (os's own, stable since 3.2)


def shown_value(stored: object) -> str:
    """A stored value as messages and checkpoints name it: the string's repr, or ``UNSET``."""
    if stored is None:
        return UNSET
    value = os.environ.decodevalue(stored) if isinstance(stored, bytes) else stored
    return repr(value)
