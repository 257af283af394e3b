"""The dispatch of a tuned ait.Module's calls: which tuned graph a call is, and running it.

Every call of tensors into and out of an ONNX Runtime session goes through the C++ half,
``_core.TorchDispatch`` (python/src/frontend/torch_dispatch.cpp). This Python half
resolves what that half cannot: it binds a call to the forward's parameters, flattens it
and finds its graph (``ModuleDispatch.call``, the general path), then hands the call's
tensors to the C++ half, and adds a route there for calls of plain tensors like it, which
the C++ half then serves before any Python runs. Graphs that run in Python (eager,
torch.compile) are run by their ``TunedGraph.infer``: here on the general path, and
called by the C++ half's routes (``python_graph_run``), so their calls skip the same
Python a session's do.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch import Tensor as _Tensor
from torch._C import _functorch
from torch._subclasses.fake_tensor import is_fake as _is_fake
from torch.nn.modules import module as _nn_module
from torch.utils.hooks import RemovableHandle

from aitune import _core
from aitune.torch import context, flatten
from aitune.torch.backend.base import TunedGraph
from aitune.torch.baked_attributes import AttributeWatch, describe_changes
from aitune.torch.grad_modes import describe as describe_mode
from aitune.torch.grad_modes import mode_of_call
from aitune.torch.graph import autocast_enabled, describe_call, differing_containers, differing_values
from aitune.torch.weight_changes import (added_to_registries, class_tensor_ids, registry_keys,
                                         see_fused_optimizer_steps, tensor_attributes, weight_slots)

logger = logging.getLogger("aitune")


class GraphNotRecordedError(_core.InvalidArgumentError):
    """A tuned module was called with an input structure, dtype, rank or non-tensor
    value that no recorded sample had."""


# torch.cuda.current_stream(device).cuda_stream builds a Stream object per call (~9 us on
# the H200's host, measured by benchmarks/forward_overhead.py); torch's own compiled code
# reads the raw handle with this private call. Fall back where a torch build lacks it.
current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream
)

# The C-level converters: torch.utils.dlpack.from_dlpack is a Python function that
# probes for __dlpack__ before calling this one (~0.5 us per output on a small model).
# Capsules, not tensors: a CUDA tensor's __dlpack__ records and waits on a new
# torch.cuda.Event per call to order with the legacy stream, which the session does itself.
_to_dlpack = torch._C._to_dlpack
_from_dlpack = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack

# A call may skip the Python path only where nn.Module.__call__ would go straight to
# forward (no hooks, no compiled call, no JIT tracing) and the proxy's forward would
# dispatch (not recording for ait.tune, not inside run_eagerly()). torch fills the global
# hook dicts in place, so they are bound once; the module's own are read per call.
_GUARDS = dict(
    global_dicts=[
        _nn_module._global_forward_pre_hooks,
        _nn_module._global_forward_hooks,
        _nn_module._global_backward_pre_hooks,
        _nn_module._global_backward_hooks,
    ],
    context_vars=[context.session_var, context.eager_var],
    # a TorchFunctionMode or TorchDispatchMode active (a user's, a FlopCounterMode, torch.device
    # as a context): it acts on eager ops, which a graph has none of (a mode doubling linear
    # changed eager's outputs 2x and not the graph's, silently)
    calls=[torch._C._get_tracing_state, torch._C._is_torch_function_mode_enabled, torch._C._len_torch_dispatch_stack],
    attributes=["_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks", "_compiled_call_impl"],
)


def new_dispatch(module: torch.nn.Module, training: bool | None, autocast: bool | None = None,
                 grad_modes: tuple[str, ...] = (), default_dtype: torch.dtype | None = None) -> _core.TorchDispatch:
    """An empty C++ half for one ait.Module; calls it does not serve go to nn.Module.__call__.
    ``training``: the mode the graphs were recorded in (None: not checked). A call while the
    wrapped ``module`` or any of its submodules is in another mode than now (where ``module``
    is in mode ``training``; else than ``training``) goes to the Python path (which runs it
    eagerly), also when train() was called on the wrapped module or a submodule itself: the
    C++ half reads each module's ``training`` per call. So does a call while a submodule's
    forward hooks differ from the ones registered now (a graph runs no submodule).
    ``autocast``: whether torch.autocast was on when they were recorded (None: not checked);
    a call in the other state goes there too. ``grad_modes``: the autograd modes forward
    computes otherwise in (grad_modes.py); a call in one goes there too. ``default_dtype``:
    torch's default dtype the graphs were made under (None: not checked); a call under
    another goes there too."""
    guards = dict(_GUARDS)
    if default_dtype is not None:
        guards["calls"] = [*guards["calls"], lambda: torch.get_default_dtype() is not default_dtype]
    if autocast is not None:
        guards["calls"] = [*guards["calls"], lambda: autocast_enabled() is not autocast]
    if grad_modes:
        guards["calls"] = [*guards["calls"], lambda: mode_of_call(grad_modes) is not None]
    return _core.TorchDispatch(
        _to_dlpack, _from_dlpack, torch.Tensor, current_raw_stream, torch.nn.Module.__call__, **guards,
        submodules=list(module.modules()), training=training, hook_counter=RemovableHandle,
    )


_module_call = torch.nn.Module.__call__


class DispatchedModule(torch.nn.Module):
    """A module whose calls go through a ``ModuleDispatch`` (its ``_ait_calls``): once a
    call of plain tensors was resolved, calls like it run in C++ (the dispatch's C++
    half), which hands everything else back to nn.Module.__call__ (then ``forward``).
    ait.Module is one; the tuner measures every candidate through another
    (``measured_call``), so what is measured and what a user calls are one code."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        direct = self._ait_calls.direct
        if direct is None:
            return _module_call(self, *args, **kwargs)
        return direct(self, args, kwargs)


class _MeasuredModule(DispatchedModule):
    """The module a candidate is measured as: ait.Module's call, its tuned path only."""

    def __init__(self, calls: ModuleDispatch):
        super().__init__()
        object.__setattr__(self, "_ait_calls", calls)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._ait_calls.call(args, kwargs)


