"""ONNXRuntimeBackend: export a graph to ONNX and run it in an ONNX Runtime session of
the C++ engine (``aitune._core.OnnxRuntimeBackend``)."""

from __future__ import annotations

import dataclasses
import enum
import json
import os

import torch

from aitune import _core
from aitune.torch import cache, candidate_isolation, export
from aitune.torch.backend.base import Backend, BackendConfig, TunedGraph
from aitune.torch.graph import RecordedGraph


class ONNXExecutionProvider(str, enum.Enum):
    """ONNX Runtime execution providers. CUDA and TENSORRT are the spec's; CPU is
    aitune's addition so the whole pipeline runs on machines without a GPU."""

    CUDA = "cuda"
    TENSORRT = "tensorrt"
    CPU = "cpu"


#: The values of ``ONNXRuntimeBackendConfig.precision`` (the engine's precision limits).
PRECISIONS = ("any", "fp32", "tf32", "fp16", "bf16")


def module_precision(module: torch.nn.Module) -> _core.Precision:
    """The precision a module computes in by its own dtype: FP16 / BF16 when all its
    floating parameters and buffers are (the export is then an fp16 / bf16 model with fp16
    / bf16 inputs and outputs, no casts at the edges), STRICT otherwise."""
    dtypes = {t.dtype for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()}
    if dtypes == {torch.float16}:
        return _core.Precision.FP16
    if dtypes == {torch.bfloat16}:
        return _core.Precision.BF16
    return _core.Precision.STRICT


@dataclasses.dataclass
class ONNXRuntimeBackendConfig(BackendConfig):
    """How ONNXRuntimeBackend exports and runs a graph.

    Attributes:
        use_dynamo: export with ``torch.onnx.export(dynamo=True)``; False uses the
            trace-based exporter.
        execution_provider: None means CUDA. Strings ("cuda", "tensorrt", "cpu") are
            accepted and converted.
        opset_version: passed to ``torch.onnx.export``; None keeps PyTorch's default.
        tune_provider_options: expand into the engine's provider-option variants (CUDA:
            TF32 on/off, convolution algorithm search, NHWC, CUDA graphs where every
            input shape is static, and an fp16 copy of the model checked against the
            fp16 tolerance (needs onnxconverter-common); CPU: threads, graph
            optimisation; TensorRT: fp16, builder level), each checked and measured.
            False: one strict candidate.
        provider_options: ONNX Runtime provider options fixed in every candidate, as ORT
            spells them (e.g. ``{"cudnn_conv_algo_search": "HEURISTIC"}``).
        precision: the loosest precision tuning may choose: "any" (default: every
            candidate competes, as before), "fp32" (strict fp32 only), "tf32" (adds TF32),
            "fp16" (adds fp16), "bf16" (adds bf16). Every candidate reports its precision.
        transformer_fusions: also try the exported graph with ONNX Runtime's transformer
            fusions (Attention, SkipLayerNormalization, BiasGelu, ...; docs/tuning.md),
            where they apply: no fused operator, no extra candidate.
    """

    use_dynamo: bool = True
    execution_provider: ONNXExecutionProvider | None = None
    opset_version: int | None = None
    tune_provider_options: bool = True
    provider_options: dict[str, str] | None = None
    precision: str = "any"
    transformer_fusions: bool = True

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
        if not isinstance(self.tune_provider_options, bool):
            raise ValueError(f"tune_provider_options must be a bool, got {self.tune_provider_options!r}")
        if self.provider_options is not None:
            if not isinstance(self.provider_options, dict) or not all(
                isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in self.provider_options.items()
            ):
                raise ValueError(
                    f"provider_options must be a dict of str to str/int/float/bool, got {self.provider_options!r}"
                )
            self.provider_options = {k: str(int(v)) if isinstance(v, bool) else str(v)
                                     for k, v in self.provider_options.items()}
        if not isinstance(self.precision, str) or self.precision.lower() not in PRECISIONS:
            raise ValueError(
                f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {self.precision!r}"
            )
        self.precision = self.precision.lower()
        if not isinstance(self.transformer_fusions, bool):
            raise ValueError(f"transformer_fusions must be a bool, got {self.transformer_fusions!r}")

    @property
    def provider(self) -> ONNXExecutionProvider:
        """The provider in effect: ``execution_provider``, or CUDA when it is None."""
        return self.execution_provider or ONNXExecutionProvider.CUDA

    def _canonical_value(self, field, value):
        if field.name == "execution_provider":  # None and CUDA are one configuration
            return self.provider.value
        return super()._canonical_value(field, value)


def _has_convolutions(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in module.modules())


class NumericMismatchError(_core.AituneError):
    """Every candidate's outputs differ from eager PyTorch beyond its tolerance; the
    message has the first failure and the tuning summary table."""


