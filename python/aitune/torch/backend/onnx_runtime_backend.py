"""ONNXRuntimeBackend: export a graph to ONNX and run it in an ONNX Runtime session of
the C++ engine (``aitune._core.OnnxSession``)."""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
from pathlib import Path

import onnx
import torch
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from aitune import _core
from aitune.torch import cache, candidate_isolation, export, transforms
from aitune.torch.backend.base import Backend, BackendConfig, TunedGraph, TuningError
from aitune.torch.graph import RecordedGraph

logger = logging.getLogger("aitune")


class ONNXExecutionProvider(str, enum.Enum):
    """ONNX Runtime execution providers. CUDA and TENSORRT are those of the AITune ONNX
    Runtime backend guide; CPU is aitune's addition so the whole pipeline runs on machines
    without a GPU."""

    CUDA = "cuda"
    TENSORRT = "tensorrt"
    CPU = "cpu"


def _provider_from(value) -> ONNXExecutionProvider | str:
    """A provider the engine's registry knows: the built-ins as ONNXExecutionProvider
    members, a provider registered in C++ beyond them by its registered name (the registry
    is open; this enum only names the built-ins)."""
    if isinstance(value, ONNXExecutionProvider):
        return value
    text = value.name if isinstance(value, _core.ExecutionProvider) else str(value)
    try:
        name = _core.parse_execution_provider(text).name
    except _core.InvalidArgumentError:
        builtin = [p.value for p in ONNXExecutionProvider]
        names = builtin + [p.name for p in _core.registered_execution_providers() if p.name not in builtin]
        valid = ", ".join(map(repr, names))
        raise ValueError(
            f"execution_provider must be None or one of {valid} (or ONNXExecutionProvider members), got {value!r}"
        ) from None
    try:
        return ONNXExecutionProvider(name)
    except ValueError:
        return name


#: The candidate precisions by name, in the engine's spelling ("fp32", "tf32", "fp16", "bf16").
PRECISION_NAMES = tuple(_core.precision_name(p) for p in (_core.Precision.STRICT, _core.Precision.TF32,
                                                          _core.Precision.FP16, _core.Precision.BF16))
#: The values of ``ONNXRuntimeBackendConfig.precision`` (the engine's precision limits):
#: "any" and every precision.
PRECISIONS = ("any", *PRECISION_NAMES)


