"""``ait.Module(..., dynamic_shapes=...)``: input axes declared to take a range of extents
beyond the recorded ones (AITune's ``dynamic_shapes``).

A graph accepts, per axis, the range its samples spanned. Declaring a range widens that:
``{"input_ids": {1: (1, 512)}}`` (or a ``torch.export.Dim``, ``None`` as max for no bound,
``Dim.DYNAMIC`` for 1 and up) lets a model tuned on sequences of 16 and 32 run sequences of 1..512 without a
``ShapeMismatchError``. The graph spec takes the range (the C++ ``GraphSpecBuilder``
checks that it holds every recorded extent and widens the output axes that followed the
axis); the dynamo export gets a ``torch.export.Dim`` of that range for the axis, so
torch.export proves the graph valid over the whole range or refuses (a shape-dependent
branch, two axes the code ties together but declared apart). Candidates are still
compared with eager at the recorded shapes and a recorded sample cropped to a shorter
extent inside the range (``interior_shapes``).

Keys name an input as the forward's argument path (``"input_ids"``, ``"inputs.image"``)
or by its tensor name (``"input_input_ids"``). A ``torch.export.Dim`` goes to the export as
given: axes declared with one share it, and a derived one (``2 * Dim("h", min=4, max=64)``,
the even heights a UNet's down- and upsampling need) makes the graph accept only its
extents (the spec's ``step``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from torch.export import Dim

UNBOUNDED = -1  # aitune::kUnbounded


@dataclasses.dataclass(frozen=True)
class DeclaredAxis:
    """One axis range: ``max`` is ``UNBOUNDED`` for no upper bound; ``step`` > 1 where only
    min, min + step, ... are taken (a derived Dim such as ``2 * h``); ``dim`` is the
    ``torch.export.Dim`` the axis was declared with (the export gets it as given, shared by
    every axis declared with it), None for a range given as a tuple (a Dim of its own)."""

    key: str
    axis: int
    min: int
    max: int
    step: int = 1
    dim: Any = None


def _tensor_name(key: str) -> str:
    """The tensor name an argument path gets (``flatten.leaf_names``' rule)."""
    return re.sub(r"[^0-9A-Za-z]", "_", f"input_{key}")


def _range(key: str, axis: Any, value: Any) -> DeclaredAxis:
    where = f"dynamic_shapes[{key!r}][{axis!r}]"
    if isinstance(axis, bool) or not isinstance(axis, int) or axis < 0:
        raise ValueError(f"{where}: an axis is an int >= 0, got {axis!r}")
    dim, step = None, 1
    if value is Dim.DYNAMIC or value == Dim.DYNAMIC:  # any extent from 1 up
        value = (1, None)
    elif type(value).__name__ == "_DimHint":  # AUTO / STATIC would let the export decide
        raise TypeError(f"{where}: {value} leaves it to the export whether the axis is dynamic; declare a range "
                        "((min, max), a torch.export.Dim, or Dim.DYNAMIC), or leave the axis out")
    if isinstance(value, Dim):
        dim = value
        low, high = int(value.min), value.max
        high = None if high is None or bool(high >= 2**62) else int(high)  # Dim's default max is int_oo
        if hasattr(value, "fn") and hasattr(value, "root"):  # derived (a * h + b): the extents it takes
            root = int(value.root.min)
            step = int(value.fn(root + 1)) - int(value.fn(root))
            if step < 1:
                raise ValueError(f"{where}: {value.__name__} does not grow with {value.root.__name__}")
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        low, high = value
    else:
        raise TypeError(f"{where}: a range is (min, max) (max None: no bound) or a torch.export.Dim, got {value!r}")
    for bound, name in ((low, "min"), (high, "max")):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
            raise TypeError(f"{where}: {name} must be an int, got {bound!r}")
    low = 0 if low is None else int(low)
    if low < 0:
        raise ValueError(f"{where}: min {low} is negative")
    if high is not None and high < low:
        raise ValueError(f"{where}: max {high} is below min {low}")
    return DeclaredAxis(key, axis, low, UNBOUNDED if high is None else int(high), step, dim)


class DynamicShapes:
    """The validated declaration of one ``ait.Module``."""

    def __init__(self, declared: Mapping[str, Mapping[int, Any]] | None):
        self.axes: list[DeclaredAxis] = []
        if declared is None:
            return
        if not isinstance(declared, Mapping):
            raise TypeError(f"dynamic_shapes is a dict {{input: {{axis: (min, max)}}}}, got {type(declared).__name__}")
        for key, axes in declared.items():
            if not isinstance(key, str):
                raise TypeError(f"dynamic_shapes: input names are strings, got {key!r}")
            if not isinstance(axes, Mapping):
                raise TypeError(f"dynamic_shapes[{key!r}] is a dict {{axis: (min, max)}}, got {axes!r}")
            self.axes.extend(_range(key, axis, value) for axis, value in axes.items())

    def __bool__(self) -> bool:
        return bool(self.axes)

    @staticmethod
    def _resolve(key: str, input_names: list[str]) -> str | None:
        if key in input_names:
            return key
        name = _tensor_name(key)
        return name if name in input_names else None

    def for_inputs(self, input_names: list[str]) -> list[tuple[str, DeclaredAxis]]:
        """(tensor name, range) for each declared axis of an input among ``input_names``."""
        found = []
        for axis in self.axes:
            name = self._resolve(axis.key, input_names)
            if name is not None:
                found.append((name, axis))
        return found

    def unknown(self, graphs_inputs: list[list[str]]) -> str | None:
        """Why a declared input is in none of the graphs (a typo would otherwise leave the
        range unapplied, unknown to the user), or None."""
        if not graphs_inputs:
            return None
        missing = sorted({axis.key for axis in self.axes
                          if all(self._resolve(axis.key, names) is None for names in graphs_inputs)})
        if not missing:
            return None
        names = sorted({name for names in graphs_inputs for name in names})
        return (f"dynamic_shapes names {', '.join(repr(k) for k in missing)}, which no recorded graph takes; the "
                f"inputs are: {', '.join(repr(n) for n in names)} (an argument path such as 'input_ids' or a tensor "
                "name such as 'input_input_ids')")

    def tied_but_left_out(self, spec, shapes: list[list[tuple[int, ...]]]) -> list[str]:
        """Axes that had the extent of a declared axis in every recorded call, varied with it,
        and were not declared themselves (``attention_mask[1]`` beside a declared
        ``input_ids[1]``): if the model ties them, calls past the undeclared axis's recorded
        range are refused although the declared one accepts them. One line per such axis, to
        warn with (whether the code ties them only the user knows: two image sides may be
        equal in every sample by chance). ``spec``: the graph spec with the declared ranges;
        ``shapes``: per recorded call, each input's shape, in ``spec.inputs``' order."""
        names = [t.name for t in spec.inputs]
        declared = {(name, axis.axis): axis for name, axis in self.for_inputs(names)}
        lines = []
        for (name, index), axis in declared.items():
            i = names.index(name)
            if index == spec.inputs[i].batch_axis or index >= len(shapes[0][i]):
                continue  # one range for every batch axis already
            extents = [call[i][index] for call in shapes]
            if len(set(extents)) < 2:
                continue
            for j, other in enumerate(spec.inputs):
                for k in range(len(shapes[0][j])):
                    if (j == i or k == other.batch_axis or (other.name, k) in declared
                            or [call[j][k] for call in shapes] != extents):
                        continue
                    high = "" if axis.max == UNBOUNDED else axis.max
                    lines.append(
                        f"dynamic_shapes declares {name}[{index}] {axis.min}..{high}, but {other.name}[{k}] had the "
                        f"same extent in every recorded call and keeps its recorded range {other.min_shape[k]}.."
                        f"{other.max_shape[k]}: if the model ties them (a mask beside its ids), declare the same "
                        "range for it too (or the same torch.export.Dim), or calls past that range are refused")
        return lines

    def describe(self) -> str:
        return ", ".join(f"{a.key}[{a.axis}] {a.min}..{'' if a.max == UNBOUNDED else a.max}"
                         + (f" step {a.step}" if a.step > 1 else "") for a in self.axes)
