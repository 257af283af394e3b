"""Which tensor-to-Python conversions in a trace depend on the input values, not only on shapes."""

from __future__ import annotations

import os
import sys

import torch

#: The conversions the tracer cannot record: their result is baked into the graph.
#: ``__len__`` and ``__iter__`` read the first extent only (a loop ``for e in t`` runs that many
#: times in the trace, for every input): a shape, unless it follows values (``nonzero``).
_CONVERSIONS = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "__len__", "__iter__",
                "numpy", "__array__",
                # comparisons that answer a Python bool (``if torch.equal(mask, zeros):``): the
                # tracer records no node for them, so their answer is baked in without a warning
                "equal", "allclose", "is_nonzero")
#: The same comparisons as torch functions (``torch.equal(a, b)`` does not go through ``Tensor.equal``),
#: and ``torch._assert_async``, a check of values the trace drops (``assertions``).
_TORCH_CONVERSIONS = ("equal", "allclose", "is_nonzero", "_assert_async")
_ASSERTIONS = ("_assert_async",)
_EXTENT_CONVERSIONS = ("__len__", "__iter__")
#: Operators whose result depends on the shape of their input only, never its values.
#: (``aten::_shape_as_tensor``: how a tracer may read ``x.shape`` as a tensor)
_SHAPE_OPERATORS = {"aten::size", "aten::sym_size", "prim::shape", "aten::dim", "aten::numel", "aten::sym_numel",
                    "aten::_shape_as_tensor", "onnx::Shape", "onnx::Size"}
#: Operators whose result's shape depends on their input's values (``nonzero(x > 0)``,
#: ``x[x > 0]``): the size of what they return is a value of the input, not a shape.
_VALUE_SHAPED_OPERATORS = {"aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select",
                           "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_dim",
                           "aten::unique_consecutive", "aten::repeat_interleave", "aten::bincount"}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


