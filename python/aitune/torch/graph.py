"""RecordedGraph: the calls of one ait.Module that share one structure, kept for tuning."""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any

import torch
import torch.utils._pytree as pytree

from aitune import _core
from aitune.torch import flatten
from aitune.torch.context import is_owned_batch, run_eagerly
from aitune.torch.dynamic_shapes import DynamicShapes


_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)


def autocast_enabled() -> bool:
    """Whether torch.autocast is on for any device here (a call's autocast state)."""
    if _any_autocast is not None:
        return bool(_any_autocast())
    return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")


@dataclasses.dataclass
class Sample:
    """One recorded call: tensor inputs and eager tensor outputs, both flat, in graph order."""

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    batch_size: int
    evaluation: int | None = None  # the labelled evaluation batch this call came from (evaluation.py); None: tuning


#: Non-tensor output values a graph can return as constants: the same value on every call.
_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


def _check_output_leaves(module_name: str, paths_leaves: list) -> None:
    """An output that is neither a tensor nor a plain constant (a transformers ``Cache``
    from ``use_cache=True``, any stateful object) cannot come out of an ONNX graph:
    returning the object recorded while tuning on every later call would be wrong, so the
    graph is refused, naming the output and what to do."""
    for path, leaf in paths_leaves:
        if isinstance(leaf, torch.Tensor) or isinstance(leaf, _CONSTANT_TYPES):
            continue
        kind = f"{type(leaf).__module__}.{type(leaf).__qualname__}"
        hint = (" (a transformers cache: call the model with use_cache=False, or, for a generation loop with "
                "its KV cache, tune aitune.torch.decode_step.DecodeStep, whose caches are tensors: docs/decoders.md)"
                if "cache" in type(leaf).__name__.lower() else "")
        raise ValueError(
            f"ait.Module '{module_name}': output{pytree.keystr(path)} is a {kind} object, which an ONNX graph "
            f"cannot return{hint}; outputs must be tensors (in tuples, lists, dicts, dataclasses or ModelOutputs) "
            "or plain constants"
        )


#: The tensor dtypes the engine and ONNX Runtime's sessions carry (``_core``'s dtype names).
_GRAPH_DTYPES = frozenset({torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                           torch.float16, torch.bfloat16, torch.float32, torch.float64})


def _check_tensor_dtypes(module_name: str, names: list[str], tensors: list[torch.Tensor]) -> None:
    """A tensor input or output of a dtype no graph carries (complex64 from torch.fft, a
    float8 or unsigned 16/32/64-bit tensor) is refused when the call is recorded, naming it:
    the engine's spec of the graph failed later with a bare 'unknown dtype 'complex64''
    that named neither the module nor the tensor."""
    for name, tensor in zip(names, tensors, strict=True):
        if tensor.dtype in _GRAPH_DTYPES:
            continue
        dtype = str(tensor.dtype).removeprefix("torch.")
        hint = (" (ONNX Runtime has no complex tensors: return torch.view_as_real(...), or take it as input, "
                "and convert back outside the module)" if tensor.is_complex() else "")
        raise ValueError(
            f"ait.Module '{module_name}': {name} is a {dtype} tensor, which aitune's graphs cannot carry{hint}; "
            f"tensors must be one of {', '.join(sorted(str(d).removeprefix('torch.') for d in _GRAPH_DTYPES))}"
        )


def _describe_leaf(leaf: Any) -> str:
    """An output leaf as the graph's identity sees it: a tensor's dtype and rank, or the constant."""
    if isinstance(leaf, torch.Tensor):
        return f"a {str(leaf.dtype).removeprefix('torch.')} tensor of rank {leaf.dim()}"
    return f"{type(leaf).__name__} {leaf!r}"


class _Tree:
    """A flattened nested value: its structure, the non-tensor leaves (constants of the
    graph) and where the tensors go."""

    def __init__(self, spec: pytree.TreeSpec, leaves: list):
        self.spec = spec
        self.template = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        self.tensor_positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        self._derive()

    def _derive(self) -> None:
        """What ``fill`` needs, from the spec and the positions."""
        self.bare_tensor = self.spec.is_leaf() and self.tensor_positions == [0]
        self._build = _sequence_builder(self.spec, self.template, self.tensor_positions)

    @classmethod
    def restore(cls, spec: pytree.TreeSpec, template: list, tensor_positions: list[int]) -> _Tree:
        """A tree rebuilt from its parts (a loaded checkpoint): ``template`` holds the
        non-tensor leaves, None where ``tensor_positions`` says a tensor goes."""
        tree = cls.__new__(cls)
        tree.spec = spec
        tree.template = list(template)
        tree.tensor_positions = list(tensor_positions)
        tree._derive()
        return tree

    def fill(self, tensors) -> Any:
        if self.bare_tensor:  # a module returning one tensor: no structure to rebuild
            return tensors[0]
        if self._build is not None:
            if len(tensors) != len(self.tensor_positions):
                raise ValueError(f"{len(tensors)} output tensors for a structure of {len(self.tensor_positions)}")
            return self._build(tensors)
        leaves = list(self.template)
        for position, tensor in zip(self.tensor_positions, tensors, strict=True):
            leaves[position] = tensor
        return pytree.tree_unflatten(leaves, self.spec)


