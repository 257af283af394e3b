"""ait.Module: a transparent proxy over an nn.Module that records its calls and, once
tuned, runs them on the backend its strategy chose."""

from __future__ import annotations

import enum
import inspect
import logging
import warnings
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor as _Tensor

from aitune import _core
from aitune.torch import cache, flatten
from aitune.torch.backend.base import TunedGraph
from aitune.torch.context import current_session, eager_only
from aitune.torch.graph import CallForm, RecordedGraph, describe_call
from aitune.torch.strategy import OneBackendStrategy, TuneStrategy
from aitune.torch.torch_dispatch import new_dispatch

logger = logging.getLogger("aitune")


class ModuleState(str, enum.Enum):
    """INIT until the first recorded call, RECORDING while ``ait.tune`` feeds samples,
    then TUNED, or PASSTHROUGH (eager) when tuning failed and failures were ignored."""

    INIT = "init"
    RECORDING = "recording"
    TUNED = "tuned"
    PASSTHROUGH = "passthrough"


class GraphNotRecordedError(_core.InvalidArgumentError):
    """A tuned module was called with an input structure, dtype, rank or non-tensor
    value that no recorded sample had."""


# nn.Module keeps parameters, buffers and submodules in these dicts. The proxy shares
# them with the wrapped module instead of registering it as a child, so that
# parameters(), named_modules() and a parent's state_dict() see the wrapped module's
# names unprefixed, exactly as before wrapping.
_SHARED_REGISTRIES = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")


def _positional_defaults(signature: inspect.Signature) -> tuple[list[str], dict[str, Any]] | None:
    """Names and defaults of a forward whose parameters are all positional-or-keyword
    (the shape of most forwards), for the fast path of ``Module._ait_bind``; None otherwise."""
    parameters = list(signature.parameters.values())
    if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters], {p.name: p.default for p in parameters}


_module_call = torch.nn.Module.__call__


def _requires_grad(args: tuple, kwargs: dict) -> bool:
    """Whether any tensor of the call requires grad (plain tensor arguments are checked
    without flattening)."""
    for value in (*args, *kwargs.values()):
        if type(value) is _Tensor:
            if value.requires_grad:
                return True
        elif any(leaf.requires_grad for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)):
            return True
    return False


# Defaults that cannot change between calls (immutable values). A call that leaves
# only such defaults unfilled binds to the same graph identity every time, so the
# graph it matched can be cached by its tensors' dtypes and ranks alone.
_FIXED_DEFAULT_TYPES = (type(None), bool, int, float, complex, str, bytes)


def _call_layout(positional: tuple[list[str], dict[str, Any]] | None, n: int, keywords: tuple) -> tuple | None:
    """For a call with ``n`` positional arguments and these keyword arguments: the
    keywords in the forward's parameter order (the order binding puts them in), when
    every parameter the call leaves out has a fixed default; None when not (or when
    the call does not bind): such calls take the general path of ``_ait_dispatch``."""
    if positional is None or n > len(positional[0]):
        return None
    names, defaults = positional
    rest = names[n:]
    if not set(keywords) <= set(rest):
        return None
    if any(type(defaults[name]) not in _FIXED_DEFAULT_TYPES for name in rest if name not in keywords):
        return None
    return tuple(name for name in rest if name in keywords)


