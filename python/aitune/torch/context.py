"""The context of a call: whether ``ait.tune`` is recording (and into which session),
whether everything runs eagerly, whether the exporters keep quiet. ContextVars, read by
ait.Module's forward, its C++ dispatch and the exporter."""

from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref
from collections.abc import Iterator

import torch


class TuneSession:
    """The recording phase of one ``ait.tune`` call: which modules were called, and the
    batch size of the samples being fed (it reveals each tensor's batch axis)."""

    def __init__(self) -> None:
        self.batch_size = 0
        self.evaluation: int | None = None  # the labelled evaluation batch being fed (None: a tuning sample)
        self.modules: dict[int, torch.nn.Module] = {}  # id -> ait.Module, in order of first call
        # names of the ait.Modules called on another thread while this session recorded (a
        # pipeline's thread pool): the recording, a context variable, is not seen there
        self.other_threads: dict[str, None] = {}

    def enlist(self, module: torch.nn.Module) -> bool:
        """Adds ``module``; True the first time (the module then drops older recordings)."""
        if id(module) in self.modules:
            return False
        self.modules[id(module)] = module
        return True


session_var: contextvars.ContextVar[TuneSession | None] = contextvars.ContextVar("aitune_session", default=None)
eager_var: contextvars.ContextVar[bool] = contextvars.ContextVar("aitune_eager", default=False)
quiet_var: contextvars.ContextVar[bool] = contextvars.ContextVar("aitune_quiet_export", default=False)


# The ContextVars' own bound ``get``s rather than wrappers: both run on every
# ait.Module call, and a Python frame around a C call doubles its cost. (The C++ hot
# half of the dispatch reads the variables themselves.)
current_session = session_var.get  # () -> TuneSession | None
eager_only = eager_var.get  # () -> bool: inside run_eagerly()
exporters_quiet = quiet_var.get  # () -> bool: what the exporters print is swallowed (ait.tune's disable_external_logging)


# The sessions recording now, by the thread whose context holds them: a call on another
# thread (which sees no session) is noted in each (``note_other_thread_call``).
recording_threads: dict[int, TuneSession] = {}


@contextlib.contextmanager
def recording(session: TuneSession) -> Iterator[TuneSession]:
    token = session_var.set(session)
    thread = threading.get_ident()
    outer = recording_threads.get(thread)
    recording_threads[thread] = session
    try:
        yield session
    finally:
        session_var.reset(token)
        if outer is None:
            recording_threads.pop(thread, None)
        else:
            recording_threads[thread] = outer


def note_other_thread_call(name: str) -> None:
    """An ait.Module called with no session in its context: if an ``ait.tune`` records on
    another thread meanwhile, that tune is told (the call is not part of its recording)."""
    thread = threading.get_ident()
    for owner, session in list(recording_threads.items()):
        if owner != thread:
            session.other_threads[name] = None


@contextlib.contextmanager
def run_eagerly() -> Iterator[None]:
    """Every ait.Module runs its wrapped module and records nothing. Used while
    exporting (an exporter must trace the PyTorch code, not a tuned backend) and while
    computing eager references."""
    token = eager_var.set(True)
    try:
        yield
    finally:
        eager_var.reset(token)


# -- batches ait.tune made ----------------------------------------------------------------

# Tensors ait.tune stacked from samples for one call (id -> weak reference): nobody else
# holds them, so a recording keeps them as they are instead of a copy. A copy of every
# recorded tensor made a tune hold its samples several times over (issue 31: 2 GiB of
# samples peaked at 12.8 GB).
_owned_batches: dict[int, weakref.ref] = {}


def mark_owned_batch(tensor: torch.Tensor) -> torch.Tensor:
    """Notes that ``tensor`` was made by ait.tune for one call and is referenced nowhere else."""
    key = id(tensor)
    _owned_batches[key] = weakref.ref(tensor, lambda _ref, key=key: _owned_batches.pop(key, None))
    return tensor


def is_owned_batch(tensor: torch.Tensor) -> bool:
    ref = _owned_batches.get(id(tensor))
    return ref is not None and ref() is tensor