def _children(spec: pytree.TreeSpec) -> list:
    children = getattr(spec, "children", None)
    return list(children()) if callable(children) else list(spec.children_specs)


def _sequence_builder(spec: pytree.TreeSpec, template: list, tensor_positions: list[int]):
    """For an output nested only in tuples and lists (None and constants among its leaves):
    a function of the output tensors that builds it as ``pytree.tree_unflatten`` would,
    without walking the spec per call: a decode step's (logits, keys, values) of 17 tensors
    in ~0.3 us instead of ~5 (a tuple of consecutive tensors is one slice). None for any
    other structure (dicts, namedtuples, dataclasses, ModelOutputs), which pytree rebuilds."""
    slot = {position: k for k, position in enumerate(tensor_positions)}
    next_leaf = iter(range(len(template)))

    def build(node):
        """(function of the tensors, the tensor slot of a tensor leaf, else None)."""
        if node.is_leaf():
            i = next(next_leaf)
            if i in slot:
                k = slot[i]
                return (lambda t: t[k]), k
            constant = template[i]
            return (lambda t: constant), None
        if node.type is type(None):
            return (lambda t: None), None
        if node.type not in (tuple, list):
            raise LookupError(node.type)
        parts, slots = [], []
        for child in _children(node):
            part, k = build(child)
            parts.append(part)
            slots.append(k)
        kind = node.type
        if parts and None not in slots and slots == list(range(slots[0], slots[0] + len(slots))):
            start, stop = slots[0], slots[0] + len(slots)  # consecutive tensors: one slice
            return ((lambda t: tuple(t[start:stop])) if kind is tuple else (lambda t: list(t[start:stop]))), None
        if kind is tuple:
            return (lambda t: tuple([part(t) for part in parts])), None
        return (lambda t: [part(t) for part in parts]), None

    try:
        return build(spec)[0]
    except LookupError:
        return None


_POSITIONAL_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclasses.dataclass(frozen=True)
class CallForm:
    """How the user called the module: which parameters were passed positionally (in
    order; a ``*args`` parameter's name stands for all the extra positional values) and
    which keywords were passed (in call order; a ``**kwargs`` key by itself).

    A graph's calls are replayed in this form (for the eager reference, profiling and the
    export), never with the defaults a binding fills in: forwards wrapped by decorators
    that add keywords of their own (Hugging Face's) would get a value twice.
    """

    positional: tuple[str, ...]
    keywords: tuple[str, ...]

    @classmethod
    def of(cls, signature: inspect.Signature, n_positional: int, keywords) -> CallForm:
        """The form of a call with ``n_positional`` positional values and these keywords
        (a call that binds to ``signature``)."""
        parameters = list(signature.parameters.values())
        named = [p.name for p in parameters if p.kind in _POSITIONAL_KINDS][:n_positional]
        if n_positional > len(named):
            named += [p.name for p in parameters if p.kind is p.VAR_POSITIONAL]
        return cls(tuple(named), tuple(keywords))

    def replay(self, signature: inspect.Signature, arguments: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """``(args, kwargs)`` in this form, from bound ``arguments`` (by parameter name,
        a ``**kwargs`` parameter's keys under its name)."""
        parameters = signature.parameters
        args: list = []
        for name in self.positional:
            if parameters[name].kind is inspect.Parameter.VAR_POSITIONAL:
                args.extend(arguments[name])
            else:
                args.append(arguments[name])
        var_keyword = next((p.name for p in parameters.values() if p.kind is p.VAR_KEYWORD), None)
        kwargs = {}
        for name in self.keywords:
            parameter = parameters.get(name)
            if parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                kwargs[name] = arguments[name]
            else:
                kwargs[name] = arguments[var_keyword][name]
        # A default holding tensors (``bias=torch.zeros(8)``) that the call left out is passed
        # by keyword all the same: the binding made it one of the graph's inputs, and left to
        # forward's own default the export baked it in as a constant, so a later call giving
        # ``bias=`` was served the default's result, silently (a session-35 probe).
        for name, parameter in parameters.items():
            if (name not in self.positional and name not in kwargs and name in arguments
                    and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
                    and _holds_tensor(parameter.default)):
                kwargs[name] = arguments[name]
        return tuple(args), kwargs

    def to_json(self) -> dict:
        return {"positional": list(self.positional), "keywords": list(self.keywords)}

    @classmethod
    def from_json(cls, data: Any, signature: inspect.Signature) -> CallForm:
        """The form saved by ``to_json``; ValueError when it is malformed or names a
        parameter ``signature`` does not have (and it has no ``**kwargs``)."""
        if not isinstance(data, dict) or set(data) != {"positional", "keywords"}:
            raise ValueError(f"a call form must be {{'positional': [...], 'keywords': [...]}}, got {data!r:.120}")
        positional, keywords = data["positional"], data["keywords"]
        if not all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in (positional, keywords)):
            raise ValueError(f"a call form lists parameter names (strings), got {data!r:.120}")
        parameters = signature.parameters
        unknown = [n for n in positional if n not in parameters]
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            unknown += [n for n in keywords if n not in parameters]
        if unknown:
            raise ValueError(f"the call passed {unknown}, which forward({', '.join(parameters)}) does not take")
        return cls(tuple(positional), tuple(keywords))


