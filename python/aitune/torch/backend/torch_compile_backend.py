"""TorchCompileBackend: torch.compile (mode "reduce-overhead" by default) as tuning
candidates, one per precision, checked and measured by the C++ engine next to ONNX
Runtime's, so a strategy over both hands the user whichever is fastest and correct."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator

import torch

from aitune import _core
from aitune.torch.backend import precision as precision_edge
from aitune.torch.backend.base import Backend, BackendConfig, TunedGraph
from aitune.torch.context import run_eagerly

#: Candidate precisions by name (the engine's Precision, which sets their default
#: tolerance, is parsed from the name at the edge: precision.candidate_precision).
PRECISIONS = precision_edge.PRECISION_NAMES
#: torch.compile modes.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: What a CUDA module tries by default: fp32, TF32 (what a user tuning for speed sets) and
#: fp16 autocast; on the host fp32 only (TF32 and fp16 autocast are GPU notions there).
DEFAULT_CUDA_PRECISIONS = ("fp32", "tf32", "fp16")
DEFAULT_CPU_PRECISIONS = ("fp32",)


@dataclasses.dataclass
class TorchCompileBackendConfig(BackendConfig):
    """How TorchCompileBackend compiles a graph.

    Attributes:
        mode: ``torch.compile``'s mode. "reduce-overhead" (default) replays CUDA graphs
            on a GPU; outputs are then copied out of the graph's pool on each call (their
            memory is reused by the next replay), and that copy is part of what is measured.
        precisions: the candidates, each a precision: "fp32" (TF32 off for matmuls and
            convolutions), "tf32" (TF32 on, ``set_float32_matmul_precision("high")``),
            "fp16" / "bf16" (``torch.autocast`` in that dtype, outputs cast back to the
            module's dtypes). None: fp32, tf32, fp16 on CUDA; fp32 on the CPU.
        precision: the loosest precision tuning may choose, as in ONNXRuntimeBackendConfig
            ("any", "fp32", "tf32", "fp16", "bf16"): filters ``precisions``.
        dynamic: ``torch.compile``'s ``dynamic`` (None: its default, static shapes first,
            dynamic after a recompile).
    """

    mode: str = "reduce-overhead"
    precisions: tuple[str, ...] | None = None
    precision: str = "any"
    dynamic: bool | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {self.mode!r}")
        if self.precisions is not None:
            if isinstance(self.precisions, str) or not all(p in PRECISIONS for p in self.precisions) \
                    or not self.precisions:
                raise ValueError(
                    f"precisions must be None or a non-empty sequence of {', '.join(map(repr, PRECISIONS))}, "
                    f"got {self.precisions!r}"
                )
            self.precisions = tuple(self.precisions)
        self.precision = precision_edge.precision_limit(self.precision)
        if self.dynamic is not None and not isinstance(self.dynamic, bool):
            raise ValueError(f"dynamic must be None or a bool, got {self.dynamic!r}")

    def candidate_precisions(self, device: torch.device) -> list[str]:
        """The precisions tried on ``device``, those ``precision`` allows."""
        wanted = self.precisions or (DEFAULT_CUDA_PRECISIONS if device.type == "cuda" else DEFAULT_CPU_PRECISIONS)
        return [p for p in wanted if _core.precision_allowed(precision_edge.candidate_precision(p), self.precision)]


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    """TF32 for CUDA matmuls and convolutions on or off around a call (and the compile
    inside the first call, which reads these flags), restored after."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