def measured_call(graph, tuned: TunedGraph, inputs: list | None = None,
                  harmless: tuple[str, ...] = ()) -> Callable[[], Any]:
    """The call a candidate is measured by: ``graph``'s largest recorded sample (or
    ``inputs``, tensors in its recording order: a candidate that writes its inputs is
    measured on copies), in the form the user called it (positional, keywords), through a dispatch whose one graph
    ``graph`` is run by ``tuned``, called as ait.Module calls its dispatch (the route in
    C++ after a first call, the output structure rebuilt: dicts, ModelOutput). So the
    latency the tuner chooses by is the latency of the module it hands back (issue 28).
    The first call (the general path, which adds the route) is made here."""
    calls = ModuleDispatch(graph.module_name, graph.module, graph.signature, eager_fallback=False,
                           tuned={graph.identity: (graph, tuned)}, recorded=[graph], harmless=harmless)
    calls.measuring = True
    calls.cpp.check_until_said(None)  # a candidate measured: nothing to say to the user
    calls.frozen_said = True
    if inputs is None:
        inputs = max(graph.samples, key=lambda sample: sample.batch_size).inputs
    args, kwargs = graph.call_arguments(inputs)
    module = _MeasuredModule(calls)
    module(*args, **kwargs)

    def call() -> Any:
        return module(*args, **kwargs)

    return call


def python_graph_run(graph, tuned: TunedGraph) -> Callable[[list], Any]:
    """What the C++ half calls for a routed call of a graph that runs in Python: the
    call's tensors (recording order) in, the module's output out; the general path's
    ``graph.rebuild_outputs(tuned.infer(tensors))``, nothing else."""
    infer, rebuild = tuned.infer, graph.rebuild_outputs
    if graph.returns_one_tensor:
        return lambda tensors: infer(tensors)[0]
    return lambda tensors: rebuild(infer(tensors))


def positional_defaults(signature: inspect.Signature) -> tuple[list[str], dict[str, Any], str | None] | None:
    """Names and defaults of a forward whose parameters are all positional-or-keyword,
    optionally followed by ``**kwargs`` (the shape of most forwards, Hugging Face's
    included: their forwards end in ``**kwargs``), for the quick binding of
    ``ModuleDispatch.bind``, and the name of that ``**kwargs`` (None: there is none);
    None for any other signature."""
    parameters = list(signature.parameters.values())
    var_keyword = None
    if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD:
        var_keyword = parameters.pop().name
    if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters], {p.name: p.default for p in parameters}, var_keyword


# Defaults that cannot change between calls (immutable values). A call that leaves
# only such defaults unfilled binds to the same graph identity every time, so its tensors'
# dtypes, ranks and devices alone name its graph: such calls may get a route.
_FIXED_DEFAULT_TYPES = (type(None), bool, int, float, complex, str, bytes)


def call_layout(positional: tuple[list[str], dict[str, Any], str | None] | None, n: int,
                keywords: tuple) -> tuple | None:
    """For a call with ``n`` positional arguments and these keyword arguments: the
    keywords in the forward's parameter order (the order binding puts them in), when
    every parameter the call leaves out has a fixed default; None when not (or when the
    call does not bind, or passes a keyword that only ``**kwargs`` takes): such calls get
    no route. A ``**kwargs`` the call leaves empty binds to ``{}`` every time."""
    if positional is None or n > len(positional[0]):
        return None
    names, defaults = positional[0], positional[1]
    rest = names[n:]
    if not set(keywords) <= set(rest):
        return None
    if any(type(defaults[name]) not in _FIXED_DEFAULT_TYPES for name in rest if name not in keywords):
        return None
    return tuple(name for name in rest if name in keywords)


def effect_on_tensors_only(hook) -> bool:
    """transformers' output-capturing hook (installed on the layers the first time a call
    asks ``output_hidden_states`` / ``output_attentions``, or a head such as SegFormer's
    asks them of its base model): it only appends a layer's output tensors to a collector
    that the decorated forward returns in its ModelOutput, an effect on tensors that the
    exported graph keeps. The user registered nothing, so naming it would send them looking
    for a hook of their own."""
    return (getattr(hook, "__module__", None) == "transformers.utils.output_capturing"
            and getattr(hook, "__name__", None) == "output_capturing_hook")


def global_forward_hooks() -> list[str]:
    """The hooks registered for every module's forward (``torch.nn.modules.module.
    register_module_forward_hook`` / ``_pre_hook``; profilers' module trackers), by name: a
    tuned graph runs no submodule, so it can neither run them on its submodules nor, where
    they ran while it was exported, leave their effect out."""
    hooks = [*_nn_module._global_forward_pre_hooks.values(), *_nn_module._global_forward_hooks.values()]
    return [getattr(hook, "__qualname__", None) or type(hook).__name__ for hook in hooks]


def _forward_hooks(module: torch.nn.Module) -> dict[str, dict]:
    """path -> {handle id: hook} of the forward (pre-)hooks of each submodule that has any."""
    found = {}
    for name, sub in module.named_modules():
        if name and (sub._forward_pre_hooks or sub._forward_hooks):
            found[name] = {**sub._forward_pre_hooks, **sub._forward_hooks}
    return found


def _weight_versions(module: torch.nn.Module, harmless: tuple[str, ...] = ()) -> list[tuple[str, torch.Tensor, int]]:
    """(name, tensor, version counter) of each parameter and buffer that has a counter
    (tensors made under torch.inference_mode() have none), and of each tensor a module
    keeps as a plain attribute (``self.scale = torch.ones(8)``, not registered: an export
    holds it as a constant all the same), harmless ones left out."""
    found = []
    for name, tensor in (*module.named_parameters(), *module.named_buffers(), *tensor_attributes(module, harmless)):
        if tensor is not None and not tensor.is_inference():
            found.append((name, tensor, tensor._version))
    return found


#: (module name, weight names) already said by ``_say_unversioned_weights``
_UNVERSIONED_SAID: set[tuple[str, tuple[str, ...]]] = set()


def _say_unversioned_weights(name: str, module: torch.nn.Module) -> None:
    """Says, once, which weights were made under ``torch.inference_mode()``: such a tensor
    has no version counter, so a write into it after tuning (a LoRA merge, ``.add_()``) is
    not seen, and the graphs would keep computing the old values (2.08 off, silently, in a
    session-36 probe)."""
    unversioned = tuple(weight for weight, tensor in (*module.named_parameters(), *module.named_buffers())
                        if tensor is not None and tensor.is_inference())
    if not unversioned or (name, unversioned) in _UNVERSIONED_SAID:
        return
    _UNVERSIONED_SAID.add((name, unversioned))
    shown = ", ".join(unversioned[:5]) + (f" and {len(unversioned) - 5} more" if len(unversioned) > 5 else "")
    logger.warning("ait.Module '%s': weights made under torch.inference_mode() (%s) have no version counter, so a "
                   "write into them after tuning (a LoRA merge, .add_() under no_grad) is not seen and the tuned "
                   "graphs would keep the old values: tune again after changing them, or build the model outside "
                   "torch.inference_mode() (under torch.no_grad() its writes are seen)", name, shown)


def _slot_storages(slots: list) -> dict[int, tuple]:
    """id -> ``_storage_of`` of each tensor among the weight slots, as they are now."""
    return {id(value): _storage_of(value) for _, _, _, value in slots
            if isinstance(value, torch.Tensor) and _no_data_cause(value) is None}