def model_file_identity(path: str) -> tuple | None:
    """(device, inode, size, mtime) of a model file, None if it is gone: tells whether the
    file a session was created from was replaced since (a later tune of a module with
    the same name and graph rewrites the cache file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class OnnxRuntimeTunedGraph(TunedGraph):
    """A graph running in a ``_core.OnnxRuntimeBackend`` session. The module's dispatch
    runs it (``_core.TorchDispatch``, the one path of tensors into and out of a session);
    this holds what that needs and what a checkpoint stores."""

    def __init__(self, session, order: list[int], input_names: list[str], describe: str):
        self.session = session
        self.order = list(order)  # session input i <- graph tensor input order[i]
        self.input_names = list(input_names)
        self._describe = describe
        self.model_file = model_file_identity(session.model_path)  # ait.save checks it is still this file

    def describe(self) -> str:
        return self._describe


class ONNXRuntimeBackend(Backend):
    """Exports each graph to ``model_raw.onnx`` and runs it with ONNX Runtime.

    Per graph: write ``config.json``, check the provider, export (checked by
    onnx.checker), then hand every candidate configuration to the engine, which creates
    its session, compares every recorded sample with eager PyTorch and measures it.
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
        core.provider_options = dict(self.config.provider_options or {})
        return core

    def _candidates(self, core: _core.OnnxRuntimeBackendConfig, spec, directory=None) -> list:
        variants = _core.provider_variants(core, spec)
        if not self.config.tune_provider_options:
            # One candidate: strict fp32 as eager matmuls run by default (the CUDA EP's TF32
            # default differs by ~1e-3 on conv/attention models, DESIGN.md).
            variants = variants[:1]
        if core.provider != _core.ExecutionProvider.TENSORRT or directory is None:
            return variants
        # TensorRT: engine and timing caches of each variant in a directory of its own (an
        # fp16 engine must not be found by the fp32 variant), profiles from the spec, so
        # engines are built once per shape range and saved with a checkpoint.
        out = []
        for i, variant in enumerate(variants):
            config = _core.OnnxRuntimeBackendConfig.from_json(variant.config.to_json())
            config.provider_options = _core.tensorrt_provider_options(
                spec, str(directory / "trt" / f"variant_{i}"), dict(variant.config.provider_options)
            )
            out.append(_core.OnnxCandidate(variant.name, config, variant.precision))
        return out

    def _fp16_candidates(self, core: _core.OnnxRuntimeBackendConfig, variants: list, module: torch.nn.Module) -> list:
        """The fp16-model candidates (CUDA, with provider-option tuning, an fp32 module):
        the last of the CUDA ``variants`` (a CUDA graph where shapes are static, else TF32)
        on an fp16 copy of the model, judged by the fp16 tolerance; for models with
        convolutions also the same with ``prefer_nhwc=1`` (cuDNN's fp16 tensor-core
        convolutions want NHWC: ResNet-50 b16 fp16 2074 -> 1635 us on the H200, issue 16).
        Empty where not offered or not allowed by ``precision``."""
        if (not self.config.tune_provider_options or core.provider != _core.ExecutionProvider.CUDA
                or module_precision(module) != _core.Precision.STRICT
                or not self._allowed(_core.Precision.FP16)):
            return []
        base = variants[-1]
        out = [_core.OnnxCandidate(f"{base.name} fp16 model", base.config, _core.Precision.FP16)]
        if _has_convolutions(module) and "prefer_nhwc" not in base.config.provider_options:
            nhwc = _core.OnnxRuntimeBackendConfig.from_json(base.config.to_json())
            nhwc.provider_options = {**dict(base.config.provider_options), "prefer_nhwc": "1"}
            out.append(_core.OnnxCandidate(f"{_core.candidate_name(nhwc)} fp16 model", nhwc, _core.Precision.FP16))
        return out

    def _allowed(self, precision) -> bool:
        return _core.precision_allowed(precision, self.config.precision)

    def _with_precision(self, variants: list, graph: RecordedGraph) -> list:
        """The variants relabelled for an fp16 / bf16 module (its model computes in that
        dtype whatever the provider options), then those ``precision`` allows."""
        own = module_precision(graph.module)
        if own != _core.Precision.STRICT:
            variants = [_core.OnnxCandidate(v.name, v.config, own) for v in variants]
        return [v for v in variants if self._allowed(v.precision)]

    def _fused_candidates(self, variants: list, fp16: list) -> list[tuple[object, bool]]:
        """(candidate, on the fp16 fused model) pairs for a fused graph: per precision the
        variant most likely to win (CUDA: the last of its precision, a CUDA graph where
        shapes are static; CPU: ORT's defaults), and the first fp16 candidate's configuration on the fp16 fused model, so a
        fusion adds at most three candidates."""
        best = {}
        for v in variants:  # CUDA: the last (graph capture); CPU: the first (ORT's defaults)
            if v.config.provider == _core.ExecutionProvider.CUDA or v.precision not in best:
                best[v.precision] = v
        out = [(v, False) for v in best.values()]
        if fp16:
            out.append((fp16[0], True))
        return out

    def candidate_count(self, graph: RecordedGraph) -> int:
        if not self.config.tune_provider_options:
            return 1
        core = self._core_config(graph.device)
        variants = self._with_precision(_core.provider_variants(core, graph.graph_spec()), graph)
        return len(variants) + len(self._fp16_candidates(core, variants, graph.module))

    def add_candidates(self, graph: RecordedGraph, tuner, group: int, advance):
        directory = cache.backend_dir(graph.module_name, graph.key, self.key())
        spec = graph.graph_spec()
        core_config = self._core_config(graph.device)
        candidates = self._with_precision(self._candidates(core_config, spec, directory), graph)
        fp16 = self._fp16_candidates(core_config, candidates, graph.module)  # CUDA with tuning: candidates are the variants
        if not candidates and not fp16:
            raise _core.InvalidArgumentError(
                f"{self.describe()}: no {self.config.provider.value} candidate computes within precision="
                f"{self.config.precision!r} (this module computes in "
                f"{_core.precision_name(module_precision(graph.module))})"
            )
        (directory / "config.json").write_text(
            json.dumps(
                {
                    "backend": type(self).__name__,
                    "config": self.config.to_dict(),
                    "session": json.loads(core_config.to_json()),
                    "candidates": [c.name for c in candidates] + [c.name for c in fp16],
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
        # The trace exporter drops inputs the graph does not use; the session only gets
        # the inputs the model declares.
        model_inputs, model_outputs = export.onnx_io_names(model_path)
        if model_outputs != graph.output_names:
            raise _core.ModelInvalidError(f"{model_path} declares outputs {model_outputs}, expected {graph.output_names}")
        order = [graph.input_names.index(name) for name in model_inputs]
        for candidate in candidates:  # contained: a failing candidate never takes the process down
            candidate_isolation.evaluate(tuner, str(model_path), candidate, self.describe(), group, order, graph)
            advance()
        if fp16:
            try:
                fp16_path = export.convert_to_fp16(model_path, directory / "model_fp16.onnx")
            except ImportError:
                fp16_path = "the fp16 model needs onnxconverter-common: pip install onnxconverter-common"
            except Exception as error:  # a model the converter cannot handle: the others stand
                fp16_path = f"fp16 conversion failed: {error}"
            for candidate in fp16:
                if isinstance(fp16_path, str):
                    tuner.add_failed(candidate.name, self.describe(), group, fp16_path)
                else:
                    candidate_isolation.evaluate(tuner, str(fp16_path), candidate, self.describe(), group, order, graph)
                advance()
        if self.config.transformer_fusions and self.config.tune_provider_options and \
                core_config.provider != _core.ExecutionProvider.TENSORRT:  # TensorRT takes no contrib operators
            self._add_fused(graph, model_path, directory, candidates, fp16, tuner, group, order)

        def make(session, candidate) -> TunedGraph:
            # The precision in the description: ait_backends says what the graph computes in.
            precision = _core.precision_name(candidate.precision)
            return OnnxRuntimeTunedGraph(session, order, graph.input_names,
                                         f"{self.describe()} {candidate.name} ({precision})")

        return make

    def _add_fused(self, graph, model_path, directory, candidates, fp16, tuner, group, order) -> None:
        """Fused-graph candidates (transforms.py), each named ``<variant> + <transform>``
        and carrying the fused-operator counts; checked like any candidate, so a fusion
        that changes results is rejected by the correctness check."""
        from aitune.torch import transforms

        model_type = getattr(getattr(graph.module, "config", None), "model_type", None) or "bert"
        name = transforms.ORT_FUSIONS if self.config.use_dynamo else transforms.ORT_TRANSFORMERS_OPTIMIZER
        try:
            fused = transforms.fuse_for_ort(model_path, directory / "model_fused.onnx",
                                            use_dynamo=self.config.use_dynamo, model_type=model_type)
        except Exception as error:  # a transform that cannot handle the graph: the raw candidates stand
            tuner.add_failed(f"{name}", self.describe(), group, f"graph transform failed: {type(error).__name__}: {error}")
            return
        if fused is None:  # nothing to fuse (not a transformer): no candidate
            return
        fused16 = None
        for candidate, half in self._fused_candidates(candidates, fp16):
            label = f"{candidate.name.removesuffix(' fp16 model')} + {fused.transform}" + (" fp16" if half else "")
            if half and fused16 is None:
                try:
                    fused16 = transforms.fused_to_fp16(fused, directory / "model_fused_fp16.onnx")
                except Exception as error:
                    tuner.add_failed(label, self.describe(), group, f"fp16 conversion failed: {error}")
                    continue
            model = fused16 if half else fused
            tagged = _core.OnnxCandidate(label, candidate.config, candidate.precision, model.transform,
                                         model.fused_operators)
            candidate_isolation.evaluate(tuner, str(model.path), tagged, self.describe(), group, order, graph)

    @staticmethod
    def _check_provider(core_config) -> None:
        status = _core.OrtRuntime.load().provider_status(core_config.provider)
        if not status.available:
            # The engine's reason names the library that failed and what to install.
            raise _core.ProviderUnavailableError(
                f"{status.reason}. Without a GPU, use ONNXRuntimeBackendConfig(execution_provider='cpu')."
            )
