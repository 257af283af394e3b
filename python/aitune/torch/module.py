"""ait.Module: a transparent proxy over an nn.Module that records its calls and, once
tuned, hands them to its dispatch (dispatch.py), which runs them on the graphs tuned."""

from __future__ import annotations

import enum
import inspect
import logging
from typing import Any

import torch
import torch.utils._pytree as pytree

from aitune.torch import cache, flatten
from aitune.torch.backend import ONNXRuntimeBackend
from aitune.torch.backend.base import TunedGraph
from aitune.torch.context import current_session, eager_only
from aitune.torch.dispatch import DispatchedModule, ModuleDispatch, measured_call
from aitune.torch.graph import CallForm, RecordedGraph
from aitune.torch.graph_tuning import tune_graph
from aitune.torch.state_changes import StateWatch
from aitune.torch.options import TuneOptions
from aitune.torch.strategy import OneBackendStrategy, TuneStrategy

logger = logging.getLogger("aitune")


class ModuleState(str, enum.Enum):
    """INIT until the first recorded call, RECORDING while ``ait.tune`` feeds samples,
    then TUNED, or PASSTHROUGH (eager) when tuning failed and failures were ignored."""

    INIT = "init"
    RECORDING = "recording"
    TUNED = "tuned"
    PASSTHROUGH = "passthrough"


# nn.Module keeps parameters, buffers and submodules in these dicts. The proxy shares
# them with the wrapped module instead of registering it as a child, so that
# parameters(), named_modules() and a parent's state_dict() see the wrapped module's
# names unprefixed, exactly as before wrapping.
_SHARED_REGISTRIES = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")
# The forward hooks too, so that they run in one place, around the proxy's forward (and
# so around a tuned graph: a pre-hook that supplies or changes the inputs is recorded on
# what it produced, a hook that changes the outputs applies once, a hook's side effects
# keep happening). Everything inside calls the wrapped module's forward, never __call__,
# which would run them a second time. Hooks receive the proxy as their module.
_SHARED_HOOKS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                 "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def submodule_hooks(module: torch.nn.Module) -> list[str]:
    """``name: hook`` for each forward hook registered on a submodule: those run inside
    a graph while it is exported, and their side effects never happen on tuned calls."""
    found = []
    for name, sub in module.named_modules():
        if not name:
            continue
        for hook in [*sub._forward_pre_hooks.values(), *sub._forward_hooks.values()]:
            found.append(f"{name}: {getattr(hook, '__qualname__', repr(hook))}")
    return found


