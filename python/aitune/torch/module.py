"""ait.Module: a transparent proxy over an nn.Module that records its calls and, once
tuned, hands them to its dispatch (dispatch.py), which runs them on the graphs tuned."""

from __future__ import annotations

import enum
import functools
import inspect
import logging
from collections.abc import Iterable
from typing import Any

import torch
import torch.utils._pytree as pytree

from aitune import _core
from aitune.torch import cache, flatten
from aitune.torch.backend import ONNXRuntimeBackend
from aitune.torch.backend.base import TunedGraph
from aitune.torch.context import TuneSession, current_session, eager_only, note_other_thread_call, recording_threads
from aitune.torch.dispatch import DispatchedModule, ModuleDispatch, global_forward_hooks, measured_call
from aitune.torch.dynamic_shapes import DynamicShapes
from aitune.torch.environment_reads import environment_key, recording_environment_reads
from aitune.torch.forward_code import exported_hooks, forward_code_digest, submodule_forward_hooks
from aitune.torch.graph import CallForm, RecordedGraph
from aitune.torch.graph_tuning import GlobalHooksTuningError, tune_graph
from aitune.torch.state_changes import (StateSnapshot, StateWatch, argument_objects, attribute_paths,
                                        changed_containers, changed_inputs, changed_objects, check_harmless_attributes,
                                        is_harmless, tensor_version)
