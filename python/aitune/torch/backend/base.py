"""Backend and BackendConfig: what every tuning backend provides to a strategy."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Callable
from typing import Any

from aitune import _core
from aitune.torch.graph import RecordedGraph


class TuningError(_core.AituneError):
    """No backend of a strategy produced a correct candidate; the message lists why each failed.
    (Here, beside the backends, so that a backend's own refusal can be one: NumericMismatchError.)"""


@dataclasses.dataclass
class BackendConfig:
    """Base of every backend's configuration: a dataclass with a stable key.

    Subclasses normalise their fields in ``__post_init__`` and may override
    ``_canonical_value`` where two spellings mean the same thing (e.g. an unset
    execution provider and its default), so that equal configurations share a key
    and therefore a cache directory.
    """

    def _canonical_value(self, field: dataclasses.Field, value: Any) -> Any:
        return value.value if isinstance(value, enum.Enum) else value

    def to_dict(self) -> dict[str, Any]:
        """Field values in canonical, JSON-ready form."""
        return {f.name: self._canonical_value(f, getattr(self, f.name)) for f in dataclasses.fields(self)}

    def key(self) -> str:
        """``<ConfigClass>_<16 hex digits>``: sha256 of the canonical JSON, stable across runs."""
        return f"{type(self).__name__}_{self.digest()}"

    def digest(self) -> str:
        canonical = json.dumps({"type": type(self).__name__, **self.to_dict()}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """``ClassName(field=value, ...)`` listing only the fields that differ from their defaults."""
        changed = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.default is not dataclasses.MISSING and value == f.default:
                continue
            if f.default_factory is not dataclasses.MISSING and value == f.default_factory():
                continue
            shown = value.value if isinstance(value, enum.Enum) else value
            changed.append(f"{f.name}={shown!r}")
        return f"{type(self).__name__}({', '.join(changed)})"


class TunedGraph:
    """One recorded graph made runnable by a backend.

    A graph that runs in an engine session sets ``session`` (a ``_core`` session) and
    ``order`` (session input i takes graph tensor input order[i]); the module's dispatch
    runs it in C++ (``_core.TorchDispatch``). A graph that runs in Python (eager,
    torch.compile) leaves ``session`` None and implements ``infer``: the graph's tensor
    inputs in recording order in, its tensor outputs in recording order out.
    ``report`` is the engine's TuneReport of the tuning that chose it.
    ``holds_weights``: the graph computes with its own copy of the module's weights (an
    ONNX model's initializers, a half-precision copy), so it no longer computes the
    module once the module's weights change; a graph that reads the module's own
    parameters on every call (eager, torch.compile of the module) sets it False.
    ``records_attributes``: the graph depends on the module's plain Python values as they
    were recorded, so a call while one differs runs eagerly (baked_attributes.py). An ONNX
    graph holds them as constants; a torch.compile graph recompiles on them, but its
    outputs are rebuilt in the structure recorded with them (a flag that makes forward
    return a tuple instead of a dict, or one more output). Only eager sets it False.
    """

    backend_name: str = "?"
    holds_weights: bool = True
    records_attributes: bool = True
    report = None
    session = None
    order: tuple[int, ...] = ()

    def infer(self, inputs: list) -> list:
        raise NotImplementedError

    def describe(self) -> str:
        return self.backend_name


class Backend:
    """A way to run a recorded graph. Stateless apart from its config: one instance may
    build many graphs of many modules (strategies share backends).

    A backend adds candidates to the engine's GraphTuner (``add_candidates``), which
    checks and measures them; for the winner, the function ``add_candidates`` returned
    makes the TunedGraph.
    """

    def __init__(self, config: BackendConfig | None = None):
        self.config = config

    def key(self) -> str:
        """Directory name of this backend's artefacts: ``<BackendClass>_<config digest>``."""
        return type(self).__name__ if self.config is None else f"{type(self).__name__}_{self.config.digest()}"

    def describe(self) -> str:
        return type(self).__name__ if self.config is None else f"{type(self).__name__}[{self.config.describe()}]"

    def candidate_count(self, graph: RecordedGraph) -> int:
        """How many candidates ``add_candidates`` will add (for the progress bar)."""
        return 1

    def add_candidates(self, graph: RecordedGraph, tuner, group: int, advance: Callable[[], None],
                       module_call: Callable[..., Callable[[], object]] | None = None):
        """Adds this backend's candidates for ``graph`` to ``tuner`` (an
        ``aitune._core.GraphTuner``) as candidate group ``group``, calling ``advance()``
        after each. Returns ``make(session, candidate) -> TunedGraph`` for the winner.
        Raises when no candidate can even be made (e.g. the export fails).
        ``module_call(tuned, inputs=None) -> call``: the call of the tuned module with this
        graph run by ``tuned`` (``dispatch.measured_call``; ``inputs``: the graph's tensors to
        call it with, None: its largest sample's), which is what a candidate's latency is
        measured by; None (no module, e.g. a test driving a backend alone): the
        candidate's own run."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.describe()