class Module(torch.nn.Module):
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
        if strategy is None:
            from aitune.torch.backend import ONNXRuntimeBackend  # the spec's default backend

            strategy = OneBackendStrategy(ONNXRuntimeBackend())
        if not isinstance(strategy, TuneStrategy):
            raise TypeError(f"strategy must be a TuneStrategy, got {type(strategy).__name__}")
        super().__init__()
        signature = inspect.signature(module.forward)
        positional = _positional_defaults(signature)
        own = {
            "_ait_module": module,
            "_ait_name": name or type(module).__name__,
            "_ait_strategy": strategy,
            "_ait_eager_fallback": eager_fallback,
            "_ait_signature": signature,
            "_ait_positional_defaults": positional,
            # numbers of positional arguments that may take the fast path without keywords
            "_ait_fast_arities": frozenset(
                n for n in range(len(positional[0]) + 1) if _call_layout(positional, n, ()) is not None
            ) if positional is not None else frozenset(),
            "_ait_keyword_layouts": {},  # (n positional, keywords as called) -> _call_layout
            "_ait_state": ModuleState.INIT,
            "_ait_graphs": {},  # identity -> RecordedGraph
            "_ait_tuned": {},  # identity -> (RecordedGraph, TunedGraph)
            "_ait_fast": {},  # (keywords, dtypes and ranks) of a call -> (identity, _ait_tuned entry)
            "_ait_direct": None,  # _core.TorchDispatch serving positional tensor calls, once one was seen
            "_ait_warned": set(),
            "_ait_grad_logged": False,  # the first call run eagerly for autograd was logged
            "_ait_record_errors": [],
            "training": module.training,
        }
        own.update({registry: getattr(module, registry) for registry in _SHARED_REGISTRIES})
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
        return {graph.key: tuned.report for graph, tuned in self._ait_tuned.values() if tuned.report is not None}

    @property
    def ait_backends(self) -> dict[str, str]:
        """Graph key -> description of the backend running it (empty unless TUNED)."""
        return {graph.key: tuned.describe() for graph, tuned in self._ait_tuned.values()}

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

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Once a call of plain tensors was resolved, calls like it run in C++
        # (torch_dispatch), which hands everything else back to nn.Module.__call__.
        direct = self._ait_direct
        if direct is None:
            return _module_call(self, *args, **kwargs)
        return direct(self, args, kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if eager_only():
            return self._ait_module(*args, **kwargs)
        session = current_session()
        if session is not None:
            return self._ait_record(session, args, kwargs)
        if self._ait_state is ModuleState.TUNED:
            return self._ait_dispatch(args, kwargs)
        return self._ait_module(*args, **kwargs)

    def _ait_bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults filled in: ``m(x)``,
        ``m(x=x)`` and ``m(x, mask=None)`` are one call (one graph). Only for telling
        graphs apart: calls are replayed in the user's own form (``CallForm``)."""
        fast = self._ait_positional_defaults
        if not kwargs and fast is not None and len(args) <= len(fast[0]):
            # The common call m(x, y): what Signature.bind + apply_defaults would give,
            # in a third of the time (this runs on every tuned call).
            names, defaults = fast
            arguments = dict(zip(names, args))
            for name in names[len(args) :]:
                if defaults[name] is inspect.Parameter.empty:
                    break  # a required argument is missing: let bind raise its TypeError
                arguments[name] = defaults[name]
            else:
                return arguments
        bound = self._ait_signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    def _ait_record(self, session, args: tuple, kwargs: dict) -> Any:
        if session.enlist(self):  # first call of this tuning: forget older recordings
            self._ait_graphs.clear()
            self._ait_record_errors.clear()
            self._ait_state = ModuleState.RECORDING
        arguments = self._ait_bind(args, kwargs)
        outputs = self._ait_module(*args, **kwargs)
        try:
            flatten.register_dataclasses((arguments, outputs))
            leaves, spec = pytree.tree_flatten(arguments)
            identity = flatten.identity(spec, leaves)
            graph = self._ait_graphs.get(identity)
            if graph is None:
                form = CallForm.of(self._ait_signature, len(args), kwargs)
                graph = RecordedGraph(self._ait_name, self._ait_module, self._ait_signature, arguments, outputs, form)
                self._ait_graphs[identity] = graph
            graph.add_sample([leaf for leaf in leaves if isinstance(leaf, torch.Tensor)], outputs, session.batch_size)
        except Exception as error:  # keep feeding samples; tuning reports it
            self._ait_record_errors.append(f"{type(error).__name__}: {error}")
        return outputs

    def _ait_dispatch(self, args: tuple, kwargs: dict) -> Any:
        if torch.is_grad_enabled() and _requires_grad(args, kwargs):
            return self._ait_run_with_autograd(args, kwargs)
        # Fast path: a call of plain tensors (positional, or keywords as well) that
        # matched a graph before matches it again when its keywords, dtypes and ranks
        # are the same, so binding, pytree flattening and the graph identity (TreeSpecs
        # hash and compare in Python) are skipped. Any other call, and the first such
        # call, takes the general path, which fills the cache. Shapes and devices are
        # checked by the backend on both paths alike.
        fast_key = cached = values = None
        if not kwargs:
            if len(args) in self._ait_fast_arities:
                keywords, values = (), args
        else:
            keywords = self._ait_keyword_layout(len(args), tuple(kwargs))
            if keywords is not None:
                values = (*args, *[kwargs[name] for name in keywords])  # in binding order
        if values is not None:
            fast_key = (keywords, tuple([(v.dtype, v.dim()) if type(v) is _Tensor else None for v in values]))
            cached = self._ait_fast.get(fast_key)
        if cached is not None:
            identity, (graph, tuned) = cached
            tensors = list(values)
        else:
            arguments = self._ait_bind(args, kwargs)
            leaves, spec = flatten.flatten_arguments(arguments)
            identity = flatten.identity(spec, leaves)
            entry = self._ait_tuned.get(identity)
            if entry is None:
                return self._ait_unrecorded(identity, arguments, args, kwargs)
            graph, tuned = entry
            if fast_key is not None and None not in fast_key[1]:  # only plain tensors make a key
                self._ait_fast[fast_key] = (identity, entry)
            else:
                fast_key = None
            tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        try:
            outputs = tuned.infer(tensors)
        except _core.ShapeMismatchError as error:
            if not self._ait_eager_fallback:
                error.add_note(f"ait.Module '{self._ait_name}' recorded for this graph: {graph.describe()}")
                raise
            self._ait_warn_once(identity, f"{error}; running eagerly")
            return self._ait_module(*args, **kwargs)
        if cached is None and fast_key is not None:  # resolved, and ran: next time in C++
            self._ait_add_route(values, keywords, graph, tuned)
        return graph.rebuild_outputs(outputs)

    def _ait_run_with_autograd(self, args: tuple, kwargs: dict) -> Any:
        """A call whose inputs require grad, with gradients enabled, runs eagerly so that
        autograd sees it (a tuned graph's outputs carry no gradient history); said once
        in the log. The C++ hot path never serves such calls (DLPack refuses tensors
        that require grad), so they all come here."""
        if not self._ait_grad_logged:
            self._ait_grad_logged = True
            logger.warning(
                "ait.Module '%s': called with inputs that require grad while gradients are enabled; such calls "
                "run eagerly in PyTorch (autograd intact), the tuned graph serves calls without gradients "
                "(torch.no_grad() / torch.inference_mode(), or inputs that do not require grad)",
                self._ait_name,
            )
        return self._ait_module(*args, **kwargs)

    def _ait_add_route(self, values: tuple, keywords: tuple, graph, tuned: TunedGraph) -> None:
        """Hands calls like this one (plain tensors, the last ``len(keywords)`` of
        ``values`` passed by those names; resolved to ``graph``) to the C++ hot path,
        where the tuned graph's backend has one."""
        dispatch = self._ait_direct or new_dispatch()
        rebuild = None if graph.returns_one_tensor else graph.rebuild_outputs
        sample = [v.detach() for v in values]  # detach: DLPack refuses grad
        if tuned.add_route(dispatch, sample, rebuild, keywords):
            self._ait_direct = dispatch  # only with a route: a dispatch without one is a detour

    def _ait_keyword_layout(self, n: int, keywords: tuple) -> tuple | None:
        """``_call_layout`` of a call with keywords, computed once per call form."""
        try:
            return self._ait_keyword_layouts[n, keywords]
        except KeyError:
            layout = self._ait_keyword_layouts[n, keywords] = _call_layout(self._ait_positional_defaults, n, keywords)
            return layout

    def _ait_unrecorded(self, identity, arguments: dict, args: tuple, kwargs: dict) -> Any:
        call = describe_call(self._ait_signature, arguments)
        if self._ait_eager_fallback:
            self._ait_warn_once(identity, f"no recorded graph matches this call ({call}); running eagerly")
            return self._ait_module(*args, **kwargs)
        recorded = "\n".join(f"  {i + 1}. {g.describe()}" for i, g in enumerate(self._ait_graphs.values()))
        raise GraphNotRecordedError(
            f"ait.Module '{self._ait_name}' was tuned for other inputs than this call.\n"
            f"This call: {call}\nRecorded graphs:\n{recorded}\n"
            "Add such samples to the data given to ait.tune, or wrap the module with "
            "ait.Module(..., eager_fallback=True) to run such calls eagerly."
        )

    def _ait_warn_once(self, identity, message: str) -> None:
        if identity not in self._ait_warned:
            self._ait_warned.add(identity)
            warnings.warn(f"ait.Module '{self._ait_name}': {message}", RuntimeWarning, stacklevel=4)

    # -- tuning -----------------------------------------------------------------------

    def _ait_tune(self, clear_cache: bool = False, options=None) -> None:
        """Builds every recorded graph with the strategy. On failure the module stays
        eager (PASSTHROUGH) and the exception propagates to ``ait.tune``."""
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
                tuned[identity] = (graph, self._ait_strategy.tune(graph, options))
                logger.info("ait.Module '%s' %s: %s", self._ait_name, graph.key, tuned[identity][1].describe())
        except Exception:
            self._ait_state = ModuleState.PASSTHROUGH
            raise
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
        self._ait_warned = set()
        self._ait_record_errors = []
        self._ait_state = ModuleState.TUNED

    def _ait_set_tuned(self, tuned: dict[Any, tuple[Any, TunedGraph]]) -> None:
        """Replaces the tuned graphs, and drops the fast paths' caches of their entries
        (``_ait_fast``, the C++ ``_ait_direct``) with them. ``_ait_tuned`` is only ever
        replaced as a whole, here; code that swaps one of its entries in place after
        calls must reset both too."""
        self._ait_tuned = tuned
        self._ait_fast = {}
        self._ait_direct = None