def checked_precision_limit(value: object) -> str:
    """The precision kwargs edge: ``value`` ("any", "fp32", ... any case) as the engine
    spells the limit, checked by the engine; ValueError naming the valid values otherwise.
    Kept as text in a config (it is part of its key); ``_core.parse_precision_limit``
    converts it, once, where it enters the engine (``precision_limit``). Shared with
    TorchCompileBackendConfig, whose ``precision`` is the same limit."""
    if isinstance(value, str):
        try:
            return _core.precision_limit_name(_core.parse_precision_limit(value.lower()))
        except _core.InvalidArgumentError:
            pass
    raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {value!r}") from None


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
        allow_trace_warnings: export with the trace exporter even where the tracer warns
            that the trace may be incorrect (a tensor's value decides Python control flow:
            the graph keeps the branch the example took). Off: such exports are refused,
            naming the lines.
        fp16_search_seconds: the wall-clock bound on the fp32-node search (the "fp16
            searched model" candidate, tried where the all-fp16 model fails the check):
            no search step starts after this many seconds, and the smallest set of fp32
            nodes that passed so far is used. Each step converts and checks the whole
            model (seconds to tens of seconds for a large decoder). A positive number;
            ``math.inf``: no bound (the search still stops after 24 steps).
        in_place_outputs: write each output that updates an input (a ScatterND of an
            input nothing else reads: a decode step's KV cache, ``DecodeStep``) into that
            input's buffer, so the tuned module updates the tensor passed in place and
            returns that very tensor, with no copy of it per call (docs/decoders.md). The
            caller must expect those inputs to change: the decode contract. A graph
            without such outputs runs as before.
    """

    use_dynamo: bool = True
    execution_provider: ONNXExecutionProvider | None = None
    opset_version: int | None = None
    tune_provider_options: bool = True
    provider_options: dict[str, str] | None = None
    precision: str = "any"
    transformer_fusions: bool = True
    allow_trace_warnings: bool = False
    fp16_search_seconds: float = _core.DEFAULT_FP32_NODE_SEARCH_SECONDS
    in_place_outputs: bool = False

    def __post_init__(self) -> None:
        if self.execution_provider is not None:
            self.execution_provider = _provider_from(self.execution_provider)
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
        self.precision = checked_precision_limit(self.precision)
        if not isinstance(self.transformer_fusions, bool):
            raise ValueError(f"transformer_fusions must be a bool, got {self.transformer_fusions!r}")
        if not isinstance(self.allow_trace_warnings, bool):
            raise ValueError(f"allow_trace_warnings must be a bool, got {self.allow_trace_warnings!r}")
        seconds = self.fp16_search_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:  # NaN fails too
            raise _core.InvalidArgumentError(
                f"fp16_search_seconds must be a positive number of seconds (math.inf: no bound), got {seconds!r}")
        self.fp16_search_seconds = float(seconds)
        if not isinstance(self.in_place_outputs, bool):
            raise ValueError(f"in_place_outputs must be a bool, got {self.in_place_outputs!r}")

    @property
    def precision_limit(self) -> _core.Precision | None:
        """``precision`` as the engine's value (None: any), what the candidate plan gets."""
        return _core.parse_precision_limit(self.precision)  # the limit's one conversion

    @property
    def provider(self) -> ONNXExecutionProvider | str:
        """The provider in effect: ``execution_provider``, or CUDA when it is None."""
        return self.execution_provider or ONNXExecutionProvider.CUDA

    @property
    def provider_name(self) -> str:
        """The provider in effect by its registered name ("cuda", "cpu", ...)."""
        provider = self.provider
        return provider.value if isinstance(provider, ONNXExecutionProvider) else provider

    def _canonical_value(self, field, value):
        if field.name == "execution_provider":  # None and CUDA are one configuration
            return self.provider_name
        return super()._canonical_value(field, value)


def _has_convolutions(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in module.modules())


class NumericMismatchError(TuningError):
    """Every candidate's outputs differ from eager PyTorch beyond its tolerance; the
    message has the first failure and the tuning summary table. A TuningError: code that
    catches the tune's failures catches this one (it did not, a session-37 probe)."""


def _tensors(graph: onnx.GraphProto):
    """The initializers and tensor attributes of ``graph`` and of the subgraphs its nodes hold."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            yield from attribute.tensors
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _tensors(attribute.g)
            for sub in attribute.graphs:
                yield from _tensors(sub)


def model_file_identity(path: str) -> tuple | None:
    """(device, inode, size, mtime) of a model file and of each external-data file it
    names (``model_raw.onnx.data``: the weights), None if one is gone: tells whether the
    files a session was created from were replaced or written since (a later tune of a
    module with the same name and graph rewrites the cache files). The weights' file
    counts as much as the graph's: a checkpoint copies both, and a changed one would be
    saved as the model's weights."""
    files = [path]
    try:
        model = onnx.load_model(path, load_external_data=False)
        base = os.path.dirname(path)
        files += sorted({os.path.join(base, ExternalDataInfo(tensor).location)
                         for tensor in _tensors(model.graph) if uses_external_data(tensor)})
    except Exception:  # noqa: BLE001  (unreadable now: stat below says whether it is gone)
        pass
    identity = []
    for file in files:
        try:
            st = os.stat(file)
        except OSError:
            return None
        identity.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(identity)


class OnnxRuntimeTunedGraph(TunedGraph):
    """A graph running in a ``_core.OnnxSession`` session. The module's dispatch
    runs it (``_core.TorchDispatch``, the one path of tensors into and out of a session);
    this holds what that needs and what a checkpoint stores."""

    def __init__(self, session, order: list[int], input_names: list[str], describe: str, savable: bool = True):
        self.session = session
        self.order = list(order)  # session input i <- graph tensor input order[i]
        self.input_names = list(input_names)
        self._describe = describe
        # ait.save checks the files are still these. A graph made only to measure a candidate
        # is never saved: it skips reading the model (the identity parses it for its
        # external-data files), once per candidate of every tune.
        self.model_file = model_file_identity(session.model_path) if savable else None

    @property
    def updated_in_place(self) -> dict[str, str]:
        """The graph's inputs its session updates in place, each with the output written into
        it (``in_place_outputs``; the dispatch returns the input's own tensor as that output)."""
        inputs, outputs = self.session.inputs, self.session.outputs
        return {inputs[k].name: outputs[j].name for j, k in enumerate(self.session.output_aliases) if k >= 0}

    @property
    def backend_description(self) -> str:
        """The backend and candidate that made the graph (what a checkpoint keeps), without
        what its session adds (``describe``: the inputs it updates in place)."""
        return self._describe

    def describe(self) -> str:
        updated = self.updated_in_place
        return f"{self._describe}, updates in place: {', '.join(updated)}" if updated else self._describe


class ONNXRuntimeBackend(Backend):
    """Exports each graph to ``model_raw.onnx`` and runs it with ONNX Runtime.

    Per graph: ask the engine for the candidate plan (``_core.plan_candidates``, the
    same plan ``aitune tune --list-candidates`` prints), write ``config.json``, check the
    provider, export (checked by onnx.checker), make the models the plan names with the
    registered transforms (``transforms.MODEL_TRANSFORMS``), then hand every candidate to
    the engine, which creates its session, compares every recorded sample with eager
    PyTorch and measures it.
    """

    config: ONNXRuntimeBackendConfig

    def __init__(self, config: ONNXRuntimeBackendConfig | None = None):
        if config is None:
            config = ONNXRuntimeBackendConfig()
        if not isinstance(config, ONNXRuntimeBackendConfig):
            raise TypeError(f"config must be an ONNXRuntimeBackendConfig, got {type(config).__name__}")
        super().__init__(config)

    def _core_config(self, device: torch.device) -> _core.OnnxSessionConfig:
        core = _core.OnnxSessionConfig()
        core.provider = _core.parse_execution_provider(self.config.provider_name)
        if device.type == "cuda":
            core.device_id = device.index or 0
        core.provider_options = dict(self.config.provider_options or {})
        core.in_place_outputs = self.config.in_place_outputs
        return core

    def candidate_request(self, spec, module: torch.nn.Module, device: torch.device,
                          cache_root: Path | None = None) -> _core.CandidateRequest:
        """What the engine's plan is made from: this config, the graph's spec, and what the
        front end knows of the module (its own precision, whether it has convolutions).
        ``cache_root``: TensorRT caches per variant go below it (None: no cache options)."""
        request = _core.CandidateRequest()
        request.base = self._core_config(device)
        request.spec = spec
        request.precision_limit = self.config.precision_limit
        request.model_precision = module_precision(module)
        request.has_convolutions = _has_convolutions(module)
        request.tune_provider_options = self.config.tune_provider_options
        request.transformer_fusions = self.config.transformer_fusions
        request.use_dynamo = self.config.use_dynamo
        request.tensorrt_cache_root = "" if cache_root is None else str(cache_root)
        return request

    def plan(self, spec, module: torch.nn.Module, device: torch.device, cache_root: Path | None = None) -> list:
        """The candidates the engine plans for a graph (``_core.plan_candidates``), in the
        order they are evaluated: the same list ``aitune tune --list-candidates`` prints."""
        return _core.plan_candidates(self.candidate_request(spec, module, device, cache_root))

    def candidate_count(self, graph: RecordedGraph) -> int:
        return max(1, len(self.plan(graph.graph_spec(), graph.module, graph.device)))

    def add_candidates(self, graph: RecordedGraph, tuner, group: int, advance, module_call=None):
        directory = cache.tune_dir(graph.module_name, graph.key, self.key())  # this tune's own
        spec = graph.graph_spec()
        core_config = self._core_config(graph.device)
        plan = self.plan(spec, graph.module, graph.device, directory)
        if not plan:
            raise _core.InvalidArgumentError(
                f"{self.describe()}: no {self.config.provider_name} candidate computes within precision="
                f"{self.config.precision!r} (this module computes in "
                f"{_core.precision_name(module_precision(graph.module))})"
            )
        with cache.writing("the tune's config.json", directory):
            (directory / "config.json").write_text(json.dumps(
                {
                    "backend": type(self).__name__,
                    "config": self.config.to_dict(),
                    "session": json.loads(core_config.to_json()),
                    "candidates": [c.name for c in plan],
                    "graph_spec": json.loads(spec.to_json()),
                },
                indent=2,
            ))
        # Both checks before an export that may take minutes.
        self._check_provider(core_config)
        on_device = _core.provider_capabilities(core_config.provider)["device_memory"]
        session_device = torch.device("cuda", core_config.device_id) if on_device else torch.device("cpu")
        if graph.device != session_device:
            raise _core.InvalidArgumentError(
                f"ait.Module '{graph.module_name}' runs on {graph.device}, but {self.describe()} runs on "
                f"{session_device}: move the module (and its samples) to {session_device}, or choose an "
                f"execution provider for {graph.device}"
            )
        conditions: list = []
        model_path = export.export_onnx(
            graph,
            spec,
            directory / "model_raw.onnx",
            use_dynamo=self.config.use_dynamo,
            opset_version=self.config.opset_version,
            allow_trace_warnings=self.config.allow_trace_warnings,
            conditions=conditions,
        )
        # The sizes where the model's code branches away from what the graph holds: the
        # engine keeps those no recorded sample violates, and every session of the graph
        # (the winner's, a checkpoint's) refuses a call outside them.
        for left_out in tuner.set_shape_conditions(conditions):
            logger.info("ait.Module '%s' (%s): a recorded sample takes the other side of `%s`; the check against "
                        "eager at that sample judges the graph there", graph.module_name, graph.key, left_out)
        for kept in tuner.spec.conditions:
            logger.info("ait.Module '%s' (%s): the exported graph holds where `%s`; calls elsewhere are outside it",
                        graph.module_name, graph.key, kept)
        # The trace exporter drops inputs the graph does not use; the session only gets
        # the inputs the model declares.
        model_inputs, model_outputs = export.onnx_io_names(model_path)
        if model_outputs != graph.output_names:
            raise _core.ModelInvalidError(f"{model_path} declares outputs {model_outputs}, expected {graph.output_names}")
        order = [graph.input_names.index(name) for name in model_inputs]
        model_type = getattr(getattr(graph.module, "config", None), "model_type", None) or "bert"
        models = transforms.TransformedModels(model_path, transforms.TransformContext(
            directory, model_type, caches_in_place=self.config.in_place_outputs,
            input_ranges={t.name: (list(t.min_shape), list(t.max_shape)) for t in spec.inputs}))
        # Each candidate's latency is the module's: measured through the module's own
        # dispatch with the candidate's session as its graph (issue 28).
        session_call = None if module_call is None else (
            lambda session: module_call(OnnxRuntimeTunedGraph(session, order, graph.input_names, "measured",
                                                               savable=False)))
        for planned in plan:
            if planned.model_transform == transforms.FP16_SEARCH:
                self._search_fp16(planned, models, tuner, group, order, graph, directory)
                models.release_fp16_keeping()  # the prepared export's memory, before the fused models
                advance()
                continue
            made = self._model_for(planned, models, tuner, group)
            if made is not None:  # contained: a failing candidate never takes the process down
                model, candidate = made
                candidate_isolation.evaluate(tuner, str(model), candidate, self.describe(), group, order, graph,
                                             session_call)
            advance()

        def make(session, candidate) -> TunedGraph:
            # The precision in the description: ait_backends says what the graph computes in.
            precision = _core.precision_name(candidate.precision)
            tuned = OnnxRuntimeTunedGraph(session, order, graph.input_names,
                                          f"{self.describe()} {candidate.name} ({precision})")
            if tuned.updated_in_place:  # the module now changes what it is given: say so
                logger.warning(
                    "ait.Module '%s': the tuned graph writes its outputs into the buffers of inputs %s "
                    "(in_place_outputs=True): each call updates those tensors in place and returns them",
                    graph.module_name, ", ".join(tuned.updated_in_place))
            return tuned

        return make

    def _model_for(self, planned, models: transforms.TransformedModels, tuner, group: int):
        """(model path, OnnxCandidate) for a planned candidate, or None when it is not
        evaluated: its transform failed (recorded as its failure) or does not apply (a
        fusion that finds nothing to fuse makes no candidate). A fused candidate carries the
        fusion's name and fused-operator counts; the correctness check judges it like any
        other, so a fusion that changes results is rejected."""
        try:
            model = models.get(planned.model_transform)
        except transforms.TransformFailed as failed:
            tuner.add_failed(planned.name, self.describe(), group, str(failed), planned.precision)
            return None
        if model is None:
            return None
        return model.path, _core.OnnxCandidate(planned.name, planned.config, planned.precision, model.transform,
                                               model.fused_operators, getattr(model, "fp32_nodes", []))

    def _search_fp16(self, planned, models: transforms.TransformedModels, tuner, group: int, order: list[int],
                     graph: RecordedGraph, directory: Path) -> None:
        """fp16 where it is safe: when the all-fp16 model of this configuration failed the
        check (the engine says, ``rejected_fp16_candidate``), the engine's bisection
        (``search_fp32_nodes``, bounded by ``fp16_search_seconds``) finds the smallest set
        of nodes to keep in fp32, each step a model converted keeping that set and checked
        by the engine; the candidate on the model it settles on carries the set (report
        field ``fp32_nodes``, kept with a checkpoint's report) and how the search ended
        (``transform_note``). Nothing is tried where the all-fp16 model passed.

        One search per graph and provider: whether a set of fp32 nodes passes is a matter
        of the model's numbers, not of the session's options, so a later configuration of
        the same provider reuses the set (and model) the first search found, and its
        candidate is still checked and measured as its own, its note naming the
        configuration whose search found the set."""
        if _core.rejected_fp16_candidate(tuner.report, planned.config) is None:
            return
        provider = _core.execution_provider_name(planned.config.provider)
        searched = models.fp16_searches.get(provider)
        if searched is None:
            searched = self._run_fp16_search(planned, models, tuner, order, directory)
            models.fp16_searches[provider] = searched
            note = searched.note
        else:
            note = f"fp32-node set from the search for {searched.configuration} ({searched.note})"
        if searched.failure is not None:
            reason = (searched.failure if searched.configuration == planned.name
                      else f"no fp32-node set from the search for {searched.configuration}: {searched.failure}")
            tuner.add_failed(planned.name, self.describe(), group, reason, planned.precision)
            return
        candidate = _core.OnnxCandidate(planned.name, planned.config, planned.precision, transforms.FP16_SEARCH, {},
                                        list(searched.kept), note)
        candidate_isolation.evaluate(tuner, str(searched.path), candidate, self.describe(), group, order, graph)

    def _run_fp16_search(self, planned, models: transforms.TransformedModels, tuner, order: list[int],
                         directory: Path) -> transforms.Fp16Search:
        """The fp32-node search on the export, its steps checked under ``planned``'s
        configuration: the model it settles on, or why there is none."""
        exported = models.get("").path
        probe = directory / "model_fp16_search_step.onnx"
        outcome = transforms.Fp16Search(configuration=planned.name)
        try:
            nodes = transforms.float_compute_nodes(exported)
            start = _passed_mixed_nodes(tuner.report, planned.config.provider)
            if start is not None:
                # The mixed model (fp16 where autocast computes in fp16) passed: the search
                # starts from its fp32 set rather than from every node, so a bounded search
                # spends its steps below a set known to pass.
                nodes = [n for n in nodes if n in start]
            keeping = models.fp16_keeping()  # the export loaded once for every step (and the mixed model)

            def passes(kept: list[str]) -> bool:
                keeping.write(probe, kept)
                candidate = _core.OnnxCandidate(planned.name, planned.config, planned.precision)
                return tuner.check_onnx(str(probe), candidate, order)

            found = _core.search_fp32_nodes(nodes, passes, max_evaluations=24,
                                            max_seconds=self.config.fp16_search_seconds)
            probe.unlink(missing_ok=True)
            outcome.note = f"fp32-node search: {found.note}" + (
                f"; started from the mixed model's {len(nodes)} fp32 nodes" if start is not None else "")
            if not found.passed:
                outcome.failure = outcome.note
                return outcome
            outcome.kept = list(found.kept)
            outcome.path = keeping.write(directory / "model_fp16_search.onnx", found.kept)
        except ImportError as error:
            outcome.failure = (f"model transform '{transforms.FP16_SEARCH}' needs onnxruntime's transformers package: "
                               f"pip install onnxruntime ({error})")
        except Exception as error:  # contained like any transform: the export cannot be loaded or converted
            outcome.failure = f"fp32-node search: the export could not be converted: {type(error).__name__}: {error}"
        return outcome

    @staticmethod
    def _check_provider(core_config) -> None:
        status = _core.OrtRuntime.load().provider_status(core_config.provider)
        if not status.available:
            # The engine's reason names the library that failed and what to install.
            raise _core.ProviderUnavailableError(
                f"{status.reason}. Without a GPU, use ONNXRuntimeBackendConfig(execution_provider='cpu')."
            )


def _passed_mixed_nodes(report, provider) -> set[str] | None:
    """The fp32 nodes of a mixed-precision candidate of ``provider`` that passed the check
    in ``report``, or None when none did."""
    for c in report.candidates:
        if c.transform == transforms.FP16_MIXED and c.status == "passed" and c.fp32_nodes and \
                _core.OnnxSessionConfig.from_json(c.config_json).provider == provider:
            return set(c.fp32_nodes)
    return None