from aitune.torch.module_registry import MODULE_REGISTRY
from aitune.torch.options import TuneOptions
from aitune.torch.strategy import OneBackendStrategy, TuneStrategy
from aitune.torch.strategy_selection import StrategySelection
from aitune.torch.weight_changes import (held_values_digest, state_dict_changes_weights, weight_values_digest,
                                         weights_fingerprint)

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
    a graph while it is exported, and their side effects never happen on tuned calls.
    Hooks whose only effect is on output tensors are left out (``submodule_forward_hooks``)."""
    return [f"{name}: {getattr(hook, '__qualname__', repr(hook))}" for name, hook in submodule_forward_hooks(module)]

#: Calls an untuned module records outside ``ait.tune`` (AITune's record-by-calling, for
#: ``module.tune()``); later calls run eagerly and are not kept, so a module wrapped and
#: never tuned does not keep copies of every input it ever saw.
MAX_CALLS_RECORDED_BY_CALLING = 32


class Module(DispatchedModule):
    """Wraps ``module``; behaves like it (attributes, state_dict, ``.to()``, ``eval()``,
    hooks) and takes over its forward once ``ait.tune`` has tuned it.

    Args:
        module: the PyTorch module to tune.
        name: names the module's cache directory; defaults to its class name.
        strategy: how to pick a backend per recorded graph; defaults to
            ``OneBackendStrategy(ONNXRuntimeBackend())`` (CUDA execution provider).
        strategies: instead of ``strategy``, one per graph: a list (graph ``i`` in
            recording order gets ``strategies[i]``) or a mapping from a graph selector
            (index, graph key, or ``callable(graph) -> bool``) to a strategy; see
            ``aitune.torch.strategy_selection``.
        dynamic_shapes: input axes that take a range of extents beyond the recorded ones,
            ``{input: {axis: (min, max)}}`` (max None: no bound; or a ``torch.export.Dim``;
            input as the argument path ``"input_ids"`` or the tensor name
            ``"input_input_ids"``): the tuned graphs accept the range, and the dynamo export
            proves itself valid over it or is refused. See ``aitune.torch.dynamic_shapes``.
        eager_fallback: when tuned, run calls no recorded graph covers (other input
            structure, dtype, rank, or shapes the backend rejects) eagerly with a
            warning instead of raising.
        harmless_attributes: plain Python attributes forward may change without the
            export being refused (a call counter used only for logging, a dict memoizing
            values computed from the weights): by name (``"calls"``: that attribute on the
            module and every submodule) or by path (``"blocks.0.attn.cache"``). The tuned
            graph does not run forward's Python, so they then stop changing on tuned calls.
            A name no attribute has is refused at tuning.

    aitune's own attributes carry an ``ait_`` prefix so they never hide the wrapped
    module's attributes.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        name: str | None = None,
        strategy: TuneStrategy | None = None,
        strategies=None,
        dynamic_shapes=None,
        *,
        eager_fallback: bool = False,
        harmless_attributes: Iterable[str] = (),
    ):
        harmless_attributes = check_harmless_attributes(harmless_attributes)
        if isinstance(module, Module):
            raise TypeError(f"module is already wrapped by ait.Module '{module.ait_name}'")
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"ait.Module wraps a torch.nn.Module, got {type(module).__name__}")
        if type(module).__call__ is not torch.nn.Module.__call__ and not isinstance(module, DispatchedModule):
            # Calls through the wrapper run forward (and the hooks), as nn.Module.__call__ does:
            # a class's own __call__ would be skipped, tuned or not (2.08 off eager, silently;
            # a session-32 probe)
            raise TypeError(
                f"ait.Module wraps a module's forward, and {type(module).__qualname__} overrides __call__, which calls "
                "through ait.Module would skip (tuned or not): move what its __call__ adds into forward, or wrap a "
                "module whose forward is what a call computes")
        # the backend guide's default backend when neither is given
        selection = StrategySelection(strategy, strategies, lambda: OneBackendStrategy(ONNXRuntimeBackend()))
        declared = DynamicShapes(dynamic_shapes)
        super().__init__()
        signature = inspect.signature(module.forward)
        own = {
            "_ait_module": module,
            "_ait_name": name or type(module).__name__,
            "_ait_strategy": selection.primary,
            "_ait_strategies": selection,
            "_ait_signature": signature,
            "_ait_state": ModuleState.INIT,
            "_ait_graphs": {},  # identity -> RecordedGraph
            # the tuned graphs and the way to them; replaced as a whole on every tune / load
            "_ait_calls": ModuleDispatch(name or type(module).__name__, module, signature, eager_fallback),
            "_ait_record_errors": [],
            "_ait_dynamic_shapes": declared,
            "_ait_failure": None,  # why the last tune failed (PASSTHROUGH), for ait.save's refusal
            "_ait_failed_reports": {},  # that tune's reports (ait_reports while PASSTHROUGH)
            "_ait_harmless_attributes": harmless_attributes,
            "training": module.training,
        }
        own.update({registry: getattr(module, registry) for registry in (*_SHARED_REGISTRIES, *_SHARED_HOOKS)})
        for key, value in own.items():
            object.__setattr__(self, key, value)
        self.register_load_state_dict_post_hook(Module._ait_after_load)
        MODULE_REGISTRY.register(self._ait_name, self)

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
        (``aitune.torch.checkpoint.SavedReport``: ``to_json()``, ``data``, ``decision``).
        After a tune that failed (PASSTHROUGH): that tune's reports, with the failed graph's
        candidates and the reason each failed."""
        if self._ait_state is ModuleState.PASSTHROUGH and self.__dict__.get("_ait_failed_reports"):
            return dict(self._ait_failed_reports)  # a failed tune: its reports, the failed graph's included
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

    # -- AITune's names (aitune.torch.Module of ai-dynamo/aitune) ----------------------

    @property
    def graph_specs(self) -> list[_core.GraphSpec]:
        """The graph spec (tensors' dtypes, min/max shapes, batch and dynamic axes) of each
        graph recorded or loaded, in order; ValueError when nothing was recorded."""
        graphs = list(self._ait_graphs.values())
        if not graphs:
            raise ValueError(f"ait.Module '{self._ait_name}' has not recorded any calls: no graph specs")
        return [graph.graph_spec() for graph in graphs]

    def tune(self, device: str | torch.device | None = None, strategy: TuneStrategy | None = None,
             dry_run: bool = False) -> None:
        """Tunes what this module recorded (by being called, or by ``ait.tune(..., dry_run=True)``),
        as AITune's ``Module.tune``.

        Args:
            device: where to tune; the recorded calls' device (None: the module's device).
                A different device is refused: the samples were recorded there.
            strategy: tunes every graph, instead of the module's ``strategy`` / ``strategies``.
            dry_run: check that every graph has a strategy, tune nothing.

        Raises ValueError when the module is TUNED already (wrap it anew, or use ``ait.tune``,
        which records again) or has recorded nothing; tuning errors propagate (the module is
        then PASSTHROUGH).
        """
        if self._ait_state is ModuleState.TUNED:
            raise ValueError(f"ait.Module '{self._ait_name}' is tuned already; ait.tune records and tunes it again")
        graphs = list(self._ait_graphs.values())
        if self._ait_state is not ModuleState.RECORDING or not graphs:
            raise ValueError(
                f"ait.Module '{self._ait_name}' has not recorded any calls ({self._ait_state.value}); call it on "
                "inputs first (or run ait.tune(..., dry_run=True) through it), then tune"
            )
        if strategy is not None and not isinstance(strategy, TuneStrategy):
            raise TypeError(f"strategy must be a TuneStrategy, got {type(strategy).__name__}")
        if device is not None:
            wanted, recorded = torch.device(device), graphs[0].device
            if wanted.type != recorded.type or (wanted.index is not None and recorded.index is not None
                                                and wanted.index != recorded.index):
                raise ValueError(
                    f"ait.Module '{self._ait_name}': tune(device='{wanted}') but its calls were recorded on "
                    f"'{recorded}'; move the module there and call it again"
                )
        if dry_run:
            if strategy is None:
                self._ait_strategies.for_graphs(self._ait_name, graphs)
            return
        with torch.no_grad():
            self._ait_tune(strategy=strategy)

    def deactivate(self) -> None:
        """A TUNED module runs its calls eagerly (the wrapped PyTorch module) until
        ``activate()``; the tuned graphs are kept (their sessions stay in memory) and
        ``ait.save`` refuses until then. No effect on a module that is not TUNED."""
        if self._ait_state is ModuleState.TUNED and "_ait_inactive_calls" not in self.__dict__:
            calls = self._ait_calls
            # a dispatch without graphs, so the C++ half no longer serves calls either
            self._ait_calls = ModuleDispatch(calls.name, calls.module, calls.signature, calls.eager_fallback)
            self._ait_inactive_calls = calls
            calls.unwatch_weights()  # activate() watches them again, as they are then
            logger.info("ait.Module '%s' deactivated: its calls run eagerly until activate()", self._ait_name)

    def activate(self) -> None:
        """Undoes ``deactivate()``: the tuned graphs serve the calls again."""
        calls = self.__dict__.pop("_ait_inactive_calls", None)
        if calls is not None:
            self._ait_calls = calls
            # the weights as they are now are the user's choice: changed in place meanwhile,
            # the graphs still compute the ones they were tuned with (the warning said so)
            calls.watch_weights_as_they_are()
            calls.watch_values_as_they_are()

    @property
    def ait_active(self) -> bool:
        """False between ``deactivate()`` and ``activate()``."""
        return "_ait_inactive_calls" not in self.__dict__

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

    def __reduce_ex__(self, protocol: int):
        # copy.deepcopy and pickle (torch.save of a whole model) both come here. A tuned
        # module's graphs are ONNX Runtime sessions and compiled code bound to this
        # module's weights: nothing that copies or pickles; say what does instead.
        if self._ait_tuned:
            raise TypeError(
                f"ait.Module '{self._ait_name}' is tuned: its graphs (ONNX Runtime sessions, compiled code bound to "
                "its weights) cannot be copied or pickled (copy.deepcopy, torch.save of the model). Save it with "
                "ait.save(model, path) and load it into a copy with ait.load(copy, path), save the weights alone "
                "(torch.save(model.state_dict(), ...)), or copy the module before wrapping it")
        return super().__reduce_ex__(protocol)

    def train(self, mode: bool = True) -> Module:
        self._ait_module.train(mode)
        self.training = mode
        return self

    def _apply(self, fn, recurse=True):  # .to(), .cuda(), .half(), ... act on the wrapped module
        before = weights_fingerprint(self._ait_module) if self._ait_graphs_hold_weights() else None
        self._ait_module._apply(fn, recurse)
        if before is not None and weights_fingerprint(self._ait_module) != before:
            self._ait_weights_changed("were moved or converted (.to(), .cuda(), .half(), ...)")
        return self

    def state_dict(self, *args, **kwargs):
        return self._ait_module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        holding = self._ait_graphs_hold_weights()
        changed = holding and state_dict_changes_weights(self._ait_module, state_dict)
        result = self._ait_module.load_state_dict(state_dict, strict=strict, assign=assign)
        if changed:
            self._ait_weights_changed("were changed by load_state_dict")
        elif holding:  # the values they had, written again: the version counters moved, nothing else
            self._ait_calls.watch_weights_as_they_are()
        return result

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A parent's load_state_dict comes here first, then loads the submodules (shared
        # with the wrapped module) itself: compare the whole subtree now, before it does.
        if self._ait_graphs_hold_weights():
            if state_dict_changes_weights(self._ait_module, state_dict, prefix):
                self._ait_weights_changed("were changed by a parent's load_state_dict")
            else:  # the same values: their new version counters are taken as seen once loaded
                self._ait_same_weights_loaded = True
        return self._ait_module._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @staticmethod
    def _ait_after_load(module: Module, incompatible_keys) -> None:
        """After a parent's load_state_dict loaded this module's subtree with the values it
        had: the writes moved the weights' version counters, which the dispatch watches."""
        if module.__dict__.pop("_ait_same_weights_loaded", False):
            module._ait_calls.watch_weights_as_they_are()

    # -- weights changed under the tuned graphs ----------------------------------------

    def _ait_graphs_hold_weights(self) -> bool:
        """Whether an active tuned graph computes with its own copy of the weights."""
        return self._ait_state is ModuleState.TUNED and self.ait_active and any(
            tuned.holds_weights for _, tuned in self._ait_tuned.values())

    def _ait_weights_changed(self, how: str) -> None:
        """The module's weights changed under tuned graphs that hold a copy of the old ones:
        they would compute another model, so the module runs eagerly (``deactivate``) and
        says so, until it is tuned again (or the user, knowingly, calls ``activate()``)."""
        holding = sorted(graph.key for graph, tuned in self._ait_tuned.values() if tuned.holds_weights)
        self.deactivate()
        said = self.__dict__.setdefault("_ait_weights_said", set())
        if how in said:  # said once per kind of change (torch.func.functional_call swaps on every call)
            return
        said.add(how)
        logger.warning(
            "ait.Module '%s': its weights %s after tuning; the tuned graphs %s hold a copy of the weights they "
            "were tuned with and would compute the old model, so the module now runs eagerly. Tune it again "
            "(ait.tune) to use the new weights; ait.save refuses until then.", self._ait_name, how,
            ", ".join(holding))

    def _ait_weights_changed_by_eager_calls(self, how: str) -> bool:
        """The dispatch found weights changed in place since tuning (an optimizer step, a
        write under torch.no_grad(), calls run eagerly in train mode or for autograd):
        where a tuned graph holds a copy of the old ones, as ``_ait_weights_changed``; True
        when the module was deactivated."""
        if not self._ait_graphs_hold_weights():
            return False
        self._ait_weights_changed(how)
        return True

    def _get_name(self) -> str:
        return f"ait.Module[{self._ait_name!r}, {self._ait_state.value}]({type(self._ait_module).__name__})"

    def extra_repr(self) -> str:
        return self._ait_module.extra_repr()

    # -- calls ------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # The hooks (shared with the wrapped module) ran around this forward already.
        # Under torch.compile (of this module or one holding it) dynamo compiles the wrapped
        # module's own forward: it cannot trace the dispatch's C++ half (which crashed it),
        # and a graph run inside would be opaque to it.
        if eager_only() or torch.compiler.is_compiling():
            return self._ait_module.forward(*args, **kwargs)
        session = current_session()
        if session is not None:
            return self._ait_record(session, args, kwargs)
        if recording_threads:  # an ait.tune records on another thread: it is told of this call
            note_other_thread_call(self._ait_name)
        state = self._ait_state
        if state is ModuleState.TUNED:
            if "_ait_inactive_calls" in self.__dict__:  # deactivate(): eager until activate()
                if not self._ait_inactive_calls.originals_back():
                    return self._ait_module.forward(*args, **kwargs)
                # the weights replaced were swapped back (torch.func.functional_call's swap):
                # the graphs compute this model again
                self._ait_inactive_calls.originals = None
                self.activate()
                logger.info("ait.Module '%s': the weights replaced after tuning are back as tuned: its graphs serve "
                            "the calls again", self._ait_name)
            return self._ait_calls.call(args, kwargs)
        if state is ModuleState.INIT or (state is ModuleState.RECORDING and "_ait_call_session" in self.__dict__):
            return self._ait_record_by_calling(args, kwargs)
        return self._ait_module.forward(*args, **kwargs)

    def _ait_record_by_calling(self, args: tuple, kwargs: dict) -> Any:
        """A call outside ``ait.tune`` of a module never tuned: recorded, as AITune does,
        for ``module.tune()`` (at most MAX_CALLS_RECORDED_BY_CALLING calls). No batch size
        is known here, so no axis is marked as the batch axis: an axis whose size varied
        between the calls becomes dynamic, the others stay as recorded."""
        session = self.__dict__.get("_ait_call_session")
        if session is None:
            session = TuneSession()
            outputs = self._ait_record(session, args, kwargs)
            self.__dict__.pop("_ait_before_recording", None)  # nothing to put back: this recording has no end
            self._ait_call_session = session
            self._ait_calls_recorded = 1
            return outputs
        if self._ait_calls_recorded >= MAX_CALLS_RECORDED_BY_CALLING:
            return self._ait_module.forward(*args, **kwargs)
        self._ait_calls_recorded += 1
        return self._ait_record(session, args, kwargs)

    def _ait_record(self, session, args: tuple, kwargs: dict) -> Any:
        if session.enlist(self):  # first call of this tuning: forget older recordings
            if self.__dict__.get("_ait_call_session") is not session:
                self.__dict__.pop("_ait_call_session", None)  # ait.tune's recording replaces one by calling
            # ...kept until the recording ends: where it raises, they come back (_ait_recording_ended)
            self._ait_before_recording = (self._ait_state, self._ait_graphs, self._ait_record_errors,
                                          self._ait_calls)
            self._ait_graphs = {}
            self._ait_record_errors = []
            self._ait_recorded_environment = set()  # the environment variables forward reads
            self._ait_state = ModuleState.RECORDING
        arguments = self._ait_calls.bind(args, kwargs)
        try:
            flatten.register_dataclasses(arguments)
            leaves, spec = pytree.tree_flatten(arguments)
            identity = flatten.identity(spec, leaves)
        except Exception as error:  # keep feeding samples; tuning reports it (once)
            self._ait_note_record_error(f"{type(error).__name__}: {error}")
            return self._ait_module.forward(*args, **kwargs)
        graph = self._ait_graphs.get(identity)
        watch = StateWatch(self._ait_module, compare_values=graph is None, watch_attributes=graph is not None,
                           harmless=self._ait_harmless_attributes)
        input_versions = [tensor_version(leaf) for leaf in leaves if isinstance(leaf, torch.Tensor)]
        objects = argument_objects(leaves)
        # an export holds the values forward read from os.environ as constants (environment_reads.py)
        with recording_environment_reads(self.__dict__.setdefault("_ait_recorded_environment", set())):
            outputs = self._ait_module.forward(*args, **kwargs)
        mutated = watch.changed()
        error = None
        if changed := changed_inputs(arguments, input_versions):
            # the sample would be the changed input, not the one the outputs came from
            error = (f"forward changed its input {', '.join(changed)} in place; the recorded sample would not be "
                     "the input its outputs were computed from, and an ONNX graph cannot write its input back (the "
                     "tuned module would silently stop changing it). Change a copy inside forward (x = x * 2 "
                     "rather than x.mul_(2))")
        elif changed := changed_containers(arguments, leaves, spec):
            # the caller's list / dict changed: a graph returns outputs only
            error = (f"forward changed its input {', '.join(changed)} (an item of a list or dict it was given "
                     "replaced, added or removed); a tuned graph returns outputs only, so the tuned module would "
                     "silently leave the caller's container as it was. Return the new values from forward instead")
        elif changed := changed_objects(arguments, leaves, objects):
            # the caller's object: a graph returns outputs only, and an export would write into it
            error = (f"forward changed the attributes of its input {', '.join(changed)} (an object it was given); a "
                     "tuned graph returns outputs only, so the tuned module would silently leave the caller's object "
                     "as it was. Return the new values from forward instead, or keep the object out of the module "
                     "tuned")
        if error is not None:  # not recorded: tuning refuses the module, naming why (once)
            self._ait_note_record_error(error)
            return outputs
        try:
            flatten.register_dataclasses(outputs)
            if graph is None:
                form = CallForm.of(self._ait_signature, len(args), kwargs)
                graph = RecordedGraph(self._ait_name, self._ait_module, self._ait_signature, arguments, outputs, form)
                graph.dynamic_shapes = self._ait_dynamic_shapes
                self._ait_graphs[identity] = graph
            graph.add_sample([leaf for leaf in leaves if isinstance(leaf, torch.Tensor)], outputs, session.batch_size,
                             session.evaluation)
            graph.note_mutated_state(mutated)
        except Exception as error:  # keep feeding samples; tuning reports it (once)
            self._ait_note_record_error(f"{type(error).__name__}: {error}")
        return outputs

    def _ait_note_record_error(self, error: str) -> None:
        """Keeps why a call could not be recorded, once: every batch of a tune fails the same way."""
        if error not in self._ait_record_errors:
            self._ait_record_errors.append(error)

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

    def _ait_tune(self, clear_cache: bool = False, options: TuneOptions | None = None,
                  strategy: TuneStrategy | None = None) -> None:
        """Builds every recorded graph with its strategy (``strategy`` if given, else the
        module's ``strategy`` / ``strategies``). On failure the module stays eager
        (PASSTHROUGH) and the exception propagates to ``ait.tune``. Interrupted
        (KeyboardInterrupt, SystemExit): ``ait.tune`` puts it back (``_ait_tuning_interrupted``)."""
        if unknown := [entry for entry in self._ait_harmless_attributes
                       if not any(is_harmless(path, (entry,)) for path in attribute_paths(self._ait_module))]:
            raise ValueError(f"ait.Module '{self._ait_name}': harmless_attributes names {unknown}, which no "
                             f"attribute of the module or its submodules is (attributes: "
                             f"{sorted(attribute_paths(self._ait_module))})")
        if global_hooks := global_forward_hooks():
            raise GlobalHooksTuningError(
                f"ait.Module '{self._ait_name}': forward hooks for every module are registered ({', '.join(global_hooks)}"
                ", torch.nn.modules.module.register_module_forward_hook or _pre_hook): the export would run them on "
                "every submodule, and the tuned graphs would keep their effect after they are removed. Remove them "
                "(handle.remove()) and tune again; register hooks on the module wrapped instead (they run around "
                "the tuned graph)")
        hooks = submodule_hooks(self._ait_module)
        if hooks:
            logger.warning(
                "ait.Module '%s': forward hooks on submodules run inside the graph while it is exported, so only "
                "their effect on tensors is kept; their other effects (counters, logging, state) will not happen "
                "on tuned calls: %s. Register them on the module wrapped instead (they then run around the tuned "
                "graph on every call).", self._ait_name, "; ".join(hooks),
            )
        self._ait_set_tuned({})
        self.__dict__.pop("_ait_call_session", None)  # its recordings are tuned now: no more recording by calling
        self.__dict__.pop("_ait_inactive_calls", None)
        tuned: dict[Any, tuple[RecordedGraph, TunedGraph]] = {}
        failing: RecordedGraph | None = None  # the graph being tuned when an error came
        try:
            if sparse := [f"{name} ({tensor.layout})" for name, tensor in
                          [*self._ait_module.named_parameters(), *self._ait_module.named_buffers()]
                          if tensor.layout != torch.strided]:
                # (recording failed on them with "Cannot access storage of SparseTensorImpl", naming nothing)
                raise ValueError(f"ait.Module '{self._ait_name}' holds tensors of a layout other than strided "
                                 f"({', '.join(sparse[:5])}), which neither the ONNX export nor aitune's checks take; "
                                 "keep them dense (to_dense()) to tune the module, or tune its dense submodules")
            if self._ait_record_errors:
                raise ValueError(
                    f"ait.Module '{self._ait_name}': recording failed: " + "; ".join(self._ait_record_errors)
                )
            if not self._ait_graphs:
                raise ValueError(f"ait.Module '{self._ait_name}' recorded no calls")
            if clear_cache:
                cache.clear_module(self._ait_name)
            graphs = list(self._ait_graphs.values())
            strategies = ([strategy] * len(graphs) if strategy is not None
                          else self._ait_strategies.for_graphs(self._ait_name, graphs))
            measured = functools.partial(measured_call, harmless=self._ait_harmless_attributes)
            # the state the recorded calls changed, as they left it: tuning's own calls do not keep theirs
            state = StateSnapshot(self._ait_module, [name for graph in graphs for name in graph.mutated_state])
            try:
                for (identity, graph), graph_strategy in zip(self._ait_graphs.items(), strategies, strict=True):
                    failing = graph
                    tuned[identity] = (graph, tune_graph(graph_strategy, graph, options, measured))
                    logger.info("ait.Module '%s' %s: %s", self._ait_name, graph.key, tuned[identity][1].describe())
            finally:
                state.restore()
        except Exception as error:
            self.__dict__.pop("_ait_before_tuning", None)
            self._ait_state = ModuleState.PASSTHROUGH
            self._ait_failure = f"{type(error).__name__}: {error}"
            # what the failed tune measured stays readable (ait_reports): the graphs tuned
            # before the failure, and the failed graph's candidates with their reasons
            reports = {graph.key: done.report for graph, done in tuned.values() if done.report is not None}
            if getattr(error, "report", None) is not None and failing is not None:
                reports[failing.key] = error.report
            self._ait_failed_reports = reports
            raise
        self.__dict__.pop("_ait_before_tuning", None)
        self._ait_environment_reads = tuple(sorted(self.__dict__.get("_ait_recorded_environment", ())))
        self._ait_set_tuned(tuned)
        # the weights the graphs were tuned and checked with (ONNX Runtime's hold a copy):
        # what a checkpoint records, whatever the module holds when it is saved
        self._ait_tuned_weights = weight_values_digest(self._ait_module)
        self._ait_tuned_held = held_values_digest(self._ait_module, self._ait_harmless_attributes)
        self._ait_tuned_code = forward_code_digest(self._ait_module)
        self._ait_tuned_hooks = exported_hooks(self._ait_module)
        self._ait_state = ModuleState.TUNED
        self._ait_failure = None
        self._ait_failed_reports = {}

    def _ait_restore(self, tuned: dict[Any, tuple[Any, TunedGraph]], saved_attributes: dict[str, str] | None = None) -> None:
        """Takes over graphs restored from a checkpoint (``ait.load``): identity ->
        (graph, tuned graph). Replaces the recordings and tuned graphs in one step and
        makes the module TUNED; called only once everything was loaded.
        ``saved_attributes``: the plain values the graphs hold, as the checkpoint stores
        them (``baked_attributes``; None: a checkpoint written before they were stored)."""
        if not tuned:
            raise ValueError(f"ait.Module '{self._ait_name}': nothing to restore")
        self._ait_graphs = {identity: graph for identity, (graph, _) in tuned.items()}
        # the environment variables the graphs hold values of, watched as the attributes are
        self._ait_environment_reads = tuple(name for path in (saved_attributes or {})
                                            if (name := environment_key(path)) is not None)
        self.__dict__.pop("_ait_call_session", None)
        self.__dict__.pop("_ait_inactive_calls", None)
        self._ait_set_tuned(dict(tuned), saved_attributes)
        self._ait_record_errors = []
        self._ait_state = ModuleState.TUNED

    @property
    def _ait_tuned(self) -> dict[Any, tuple[Any, TunedGraph]]:
        """identity -> (graph, TunedGraph) of the graphs tuned (or loaded)."""
        return self._ait_calls.tuned

    def _ait_set_tuned(self, tuned: dict[Any, tuple[Any, TunedGraph]],
                       saved_attributes: dict[str, str] | None = None) -> None:
        """Replaces the tuned graphs, and with them the whole dispatch: its C++ half and
        that half's routes are made anew from these graphs, so nothing that answered
        "which graph" for the old ones survives."""
        self.__dict__.pop("_ait_weights_said", None)  # new graphs: weight changes are said again
        old = self._ait_calls
        self._ait_calls = ModuleDispatch(old.name, old.module, old.signature, old.eager_fallback, tuned,
                                         list(self._ait_graphs.values()), self._ait_harmless_attributes,
                                         saved_attributes, self.__dict__.get("_ait_environment_reads", ()))
        self._ait_calls.weights_changed = self._ait_weights_changed_by_eager_calls