class ValueConversions:
    """While active (``with``), notes each place where a trace being recorded turns a tensor
    into a Python value (``if x.sum() > 0:``, ``int(t)``, ``t.item()``) and that tensor was
    computed from the values of the trace's inputs (``note_inputs``): the graph then keeps
    the branch or number of the example input for every input. Conversions of shapes
    (``q_length > 1`` where ``q_length`` is ``x.shape[1]``) and of weights are not noted:
    the tracer warns of those too, but the check on the samples (which span every dynamic
    shape's range) covers them.

    ``sites``: (file, line) -> the conversion, in order of first occurrence.
    ``assertions``: likewise for ``torch._assert_async`` of input values, which no graph keeps.
    ``shape_sites``: likewise for the conversions of values computed from the inputs' shapes
    (``x.shape[1] > 32``): the graph keeps the example's branch or number for every shape,
    which the samples' check covers only over the recorded shapes (not over a declared
    ``dynamic_shapes`` range)."""

    def __init__(self) -> None:
        self.inputs: set[int] = set()
        self.sites: dict[tuple[str, int], str] = {}
        self.shape_sites: dict[tuple[str, int], str] = {}
        self.assertions: dict[tuple[str, int], str] = {}  # checks of input values the graph drops
        self._originals: dict[tuple[object, str], object] = {}

    def note_inputs(self, tensors) -> None:
        """The trace's input tensors (called inside the traced forward)."""
        if torch._C._get_tracing_state() is None:
            return
        for tensor in tensors:
            try:
                self.inputs.add(torch._C._get_value_trace(tensor).unique())
            except RuntimeError:
                pass

    def __enter__(self) -> ValueConversions:
        for owner, names in ((torch.Tensor, _CONVERSIONS), (torch, _TORCH_CONVERSIONS)):
            for name in names:
                original = getattr(owner, name)
                self._originals[(owner, name)] = original
                label = f"{'Tensor' if owner is torch.Tensor else 'torch'}.{name}"
                setattr(owner, name, self._watched(name, label, original))
        # ``h.data`` is a tensor the tracer does not follow: what is computed from it (``peak =
        # h.data.abs().max(); if peak > 10:``, ``h * (10 / peak)``) is a constant of the graph, the
        # example's, with no TracerWarning (old code reads values so; a session-37 probe served a
        # 10x larger output silently). Noted like a conversion where ``h`` is of the inputs' values.
        descriptor = torch._C.TensorBase.data

        def data(tensor):
            if self.inputs and torch._C._get_tracing_state() is not None and self._source(tensor) == "values":
                self.sites.setdefault(_caller(), "Tensor.data")
            return descriptor.__get__(tensor)

        torch.Tensor.data = property(data, descriptor.__set__, doc=descriptor.__doc__)
        self._data_watched = True
        return self

    def __exit__(self, *exc) -> None:
        for (owner, name), original in self._originals.items():
            setattr(owner, name, original)
        self._originals.clear()
        if self.__dict__.pop("_data_watched", False):
            del torch.Tensor.data  # the C descriptor of TensorBase again

    def _watched(self, name: str, label: str, original):
        def converted(tensor, *args, **kwargs):
            if self.inputs and torch._C._get_tracing_state() is not None:
                # len(t) and a loop over t read t's first extent: a shape, unless t's shape follows
                # values (a mixture of experts' ``for expert in nonzero(hits)``: the trace kept the
                # example's experts, and an input routed to fewer failed in ORT's Split, a probe)
                # a comparison's answer depends on every tensor it compares (``torch.equal(a, b)``)
                compared = [t for t in (tensor, *args) if isinstance(t, torch.Tensor)]
                sources = {self._source(t, through_shape=name in _EXTENT_CONVERSIONS) for t in compared}
                source = "values" if "values" in sources else "shapes" if "shapes" in sources else None
                if source == "values" and name in _ASSERTIONS:
                    self.assertions.setdefault(_caller(), label)
                elif source == "values":
                    self.sites.setdefault(_caller(), label)
                elif source == "shapes":
                    self.shape_sites.setdefault(_caller(), label)
            return original(tensor, *args, **kwargs)

        return converted

    def _source(self, tensor: torch.Tensor, through_shape: bool = False) -> str | None:
        """"values" where ``tensor`` was computed from the inputs' values, "shapes" where from
        their shapes only, None where from neither (a constant, a weight). A shape taken of
        what a value-shaped operator returned (``len(nonzero(x > 0))``, ``x[x > 0].shape[0]``)
        is a value. ``through_shape``: only ``tensor``'s shape is used (``len``)."""
        try:
            value = torch._C._get_value_trace(tensor)
        except RuntimeError:  # not traced: a constant
            return None
        seen: set[int] = set()
        pending = [(value, through_shape)]
        shapes = False
        while pending:
            value, through_shape = pending.pop()
            if (value.unique(), through_shape) in seen:
                continue
            seen.add((value.unique(), through_shape))
            if value.unique() in self.inputs:
                if not through_shape:
                    return "values"
                shapes = True
                continue
            node = value.node()
            if through_shape and _shape_follows_values(node):
                through_shape = False  # the shape taken is what the inputs' values made it
            pending.extend((v, through_shape or node.kind() in _SHAPE_OPERATORS) for v in node.inputs())
        return "shapes" if shapes else None


def _shape_follows_values(node) -> bool:
    """True where ``node``'s output shape depends on the values of its inputs: a value-shaped
    operator, or indexing by a boolean mask (``x[x > 0]``, traced as ``aten::index``)."""
    kind = node.kind()
    if kind in _VALUE_SHAPED_OPERATORS:
        return True
    if kind != "aten::index":
        return False
    # aten::index(self, indices): only the indices decide. The indexed tensor being boolean
    # (transformers' padding mask indexed by positions, ``mask[batch, kv]``) gives a result of
    # the positions' shape; taking it for ``x[x > 0]`` refused a BERT's ``q_length > 1``.
    for listed in list(node.inputs())[1:]:
        producer = listed.node()
        indices = list(producer.inputs()) if producer.kind() == "prim::ListConstruct" else [listed]
        for index in indices:
            try:
                if index.type().scalarType() in ("Bool", "Byte"):
                    return True
            except (AttributeError, RuntimeError):
                continue
    return False


def _caller() -> tuple[str, int]:
    """The innermost frame outside torch and this file: the model's line."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith(_TORCH_DIR) or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("<unknown>", 0)
