"""TorchCompileBackend: torch.compile (mode "reduce-overhead" by default) as tuning
candidates, one per mode and precision, checked and measured by the C++ engine next to
ONNX Runtime's, so a strategy over both hands the user whichever is fastest and correct.
A candidate is what a user would write by hand: torch.compile of the same module, in the
same mode, under the same autocast; nothing is copied or cast after it (issue 28)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import logging
import time
import types

import torch
import torch.utils._pytree as pytree

from aitune import _core
from aitune.torch.backend.base import Backend, BackendConfig, TunedGraph
from aitune.torch.backend.onnx_runtime_backend import PRECISION_NAMES, checked_precision_limit
from aitune.torch.context import eager_var
from aitune.torch.eager_precision import allow_tf32

#: Candidate precisions by name (the engine's Precision, which sets their default
#: tolerance, is parsed from the name once, at the edge: ``_core.parse_precision``).
PRECISIONS = PRECISION_NAMES
#: torch.compile modes.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: What a CUDA module tries by default: fp32, TF32 (what a user tuning for speed sets) and
#: fp16 autocast; on the host fp32 only (TF32 and fp16 autocast are GPU notions there).
DEFAULT_CUDA_PRECISIONS = ("fp32", "tf32", "fp16")
DEFAULT_CPU_PRECISIONS = ("fp32",)
#: ``output_dtype``: "module" (outputs in the module's dtypes) or "compute" (as the
#: reduced precision computes them, no cast back).
OUTPUT_DTYPES = ("module", "compute")
_REDUCED = {"fp16": torch.float16, "bf16": torch.bfloat16}

logger = logging.getLogger("aitune")


@dataclasses.dataclass
class TorchCompileBackendConfig(BackendConfig):
    """How TorchCompileBackend compiles a graph.

    Attributes:
        mode: ``torch.compile``'s mode. "reduce-overhead" (default) replays CUDA graphs
            on a GPU; as with torch.compile itself, outputs then live in the graph's memory
            pool until the next call of the module overwrites them (torch raises when such
            an output is read after that; ``.clone()`` what must outlive the next call).
        modes: several modes to try, one candidate per mode and precision (e.g.
            ``("default", "reduce-overhead", "max-autotune")``); None: ``mode`` alone.
        max_compile_s: a candidate whose compile (its first call, CUDA graph capture
            included) takes longer is recorded as failed, with its compile time. Checked
            when the compile returns (torch.compile cannot be interrupted). None: no limit.
            Each candidate's compile time is in the report (``first_run_ms``).
        precisions: the candidates, each a precision: "fp32" (TF32 off for matmuls and
            convolutions), "tf32" (TF32 on, ``set_float32_matmul_precision("high")``),
            "fp16" / "bf16" (``torch.autocast`` in that dtype, outputs cast back to the
            module's dtypes; a module whose floating weights are all in that dtype already,
            ``model.half()``, is compiled as it is, without autocast, as a user compiles it). None: fp32, tf32, fp16 on CUDA; fp32 on the CPU.
        precision: the loosest precision tuning may choose, as in ONNXRuntimeBackendConfig
            ("any", "fp32", "tf32", "fp16", "bf16"): filters ``precisions``.
        dynamic: ``torch.compile``'s ``dynamic`` (None: its default, static shapes first,
            dynamic after a recompile).
        half_weights: also try, per fp16 / bf16 precision, the module with its floating
            parameters and buffers converted once to that dtype (what ``model.half()``
            gives; float inputs cast in, outputs cast back), compiled without autocast:
            no per-call weight casts (autocast recasts every fp32 weight on every call).
            Judged like the autocast candidate (its error against eager at that precision).
            None (default): on CUDA, where the copy fits in the device's free memory with a
            quarter of it to spare, and the module has floating weights in another dtype;
            never on the CPU. True: always; False: never. The copy is made at tuning (and
            on ``ait.load``): it costs its memory (``weights_copy_bytes`` in the report's
            config) and holds the weights as they were, like an ONNX Runtime candidate's
            initializers (``load_state_dict`` and ``.to()`` after tuning send the module
            back to eager until it is tuned again, docs/tuning.md).
        output_dtype: "module" (default): outputs in the module's own dtypes, fp16 / bf16
            results cast back inside the compiled code. "compute": fp16 / bf16 candidates
            return outputs as they compute them (no cast back; saves the cast of large
            outputs such as logits); the tuned module then returns other dtypes than the
            user's module, which tuning warns about and the candidate's name says.
        in_place_outputs: for a module that offers an in-place variant of itself
            (``in_place_variant()``: the same computation writing each output that updates
            an input into that input; ``DecodeStep``, whose caches are those outputs), the
            candidates compile that variant, with the inputs it writes marked as static
            addresses (``torch._dynamo.mark_static_address``, as transformers' StaticCache
            marks its buffers), so CUDA graphs replay with the caches where they lie and no
            copy of a cache is made per call. The tuned module then updates those inputs in
            place and returns them, as ONNXRuntimeBackendConfig(in_place_outputs=True) does:
            the caller must expect them to change (docs/decoders.md); tuning warns, naming
            them. Half-weights candidates (which cast the inputs they would write) and
            modules without a variant compile as without it. A new tensor at such an input
            (another cache) makes CUDA graphs record again (torch gives up on CUDA graphs
            for the function after ``cudagraph_unexpected_rerecord_limit`` such records): a
            generation loop passes the same ones on, and a server keeps its caches.
    """

    mode: str = "reduce-overhead"
    precisions: tuple[str, ...] | None = None
    precision: str = "any"
    dynamic: bool | None = None
    modes: tuple[str, ...] | None = None
    max_compile_s: float | None = None
    half_weights: bool | None = None
    output_dtype: str = "module"
    in_place_outputs: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.in_place_outputs, bool):
            raise ValueError(f"in_place_outputs must be a bool, got {self.in_place_outputs!r}")
        if self.half_weights is not None and not isinstance(self.half_weights, bool):
            raise ValueError(f"half_weights must be None (on CUDA where the copy fits) or a bool, "
                             f"got {self.half_weights!r}")
        if self.output_dtype not in OUTPUT_DTYPES:
            raise ValueError(f"output_dtype must be one of {', '.join(map(repr, OUTPUT_DTYPES))}, "
                             f"got {self.output_dtype!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {self.mode!r}")
        if self.modes is not None:
            if isinstance(self.modes, str) or not self.modes or not all(m in MODES for m in self.modes) \
                    or len(set(self.modes)) != len(self.modes):
                raise ValueError(
                    f"modes must be None or a non-empty sequence of distinct modes out of "
                    f"{', '.join(map(repr, MODES))}, got {self.modes!r}"
                )
            self.modes = tuple(self.modes)
        if self.max_compile_s is not None and (
            isinstance(self.max_compile_s, bool) or not isinstance(self.max_compile_s, (int, float))
            or not self.max_compile_s > 0
        ):
            raise ValueError(f"max_compile_s must be None or a positive number of seconds, got {self.max_compile_s!r}")
        if self.precisions is not None:
            if isinstance(self.precisions, str) or not all(p in PRECISIONS for p in self.precisions) \
                    or not self.precisions:
                raise ValueError(
                    f"precisions must be None or a non-empty sequence of {', '.join(map(repr, PRECISIONS))}, "
                    f"got {self.precisions!r}"
                )
            self.precisions = tuple(self.precisions)
        self.precision = checked_precision_limit(self.precision)
        if self.dynamic is not None and not isinstance(self.dynamic, bool):
            raise ValueError(f"dynamic must be None or a bool, got {self.dynamic!r}")

    def candidate_modes(self) -> tuple[str, ...]:
        """The modes tried: ``modes``, or ``mode`` alone."""
        return self.modes or (self.mode,)

    def candidate_precisions(self, device: torch.device) -> list[str]:
        """The precisions tried on ``device``, those ``precision`` allows."""
        wanted = self.precisions or (DEFAULT_CUDA_PRECISIONS if device.type == "cuda" else DEFAULT_CPU_PRECISIONS)
        limit = _core.parse_precision_limit(self.precision)
        return [p for p in wanted if _core.precision_allowed(_core.parse_precision(p), limit)]

    def candidate_variants(self, device: torch.device) -> list[tuple[str, str]]:
        """(precision, weights) of each candidate per mode: weights "module" (the module's
        own, under autocast for fp16 / bf16) or "half" (a copy in that dtype: half_weights
        True, or None on CUDA; ``half_weights_plan`` then decides per module)."""
        half = self.half_weights if self.half_weights is not None else device.type == "cuda"
        variants = []
        for precision in self.candidate_precisions(device):
            variants.append((precision, "module"))
            if half and precision in _REDUCED:
                variants.append((precision, "half"))
        return variants

    def in_place_for(self, module: torch.nn.Module, weights: str) -> bool:
        """Whether the candidate of ``weights`` compiles ``module``'s in-place variant."""
        return self.in_place_outputs and weights == "module" and callable(getattr(module, "in_place_variant", None))

    def half_weights_plan(self, module: torch.nn.Module, precision: str, device: torch.device) -> str | None:
        """None when the half-weights candidate at ``precision`` is tried on ``module``;
        otherwise why not (only with half_weights=None: an explicit True always tries it).
        Not tried by default: a module whose floating weights are all in that dtype already
        (the copy would be the module), or a copy that would leave less than a quarter of
        the device's free memory (the tune's other candidates and the user's work need it)."""
        if self.half_weights is not None:
            return None
        dtype = _REDUCED[precision]
        tensors = [t for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()]
        if not any(t.dtype != dtype for t in tensors):
            return f"the module's floating weights are {precision} already"
        copy_bytes = sum(t.numel() * dtype.itemsize for t in tensors if t.dtype != dtype)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            if copy_bytes > 0.75 * free:
                return (f"its {precision} copy of the weights ({copy_bytes / 2**30:.2f} GiB) would leave less than a "
                        f"quarter of the device's {free / 2**30:.2f} GiB free; half_weights=True tries it anyway")
        return None


