"""The model transforms the front end registers for the engine's candidate plan: ONNX
Runtime's transformer fusions (Attention, SkipLayerNormalization, BiasGelu, ...) applied to
an exported model, fp16 copies of exported and fused models, and the registry the plan's
transform names are looked up in."""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path

import onnx

from aitune import _core
from aitune.torch.library_logs import routed_to_aitune

logger = logging.getLogger("aitune")

#: The transform names candidates and reports carry.
ORT_FUSIONS = "ort_fusions"  # decoder_fusions.optimize_for_ort: onnxscript's fusions + ours (dynamo exports)
ORT_TRANSFORMERS_OPTIMIZER = "ort_transformers_optimizer"  # onnxruntime.transformers.optimizer (trace exports)
FP16 = "fp16"  # every float node in fp16 (onnxconverter-common), I/O kept
FP16_MIXED = "fp16_mixed"  # sensitive nodes kept in fp32 (SENSITIVE_OPS, vocabulary projections)
FP16_SEARCH = "fp16_search"  # the smallest fp32 set a measured search finds (the backend runs it)

#: ONNX Runtime's contrib domain: every fused operator lives there.
_CONTRIB_DOMAIN = "com.microsoft"
#: protobuf's 2 GB limit: larger models keep their weights in a side file.
_LARGE_MODEL_BYTES = 1_800_000_000


@dataclasses.dataclass
class FusedModel:
    """A transformed model file and what the transform made of the graph."""

    transform: str
    path: Path
    fused_operators: dict[str, int]  # op type -> count of com.microsoft nodes in the result
    nodes_before: int
    nodes_after: int

    def describe(self) -> str:
        """``"ort_fusions (Attention: 2, SkipLayerNormalization: 4)"``."""
        ops = ", ".join(f"{op}: {n}" for op, n in sorted(self.fused_operators.items()))
        return f"{self.transform} ({ops})"