def _holds_tensor(value: Any) -> bool:
    return value is not inspect.Parameter.empty and any(isinstance(leaf, torch.Tensor)
                                                         for leaf in pytree.tree_leaves(value))


def _argument_path(signature: inspect.Signature, path: tuple) -> tuple:
    """Key path of a bound argument, without the name of a ``**kwargs`` parameter: its
    keys are the keywords the caller wrote."""
    parameter = signature.parameters.get(getattr(path[0], "key", None)) if path else None
    return path[1:] if parameter is not None and parameter.kind is parameter.VAR_KEYWORD else path


def _path_name(path: tuple) -> str:
    """A bound argument's key path as a user writes it: ``use_cache``, ``past.0``."""
    return ".".join(str(getattr(key, "key", getattr(key, "idx", key))) for key in path)


def non_tensor_values(signature: inspect.Signature, paths_leaves: list) -> dict[str, Any]:
    """name -> value of each non-tensor leaf of a bound call (None included)."""
    return {_path_name(_argument_path(signature, path)): leaf for path, leaf in paths_leaves
            if not isinstance(leaf, torch.Tensor)}


def _shown_values(values: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in values.items() if value is not None)


def _tensor_records(names: list[str], tensors: list[torch.Tensor]) -> list[tuple[str, str, list[int]]]:
    return [(n, flatten.dtype_name(t.dtype), list(t.shape)) for n, t in zip(names, tensors, strict=True)]


class _Marker:
    """Stands for call tensor ``index`` while a replay is planned (``_GraphCalls._plan_replay``)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _Constant:
    """A constant value of a planned replay (a wrapper: an int constant is not an index)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def take(self, tensors) -> Any:
        return self.value


class _Tensors:
    """A tuple or list of call tensors in a planned replay (a decode step's cache, one
    tensor per layer): made anew per call, of the recorded kind, from these indices."""

    __slots__ = ("kind", "indices")

    def __init__(self, kind: type, indices: tuple[int, ...]):
        self.kind, self.indices = kind, indices

    def take(self, tensors) -> tuple | list:
        return self.kind([tensors[i] for i in self.indices])


_UNPLANNED = object()
#: Values a planned replay passes on every call as the same object: nothing can change them.
_IMMUTABLE_CONSTANTS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