def _storage_of(tensor: torch.Tensor) -> tuple:
    """What a ``.data = ...`` assignment changes on the same tensor object (its version
    counter stays): data pointer, dtype, device, shape and strides."""
    try:
        where = tensor.data_ptr(), tensor.stride()
    except RuntimeError:  # a layout without one storage (sparse): shape, dtype and device alone
        where = None
    return where, tensor.dtype, tensor.device, tuple(tensor.shape)


def _same_held_values(old: Any, new: Any) -> bool:
    """Whether a watched slot's object replaced by ``new`` leaves the graphs right: an equal
    tensor or array (``_equal_tensors``), a tuple, list or dict of equal ones, or an emptied
    container where one held tensors (a cache cleared: timm's LeViT empties its
    ``attention_bias_cache`` on ``train()`` and refills it from its weights; a forward reading
    an item from an empty container recomputes it or fails, eagerly too)."""
    containers = (tuple, list, dict)
    if isinstance(old, containers) and isinstance(new, containers):
        if not new:
            return True
        if type(old) is not type(new) or len(old) != len(new):
            return False
        if isinstance(old, dict):
            return old.keys() == new.keys() and all(_same_held_values(old[k], new[k]) for k in old)
        return all(_same_held_values(a, b) for a, b in zip(old, new))
    return old is new or _equal_tensors(old, new)


def _equal_tensors(old: Any, new: Any) -> bool:
    """Whether a tensor replaced by ``new`` was replaced by the same values (a cache or a
    weight assigned again as an equal copy: the graphs hold those values still)."""
    if isinstance(old, np.ndarray) and isinstance(new, np.ndarray):  # weight_changes.is_numeric_array
        return old.dtype == new.dtype and old.shape == new.shape and bool(np.array_equal(old, new, equal_nan=True))
    return (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.dtype == new.dtype
            and old.shape == new.shape and old.device == new.device and bool(torch.equal(old, new)))