def fused_operator_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Nodes of ONNX Runtime's contrib domain (the fused operators), by op type, counted
    on the graph itself, so both transforms are reported the same way."""
    return dict(collections.Counter(n.op_type for n in model.graph.node if n.domain == _CONTRIB_DOMAIN))


def _node_count(path: Path) -> int:
    return len(onnx.load(str(path), load_external_data=False).graph.node)


def _save(model: onnx.ModelProto, target: Path) -> None:
    """Written to a sibling first, so a failed save leaves no half-written model."""
    scratch = target.with_name(target.name + ".partial")
    large = model.ByteSize() > _LARGE_MODEL_BYTES
    onnx.save(model, str(scratch), save_as_external_data=large, location=target.name + ".data" if large else None)
    os.replace(scratch, target)


def fuse_for_ort(source: Path, target: Path, *, use_dynamo: bool, model_type: str = "bert",
                 caches_in_place: bool = False, input_ranges: dict | None = None,
                 sort_padded_rows: bool = True) -> FusedModel | None:
    """Writes ``target``: ``source`` with ONNX Runtime's transformer fusions applied.
    A dynamo export goes through onnxscript's ``optimize_for_ort`` sequence with our decoder
    rules (``decoder_fusions.py``); a trace export through ``onnxruntime.transformers.optimizer``
    (``model_type`` picks its fusion set: "bert", "gpt2", ...; its attention patterns do not
    match today's transformers, so it fuses normalisations and GELUs only). Returns None
    and writes nothing when no fused operator results (the transform does not apply to
    this graph). Raises ImportError when the transform's package is missing.
    ``input_ranges``: ONNX input name -> (smallest, largest shape) the graph accepts, by which
    a prefill's GroupQueryAttention may drop its mask (``unbiased_attention``; not with
    ``sort_padded_rows=False``, which benchmarks/prefill_graph_probe.py compares)."""
    if use_dynamo:
        import onnx_ir as ir

        from aitune.torch import decoder_fusions
        from aitune.torch.exact_lowerings import exact_identity_constants

        model = ir.load(str(source))
        ranks = {v.name: len(v.shape) for v in _values(model.graph) if v.name and v.shape is not None}
        # (the optimizer's no-op rules made exact: an RMSNorm's `+ 1e-8` is no `+ 0`)
        with routed_to_aitune(), exact_identity_constants():  # the constant folder's notes, not the user's business
            # onnxscript's sequence with our decoder rules (rotary with per-row positions,
            # transformers 5's angle form, GroupQueryAttention that keeps the mask)
            fused, _ = decoder_fusions.optimize_for_ort(model, caches_in_place=caches_in_place)
        _restore_flat_attention_outputs(fused, ranks)
        proto = ir.serde.serialize_model(fused)
        if sort_padded_rows and not caches_in_place:  # a prefill: GQA over rows sorted valid tokens first, no bias
            from aitune.torch import unbiased_attention

            rewritten, why_not = unbiased_attention.sort_padded_rows(proto, input_ranges, Path(source).parent)
            if rewritten:
                logger.info("%s: %d GroupQueryAttention without the mask as a bias, over rows sorted valid tokens "
                            "first", Path(source).name, rewritten)
            else:
                logger.info("%s: GroupQueryAttention keeps its bias: %s", Path(source).name, why_not)
        transform = ORT_FUSIONS
    else:
        from onnxruntime.transformers import optimizer

        # opt_level=0: only the Python fusions, no ORT session here (the candidate's own
        # session applies ORT's graph optimisations, on its provider). num_heads=0 and
        # hidden_size=0: read from the graph.
        with routed_to_aitune():  # "Unsupported model type ...": its notes, not the user's business
            optimized = optimizer.optimize_model(
                str(source), model_type=model_type, num_heads=0, hidden_size=0, opt_level=0, use_gpu=False
            )
        proto = optimized.model
        transform = ORT_TRANSFORMERS_OPTIMIZER
    counts = fused_operator_counts(proto)
    if not counts:
        return None
    _save(proto, target)
    return FusedModel(transform, target, counts, _node_count(source), len(proto.graph.node))


#: Fused attention operators: their output is (batch, sequence, hidden), always rank 3.
_ATTENTION_OPS = ("Attention", "MultiHeadAttention")


def _values(graph):
    for node in graph:
        yield from node.outputs
    yield from graph.inputs


def _restore_flat_attention_outputs(model, ranks_before: dict[str, int]) -> int:
    """Where an attention fusion swallowed a final ``Reshape`` to (batch * sequence,
    hidden) (GPT-2's ``Conv1D`` feeds a 2-D ``Gemm``: onnxscript's MHA pattern matches
    that Reshape as if it restored (batch, sequence, hidden)), the fused operator's rank-3
    output now reaches consumers built for the 2-D value, and ONNX Runtime refuses the
    graph ("Gemm: Input 0 expected to have rank 2 but has rank 3"). ``Flatten(axis=2)``
    restores exactly the swallowed reshape (same memory order), whatever the shapes.
    Returns the number of outputs repaired."""
    import onnx_ir as ir

    repaired = 0
    for node in list(model.graph):
        if node.domain != _CONTRIB_DOMAIN or node.op_type not in _ATTENTION_OPS:
            continue
        out = node.outputs[0]
        if ranks_before.get(out.name, len(out.shape) if out.shape is not None else 3) != 2:
            continue
        name, flat_shape = out.name, out.shape
        out.name, out.shape = f"{name}_3d", None
        flatten = ir.node("Flatten", [out], {"axis": 2}, name=f"{node.name}_restore_2d")
        flat = flatten.outputs[0]
        ir.convenience.replace_all_uses_with(out, flat)
        flatten.replace_input_with(0, out)  # replace_all_uses_with also rewired the Flatten itself
        flat.name, flat.shape, flat.dtype = name, flat_shape, out.dtype
        outputs = model.graph.outputs
        for i, value in enumerate(outputs):
            if value is out:
                outputs[i] = flat
        model.graph.insert_after(node, flatten)
        repaired += 1
    return repaired


def fused_to_fp16(fused: FusedModel, target: Path) -> FusedModel:
    """An fp16 copy of a fused model: onnxruntime.transformers' converter, which knows the
    fused operators' fp16 inputs (onnxconverter-common's does not), inputs and outputs
    kept in their dtypes so the interface and the correctness check are unchanged."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    from aitune.torch import export
    from aitune.torch.unbiased_attention import INDEX_NODE_PREFIX

    proto = onnx.load(str(fused.path))
    export.separate_consumed_outputs(proto)  # the same converter bug (see there)
    model = OnnxModel(proto)
    # the rows' order of unbiased_attention stays fp32 (its positions exact past 2048)
    model.convert_float_to_float16(keep_io_types=True, node_block_list=[
        n.name for n in proto.graph.node if n.name.startswith(INDEX_NODE_PREFIX)])
    _save(model.model, target)
    return dataclasses.replace(
        fused, path=target, fused_operators=fused_operator_counts(model.model), nodes_after=len(model.model.graph.node)
    )