class _GraphCalls:
    """Running a graph's calls: what RecordedGraph and SavedGraph share. Needs
    ``signature``, ``module``, ``_inputs`` and ``_outputs``."""

    signature: inspect.Signature
    module: torch.nn.Module
    call_form: CallForm | None
    _inputs: _Tree
    _outputs: _Tree

    def call_arguments(self, input_tensors) -> tuple[tuple, dict[str, Any]]:
        """``(args, kwargs)`` for the wrapped module: the recorded call with these tensors,
        in the form the user called it (``CallForm``)."""
        plan = self.__dict__.get("_replay_plan", _UNPLANNED)
        if plan is _UNPLANNED:
            plan = self._replay_plan = self._plan_replay()
        if plan is not None:  # each value a tensor, a tuple / list of them or a constant: no tree to rebuild
            positional, keywords = plan
            return (tuple(input_tensors[v] if type(v) is int else v.take(input_tensors) for v in positional),
                    {k: input_tensors[v] if type(v) is int else v.take(input_tensors) for k, v in keywords})
        return self._replay(input_tensors)

    def _plan_replay(self):
        """Where each value of the replayed call comes from: the index of a call tensor, a
        tuple or list of call tensors (``_Tensors``: a decode step's cache), or a constant of
        the recording (``_Constant``); None when a value is another container (a dict, a
        nested tuple) or a mutable object, rebuilt per call by ``_replay``.
        Found by replaying markers in the tensors' places. Calls of tensors and plain
        values (HF forwards: ``input_ids=``, ``attention_mask=``, defaults None) then skip
        pytree on every call (issue 28: it ran on every call of a torch.compile graph)."""
        markers = [_Marker(i) for i in range(len(self._inputs.tensor_positions))]
        try:
            args, kwargs = self._replay(markers)
        except Exception:  # a container whose constructor looks at its tensors: replayed per call
            return None

        def source(value):
            if type(value) is _Marker:
                return value.index
            if type(value) in (tuple, list) and all(type(item) is _Marker for item in value):
                return _Tensors(type(value), tuple(item.index for item in value))
            return _Constant(value) if type(value) in _IMMUTABLE_CONSTANTS else None

        positional = [source(v) for v in args]
        keywords = [(k, source(v)) for k, v in kwargs.items()]
        if any(v is None for v in positional) or any(v is None for _, v in keywords):
            return None
        return positional, keywords

    def _replay(self, input_tensors) -> tuple[tuple, dict[str, Any]]:
        arguments = self._inputs.fill(input_tensors)
        if self.call_form is not None:
            return self.call_form.replay(self.signature, arguments)
        bound = self.signature.bind_partial()  # a checkpoint saved before call forms were kept
        bound.arguments = arguments
        return bound.args, bound.kwargs

    def output_tensors(self, outputs: Any) -> list[torch.Tensor]:
        return [leaf for leaf in pytree.tree_leaves(outputs) if isinstance(leaf, torch.Tensor)]

    @property
    def returns_one_tensor(self) -> bool:
        """The module's output is a bare tensor: the flat outputs' only one."""
        return self._outputs.bare_tensor

    def rebuild_outputs(self, output_tensors) -> Any:
        """The module's output structure around tensors produced by a backend."""
        return self._outputs.fill(output_tensors)

    def run_eager(self, input_tensors) -> list[torch.Tensor]:
        """Flat outputs of the wrapped PyTorch module (nested ait.Modules run eagerly too)."""
        args, kwargs = self.call_arguments(input_tensors)
        with run_eagerly():  # forward: the module's hooks run around a graph, not in it
            return self.output_tensors(self.module.forward(*args, **kwargs))

    def _keep(self, tensor: torch.Tensor) -> torch.Tensor:
        # an inference-mode tensor has no version counter: check_unchanged could not see it
        # changed in place (the caller's pipeline zeroing its batch after the call), so it is copied
        if not is_owned_batch(tensor) or tensor.is_inference():
            return tensor.detach().clone()
        self.borrowed.append((tensor, tensor._version))
        return tensor.detach()

    def check_unchanged(self) -> None:
        """ValueError when a tensor kept without a copy was changed in place since it was
        recorded (its samples would no longer match the recorded outputs)."""
        if any(tensor._version != version for tensor, version in self.borrowed):
            raise ValueError(
                f"ait.Module '{self.module_name}': a sample tensor was changed in place after it was recorded "
                "(ait.tune keeps the samples it was given without copying them); leave the samples unchanged while "
                "ait.tune runs"
            )