def _no_data_cause(tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` has no data a graph could read, or None: a torch.func transform's
    wrapper (``torch.vmap``, ``grad``, ``jacrev``: a plain ``torch.Tensor`` to Python, with no
    storage of its own) or a FakeTensor (shape propagation under ``FakeTensorMode``)."""
    if _functorch.is_functorch_wrapped_tensor(tensor):
        return "a torch.func transform (torch.vmap, grad, jacrev, ...)"
    if _is_fake(tensor):
        return "FakeTensorMode (fake tensors)"
    return None


def _overriding_subclass(tensor: torch.Tensor) -> str | None:
    """The class of ``tensor`` where it is a subclass with its own ``__torch_function__`` or
    ``__torch_dispatch__`` (a masked, quantized or unit-carrying tensor), or None: eager
    PyTorch runs the subclass's overrides on the module's ops, a graph only reads the data."""
    kind = type(tensor)
    if kind is _Tensor or kind is torch.nn.Parameter:
        return None
    function = getattr(kind.__torch_function__, "__func__", kind.__torch_function__)
    if function is not _Tensor.__torch_function__.__func__ or kind.__torch_dispatch__ is not _Tensor.__torch_dispatch__:
        return kind.__qualname__
    return None


def _call_tensors(args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    """The tensors of a call: its tensor arguments, and those inside its containers."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        else:
            yield from (leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor))


def _subclass_inputs(args: tuple, kwargs: dict) -> str | None:
    """The first overriding tensor subclass among the call's tensors (``_overriding_subclass``)."""
    return next((name for tensor in _call_tensors(args, kwargs) if (name := _overriding_subclass(tensor))), None)


def _active_modes() -> str | None:
    """The TorchFunctionModes and TorchDispatchModes active now, by class name, or None."""
    names = []
    if torch._C._is_torch_function_mode_enabled():
        names += [type(m).__name__ for m in torch.overrides._get_current_function_mode_stack()]
    if torch._C._len_torch_dispatch_stack():
        names += [type(m).__name__ for m in torch.utils._python_dispatch._get_current_dispatch_mode_stack()]
    return ", ".join(names) or None


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


def _without_data(args: tuple, kwargs: dict) -> str | None:
    """What makes a tensor of the call one no graph can read (``_no_data_cause``), or None.
    Eager PyTorch computes such calls; a graph would read a null pointer or the unbatched
    per-sample view. (A meta tensor is refused as any tensor on another device is: the
    module's weights are not on it.)"""
    return next((cause for tensor in _call_tensors(args, kwargs) if (cause := _no_data_cause(tensor)) is not None),
                None)


_SWAPPED_UNDER_TRANSFORM = ("a torch.func transform over the module's weights (torch.func.grad over "
                            "functional_call: weights swapped in for the call)")


def _mode_free_containers() -> tuple[type, ...]:
    from torch.nn.utils.parametrize import ParametrizationList

    return (torch.nn.ModuleDict, torch.nn.ModuleList, torch.nn.ParameterDict, torch.nn.ParameterList,
            torch.nn.Sequential, ParametrizationList)


#: torch's containers, whose code never reads ``training`` (their children's modes are
#: checked one by one): one in another mode than at tuning is no change. A parametrization
#: added after ``model.eval()`` creates its containers in train mode, and a later ``.eval()``
#: made every call run eagerly.
_MODE_FREE_CONTAINERS = _mode_free_containers()


#: How to have calls outside the recorded graphs run eagerly, wherever the module was wrapped.
_FALLBACK_ADVICE = ("wrap the module with ait.Module(..., eager_fallback=True) (ait.wrap(..., eager_fallback=True), "
                    "ait.load(..., eager_fallback=True) for the modules they wrap) to run such calls eagerly")


class ModuleDispatch:
    """The tuned graphs of one ait.Module and the way to them. Replaced as a whole when the
    module is tuned or loaded again, so its graphs, its C++ half and that half's routes
    are never out of step.

    Args:
        name: the module's name (for messages).
        module: the wrapped PyTorch module (runs calls eagerly where asked).
        signature: its forward's signature.
        eager_fallback: run calls no graph covers eagerly with a warning instead of raising.
        tuned: identity -> (graph, TunedGraph); empty for a module that is not tuned.
        recorded: the recorded graphs, named in the error for an unrecorded call.
        harmless: attributes declared harmless (``ait.Module(..., harmless_attributes=)``):
            not watched.
        saved_attributes: path -> repr of the plain values the graphs were exported with, as
            a checkpoint stores them (None: the module's values now are the graphs').
        environment: the environment variables forward read while recorded, watched beside
            the attributes (environment_reads.py).
    """

    def __init__(self, name: str, module: torch.nn.Module, signature: inspect.Signature, eager_fallback: bool,
                 tuned: dict[Any, tuple[Any, TunedGraph]] | None = None, recorded: list | None = None,
                 harmless: tuple[str, ...] = (), saved_attributes: dict[str, str] | None = None,
                 environment: tuple[str, ...] = ()):
        self.name = name
        self.module = module
        self.signature = signature
        self.eager_fallback = eager_fallback
        self.tuned = dict(tuned or {})
        self.recorded = list(recorded or [])
        self.positional = positional_defaults(signature)
        # The mode (train() / eval()) the graphs were recorded in; None: not known (a
        # checkpoint written before it was kept) or mixed, then not checked.
        modes = {getattr(graph, "training", None) for graph, _ in self.tuned.values()}
        self.training = modes.pop() if len(modes) == 1 else None
        # Whether torch.autocast was on when they were recorded; None: not known or mixed.
        autocasts = {getattr(graph, "autocast", None) for graph, _ in self.tuned.values()}
        self.autocast = autocasts.pop() if len(autocasts) == 1 else None
        # The autograd modes some graph's forward computes otherwise in: such calls run eagerly.
        self.grad_modes = tuple(sorted({mode for graph, _ in self.tuned.values()
                                        for mode in getattr(graph, "grad_modes", ())}))
        self.grad_modes_logged: set[str] = set()
        # torch's default dtype as the graphs were made or loaded: under another, eager's
        # torch.ones / arange in forward make that dtype and its outputs follow, a graph's
        # constants do not (set_default_dtype(float64) after tuning: float64 vs float32)
        self.default_dtype = torch.get_default_dtype()
        self.default_dtypes_logged: set[torch.dtype] = set()
        self.cpp = (new_dispatch(module, self.training, self.autocast, self.grad_modes, self.default_dtype)
                    if self.tuned else None)
        if self.cpp is not None:  # the first routed call with gradients on comes to Python, to be said
            self.cpp.check_until_said(torch.is_grad_enabled)
        # The names of the modules the C++ half watches (module.modules() order, "" the
        # wrapped module) and the forward hooks of each submodule with hooks when it was made.
        self.submodule_names = [name for name, _ in module.named_modules()] if self.tuned else []
        self.submodule_hooks = _forward_hooks(module) if self.tuned else {}
        # identity -> the graph's index in the C++ half: graphs that run in a session, and
        # those that run in Python (torch.compile, eager), whose routed calls the C++ half
        # hands straight to their run (python_graph_run), past nn.Module.__call__ and binding
        self.indices = {
            identity: (self.cpp.add_graph(tuned.session, list(tuned.order), len(graph.input_names),
                                          None if graph.returns_one_tensor else graph.rebuild_outputs)
                       if tuned.session is not None
                       else self.cpp.add_python_graph(python_graph_run(graph, tuned), len(graph.input_names)))
            for identity, (graph, tuned) in self.tuned.items()
        }
        self.direct = None  # the C++ half, once it has a route (before: a detour for every call)
        self.changes_logged: set = set()  # the changed submodules whose eager calls were logged
        self.warned: set = set()
        self.grad_logged = False  # the first call run eagerly for autograd was logged
        self.without_data_logged: set[str] = set()  # causes of calls without data, said once each
        self.tracing_logged = False  # a call under the JIT tracer said
        self.frozen_said = False  # a graph served a call with gradients on: its weights get none, said once
        self.modes_logged: set[str] = set()
        self.subclasses_logged: set[str] = set()  # the tensor subclasses whose eager calls were logged  # the sets of active modes whose eager calls were logged
        self.autocast_logged = False  # the first call run eagerly for autocast was logged
        self.global_hooks_logged: set = set()  # the sets of global forward hooks whose eager calls were logged
        self.measuring = False  # made by measured_call to measure a candidate, not a module's
        # Where a tuned graph holds a copy of the weights (an ONNX model's initializers), the
        # parameters and buffers with their version counters as tuning left them: an
        # optimizer step, a write under torch.no_grad(), calls run eagerly in train() mode
        # (BatchNorm statistics) change them in place, and the graphs would compute the old
        # model. The C++ half serves routed calls only while every counter is unchanged;
        # the general path compares them on each call (then ``weights_changed(how) -> bool``,
        # set by ait.Module, deactivates it). A write into ``.data`` moves no counter.
        self.holding = any(tuned.holds_weights for _, tuned in self.tuned.values())
        if self.holding:
            see_fused_optimizer_steps()  # (a fused step moves no counter of its own)
        self.harmless = harmless
        # The weights' slots and versions as tuned, kept when replaced weights deactivated
        # the module (``originals_back``); None otherwise.
        self.originals: tuple[list, list] | None = None
        self.weights: list[tuple[str, torch.Tensor, int]] = []
        self.watch_weights_as_they_are()
        self.weights_changed: Callable[[str], bool] | None = None
        # The plain Python values (``self.temperature``, a config's flags) the graphs were
        # recorded with: an ONNX Runtime graph holds them as constants, and every graph's
        # outputs are rebuilt in the structure recorded with them (torch.compile recompiles
        # on a changed flag, but a flag that makes forward return a tuple, or one more
        # output, came back under the recorded dict's names). A call while one was
        # reassigned to another value runs eagerly (baked_attributes.py).
        self.attributes = (AttributeWatch(module, harmless, saved_attributes, environment)
                           if any(tuned.records_attributes for _, tuned in self.tuned.values()) else None)
        # the tensors the modules' classes hold, by identity: one replaced on the class
        # (``Block.OFFSET = torch.full(...)``) is no plain value the attribute watch compares,
        # and the graphs kept the old one silently (a session-36 probe)
        self.class_tensors = class_tensor_ids(module, harmless)
        self.attributes_logged: set = set()
        # Where a graph holds a copy of the weights, the objects in their slots and those of
        # the submodules: one replaced by assignment (``fc.weight = nn.Parameter(w)``,
        # ``model.fc = nn.Linear(...)``, on the wrapped module) moves no version counter, but
        # is another object there (weight_changes.weight_slots).
        self.slots = weight_slots(module, harmless) if self.holding else []
        self.storages = _slot_storages(self.slots)
        self.registries = registry_keys(module) if self.holding else []
        self.watch_values_as_they_are()

    def in_other_mode(self, training: bool) -> bool:
        """Whether a module in mode ``training`` is in the other mode than the graphs were
        recorded in (then its calls run eagerly: the C++ half's mode guard sends them here)."""
        return self.training is not None and bool(training) is not self.training

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults filled in: ``m(x)``,
        ``m(x=x)`` and ``m(x, mask=None)`` are one call (one graph). Only for telling
        graphs apart: calls are replayed in the user's own form (``CallForm``)."""
        fast = self.positional
        if fast is not None and len(args) <= len(fast[0]):
            names, defaults, var_keyword = fast
            rest = names[len(args) :]
            if not kwargs or kwargs.keys() <= set(rest):
                # The common calls m(x, y) and m(input_ids=..., attention_mask=...): what
                # Signature.bind + apply_defaults would give, in a fraction of the time.
                arguments = dict(zip(names, args))
                for name in rest:
                    if name in kwargs:
                        arguments[name] = kwargs[name]
                    elif defaults[name] is inspect.Parameter.empty:
                        break  # a required argument is missing: let bind raise its TypeError
                    else:
                        arguments[name] = defaults[name]
                else:
                    if var_keyword is not None:
                        arguments[var_keyword] = {}  # what apply_defaults gives an unused **kwargs
                    return arguments
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    def call(self, args: tuple, kwargs: dict) -> Any:
        """The general path of a tuned call: bind, flatten, find the graph, run it."""
        if torch._C._get_tracing_state() is not None:
            return self._run_while_tracing(args, kwargs)
        # torch.func first: jacrev's inputs require grad too, and are said as its own
        if (why := _without_data(args, kwargs)) is not None:
            return self._run_without_data(why, args, kwargs)
        if (modes := _active_modes()) is not None:
            return self._run_under_modes(modes, args, kwargs)
        if (subclass := _subclass_inputs(args, kwargs)) is not None:
            return self._run_with_subclass(subclass, args, kwargs)
        if torch.is_grad_enabled() and _requires_grad(args, kwargs):
            return self._run_with_autograd(args, kwargs)
        if self.tuned and (changed := self.changed_submodules()):
            return self._run_changed_submodules(changed, args, kwargs)
        if self.tuned and (_nn_module._global_forward_pre_hooks or _nn_module._global_forward_hooks):
            return self._run_with_global_hooks(args, kwargs)
        if self.tuned and self.autocast is not None and autocast_enabled() is not self.autocast:
            return self._run_in_other_autocast(args, kwargs)
        if self.tuned and torch.get_default_dtype() is not self.default_dtype:
            return self._run_in_other_default_dtype(args, kwargs)
        if self.tuned and self.grad_modes and (mode := mode_of_call(self.grad_modes)) is not None:
            return self._run_in_other_grad_mode(mode, args, kwargs)
        if (self.attributes is not None or self.slots) and not self.cpp.attributes_clear():
            # weights swapped in for this call by a torch.func transform (grad over functional_call):
            # equal in value, but the gradient flows through them, which a graph cuts (it gave zeros)
            if any((now := registry.get(key)) is not held and isinstance(now, torch.Tensor)
                   and _no_data_cause(now) is not None for _, registry, key, held in self.slots):
                return self._run_without_data(_SWAPPED_UNDER_TRANSFORM, args, kwargs)
            if self.slots and self._weights_replaced():
                return self.module.forward(*args, **kwargs)  # deactivated: eager from now on
            if self.attributes is not None and (changed := self.changed_attributes()):
                return self._run_changed_attributes(changed, args, kwargs)
        if self.weights and self._weights_changed_in_place():
            return self.module.forward(*args, **kwargs)  # deactivated: eager from now on
        if not self.frozen_said and torch.is_grad_enabled() and self.tuned:
            self._say_weights_frozen()
        if self.direct is not None:
            # Calls that reach forward past the C++ half's guards (a module with hooks,
            # JIT tracing) still match its routes: the forward itself is the graph.
            try:
                outputs = self.direct.serve(args, kwargs)
                if outputs is not NotImplemented:
                    return outputs
            except _core.ShapeMismatchError:
                pass  # below, the general path raises it naming the graph, or runs eagerly
        arguments = self.bind(args, kwargs)
        leaves, spec = flatten.flatten_arguments(arguments)
        identity = flatten.identity(spec, leaves)
        entry = self.tuned.get(identity)
        if entry is None:
            return self._unrecorded(identity, arguments, args, kwargs)
        graph, tuned = entry
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        index = self.indices[identity]
        try:
            if tuned.session is None:  # a graph run in Python (eager, torch.compile)
                outputs = graph.rebuild_outputs(tuned.infer(tensors))
            else:
                outputs = self.cpp.run(index, tensors)
        except _core.ShapeMismatchError as error:
            if not self.eager_fallback:
                error.add_note(f"ait.Module '{self.name}' recorded for this graph: {graph.describe()}")
                error.add_note(f"Add such samples to the data given to ait.tune, or {_FALLBACK_ADVICE}")
                raise
            self._warn_once(identity, f"{error}; running eagerly")
            return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward
        self._add_route(index, args, kwargs)
        return outputs

    def _add_route(self, index: int, args: tuple, kwargs: dict) -> None:
        """After a call of graph ``index`` ran: hands calls like it to the C++ half, when it
        is made of plain tensors, or tuples / lists of plain tensors (a decode step's cache,
        one tensor per layer), only and binds the same way every time. The flattening of
        such a call puts a container's tensors in its place, in order: the order the C++
        half hands them to the graph."""
        keywords = call_layout(self.positional, len(args), tuple(kwargs))
        if keywords is None:
            return
        sample = []
        for value in (*args, *[kwargs[name] for name in keywords]):  # in binding order
            if type(value) is _Tensor:
                sample.append(value.detach())  # detach: DLPack refuses grad
            elif type(value) in (tuple, list) and all(type(t) is _Tensor for t in value):
                sample.append(type(value)(t.detach() for t in value))
            else:
                return
        self.cpp.add_route(sample, index, list(keywords))
        self.direct = self.cpp

    def changed_submodules(self) -> dict[str, list[str]]:
        """The modules whose mode, forward hooks, instance ``forward`` or class differ from
        tuning's, by kind ("mode", "hooks", "forward", "class", "class forward"), each named 'path (Class)'
        ('<root>' the wrapped module, first), with the mode it is in now for "mode"; empty
        when none.
        Hooks whose only effect is on tensors that a graph keeps (transformers' output
        capturing, installed on first use) added since are taken as expected from now on."""
        changed = self.cpp.changed_submodules()
        if not changed:
            return {}
        modules = list(self.module.modules())
        if len(modules) != len(self.submodule_names):  # a submodule added or removed since
            modules = [None] * len(self.submodule_names)
        found: dict[str, list[str]] = {}
        for index, what in changed:
            name, sub = self.submodule_names[index], modules[index]
            if what == "class attributes":
                # something was assigned on a module's class or a base: what matters is a
                # class value or a method forward reads, which the attribute watch compares
                if "class attributes" not in found and self.attributes is not None and (
                        differ := self.attributes.changed()):
                    found["class attributes"] = [describe_changes(differ)]
                if "class attributes" not in found and (
                        replaced := sorted(path for path, ident in class_tensor_ids(self.module, self.harmless).items()
                                           if self.class_tensors.get(path, ident) != ident)):
                    found["class attributes"] = [f"{', '.join(replaced)} (a tensor, replaced)"]
                continue
            if what == "hooks" and sub is not None and self._only_tensor_hooks_added(index, sub):
                continue
            if what == "mode" and type(sub) in _MODE_FREE_CONTAINERS:
                continue  # its own code never reads `training`; its children's modes are checked
            said = f"{name or '<root>'} ({type(sub).__name__})" if sub is not None else name or "<root>"
            if what == "mode" and sub is not None:
                said += f" in {'train' if sub.training else 'eval'} mode"
            found.setdefault(what, []).append(said)
        if not found:
            self.cpp.snapshot_submodules(self.training)
            self.submodule_hooks = _forward_hooks(self.module)
        return found

    def _only_tensor_hooks_added(self, index: int, sub: torch.nn.Module) -> bool:
        """Whether submodule ``index`` only gained hooks whose only effect is on tensors
        (``effect_on_tensors_only``) since the dispatch was made, and lost none."""
        before = self.submodule_hooks.get(self.submodule_names[index], {})
        now = {**sub._forward_pre_hooks, **sub._forward_hooks}
        return before.keys() <= now.keys() and all(
            effect_on_tensors_only(hook) for key, hook in now.items() if key not in before)

    def _run_changed_submodules(self, changed: dict[str, list[str]], args: tuple, kwargs: dict) -> Any:
        """A call while the module or a submodule is in another mode than its graphs were
        recorded in (train() after tuning in eval(), Monte Carlo dropout), or while a
        submodule's forward hooks differ from tuning's (a hook registered after tuning, one
        the export ran removed): the graphs would silently keep the recorded mode's
        behaviour (no dropout, BatchNorm statistics frozen, no gradients) and run no
        submodule, so it runs eagerly; said once in the log per set of changes."""
        key = tuple((what, tuple(names)) for what, names in changed.items())
        if key not in self.changes_logged:
            self.changes_logged.add(key)
            said = []
            if "mode" in changed:
                tuned, now = ("train", "eval") if self.training else ("eval", "train")
                if changed["mode"][0].startswith("<root> "):
                    said.append(f"in {now} mode, but its graphs were tuned in {tuned} mode")
                else:
                    said.append(f"modules are in another mode than when its graphs were tuned in {tuned} mode: "
                                f"{', '.join(changed['mode'])}")
            if "hooks" in changed:
                said.append("the forward hooks of submodules changed since tuning (a graph runs no submodule, so "
                            f"their hooks would not run): {', '.join(changed['hooks'])}")
            if "forward" in changed:
                said.append("modules' forward was replaced on the instance since tuning (module.forward = ...: the "
                            f"graphs compute the forward they were exported from): {', '.join(changed['forward'])}")
            if "class" in changed:
                said.append("modules' class was changed since tuning (module.__class__ = ...: the graphs compute the "
                            f"methods they were exported from): {', '.join(changed['class'])}")
            if "class forward" in changed:
                said.append("the forward of modules' class was replaced since tuning (Class.forward = ...: the graphs "
                            f"compute the forward they were exported from): {', '.join(changed['class forward'])}")
            if "class attributes" in changed:
                said.append("a method or value that forward reads was replaced on modules' class since tuning "
                            "(Class.method = ...: the graphs compute what they were exported from): "
                            f"{', '.join(changed['class attributes'])}")
            back = []
            if "mode" in changed:
                back.append(f"the modules are back in the mode they were tuned in (.{tuned}())")
            if "hooks" in changed:
                back.append("the hooks are as they were, or the module is tuned again with them (register hooks "
                            "on the module wrapped: they run around the tuned graph)")
            if changed.keys() & {"forward", "class", "class forward"}:
                back.append("the forward and class are back (del module.forward), or the module is tuned again")
            if "class attributes" in changed:
                back.append("the class's methods and values are back, or the module is tuned again")
            logger.warning("ait.Module '%s': %s; calls run eagerly in PyTorch until %s", self.name,
                           "; ".join(said), " and ".join(back))
        return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward

    def changed_attributes(self) -> list[tuple[str, str, str]]:
        """(path, value the graphs hold, value now) of each watched plain value that differs
        (``AttributeWatch.changed``); when none does, routed calls skip Python again."""
        changed = self.attributes.changed()
        if not changed:
            self.watch_values_as_they_are()
        return changed

    def watch_values_as_they_are(self) -> None:
        """Hands the C++ half what it compares by identity per call: the plain values the
        graphs hold (as expected) and the weights' and submodules' slots (as they are now)."""
        if self.cpp is None:
            return
        if self.slots:
            found = weight_slots(self.module, self.harmless)
            # a container emptied since (a cache cleared, _same_held_values) holds no tensor now, but
            # stays watched: other tensors put there in a new container are a change
            have = {path for path, _, _, _ in found}
            found += [(path, registry, key, registry[key]) for path, registry, key, old in self.slots
                      if isinstance(old, (tuple, list, dict)) and path not in have
                      and isinstance(registry.get(key), (tuple, list, dict)) and not registry[key]]
            self.slots = found
            self.storages = _slot_storages(self.slots)
            self.registries = registry_keys(self.module)
        watched = self.attributes.watched() if self.attributes is not None else []
        # (a write to a weight's registry goes to _weights_replaced even where every object is
        # back: torch.nn.utils.prune.remove puts the Parameter back with the pruned data under it)
        written = [registry for sub in self.module.modules() for registry in (sub._parameters, sub._buffers)
                   ] if self.slots else []
        self.cpp.watch_attributes(watched + [(registry, key, tensor) for _, registry, key, tensor in self.slots],
                                  written)

    def _weights_replaced(self) -> bool:
        """True when a parameter, buffer or submodule the graphs hold a copy of was replaced by
        another object since tuning (``fc.weight = nn.Parameter(w)``, ``model.fc =
        nn.Linear(...)``) and the module was deactivated for it (as
        ``_weights_changed_in_place``); otherwise the objects as they are now are taken as seen."""
        replaced = [(name, tensor) for name, registry, key, tensor in self.slots
                    if registry.get(key) is not tensor and not _same_held_values(tensor, registry.get(key))]
        # the same object with other data under it: `p.data = ...` moves no counter, and
        # torch.nn.utils.prune.remove puts the pruned values back so (seen here, where a
        # registry changed; a lone `.data` assignment changes none, docs/onnxruntime-backend.md)
        refilled = [name for name, registry, key, tensor in self.slots
                    if registry.get(key) is tensor and id(tensor) in self.storages
                    and _storage_of(tensor) != self.storages[id(tensor)]]
        added = added_to_registries(self.registries)
        if not replaced and not added and not refilled:
            if any(registry.get(key) is not tensor for _, registry, key, tensor in self.slots):
                self.watch_weights_as_they_are()  # equal copies: watched from now on, counters too
            self.watch_values_as_they_are()  # (the registries' writes as seen)
            return False
        modules = [name for name, old in replaced if isinstance(old, torch.nn.Module)]
        tensors = [name for name, old in replaced if not isinstance(old, torch.nn.Module)
                   and not any(name.startswith(m + ".") for m in modules)]

        def shown(names: list[str]) -> str:
            return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")

        # A submodule appended to a Sequential or ModuleList (or a parameter registered)
        # after tuning is one forward may run; the graphs were exported without it.
        how = " and ".join(
            [f"were replaced with the submodules holding them ({shown(modules)})"] * bool(modules)
            + [f"were replaced by other tensors ({shown(tensors)})"] * bool(tensors)
            + [f"were extended by submodules, parameters or buffers added since tuning ({shown(added)})"] * bool(added)
            + [f"had their data replaced ({shown(refilled)}: `.data = ...`, torch.nn.utils.prune.remove)"]
            * bool(refilled)
        ) + ", assigned on the module"
        originals = None
        if not added and not refilled:
            # Swapped, not extended: the graphs serve again once the very objects are back
            # unchanged (torch.func.functional_call swaps the weights for one call and back);
            # taken before deactivating, which lets go of the versions
            # (each tensor's storage too: torch.nn.utils.prune.remove puts the very Parameter
            # back with `.data` replaced by the pruned values, which moves no counter)
            originals = ([(registry, key, tensor) for _, registry, key, tensor in self.slots],
                         [(tensor, version, _storage_of(tensor)) for _, tensor, version in self.weights])
            how += " (put the very tensors back, unchanged, and the graphs serve again)"
        if self.weights_changed is not None and self.weights_changed(how):
            self.originals = originals
            return True
        self.watch_values_as_they_are()
        self.watch_weights_as_they_are()
        return False

    def originals_back(self) -> bool:
        """After the module was deactivated for replaced weights (``_weights_replaced``):
        whether every parameter, buffer and submodule slot holds the object it held when the
        graphs were tuned again, each tensor unchanged since (its version counter)."""
        if self.originals is None:
            return False
        slots, versions = self.originals
        return (all(registry.get(key) is held for registry, key, held in slots)
                and all(tensor._version == version and _storage_of(tensor) == storage
                        for tensor, version, storage in versions))

    def _run_changed_attributes(self, changed: list[tuple[str, str, str]], args: tuple, kwargs: dict) -> Any:
        """A call while plain Python values the ONNX Runtime graphs hold as constants differ
        from the graphs' (``model.temperature = 0.1`` after tuning, a config flag turned
        on): a graph would compute the old model, so the call runs eagerly; said once per
        set of changes."""
        key = tuple(changed)
        if key not in self.attributes_logged:
            self.attributes_logged.add(key)
            logger.warning(
                "ait.Module '%s': plain Python attributes (or module globals or environment variables forward reads) "
                "differ from the values its tuned graphs were recorded with (%s): an ONNX Runtime graph holds them as "
                "constants, and every tuned graph returns its outputs in the structure recorded with them; calls run "
                "eagerly in PyTorch until they are back, or the module is tuned again (ait.tune). An attribute forward "
                "never reads can be declared with ait.Module(..., harmless_attributes=[...]).", self.name,
                describe_changes(changed))
        return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward

    def watch_weights_as_they_are(self) -> None:
        """Takes the weights' version counters as they are now as seen (at tuning, after a
        load_state_dict of the values they had, on a knowing ``activate()``). The C++ half
        reads them through detached tensors, which share each weight's counter: reading a
        plain tensor's is half the cost of a Parameter's (~160 against ~320 ns on a 2-core
        host; torch looks up a subclass's ``__torch_function__`` on every read)."""
        if self.holding:
            self.weights = _weight_versions(self.module, self.harmless)
            self.cpp.watch_weights([tensor.detach() for _, tensor, _ in self.weights])
            _say_unversioned_weights(self.name, self.module)

    def unwatch_weights(self) -> None:
        """Stops watching (a deactivated module: its calls run eagerly), letting go of the
        detached tensors (they hold the storage of weights a .to() replaced)."""
        self.weights = []
        self.cpp.watch_weights([])

    def _weights_changed_in_place(self) -> bool:
        """True when parameters or buffers the graphs hold copies of changed in place since
        tuning and the module was deactivated for it. Changed where nothing deactivates
        (a measured call's dispatch, graphs no longer active): the counters as they are now
        are taken as seen, so routed calls skip Python again."""
        changed = [name for name, tensor, version in self.weights if tensor._version != version]
        if not changed:
            return False
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        how = (f"were changed in place ({shown}): an optimizer step, a write under torch.no_grad(), or calls run "
               "eagerly (train mode, changed submodules, autograd)")
        if self.weights_changed is not None and self.weights_changed(how):
            return True
        self.watch_weights_as_they_are()
        return False

    def _run_with_global_hooks(self, args: tuple, kwargs: dict) -> Any:
        """A call while hooks for every module's forward are registered (registered after
        tuning: ait.tune refuses to tune under them): a graph runs no submodule, so the
        hooks would not run on them; the call runs eagerly, said once per set of hooks."""
        hooks = tuple(global_forward_hooks())
        if hooks not in self.global_hooks_logged:
            self.global_hooks_logged.add(hooks)
            logger.warning(
                "ait.Module '%s': forward hooks for every module are registered (%s, torch.nn.modules.module."
                "register_module_forward_hook or _pre_hook); a tuned graph runs no submodule, so calls run eagerly "
                "in PyTorch while they are registered", self.name, ", ".join(hooks))
        return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward

    def _run_with_subclass(self, subclass: str, args: tuple, kwargs: dict) -> Any:
        """A call with a tensor of a subclass that overrides torch's functions runs eagerly:
        eager PyTorch applies its overrides to the module's ops, a graph would read the data
        alone (0.65 off eager in a probe, silently); said once per class."""
        if subclass not in self.subclasses_logged:
            self.subclasses_logged.add(subclass)
            logger.warning("ait.Module '%s': a call with a %s tensor runs eagerly in PyTorch: the subclass overrides "
                           "torch's functions (__torch_function__ or __torch_dispatch__), which act on eager ops and "
                           "not inside a tuned graph; pass plain tensors (t.as_subclass(torch.Tensor)) where the "
                           "overrides do not matter", self.name, subclass)
        return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward

    def _say_weights_frozen(self) -> None:
        """Once, at the first call a graph serves with gradients enabled while the module's
        weights require grad: the graph's outputs carry no gradient to them, so a loss through
        the module trains nothing of it (a fine-tune in eval() mode trained only the head
        after it, silently; a session-32 probe). Inference under torch.no_grad() says nothing.
        Until then the C++ half sends calls with gradients on here (``check_until_said``)."""
        self.frozen_said = True
        self.cpp.check_until_said(None)  # said (or nothing to say): routed calls stay in C++
        trainable = [name for name, p in self.module.named_parameters() if p.requires_grad]
        if trainable:
            logger.warning(
                "ait.Module '%s': called with gradients enabled while its weights require grad (%s%s); the tuned graph "
                "serves the call and its outputs carry no gradient to them, so a loss through it trains none of them. "
                "For inference call it under torch.no_grad() / torch.inference_mode() (or requires_grad_(False)); to "
                "fine-tune, put it in train() (it then runs eagerly)", self.name, ", ".join(trainable[:3]),
                f" and {len(trainable) - 3} more" if len(trainable) > 3 else "")

    def _run_while_tracing(self, args: tuple, kwargs: dict) -> Any:
        """A call under torch's JIT tracer (``torch.jit.trace``, ``torch.onnx.export(dynamo=
        False)`` of a model holding this one) runs eagerly, so that the tracer records the
        module's ops: a graph's outputs would be recorded as constants, the example's values
        for every input (0.7 off in a probe, silently); said once."""
        if not self.tracing_logged:
            self.tracing_logged = True
            logger.info("ait.Module '%s': a call under torch's JIT tracer (torch.jit.trace, torch.onnx.export with "
                        "dynamo=False) runs eagerly in PyTorch, so that the trace records the module's ops", self.name)
        return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward

    def _run_without_data(self, why: str, args: tuple, kwargs: dict) -> Any:
        """A call whose tensors no graph can read (``_without_data``) runs eagerly, said once
        per cause (an error before: a graph not recorded for vmap's per-sample rank, or a null
        data pointer)."""
        if why not in self.without_data_logged:
            self.without_data_logged.add(why)
            logger.info("ait.Module '%s': a call under %s runs eagerly in PyTorch: a tuned graph reads the "
                        "tensors' data, which these have none of", self.name, why)
        return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward

    def _run_in_other_autocast(self, args: tuple, kwargs: dict) -> Any:
        """A call with torch.autocast on where the graphs were recorded without it (or off
        where they were recorded under it): a graph computes as its recording did (float32
        outputs under an autocast that asks for bfloat16), so it runs eagerly; said once."""
        if not self.autocast_logged:
            self.autocast_logged = True
            now, then = ("on", "off") if not self.autocast else ("off", "on")
            logger.warning(
                "ait.Module '%s': called with torch.autocast %s, but its graphs were recorded with it %s and compute "
                "as they were recorded; such calls run eagerly in PyTorch (autocast as asked). Tune with autocast "
                "as the calls will use it.", self.name, now, then,
            )
        return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward

    def _run_in_other_grad_mode(self, mode: str, args: tuple, kwargs: dict) -> Any:
        """A call in an autograd mode forward computes otherwise in (``torch.is_grad_enabled()``
        branches) than the graphs, exported with gradients off: run eagerly; said once a mode."""
        if mode not in self.grad_modes_logged:
            self.grad_modes_logged.add(mode)
            logger.warning(
                "ait.Module '%s': called with %s, in which its forward computes otherwise than its graphs (exported "
                "with gradients off; seen when it was tuned); such calls run eagerly in PyTorch. Call it under "
                "torch.no_grad() to run the graphs.", self.name, describe_mode(mode))
        return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward

    def _run_in_other_default_dtype(self, args: tuple, kwargs: dict) -> Any:
        """A call while torch's default dtype is another than when the graphs were made runs
        eagerly: tensors forward makes (torch.ones, arange) take it, the graphs' constants do
        not (said once per dtype)."""
        now = torch.get_default_dtype()
        if now not in self.default_dtypes_logged:
            self.default_dtypes_logged.add(now)
            logger.warning(
                "ait.Module '%s': called with torch's default dtype %s, its graphs were made under %s (tensors "
                "forward creates take the default dtype, a graph's constants do not); such calls run eagerly in "
                "PyTorch", self.name, str(now).removeprefix("torch."), str(self.default_dtype).removeprefix("torch."))
        return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward

    def _run_under_modes(self, modes: str, args: tuple, kwargs: dict) -> Any:
        """A call under a TorchFunctionMode or TorchDispatchMode runs eagerly: the mode acts
        on each PyTorch op forward runs, and a graph runs none (said once per set of modes)."""
        if modes not in self.modes_logged:
            self.modes_logged.add(modes)
            logger.warning(
                "ait.Module '%s': called under %s (TorchFunctionMode / TorchDispatchMode), which act on the PyTorch "
                "ops forward runs, none of which a tuned graph runs; such calls run eagerly in PyTorch", self.name,
                modes)
        return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward

    def _run_with_autograd(self, args: tuple, kwargs: dict) -> Any:
        """A call whose inputs require grad, with gradients enabled, runs eagerly so that
        autograd sees it (a tuned graph's outputs carry no gradient history); said once
        in the log. The C++ half never serves such calls, so they all come here."""
        if not self.grad_logged:
            self.grad_logged = True
            logger.warning(
                "ait.Module '%s': called with inputs that require grad while gradients are enabled; such calls "
                "run eagerly in PyTorch (autograd intact), the tuned graph serves calls without gradients "
                "(torch.no_grad() / torch.inference_mode(), or inputs that do not require grad)",
                self.name,
            )
        return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward

    def _unrecorded(self, identity, arguments: dict, args: tuple, kwargs: dict) -> Any:
        call = describe_call(self.signature, arguments)
        if self.eager_fallback:
            self._warn_once(identity, f"no recorded graph matches this call ({call}); running eagerly")
            return self.module.forward(*args, **kwargs)  # the hooks ran around the proxy's forward
        recorded = "\n".join(f"  {i + 1}. {g.describe()}" for i, g in enumerate(self.recorded))
        differ = differing_values(self.signature, arguments, self.recorded) or differing_containers(arguments,
                                                                                                    self.recorded)
        raise GraphNotRecordedError(
            f"ait.Module '{self.name}' was tuned for other inputs than this call.\n"
            f"This call: {call}\nRecorded graphs:\n{recorded}\n" + (f"{differ}\n" if differ else "") +
            f"Add such samples to the data given to ait.tune, or {_FALLBACK_ADVICE}."
        )

    def _warn_once(self, identity, message: str) -> None:
        if identity not in self.warned:
            self.warned.add(identity)
            warnings.warn(f"ait.Module '{self.name}': {message}", RuntimeWarning, stacklevel=4)