class Module(DispatchedModule):
    """Wraps ``module``; behaves like it (attributes, state_dict, ``.to()``, ``eval()``,
    hooks) and takes over its forward once ``ait.tune`` has tuned it.

    Args:
        module: the PyTorch module to tune.
        name: names the module's cache directory; defaults to its class name.
        strategy: how to pick a backend per recorded graph; defaults to
            ``OneBackendStrategy(ONNXRuntimeBackend())`` (CUDA execution provider).
        eager_fallback: when tuned, run calls no recorded graph covers (other input
            structure, dtype, rank, or shapes the backend rejects) eagerly with a
            warning instead of raising.

    aitune's own attributes carry an ``ait_`` prefix so they never hide the wrapped
    module's attributes.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        name: str | None = None,
        strategy: TuneStrategy | None = None,
        *,
        eager_fallback: bool = False,
    ):
        if isinstance(module, Module):
            raise TypeError(f"module is already wrapped by ait.Module '{module.ait_name}'")
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"ait.Module wraps a torch.nn.Module, got {type(module).__name__}")
        if strategy is None:  # the backend guide's default backend
            strategy = OneBackendStrategy(ONNXRuntimeBackend())
        if not isinstance(strategy, TuneStrategy):
            raise TypeError(f"strategy must be a TuneStrategy, got {type(strategy).__name__}")
        super().__init__()
        signature = inspect.signature(module.forward)
        own = {
            "_ait_module": module,
            "_ait_name": name or type(module).__name__,
            "_ait_strategy": strategy,
            "_ait_signature": signature,
            "_ait_state": ModuleState.INIT,
            "_ait_graphs": {},  # identity -> RecordedGraph
            # the tuned graphs and the way to them; replaced as a whole on every tune / load
            "_ait_calls": ModuleDispatch(name or type(module).__name__, module, signature, eager_fallback),
            "_ait_record_errors": [],
            "training": module.training,
        }
        own.update({registry: getattr(module, registry) for registry in (*_SHARED_REGISTRIES, *_SHARED_HOOKS)})
        for key, value in own.items():
            object.__setattr__(self, key, value)

    # -- aitune's view ----------------------------------------------------------------

    @property
    def ait_name(self) -> str:
        return self._ait_name

    @property
    def ait_module(self) -> torch.nn.Module:
        """The wrapped PyTorch module."""
        return self._ait_module

    @property
    def ait_state(self) -> ModuleState:
        return self._ait_state

    @property
    def ait_strategy(self) -> TuneStrategy:
        return self._ait_strategy

    @property
    def ait_graphs(self) -> list[RecordedGraph]:
        """The graphs recorded by the last ``ait.tune``, in order of first call."""
        return list(self._ait_graphs.values())

    @property
    def ait_reports(self) -> dict:
        """Graph key -> the engine's TuneReport of the last tuning (``summary_table()``,
        ``to_json()``, ``candidates``, ``decision``); also written as ``tune_report.json``
        in the graph's cache directory. After ``ait.load``: the saved reports
        (``aitune.torch.checkpoint.SavedReport``: ``to_json()``, ``data``, ``decision``)."""
        return {graph.key: tuned.report for graph, tuned in self._ait_calls.tuned.values() if tuned.report is not None}

    @property
    def ait_backends(self) -> dict[str, str]:
        """Graph key -> description of the backend running it (empty unless TUNED)."""
        return {graph.key: tuned.describe() for graph, tuned in self._ait_calls.tuned.values()}

    def ait_device(self) -> torch.device:
        """The device of the wrapped module's first parameter or buffer (CPU if none)."""
        for tensor in self._ait_module.parameters():
            return tensor.device
        for tensor in self._ait_module.buffers():
            return tensor.device
        return torch.device("cpu")

    # -- transparency -----------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # parameters, buffers, submodules (shared)
        except AttributeError:
            pass
        try:
            module = self.__dict__["_ait_module"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # The proxy's own state (nn.Module's bookkeeping, aitune's _ait_*) stays here;
        # everything a user sets lands on the wrapped module, as it would unwrapped.
        if name.startswith("_ait_") or name in self.__dict__:
            super().__setattr__(name, value)
        else:
            setattr(self._ait_module, name, value)

    def __delattr__(self, name: str) -> None:
        if name.startswith("_ait_") or name in self.__dict__:
            super().__delattr__(name)
        else:
            delattr(self._ait_module, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self._ait_module)))

    def train(self, mode: bool = True) -> Module:
        self._ait_module.train(mode)
        self.training = mode
        return self

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .half(), ... act on the wrapped module
        self._ait_module._apply(fn, recurse)
        return self

    def state_dict(self, *args, **kwargs):
        return self._ait_module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self._ait_module.load_state_dict(state_dict, strict=strict, assign=assign)

    def _load_from_state_dict(self, *args, **kwargs):  # a parent's load_state_dict comes here
        return self._ait_module._load_from_state_dict(*args, **kwargs)

    def _get_name(self) -> str:
        return f"ait.Module[{self._ait_name!r}, {self._ait_state.value}]({type(self._ait_module).__name__})"

    def extra_repr(self) -> str:
        return self._ait_module.extra_repr()

    # -- calls ------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # The hooks (shared with the wrapped module) ran around this forward already.
        if eager_only():
            return self._ait_module.forward(*args, **kwargs)
        session = current_session()
        if session is not None:
            return self._ait_record(session, args, kwargs)
        if self._ait_state is ModuleState.TUNED:
            return self._ait_calls.call(args, kwargs)
        return self._ait_module.forward(*args, **kwargs)

    def _ait_record(self, session, args: tuple, kwargs: dict) -> Any:
        if session.enlist(self):  # first call of this tuning: forget older recordings
            # ...kept until the recording ends: where it raises, they come back (_ait_recording_ended)
            self._ait_before_recording = (self._ait_state, self._ait_graphs, self._ait_record_errors,
                                          self._ait_calls)
            self._ait_graphs = {}
            self._ait_record_errors = []
            self._ait_state = ModuleState.RECORDING
        arguments = self._ait_calls.bind(args, kwargs)
        try:
            flatten.register_dataclasses(arguments)
            leaves, spec = pytree.tree_flatten(arguments)
            identity = flatten.identity(spec, leaves)
        except Exception as error:  # keep feeding samples; tuning reports it
            self._ait_record_errors.append(f"{type(error).__name__}: {error}")
            return self._ait_module.forward(*args, **kwargs)
        graph = self._ait_graphs.get(identity)
        watch = StateWatch(self._ait_module, compare_values=graph is None)
        outputs = self._ait_module.forward(*args, **kwargs)
        mutated = watch.changed()
        try:
            flatten.register_dataclasses(outputs)
            if graph is None:
                form = CallForm.of(self._ait_signature, len(args), kwargs)
                graph = RecordedGraph(self._ait_name, self._ait_module, self._ait_signature, arguments, outputs, form)
                self._ait_graphs[identity] = graph
            graph.add_sample([leaf for leaf in leaves if isinstance(leaf, torch.Tensor)], outputs, session.batch_size)
            graph.note_mutated_state(mutated)
        except Exception as error:  # keep feeding samples; tuning reports it
            self._ait_record_errors.append(f"{type(error).__name__}: {error}")
        return outputs

    def _ait_recording_ended(self, failed: bool) -> None:
        """ait.tune's recording is over. ``failed``: it raised (the user's code refused a
        batch, an interrupt): the module is put back as it was before, its state and
        recordings (a TUNED module keeps serving its graphs, which the recording never
        touched), rather than left RECORDING with its recordings gone."""
        before = self.__dict__.pop("_ait_before_recording", None)
        if failed and before is not None:
            self._ait_state, self._ait_graphs, self._ait_record_errors, self._ait_calls = before
        elif before is not None:  # until tuning is over: an interrupt there puts it back too
            self._ait_before_tuning = before

    def _ait_tuning_interrupted(self) -> None:
        """ait.tune was interrupted (KeyboardInterrupt, SystemExit) before this module's
        tuning finished: it goes back to what it was before the recording (a TUNED module
        keeps serving its old graphs), rather than half-tuned or RECORDING."""
        before = self.__dict__.pop("_ait_before_tuning", None)
        if before is not None:
            self._ait_state, self._ait_graphs, self._ait_record_errors, self._ait_calls = before

    # -- tuning -----------------------------------------------------------------------

    def _ait_tune(self, clear_cache: bool = False, options: TuneOptions | None = None) -> None:
        """Builds every recorded graph with the strategy. On failure the module stays
        eager (PASSTHROUGH) and the exception propagates to ``ait.tune``. Interrupted
        (KeyboardInterrupt, SystemExit): ``ait.tune`` puts it back (``_ait_tuning_interrupted``)."""
        hooks = submodule_hooks(self._ait_module)
        if hooks:
            logger.warning(
                "ait.Module '%s': forward hooks on submodules run inside the graph while it is exported, so only "
                "their effect on tensors is kept; their other effects (counters, logging, state) will not happen "
                "on tuned calls: %s. Register them on the module wrapped instead (they then run around the tuned "
                "graph on every call).", self._ait_name, "; ".join(hooks),
            )
        self._ait_set_tuned({})
        try:
            if self._ait_record_errors:
                raise ValueError(
                    f"ait.Module '{self._ait_name}': recording failed: " + "; ".join(self._ait_record_errors)
                )
            if not self._ait_graphs:
                raise ValueError(f"ait.Module '{self._ait_name}' recorded no calls")
            if clear_cache:
                cache.clear_module(self._ait_name)
            tuned: dict[Any, tuple[RecordedGraph, TunedGraph]] = {}
            for identity, graph in self._ait_graphs.items():
                tuned[identity] = (graph, tune_graph(self._ait_strategy, graph, options, measured_call))
                logger.info("ait.Module '%s' %s: %s", self._ait_name, graph.key, tuned[identity][1].describe())
        except Exception:
            self.__dict__.pop("_ait_before_tuning", None)
            self._ait_state = ModuleState.PASSTHROUGH
            raise
        self.__dict__.pop("_ait_before_tuning", None)
        self._ait_set_tuned(tuned)
        self._ait_state = ModuleState.TUNED

    def _ait_restore(self, tuned: dict[Any, tuple[Any, TunedGraph]]) -> None:
        """Takes over graphs restored from a checkpoint (``ait.load``): identity ->
        (graph, tuned graph). Replaces the recordings and tuned graphs in one step and
        makes the module TUNED; called only once everything was loaded."""
        if not tuned:
            raise ValueError(f"ait.Module '{self._ait_name}': nothing to restore")
        self._ait_graphs = {identity: graph for identity, (graph, _) in tuned.items()}
        self._ait_set_tuned(dict(tuned))
        self._ait_record_errors = []
        self._ait_state = ModuleState.TUNED

    @property
    def _ait_tuned(self) -> dict[Any, tuple[Any, TunedGraph]]:
        """identity -> (graph, TunedGraph) of the graphs tuned (or loaded)."""
        return self._ait_calls.tuned

    def _ait_set_tuned(self, tuned: dict[Any, tuple[Any, TunedGraph]]) -> None:
        """Replaces the tuned graphs, and with them the whole dispatch: its C++ half and
        that half's routes are made anew from these graphs, so nothing that answered
        "which graph" for the old ones survives."""
        old = self._ait_calls
        self._ait_calls = ModuleDispatch(old.name, old.module, old.signature, old.eager_fallback, tuned,
                                         list(self._ait_graphs.values()))