class _PrecisionForward(torch.nn.Module):
    """The graph's module as ``forward(*args, **kwargs) -> tuple of its output tensors``,
    under autocast when the candidate asks for it: what is compiled. An output autocast
    left in another dtype than the module's own is cast back inside the compiled code
    (the tuned module returns what the user's module returns); one already in the
    module's dtype is returned as it is, no op added (``Tensor.to`` of its own dtype is
    the tensor itself). ``output_dtypes`` None: no cast back (output_dtype="compute").
    ``input_dtype``: float inputs are cast to it first (a module whose weights are in it)."""

    def __init__(self, inner: torch.nn.Module, graph, device_type: str, autocast: torch.dtype | None,
                 output_dtypes: list[torch.dtype] | None, input_dtype: torch.dtype | None = None):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "graph", graph)  # not a submodule
        self.device_type = device_type
        self.autocast = autocast
        self.output_dtypes = output_dtypes
        self.input_dtype = input_dtype

    def forward(self, *args, **kwargs) -> tuple[torch.Tensor, ...]:
        # The recorded call is rebuilt outside (infer): binding a signature inside the
        # compiled region would break its graph.
        if self.input_dtype is not None:
            args, kwargs = pytree.tree_map_only(
                torch.Tensor, lambda t: t.to(self.input_dtype) if t.is_floating_point() else t, (args, kwargs))
        if self.autocast is None:
            outputs = self.inner.forward(*args, **kwargs)
        else:
            with torch.autocast(self.device_type, dtype=self.autocast):
                outputs = self.inner.forward(*args, **kwargs)
        tensors = self.graph.output_tensors(outputs)
        if self.output_dtypes is None:
            return tuple(tensors)
        return tuple(t.to(d) for t, d in zip(tensors, self.output_dtypes, strict=True))


