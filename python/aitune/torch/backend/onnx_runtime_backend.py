"""ONNXRuntimeBackend: export a graph to ONNX and run it in an ONNX Runtime session of
the C++ engine (``aitune._core.OnnxRuntimeBackend``)."""

from __future__ import annotations

import dataclasses
import enum
import json

import torch

from aitune import _core
from aitune.torch import cache, export
from aitune.torch.backend.base import Backend, BackendConfig, TunedGraph
from aitune.torch.graph import RecordedGraph


class ONNXExecutionProvider(str, enum.Enum):
    """ONNX Runtime execution providers. CUDA and TENSORRT are the spec's; CPU is
    aitune's addition so the whole pipeline runs on machines without a GPU."""

    CUDA = "cuda"
    TENSORRT = "tensorrt"
    CPU = "cpu"


@dataclasses.dataclass
class ONNXRuntimeBackendConfig(BackendConfig):
    """How ONNXRuntimeBackend exports and runs a graph.

    Attributes:
        use_dynamo: export with ``torch.onnx.export(dynamo=True)``; False uses the
            trace-based exporter.
        execution_provider: None means CUDA. Strings ("cuda", "tensorrt", "cpu") are
            accepted and converted.
        opset_version: passed to ``torch.onnx.export``; None keeps PyTorch's default.
    """

    use_dynamo: bool = True
    execution_provider: ONNXExecutionProvider | None = None
    opset_version: int | None = None

    def __post_init__(self) -> None:
        if self.execution_provider is not None and not isinstance(self.execution_provider, ONNXExecutionProvider):
            try:
                self.execution_provider = ONNXExecutionProvider(str(self.execution_provider).lower())
            except ValueError:
                valid = ", ".join(repr(p.value) for p in ONNXExecutionProvider)
                raise ValueError(
                    f"execution_provider must be None or one of {valid} (or ONNXExecutionProvider members), "
                    f"got {self.execution_provider!r}"
                ) from None
        if not isinstance(self.use_dynamo, bool):
            raise ValueError(f"use_dynamo must be a bool, got {self.use_dynamo!r}")
        if self.opset_version is not None and (
            isinstance(self.opset_version, bool) or not isinstance(self.opset_version, int) or self.opset_version < 1
        ):
            raise ValueError(f"opset_version must be None or a positive int, got {self.opset_version!r}")

    @property
    def provider(self) -> ONNXExecutionProvider:
        """The provider in effect: ``execution_provider``, or CUDA when it is None."""
        return self.execution_provider or ONNXExecutionProvider.CUDA

    def _canonical_value(self, field, value):
        if field.name == "execution_provider":  # None and CUDA are one configuration
            return self.provider.value
        return super()._canonical_value(field, value)


# Largest |ORT - eager| accepted at build time, as (atol, rtol) per output dtype: an
# element fails when it exceeds atol + rtol * |eager|. fp32 is strict on purpose; the
# tuning-engine issue refines this (TF32 / fp16 candidates get their own tolerances).
_TOLERANCES = {
    torch.float64: (1e-6, 1e-6),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}


class NumericMismatchError(_core.AituneError):
    """A built backend's outputs differ from eager PyTorch beyond the tolerance."""