# -- the named model transforms the engine's candidate plan asks for --------------------


@dataclasses.dataclass
class ModelFile:
    """A model a candidate runs on: the export, or what a transform made of it. ``transform``
    and ``fused_operators`` are what the candidate reports (a fusion's name and counts)."""

    path: Path
    transform: str = ""
    fused_operators: dict[str, int] = dataclasses.field(default_factory=dict)
    fp32_nodes: list[str] = dataclasses.field(default_factory=list)  # mixed precision: nodes kept in fp32


@dataclasses.dataclass(frozen=True)
class TransformContext:
    """What a transform step needs besides its source model."""

    directory: Path  # where the transformed models are written
    model_type: str = "bert"  # onnxruntime.transformers.optimizer's fusion set (trace exports)
    #: The session writes the graph's cache outputs into their inputs' buffers
    #: (``in_place_outputs``): a step over a static KV cache may fuse into GroupQueryAttention
    #: with the cache as its shared past / present (decoder_fusions.CachedGroupQueryAttention).
    caches_in_place: bool = False
    #: The export prepared once for fp16 conversions keeping nodes in fp32 (the mixed model,
    #: the fp32-node search); TransformedModels sets it to its own.
    fp16_keeping: Callable[[], Fp16Keeping] | None = None
    #: ONNX input name -> (smallest shape, largest shape) the graph accepts (its GraphSpec):
    #: the sequence lengths over which a fusion proves what it assumes (unbiased_attention).
    input_ranges: dict | None = None


def _to_fp16(source, context: TransformContext):
    if isinstance(source, FusedModel):  # onnxruntime.transformers' converter knows fused operators
        return fused_to_fp16(source, context.directory / "model_fused_fp16.onnx")
    from aitune.torch import export

    return ModelFile(export.convert_to_fp16(source.path, context.directory / "model_fp16.onnx"), FP16)


#: The operators the mixed-precision candidate ("fp16_mixed") computes in fp16: those
#: autocast runs in fp16 (matmul / linear / bmm / baddbmm, conv, conv_transpose; einsum
#: and attention decompose into them). Every other operator stays fp32, as under autocast,
#: where an elementwise op on an fp32 and an fp16 tensor computes in fp32: the residual
#: stream a transformer adds its blocks to, rotary, the norms, softmax, reductions. Keeping
#: only softmax, reductions and norms in fp32 was measured not to be enough: on a
#: Llama-shaped decoder (H200) that model's logits erred 9x more than eager autocast's,
#: the residual adds and rotary in fp16 losing what autocast keeps.
AUTOCAST_FP16_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum")
#: Operators where fp16 loses range or precision (softmax, reductions, norms, exp / log /
#: pow): kept in fp32 by the mixed model like every operator outside AUTOCAST_FP16_OPS;
#: named for the docs and for the divergence report's hints.
SENSITIVE_OPS = (
    "Softmax", "LogSoftmax", "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp", "ReduceProd",
    "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization", "RMSNormalization", "GroupNormalization", "InstanceNormalization",
    "Exp", "Log", "Pow", "Sqrt", "Reciprocal", "Div", "Erf",
)
#: The last MatMul / Gemm of a graph whose weight has at least this many output columns is
#: its vocabulary- (or class-) sized projection (an LM head): kept in fp32 (the logits).
VOCABULARY_COLUMNS = 1024


def vocabulary_projections(model: onnx.ModelProto) -> list[str]:
    """The name of the last MatMul / Gemm node whose weight (an initializer) has at least
    VOCABULARY_COLUMNS output columns, if there is one (a Gemm with transB=1 stores its
    weight as (columns, features))."""
    weights = {init.name: list(init.dims) for init in model.graph.initializer if init.dims}
    found = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in weights:
            continue
        dims = weights[node.input[1]]
        trans_b = any(a.name == "transB" and a.i == 1 for a in node.attribute)
        columns = dims[0] if node.op_type == "Gemm" and trans_b else dims[-1]
        if columns >= VOCABULARY_COLUMNS and node.name:
            found = [node.name]
    return found