_FUNCTIONS = itertools.count()


def own_function(forward: _PrecisionForward) -> _PrecisionForward:
    """``forward`` with a ``forward`` method of its own code object, so that dynamo sees
    each candidate as its own function, as a user's torch.compile of their module is.
    Dynamo keeps compiled code, its recompile limit (8) and automatic dynamic shapes per
    code object: with one ``_PrecisionForward.forward`` for every candidate of every graph,
    the second graph tuned in a process (a decode step after its prefill, another batch)
    was compiled as a recompile of the first, its sizes that differed made symbolic
    (dynamic-shape kernels, where the user's compile is static), and a ninth candidate ran
    eagerly under a compile candidate's name."""
    code = _PrecisionForward.forward.__code__
    code = code.replace(co_name=f"forward_{next(_FUNCTIONS)}")
    function = types.FunctionType(code, _PrecisionForward.forward.__globals__, code.co_name)
    forward.forward = types.MethodType(function, forward)
    return forward


def weights_in(module: torch.nn.Module, dtype: torch.dtype) -> bool:
    """Whether ``module`` has floating parameters or buffers and all are in ``dtype``."""
    dtypes = {t.dtype for t in (*module.parameters(), *module.buffers()) if t.is_floating_point()}
    return dtypes == {dtype}