class _PrecisionForward(torch.nn.Module):
    """The graph's module as ``forward(*args, **kwargs) -> tuple of its output tensors``,
    under autocast when the candidate asks for it, outputs cast back to the module's own
    dtypes: what is compiled."""

    def __init__(self, graph, device_type: str, autocast: torch.dtype | None, output_dtypes: list[torch.dtype]):
        super().__init__()
        self.inner = graph.module
        object.__setattr__(self, "graph", graph)  # not a submodule
        self.device_type = device_type
        self.autocast = autocast
        self.output_dtypes = output_dtypes

    def forward(self, *args, **kwargs) -> tuple[torch.Tensor, ...]:
        # The recorded call is rebuilt outside (infer): binding a signature inside the
        # compiled region would break its graph.
        if self.autocast is None:
            outputs = self.inner.forward(*args, **kwargs)
        else:
            with torch.autocast(self.device_type, dtype=self.autocast):
                outputs = self.inner.forward(*args, **kwargs)
        return tuple(t.to(d) for t, d in zip(self.graph.output_tensors(outputs), self.output_dtypes, strict=True))


class TorchCompileTunedGraph(TunedGraph):
    """A graph run by ``torch.compile`` of the wrapped module in one precision. Built
    lazily: the first call compiles (and, with CUDA graphs, captures)."""

    backend_name = "TorchCompileBackend"

    def __init__(self, graph, precision: str, mode: str, output_dtypes: list[torch.dtype], dynamic: bool | None = None,
                 device: torch.device | None = None):
        self.graph = graph
        self.precision = precision
        self.mode = mode
        self.dynamic = dynamic
        self.output_dtypes = list(output_dtypes)
        self.device = device if device is not None else _module_device(graph.module)
        autocast = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
        forward = _PrecisionForward(graph, self.device.type, autocast, self.output_dtypes)
        self._compiled = torch.compile(forward, mode=mode, dynamic=dynamic)
        # TF32 is a CUDA setting; fp16 / bf16 candidates leave the user's flags alone.
        self._sets_tf32 = self.device.type == "cuda" and autocast is None
        self._cuda_graphs = self.device.type == "cuda" and mode in ("reduce-overhead", "max-autotune")

    def infer(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        with run_eagerly(), (_tf32(self.precision == "tf32") if self._sets_tf32 else contextlib.nullcontext()):
            if self._cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            args, kwargs = self.graph.call_arguments(inputs)
            outputs = self._compiled(*args, **kwargs)
        if self._cuda_graphs:  # the next replay overwrites the graph's output memory
            return [t.clone() for t in outputs]
        return list(outputs)

    def config(self) -> dict:
        """What a checkpoint stores to recompile this graph on load."""
        return {
            "precision": self.precision,
            "mode": self.mode,
            "dynamic": self.dynamic,
            "output_dtypes": [str(d).removeprefix("torch.") for d in self.output_dtypes],
        }

    def describe(self) -> str:
        return f"{self.backend_name}[mode={self.mode}, precision={self.precision}]"


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
        return len(self.config.candidate_precisions(graph.device))

    def add_candidates(self, graph, tuner, group: int, advance):
        precisions = self.config.candidate_precisions(graph.device)
        if not precisions:
            raise _core.InvalidArgumentError(
                f"{self.describe()}: none of its precisions is within precision={self.config.precision!r}"
            )
        output_dtypes = [t.dtype for t in graph.samples[0].outputs]
        inputs = [[t.detach() for t in s.inputs] for s in graph.samples]
        largest = max(range(len(graph.samples)), key=lambda i: graph.samples[i].batch_size)
        made: dict[str, TorchCompileTunedGraph] = {}
        for precision in precisions:
            tuned = TorchCompileTunedGraph(graph, precision, self.config.mode, output_dtypes, self.config.dynamic,
                                           graph.device)
            name = f"torch.compile[mode={self.config.mode}] {precision}"
            made[name] = tuned

            def outputs(i: int, tuned=tuned) -> list[torch.Tensor]:
                return [t.detach().cpu().contiguous() for t in tuned.infer(inputs[i])]

            def run(tuned=tuned) -> None:
                tuned.infer(inputs[largest])

            tuner.evaluate_external(name, self.describe(), group, precision_edge.candidate_precision(precision),
                                    json.dumps({**self.config.to_dict(), **tuned.config()}), outputs, run)
            advance()

        def make(session, candidate) -> TunedGraph:
            return made[candidate.name]

        return make