def float_compute_nodes(path: Path) -> list[str]:
    """Names of the nodes an fp16 conversion changes, in graph (topological) order: those
    of no operator the converter keeps by default; what the fp32-node search bisects.
    Nodes without a name cannot be named in a block list and are left out."""
    from onnxruntime.transformers import float16

    model = onnx.load(str(path), load_external_data=False)
    default = set(float16.DEFAULT_OP_BLOCK_LIST)
    return [n.name for n in model.graph.node if n.name and n.op_type not in default and n.op_type != "Constant"]


def float_constant_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of the Constant nodes holding a float32 tensor (the trace exporter's scalars)."""
    return [n.name for n in model.graph.node if n.op_type == "Constant" and n.name
            and any(a.name == "value" and a.t.data_type == onnx.TensorProto.FLOAT for a in n.attribute)]


class Fp16Keeping:
    """fp16 copies of one model keeping chosen nodes in fp32 (onnxruntime.transformers'
    converter with block lists): the mixed-precision model and the fp32-node search's
    models. The source is loaded, prepared and its shapes inferred once; each copy
    converts a copy of that in memory. Measured on a Llama (hidden 1024, 4 layers,
    benchmarks/fp16_search_breakdown.py): reloading and re-inferring the source was half
    of each search step's conversion.

    ``write`` (the search's models) keeps float Constant nodes too (the converter would
    round their values, 1.0001 to 1, even for nodes kept in fp32; an fp16 consumer reads a
    Cast that ONNX Runtime folds): so keeping every node of ``float_compute_nodes`` is the
    fp32 model, the search's first probe."""

    def __init__(self, source: Path):
        from aitune.torch import export

        model = onnx.load(str(source))
        export.separate_consumed_outputs(model)
        self._constants = float_constant_nodes(model)
        # What the converter does first on every call (a copy through serialisation), once.
        self._inferred = onnx.shape_inference.infer_shapes(model)

    def write(self, target: Path, nodes: list[str]) -> Path:
        """The fp16 copy keeping ``nodes`` (names) and the float Constants in fp32, besides
        the converter's default operators, written to ``target``."""
        from onnxruntime.transformers import float16

        return self.convert(target, list(float16.DEFAULT_OP_BLOCK_LIST), [*nodes, *self._constants])

    def convert(self, target: Path, op_block_list: list[str], node_block_list: list[str]) -> Path:
        """The fp16 copy keeping those operator types and node names in fp32, exactly as
        ``export.convert_to_fp16(source, target, op_block_list=..., node_block_list=...)``
        writes it, written to ``target``."""
        from aitune.torch import export

        model = onnx.ModelProto()
        model.CopyFrom(self._inferred)  # the converter changes what it is given
        converted = export.convert_keeping(model, op_block_list, node_block_list, shapes_inferred=True)
        return export.save_converted(converted, target)


def fp16_keeping(source: Path, target: Path, nodes: list[str]) -> Path:
    """One fp16 copy of ``source`` keeping ``nodes`` in fp32 (``Fp16Keeping``)."""
    return Fp16Keeping(source).write(target, nodes)


def _to_fp16_mixed(source, context: TransformContext):
    from onnxruntime.transformers import float16

    if isinstance(source, FusedModel):
        raise ValueError("the mixed-precision conversion applies to the export, not to a fused model")
    model = onnx.load(str(source.path), load_external_data=False)
    present = {n.op_type for n in model.graph.node}
    if not present & set(AUTOCAST_FP16_OPS):
        return None  # nothing autocast would compute in fp16: the mixed model would be the fp32 one
    kept_ops = sorted({*float16.DEFAULT_OP_BLOCK_LIST, *(present - set(AUTOCAST_FP16_OPS))})
    kept_nodes = vocabulary_projections(model)
    # The export prepared once for this model and the fp32-node search that may follow.
    keeping = context.fp16_keeping() if context.fp16_keeping is not None else Fp16Keeping(source.path)
    path = keeping.convert(context.directory / "model_fp16_mixed.onnx", kept_ops, kept_nodes)
    kept = [n.name for n in model.graph.node
            if n.name and n.op_type != "Constant" and (n.op_type not in AUTOCAST_FP16_OPS or n.name in kept_nodes)]
    return ModelFile(path, FP16_MIXED, fp32_nodes=kept)


def _fusion(use_dynamo: bool):
    def fuse(source, context: TransformContext):
        # fuse_for_ort is looked up when called, so tests can substitute it.
        return fuse_for_ort(source.path, context.directory / "model_fused.onnx", use_dynamo=use_dynamo,
                            model_type=context.model_type, caches_in_place=context.caches_in_place,
                            input_ranges=context.input_ranges)

    return fuse


@dataclasses.dataclass(frozen=True)
class ModelTransform:
    """One registered step: ``apply(source, context)`` returns the new model, or None where
    the step does not apply (a fusion that finds nothing to fuse); ``package`` is what
    ``pip install`` gets when its import fails."""

    apply: Callable
    package: str


#: The steps of the engine's model transform names (candidates.hpp, ``model_transform``),
#: by name. A plan's name joins steps with '+'; each applies to the previous step's model.
MODEL_TRANSFORMS: dict[str, ModelTransform] = {
    FP16: ModelTransform(_to_fp16, "onnxconverter-common"),
    FP16_MIXED: ModelTransform(_to_fp16_mixed, "onnxruntime"),
    ORT_FUSIONS: ModelTransform(_fusion(True), "onnxscript"),
    ORT_TRANSFORMERS_OPTIMIZER: ModelTransform(_fusion(False), "onnxruntime"),
}


@dataclasses.dataclass
class Fp16Search:
    """What the fp32-node search found for a graph (the backend runs it once per provider):
    the model keeping ``kept`` in fp32, or ``failure``; ``configuration`` is the candidate
    whose session checked its steps, ``note`` how it ended."""

    configuration: str
    kept: list[str] = dataclasses.field(default_factory=list)
    path: Path | None = None
    note: str = ""
    failure: str | None = None


class TransformFailed(Exception):
    """A model transform could not make its model; the message says which and why."""


class TransformedModels:
    """The models a plan's candidates run on, each made once on first use: ``get("")`` is
    the export, ``get("ort_fusions+fp16")`` the fused model converted to fp16."""

    def __init__(self, exported: Path, context: TransformContext):
        self._context = dataclasses.replace(context, fp16_keeping=self.fp16_keeping)
        self._made: dict[str, ModelFile | FusedModel | None | TransformFailed] = {"": ModelFile(Path(exported))}
        self._fp16_keeping: Fp16Keeping | None = None
        #: provider name -> the fp32-node search's outcome on this export (one search per
        #: provider: its verdicts do not depend on the session's options).
        self.fp16_searches: dict[str, Fp16Search] = {}

    def fp16_keeping(self) -> Fp16Keeping:
        """The export prepared once (loaded, shapes inferred) for the mixed-precision model
        and the fp32-node search's steps; held, about the export's size in memory, until
        ``release_fp16_keeping``."""
        if self._fp16_keeping is None:
            self._fp16_keeping = Fp16Keeping(self.get("").path)
        return self._fp16_keeping

    def release_fp16_keeping(self) -> None:
        """Drops the prepared export (after the search: the fused models follow)."""
        self._fp16_keeping = None

    def get(self, name: str):
        """The model, None where a step does not apply; raises TransformFailed."""
        if name not in self._made:
            self._made[name] = self._make(name)
        made = self._made[name]
        if isinstance(made, TransformFailed):
            raise made
        return made

    def _make(self, name: str):
        *before, step = _core.model_transform_steps(name)
        source = self.get("+".join(before))
        if source is None:
            return None
        transform = MODEL_TRANSFORMS.get(step)
        if transform is None:
            return TransformFailed(f"model transform '{step}' is not registered by the front end "
                                   f"(known: {', '.join(sorted(MODEL_TRANSFORMS))})")
        try:
            return transform.apply(source, self._context)
        except ImportError as error:
            return TransformFailed(f"model transform '{step}' needs {transform.package}: pip install "
                                   f"{transform.package} ({error})")
        except Exception as error:  # a model the transform cannot handle: the other candidates stand
            return TransformFailed(f"model transform '{step}' failed: {type(error).__name__}: {error}")