def half_weights_copy(module: torch.nn.Module, dtype: torch.dtype) -> tuple[torch.nn.Module, int]:
    """A copy of ``module`` whose floating parameters and buffers are in ``dtype`` (what
    ``module.half()`` / ``.to(torch.bfloat16)`` gives, without touching ``module``), and
    the bytes its converted tensors take. The converted tensors are made directly (the
    memo of deepcopy), so no fp32 copy of the weights is made on the way."""
    memo: dict[int, object] = {}
    extra = 0
    for tensor in [*module.parameters(), *module.buffers()]:
        if id(tensor) in memo or not tensor.is_floating_point():
            continue
        half = tensor.detach().to(dtype)
        extra += half.numel() * half.element_size()
        memo[id(tensor)] = torch.nn.Parameter(half, requires_grad=False) if isinstance(
            tensor, torch.nn.Parameter) else half
    return copy.deepcopy(module, memo), extra


class TorchCompileTunedGraph(TunedGraph):
    """A graph run by ``torch.compile`` of the wrapped module in one precision. Built
    lazily: the first call compiles (and, with CUDA graphs, captures)."""

    backend_name = "TorchCompileBackend"

    def __init__(self, graph, precision: str, mode: str, output_dtypes: list[torch.dtype], dynamic: bool | None = None,
                 device: torch.device | None = None, weights: str = "module", output_dtype: str = "module",
                 in_place: bool = False):
        if weights not in ("module", "half"):
            raise ValueError(f"weights must be 'module' or 'half', got {weights!r}")
        if output_dtype not in OUTPUT_DTYPES:
            raise ValueError(f"output_dtype must be one of {', '.join(map(repr, OUTPUT_DTYPES))}, got {output_dtype!r}")
        reduced = _REDUCED.get(precision)
        if weights == "half" and reduced is None:
            raise ValueError(f"half weights need precision fp16 or bf16, got {precision!r}")
        self.graph = graph
        self.precision = precision
        self.mode = mode
        self.dynamic = dynamic
        self.output_dtypes = list(output_dtypes)
        self.weights = weights
        # A half-weights copy is a snapshot; the module compiled as it is reads its own parameters.
        self.holds_weights = weights == "half"
        # "compute" only changes fp16 / bf16 candidates: the others compute in the module's dtypes
        self.output_dtype = output_dtype if reduced is not None else "module"
        self.device = device if device is not None else _module_device(graph.module)
        self.weights_copy_bytes = 0
        # A module whose floating weights are all in the reduced dtype already (model.half())
        # is compiled as it is, as a user compiles it: autocast would recast the ops it lists
        # (softmax, layer_norm, exp, sum, ... on CUDA) to fp32 and back, kernels and results
        # neither eager nor the user's torch.compile of that module has.
        self.autocast = reduced is not None and weights == "module" and not weights_in(graph.module, reduced)
        self.in_place = bool(in_place)
        # The recorded inputs the in-place variant writes (found on the first call, _written_inputs).
        self.written: list[int] | None = None
        inner, input_dtype = graph.module, None
        if self.in_place:
            if weights != "module":
                raise ValueError("in_place needs the module's own weights: a half-weights copy casts the inputs "
                                 "it would write")
            variant = getattr(graph.module, "in_place_variant", None)
            if not callable(variant):
                raise ValueError(f"in_place: {type(graph.module).__name__} offers no in_place_variant()")
            inner = variant()
        if weights == "half":  # float inputs cast to the copy's dtype
            (inner, self.weights_copy_bytes), input_dtype = half_weights_copy(graph.module, reduced), reduced
        forward = _PrecisionForward(inner, graph, self.device.type, reduced if self.autocast else None,
                                    None if self.output_dtype == "compute" else self.output_dtypes, input_dtype)
        self._forward = forward
        self._compiled = torch.compile(own_function(forward), mode=mode, dynamic=dynamic)
        # TF32 is a CUDA setting; fp16 / bf16 candidates leave the user's flags alone.
        self._sets_tf32 = self.device.type == "cuda" and reduced is None
        self._cuda_graphs = self.device.type == "cuda" and mode in ("reduce-overhead", "max-autotune")

    def infer(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        # The compiled outputs as they are: no copy, no cast (with CUDA graphs they live
        # in the graph's pool until the next call, exactly as with torch.compile).
        # run_eagerly() (nested ait.Modules run their PyTorch code if dynamo traces again),
        # set directly: a generator context manager per call costs more than the rest here
        token = eager_var.set(True)
        try:
            if self._sets_tf32:
                with allow_tf32(self.precision == "tf32"):
                    return self._run(inputs)
            return self._run(inputs)
        finally:
            eager_var.reset(token)

    def _run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.in_place:
            written = self.written if self.written is not None else self._written_inputs(inputs)
            for i in written:  # before dynamo sees them: static, so CUDA graphs write them where they lie
                if getattr(inputs[i], "_dynamo_static_input_type", None) is None:
                    torch._dynamo.mark_static_address(inputs[i])
        if self._cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        args, kwargs = self.graph.call_arguments(inputs)
        return list(self._compiled(*args, **kwargs))

    def _written_inputs(self, inputs: list[torch.Tensor]) -> list[int]:
        """The inputs the in-place variant writes: found once, by one eager call on copies
        of ``inputs`` (their version counters), before the first compile must know them."""
        copies = [t.clone() for t in inputs]
        args, kwargs = self.graph.call_arguments(copies)
        with torch.no_grad():
            self._forward(*args, **kwargs)
        self.written = [i for i, t in enumerate(copies) if t._version != 0]
        return self.written

    def written_input_names(self) -> list[str]:
        """The recorded inputs the tuned module updates in place (empty before its first call)."""
        return [self.graph.input_names[i] for i in self.written or ()]

    def config(self) -> dict:
        """What a checkpoint stores to recompile this graph on load (``weights`` and
        ``output_dtype`` only where they are not the defaults)."""
        config = {
            "precision": self.precision,
            "mode": self.mode,
            "dynamic": self.dynamic,
            "output_dtypes": [str(d).removeprefix("torch.") for d in self.output_dtypes],
        }
        if self.weights != "module":
            config["weights"] = self.weights
        if self.output_dtype != "module":
            config["output_dtype"] = self.output_dtype
        if self.in_place:
            config["in_place"] = True
        return config

    def describe(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in (("weights", self.weights), ("output_dtype", self.output_dtype))
                        if v != "module") + (", in place" if self.in_place else "")
        return f"{self.backend_name}[mode={self.mode}, precision={self.precision}{extra}]"


def _module_device(module: torch.nn.Module) -> torch.device:
    for tensor in [*module.parameters(), *module.buffers()]:
        return tensor.device
    return torch.device("cpu")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"'{name}' is not a torch dtype")
    return dtype