def _compare(graph: RecordedGraph, index: int, actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for name, a, e in zip(graph.output_names, actual, expected, strict=True):
        if a.shape != e.shape or a.dtype != e.dtype:
            raise NumericMismatchError(
                f"{graph.module_name}/{graph.key} sample {index}: {name} is {a.dtype}{list(a.shape)}, "
                f"eager gave {e.dtype}{list(e.shape)}"
            )
        e = e.to(a.device)
        if not a.is_floating_point():
            if not torch.equal(a, e):
                raise NumericMismatchError(
                    f"{graph.module_name}/{graph.key} sample {index}: {name} differs from eager "
                    f"({int((a != e).sum())} of {a.numel()} elements)"
                )
            continue
        atol, rtol = _TOLERANCES[a.dtype]
        if not torch.allclose(a, e, atol=atol, rtol=rtol, equal_nan=True):
            diff = (a.double() - e.double()).abs()
            raise NumericMismatchError(
                f"{graph.module_name}/{graph.key} sample {index}: {name} differs from eager beyond "
                f"atol={atol:g}, rtol={rtol:g}: max abs diff {diff.max().item():.3g}, "
                f"max rel diff {(diff / e.double().abs().clamp_min(1e-12)).max().item():.3g}"
            )


class OnnxRuntimeTunedGraph(TunedGraph):
    """A graph running in a ``_core.OnnxRuntimeBackend`` session."""

    def __init__(self, session, order: list[int], input_names: list[str], describe: str):
        self.session = session
        self.device = torch.device(session.device)
        self._order = order  # session input i <- graph tensor input order[i]
        self._names = input_names
        self._describe = describe

    def infer(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        ordered = []
        for i in self._order:
            tensor = inputs[i]
            if tensor.device != self.device:
                raise _core.InvalidArgumentError(
                    f"input '{self._names[i]}' is on {tensor.device}, but the ONNX Runtime session runs on "
                    f"{self.device}; move the input (or the module before tuning) to {self.device}"
                )
            # detach: DLPack refuses tensors that require grad; contiguous: ORT reads dense
            # memory (a copy only for strided views, kept alive in `ordered`).
            ordered.append(tensor.detach().contiguous())
        if self.device.type == "cuda":
            # ORT runs on its own stream: torch's pending work on these inputs must finish
            # first. (ORT synchronises its stream before returning the outputs.)
            torch.cuda.current_stream(self.device).synchronize()
        return self.session.infer(ordered, framework="torch")

    def describe(self) -> str:
        return self._describe


class ONNXRuntimeBackend(Backend):
    """Exports each graph to ``model_raw.onnx`` and runs it with ONNX Runtime.

    Build = write ``config.json``, export (checked by onnx.checker), create the session
    for the configured provider on the module's device, run every recorded sample and
    compare with eager PyTorch (a mismatch fails the build), activate.
    """

    config: ONNXRuntimeBackendConfig

    def __init__(self, config: ONNXRuntimeBackendConfig | None = None):
        if config is None:
            config = ONNXRuntimeBackendConfig()
        if not isinstance(config, ONNXRuntimeBackendConfig):
            raise TypeError(f"config must be an ONNXRuntimeBackendConfig, got {type(config).__name__}")
        super().__init__(config)

    def _core_config(self, device: torch.device) -> _core.OnnxRuntimeBackendConfig:
        core = _core.OnnxRuntimeBackendConfig()
        core.provider = _core.parse_execution_provider(self.config.provider.value)
        if device.type == "cuda":
            core.device_id = device.index or 0
        if self.config.provider is ONNXExecutionProvider.CUDA:
            # Strict fp32, as eager matmuls run by default: the CUDA EP's TF32 default
            # differs from fp32 by ~1e-3 on conv/attention models (DESIGN.md), beyond 1e-4.
            core.provider_options = {"use_tf32": "0"}
        return core

    def build(self, graph: RecordedGraph) -> TunedGraph:
        directory = cache.backend_dir(graph.module_name, graph.key, self.key())
        spec = graph.graph_spec()
        core_config = self._core_config(graph.device)
        (directory / "config.json").write_text(
            json.dumps(
                {
                    "backend": type(self).__name__,
                    "config": self.config.to_dict(),
                    "session": json.loads(core_config.to_json()),
                    "graph_spec": json.loads(spec.to_json()),
                },
                indent=2,
            )
        )
        # Both checks before an export that may take minutes.
        self._check_provider(core_config)
        session_device = torch.device("cpu") if self.config.provider is ONNXExecutionProvider.CPU else torch.device(
            "cuda", core_config.device_id
        )
        if graph.device != session_device:
            raise _core.InvalidArgumentError(
                f"ait.Module '{graph.module_name}' runs on {graph.device}, but {self.describe()} runs on "
                f"{session_device}: move the module (and its samples) to {session_device}, or choose an "
                f"execution provider for {graph.device}"
            )
        model_path = export.export_onnx(
            graph,
            spec,
            directory / "model_raw.onnx",
            use_dynamo=self.config.use_dynamo,
            opset_version=self.config.opset_version,
        )
        # The trace exporter drops inputs the graph does not use; the session only
        # gets (and the spec only describes) the inputs the model declares.
        model_inputs, model_outputs = export.onnx_io_names(model_path)
        if model_outputs != graph.output_names:
            raise _core.ModelInvalidError(f"{model_path} declares outputs {model_outputs}, expected {graph.output_names}")
        if model_inputs != graph.input_names:
            spec = graph.graph_spec(model_inputs)
        session = _core.OnnxRuntimeBackend.create(str(model_path), core_config, spec)
        order = [graph.input_names.index(name) for name in model_inputs]
        tuned = OnnxRuntimeTunedGraph(session, order, graph.input_names, self.describe())
        # Every sample once through the session: TensorRT builds its engines now, and
        # outputs must match eager PyTorch before the backend may replace it.
        for index, sample in enumerate(graph.samples):
            _compare(graph, index, tuned.infer(sample.inputs), sample.outputs)
        session.activate()
        return tuned

    @staticmethod
    def _check_provider(core_config) -> None:
        status = _core.OrtRuntime.load().provider_status(core_config.provider)
        if not status.available:
            # The engine's reason names the library that failed and what to install.
            raise _core.ProviderUnavailableError(
                f"{status.reason}. Without a GPU, use ONNXRuntimeBackendConfig(execution_provider='cpu')."
            )