class RecordedGraph(_GraphCalls):
    """Calls of one module with equal input structure, tensor dtypes and ranks, and
    non-tensor values (bound to the forward signature, defaults filled in, so ``m(x)`` and
    ``m(x=x)`` are one graph). Built from the first such call, whose ``call_form`` every
    replay keeps; ``add_sample`` adds the others.

    Tensor inputs are named ``input_<path>`` after their place in the call bound to the
    forward signature (``input_x``, ``input_batch_image``; keys of ``**kwargs`` without
    the parameter's name), outputs ``output_<path>`` (a bare tensor is ``output_0``).
    """

    def __init__(
        self,
        module_name: str,
        module: torch.nn.Module,
        signature: inspect.Signature,
        arguments: dict[str, Any],
        outputs: Any,
        call_form: CallForm | None = None,
    ):
        self.module_name = module_name
        self.module = module
        self.signature = signature
        self.call_form = call_form
        in_paths_leaves, in_spec = pytree.tree_flatten_with_path(arguments)
        in_leaves = [leaf for _, leaf in in_paths_leaves]
        self.identity = flatten.identity(in_spec, in_leaves)
        self.key = f"graph_{flatten.stable_digest(in_spec, in_leaves)}"
        self._inputs = _Tree(in_spec, in_leaves)
        self.non_tensor_values = non_tensor_values(signature, in_paths_leaves)
        # what each was when recorded: an object compared by identity may change in place
        self.non_tensor_descriptors = {name: flatten.leaf_descriptor(value)
                                       for name, value in self.non_tensor_values.items()}
        self.input_names = flatten.leaf_names(
            "input", [_argument_path(signature, p) for p, leaf in in_paths_leaves if isinstance(leaf, torch.Tensor)]
        )

        out_paths_leaves, out_spec = pytree.tree_flatten_with_path(outputs)
        _check_output_leaves(module_name, out_paths_leaves)
        self._outputs = _Tree(out_spec, [leaf for _, leaf in out_paths_leaves])
        self._output_constants = flatten.identity(out_spec, [leaf for _, leaf in out_paths_leaves])
        self._output_leaves = [(pytree.keystr(path), _describe_leaf(leaf)) for path, leaf in out_paths_leaves]
        self.output_names = flatten.leaf_names(
            "output", [path for path, leaf in out_paths_leaves if isinstance(leaf, torch.Tensor)]
        )
        _check_tensor_dtypes(module_name, self.input_names,
                             [leaf for _, leaf in in_paths_leaves if isinstance(leaf, torch.Tensor)])
        _check_tensor_dtypes(module_name, self.output_names,
                             [leaf for _, leaf in out_paths_leaves if isinstance(leaf, torch.Tensor)])
        self.samples: list[Sample] = []
        # Input axes the user declared ranges of (ait.Module's dynamic_shapes): the spec
        # takes them and the dynamo export proves them (aitune.torch.dynamic_shapes).
        self.dynamic_shapes = DynamicShapes(None)
        # Names of the buffers and parameters a recorded call changed (the forward updates
        # state: a counter, running statistics); an export cannot carry that and refuses.
        self.mutated_state: list[str] = []
        self._nan_warned: set[str] = set()
        self._alias_warned: set[str] = set()
        # Recorded tensors kept without a copy (batches ait.tune made) and their version
        # counters then: a tune checks that nothing changed them in place since.
        self.borrowed: list[tuple[torch.Tensor, int]] = []
        # The mode the calls ran in: an exported graph keeps that mode's behaviour (dropout,
        # BatchNorm statistics), so the dispatch serves only calls in the same mode.
        self.training: bool | None = bool(module.training)
        # Whether torch.autocast was on: the export computes as the calls did (float32
        # without it), so the dispatch serves only calls with autocast in the same state.
        self.autocast: bool | None = autocast_enabled()
        # The autograd modes forward computes otherwise in (grad_modes.py), set by the tune.
        self.grad_modes: tuple[str, ...] = ()
        if not self.input_names:
            raise ValueError(f"ait.Module '{module_name}': a call without tensor inputs cannot be tuned")
        if not self.output_names:
            raise ValueError(f"ait.Module '{module_name}': a call without tensor outputs cannot be tuned")

    # -- recording -----------------------------------------------------------------

    def add_sample(self, input_tensors: list[torch.Tensor], outputs: Any, batch_size: int,
                   evaluation: int | None = None) -> None:
        """Keeps one call's tensors: copies of the caller's (it may reuse or modify its
        own), the batches ait.tune stacked for this call as they are (nobody else holds
        them; a copy would hold every sample twice)."""
        if difference := self.other_outputs(outputs):
            raise ValueError(
                f"ait.Module '{self.module_name}': calls of one input structure returned outputs of different "
                f"structure, dtypes or constant values ({difference}); such a module cannot be exported as one graph"
            )
        out_tensors = self.output_tensors(outputs)
        self._warn_all_nan(out_tensors)
        self._warn_aliased(input_tensors, out_tensors)
        self.samples.append(
            Sample(
                inputs=[self._keep(t) for t in input_tensors],
                outputs=[t.detach().clone() for t in out_tensors],
                batch_size=batch_size,
                evaluation=evaluation,
            )
        )

    def other_outputs(self, outputs: Any) -> str | None:
        """None where ``outputs`` have the recorded calls' structure, tensor dtypes and ranks,
        and values of the outputs that are no tensors (a graph returns those at every size it
        takes); else what differs (``_output_difference``)."""
        leaves, spec = pytree.tree_flatten(outputs)
        return None if flatten.identity(spec, leaves) == self._output_constants else self._output_difference(outputs)

    def _output_difference(self, outputs: Any) -> str:
        """What differs from the first recorded call's outputs: the structure, or the first
        leaf whose value (a constant) or dtype and rank (a tensor) differs."""
        paths_leaves, spec = pytree.tree_flatten_with_path(outputs)
        if spec != self._outputs.spec:
            return f"structure {self._outputs.spec} in one call, {spec} in another"
        for (path, first), (_, leaf) in zip(self._output_leaves, paths_leaves, strict=True):
            if _describe_leaf(leaf) != first:
                where = path or "(the value returned)"
                return f"output {where}: {first} in one call, {_describe_leaf(leaf)} in another"
        return f"structure {spec}"

    def note_mutated_state(self, names: list[str]) -> None:
        """A recorded call changed these buffers or parameters (``module.changed_state``)."""
        self.mutated_state += [name for name in names if name not in self.mutated_state]

    def _warn_aliased(self, input_tensors: list[torch.Tensor], out_tensors: list[torch.Tensor]) -> None:
        """An eager output that is an input itself, or a view of it, or that shares memory with
        an earlier output, is said once per output: a graph returns a new tensor with its
        values, so the tuned module's output no longer shares memory with what it was given,
        or with the other output (a change to one stops showing in the other)."""
        storages = {}
        for name, tensor in zip(self.input_names, input_tensors, strict=True):
            if tensor.numel() > 0:
                storages.setdefault((tensor.device, tensor.untyped_storage().data_ptr()), name)
        # (the module's own weights too: `return self.scale` hands the caller the buffer, which
        # a caller's in-place change then changes; a graph returns a copy of its values)
        weights = {}
        for name, tensor in (*self.module.named_parameters(), *self.module.named_buffers()):
            if tensor is not None and tensor.numel() > 0 and not tensor.is_meta:
                weights.setdefault((tensor.device, tensor.untyped_storage().data_ptr()), name)
        returned = {}  # storage -> the first output on it
        for name, tensor in zip(self.output_names, out_tensors, strict=True):
            if tensor.numel() == 0:
                continue
            storage = (tensor.device, tensor.untyped_storage().data_ptr())
            earlier = returned.setdefault(storage, name)
            if name in self._alias_warned:
                continue
            given = storages.get(storage)
            if given is not None:
                self._alias_warned.add(name)
                warnings.warn(
                    f"ait.Module '{self.module_name}' {self.key}: eager output {name} is input {given} itself (or a "
                    "view of it); a tuned graph returns a new tensor with its values instead, so a change to the "
                    "output no longer changes the input, nor the other way round",
                    RuntimeWarning,
                    stacklevel=2,
                )
            elif (weight := weights.get(storage)) is not None:
                self._alias_warned.add(name)
                warnings.warn(
                    f"ait.Module '{self.module_name}' {self.key}: eager output {name} is the module's {weight} itself "
                    "(or a view of it); a tuned graph returns a new tensor with its values instead, so a change made "
                    "to the output no longer changes the module's weight, nor the other way round",
                    RuntimeWarning,
                    stacklevel=2,
                )
            elif earlier != name:
                # Two outputs on one memory (`return h, h[:, :4]`, or h twice): a graph returns
                # each as its own tensor, so an in-place change to one stops showing in the other.
                self._alias_warned.add(name)
                warnings.warn(
                    f"ait.Module '{self.module_name}' {self.key}: eager outputs {earlier} and {name} share memory "
                    "(one is the other, or a view of it); a tuned graph returns each as a tensor of its own, so a "
                    "change made in place to one of them no longer shows in the other",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def _warn_all_nan(self, out_tensors: list[torch.Tensor]) -> None:
        """An eager output that is NaN everywhere is said once per output: every
        candidate matches it (NaN compares equal to NaN), so the tune proves nothing there."""
        for name, tensor in zip(self.output_names, out_tensors, strict=True):
            if (name not in self._nan_warned and tensor.is_floating_point() and tensor.numel() > 0
                    and bool(torch.isnan(tensor).all())):
                self._nan_warned.add(name)
                warnings.warn(
                    f"ait.Module '{self.module_name}' {self.key}: eager output {name} is NaN everywhere "
                    f"(shape {list(tensor.shape)}); the correctness check cannot tell a right graph from a wrong "
                    "one there: check the model's weights and inputs",
                    RuntimeWarning,
                    stacklevel=2,
                )


    def graph_spec(self, input_names: list[str] | None = None, declared: bool = True) -> _core.GraphSpec:
        """Min/max shapes, batch and dynamic axes of the recorded samples, derived by
        the C++ core, widened by the ranges declared in ``dynamic_shapes`` (unless
        ``declared`` is False: the recorded ranges only). ``input_names`` restricts the
        inputs (an exporter may drop an input the graph does not use)."""
        keep = range(len(self.input_names)) if input_names is None else [self.input_names.index(n) for n in input_names]
        names = [self.input_names[i] for i in keep]
        builder = _core.GraphSpecBuilder()
        for sample in self.samples:
            builder.record(
                _tensor_records(names, [sample.inputs[i] for i in keep]),
                _tensor_records(self.output_names, sample.outputs),
                sample.batch_size,
            )
        if declared:
            for name, axis in self.dynamic_shapes.for_inputs(names):
                builder.declare_range(name, axis.axis, axis.min, axis.max, axis.step)
        return builder.build()

    # -- running -------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.samples[0].inputs[0].device if self.samples else torch.device("cpu")

    def describe(self) -> str:
        """One line per tensor: ``input_x: float32 rank 4 (shapes [1, 3, 8, 8] .. [2, 3, 16, 16])``, then
        the non-tensor values."""
        lines = []
        # Inputs with ranges declared in dynamic_shapes: the range the graph accepts, not the
        # shapes recorded (a call refused for its dtype read as refused for "shapes [2, 12] ..
        # [3, 13]" where 2..64 was declared).
        declared = {name for name, _ in self.dynamic_shapes.for_inputs(self.input_names)}
        spec = {t.name: t for t in self.graph_spec().inputs} if declared and self.samples else {}
        for i, name in enumerate(self.input_names):
            shapes = sorted({tuple(s.inputs[i].shape) for s in self.samples})
            first = self.samples[0].inputs[i] if self.samples else None
            kind = f"{flatten.dtype_name(first.dtype)} rank {first.dim()}" if first is not None else "?"
            if name in spec:
                seen = f"accepts {list(spec[name].min_shape)} .. {list(spec[name].max_shape)}, declared"
            else:
                # each axis over its own recorded extents: the first and last shape in sorted
                # order misstated the range ([4, 8, 8] .. [4, 12, 12] for a last axis of 8..16)
                low, high = [min(axis) for axis in zip(*shapes)], [max(axis) for axis in zip(*shapes)]
                seen = f"shapes {low}" if len(shapes) == 1 else f"shapes {low} .. {high}"
            lines.append(f"{name}: {kind} ({seen})")
        if constants := _shown_values(self.non_tensor_values):
            lines.append(f"non-tensor values: {constants}")
        return "; ".join(lines)


class SavedGraph(_GraphCalls):
    """A graph restored from a checkpoint (``ait.load``): everything a call needs to be
    dispatched (identity, tensor names, the input and output structures) and nothing
    recorded. It has no samples, so it cannot be tuned again; ``describe`` is the
    description saved with it."""

    def __init__(
        self,
        module_name: str,
        module: torch.nn.Module,
        signature: inspect.Signature,
        key: str,
        identity: tuple,
        inputs: _Tree,
        outputs: _Tree,
        input_names: list[str],
        output_names: list[str],
        description: str,
        spec: _core.GraphSpec | None = None,
        call_form: CallForm | None = None,
        training: bool | None = None,
        autocast: bool | None = None,
        grad_modes: tuple[str, ...] = (),
    ):
        self.module_name = module_name
        self.module = module
        self.signature = signature
        self.call_form = call_form
        self.training = training  # None: saved before the mode was kept (not checked)
        self.autocast = autocast  # None: saved before the autocast state was kept (not checked)
        self.grad_modes = tuple(grad_modes)  # (): none, or saved before they were kept
        self.key = key
        self.identity = identity
        self._inputs = inputs
        self._outputs = outputs
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self._description = description
        self._spec = spec
        self.samples: list[Sample] = []
        # Recorded tensors kept without a copy (batches ait.tune made) and their version
        # counters then: a tune checks that nothing changed them in place since.
        self.borrowed: list[tuple[torch.Tensor, int]] = []


    def graph_spec(self, input_names: list[str] | None = None) -> _core.GraphSpec:
        """The graph spec saved with the graph (of the inputs its ONNX model declares)."""
        if self._spec is None:
            raise _core.StateError(
                f"graph '{self.key}' of '{self.module_name}' was saved without a graph spec (it runs eagerly)"
            )
        return self._spec

    def describe(self) -> str:
        return self._description


def describe_call(signature: inspect.Signature, arguments: dict[str, Any]) -> str:
    """A call described like ``RecordedGraph.describe`` does, for error messages."""
    paths_leaves, _ = pytree.tree_flatten_with_path(arguments)
    parts = []
    for path, leaf in paths_leaves:
        if isinstance(leaf, torch.Tensor):
            name = flatten.leaf_names("input", [_argument_path(signature, path)])[0]
            parts.append(f"{name}: {flatten.dtype_name(leaf.dtype)} rank {leaf.dim()} (shape {list(leaf.shape)})")
    if constants := _shown_values(non_tensor_values(signature, paths_leaves)):
        parts.append(f"non-tensor values: {constants}")
    return "; ".join(parts) or "no tensors"


def _equal(recorded: Any, now: Any) -> bool:
    """``recorded == now`` as a bool; a value without one (a NumPy array) is compared by
    ``leaf_descriptor`` (its bytes), one that cannot be compared at all differs."""
    try:
        return bool(recorded == now)
    except Exception:
        try:
            return flatten.leaf_descriptor(recorded) == flatten.leaf_descriptor(now)
        except Exception:
            return False


def differing_values(signature: inspect.Signature, arguments: dict[str, Any], graphs: list) -> str:
    """For an unrecorded call: where its non-tensor values (None included) differ from the
    recorded graph closest to it (``use_cache: None here, False recorded (graph 2)``), or ''."""
    paths_leaves = pytree.tree_flatten_with_path(arguments)[0]
    now = non_tensor_values(signature, paths_leaves)
    # A value that is not among the non-tensor ones may be a tensor (labels=tensor here, a
    # mask tensor recorded): named so, not "absent".
    now_tensors = {_path_name(_argument_path(signature, path)) for path, leaf in paths_leaves
                   if isinstance(leaf, torch.Tensor)}
    best = None
    for index, graph in enumerate(graphs):
        recorded = getattr(graph, "non_tensor_values", None)
        if recorded is None:
            continue
        described = getattr(graph, "non_tensor_descriptors", {})
        changed = {name for name in now if name in recorded and recorded[name] is now[name]
                   and name in described and flatten.leaf_descriptor(now[name]) != described[name]}
        differ = [name for name in {**recorded, **now} if name not in recorded or name not in now
                  or type(recorded[name]) is not type(now[name]) or not _equal(recorded[name], now[name])
                  or name in changed]
        if not differ:
            return ""  # a graph with these values: the tensors differ, which the call's line shows
        if best is None or len(differ) < len(best[1]):
            best = (index, differ, recorded, changed)
    if best is None:
        return ""
    index, differ, recorded, changed = best
    recorded_tensors = set(getattr(graphs[index], "input_names", ()))

    def shown_now(name: str) -> str:
        if name in changed:  # the graph holds what its attributes were: constants
            return f"{now[name]!r} changed in place since it was recorded (the graph holds its attributes as they were)"
        return repr(now[name]) if name in now else "a tensor" if name in now_tensors else "absent"

    def shown_recorded(name: str) -> str:
        if name in recorded:
            return repr(recorded[name])
        tensor = flatten.leaf_names("input", [tuple(name.split("."))])[0]
        return "a tensor" if tensor in recorded_tensors else "absent"

    shown = [f"{name}: {shown_now(name)} here, {shown_recorded(name)} recorded" for name in sorted(differ)]
    return f"non-tensor values that differ from recorded graph {index + 1}: " + "; ".join(shown)


def _containers(spec: pytree.TreeSpec) -> str:
    """The containers of a flattened value, leaves as ``*`` (``dict(ids: *, caches: tuple(*, *))``)."""
    if spec.is_leaf():
        return "*"
    children = [_containers(child) for child in spec.children()]
    if spec.type is dict or (isinstance(spec.context, list) and len(spec.context) == len(children)):
        children = [f"{key}: {child}" for key, child in zip(spec.context, children, strict=True)]
    return f"{getattr(spec.type, '__name__', spec.type)}({', '.join(children)})"


def differing_containers(arguments: dict[str, Any], graphs: list) -> str:
    """For an unrecorded call whose tensors and values read as a recorded graph's: where its
    containers differ (caches as a list where a tuple was recorded: the call and the graph
    were shown alike, and nothing said why they did not match, a session-36 probe), or ''."""
    _, spec = pytree.tree_flatten(arguments)
    mine = _containers(spec)
    for index, graph in enumerate(graphs):
        theirs = _containers(graph._inputs.spec)  # noqa: SLF001
        if theirs != mine and spec.num_leaves == graph._inputs.spec.num_leaves:  # noqa: SLF001
            return (f"containers that differ from recorded graph {index + 1}: {mine} here, {theirs} recorded "
                    "(a list is not a tuple: pass the same containers as the samples did)")
    return ""