class TorchCompileBackend(Backend):
    """``torch.compile`` of each graph, one candidate per precision (see
    TorchCompileBackendConfig), checked against eager PyTorch and measured by the engine
    like ONNX Runtime's candidates. List it next to ONNXRuntimeBackend in a strategy that
    compares backends (MaxThroughputStrategy, MinLatencyStrategy) to get the faster of
    the two; OneBackendStrategy(ONNXRuntimeBackend(...)) stays ONNX Runtime only.

    A checkpoint (``ait.save``) stores the decision and this configuration, not compiled
    code: ``ait.load`` compiles again on the first call, with the loaded module's weights.
    """

    config: TorchCompileBackendConfig

    def __init__(self, config: TorchCompileBackendConfig | None = None):
        if config is None:
            config = TorchCompileBackendConfig()
        if not isinstance(config, TorchCompileBackendConfig):
            raise TypeError(f"config must be a TorchCompileBackendConfig, got {type(config).__name__}")
        super().__init__(config)

    def candidate_count(self, graph) -> int:
        return len(self.config.candidate_variants(graph.device)) * len(self.config.candidate_modes())

    def add_candidates(self, graph, tuner, group: int, advance, module_call=None):
        precisions = self.config.candidate_precisions(graph.device)
        if not precisions:
            raise _core.InvalidArgumentError(
                f"{self.describe()}: none of its precisions is within precision={self.config.precision!r}"
            )
        output_dtypes = [t.dtype for t in graph.samples[0].outputs]
        inputs = [[t.detach() for t in s.inputs] for s in graph.samples]
        largest = max(range(len(graph.samples)), key=lambda i: graph.samples[i].batch_size)
        made: dict[str, TorchCompileTunedGraph] = {}
        for mode in self.config.candidate_modes():
            for precision, weights in self.config.candidate_variants(graph.device):
                in_place = self.config.in_place_for(graph.module, weights)
                variant = ", ".join(([] if weights == "module" else ["half weights"]) + (
                    [f"{precision} outputs"] if self.config.output_dtype == "compute" and precision in _REDUCED else [])
                    + (["in place"] if in_place else []))
                name = f"torch.compile[mode={mode}] {precision}" + (f" ({variant})" if variant else "")
                skip = self.config.half_weights_plan(graph.module, precision, graph.device) if weights == "half" \
                    else None
                if skip is not None:  # half_weights=None left it out for this module: said, not a failure
                    logger.info("ait.Module '%s' %s: %s not tried: %s", graph.module_name, graph.key, name, skip)
                    advance()
                    continue
                try:
                    tuned = TorchCompileTunedGraph(graph, precision, mode, output_dtypes, self.config.dynamic,
                                                   graph.device, weights, self.config.output_dtype, in_place)
                except Exception as error:  # a module that cannot be copied: the other candidates stand
                    tuner.add_failed(name, self.describe(), group, f"{type(error).__name__}: {error}",
                                     _core.parse_precision(precision))
                    advance()
                    continue
                made[name] = tuned
                # An in-place candidate is judged on copies of the samples (one set, kept:
                # static addresses), so what it writes never reaches another candidate's.
                judged = [[t.clone() for t in s] for s in inputs] if in_place else inputs

                def outputs(i: int, tuned=tuned, judged=judged) -> list[torch.Tensor]:
                    # Judged in the module's dtypes: outputs left in fp16 / bf16
                    # (output_dtype="compute") are compared by value, as computed.
                    return [t.detach().to(d).cpu().contiguous() for t, d in zip(tuned.infer(judged[i]), output_dtypes)]

                config = {**self.config.to_dict(), **tuned.config()}
                if tuned.weights_copy_bytes:
                    config["weights_copy_bytes"] = tuned.weights_copy_bytes  # the memory the copy adds
                tuner.evaluate_external(name, self.describe(), group, _core.parse_precision(precision),
                                        json.dumps(config), outputs, self._timed_call(tuned, judged[largest], module_call))
                advance()

        if self.config.in_place_outputs and not self.config.in_place_for(graph.module, "module"):
            logger.info("ait.Module '%s' %s: in_place_outputs=True has no effect: %s offers no in_place_variant()",
                        graph.module_name, graph.key, type(graph.module).__name__)

        def make(session, candidate) -> TunedGraph:
            tuned = made[candidate.name]
            if tuned.in_place:  # the module now changes what it is given: say so
                logger.warning(
                    "ait.Module '%s': the tuned graph (%s) writes its outputs into inputs %s (in_place_outputs=True): "
                    "each call updates those tensors in place and returns them", graph.module_name, candidate.name,
                    ", ".join(tuned.written_input_names()) or "(found on its first call)")
            if tuned.output_dtype == "compute":
                module_dtypes = sorted({str(d).removeprefix("torch.") for d in output_dtypes if d.is_floating_point})
                logger.warning(
                    "ait.Module '%s' %s: %s returns its outputs as %s computes them (%s where it leaves them "
                    "so), not cast to the module's %s (TorchCompileBackendConfig(output_dtype='compute'))",
                    graph.module_name, graph.key, candidate.name, tuned.precision,
                    str(_REDUCED[tuned.precision]).removeprefix("torch."), ", ".join(module_dtypes) or "dtypes")
            return tuned

        return make

    def _timed_call(self, tuned: TorchCompileTunedGraph, inputs: list[torch.Tensor], module_call):
        """What the engine calls: the first call compiles (timed by the engine as the first
        run, bounded by ``max_compile_s``); every later one is the module's call with this
        candidate as its graph (``module_call``), or the candidate's own run without one."""
        state: dict = {}

        def run() -> None:
            call = state.get("call")
            if call is not None:
                call()
                return
            start = time.perf_counter()
            if module_call is None:
                call = lambda: tuned.infer(inputs)  # noqa: E731
                call()
            elif tuned.in_place:  # on the candidate's own copies of the sample (it writes them)
                call = module_call(tuned, inputs)  # makes the first call: the compile
            else:
                call = module_call(tuned)  # makes the first call: the compile
            seconds = time.perf_counter() - start
            limit = self.config.max_compile_s
            if limit is not None and seconds > limit:
                raise _core.InvalidArgumentError(
                    f"compiling took {seconds:.1f} s, over max_compile_s={limit:g} (TorchCompileBackendConfig)"
                )
            state["call"] = call

        return run
