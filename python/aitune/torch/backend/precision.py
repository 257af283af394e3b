"""The precision kwargs edge: a backend config's precision text is checked and converted by
the engine (one C++ ``Precision`` type, ``_core.parse_precision`` / ``parse_precision_limit``);
past this edge precision travels as ``_core.Precision`` until the report writes its name."""

from __future__ import annotations

from aitune import _core

#: The candidate precisions by name, in the engine's spelling ("fp32", "tf32", "fp16", "bf16").
PRECISION_NAMES = tuple(
    _core.precision_name(p) for p in (_core.Precision.STRICT, _core.Precision.TF32, _core.Precision.FP16,
                                      _core.Precision.BF16)
)
#: The precision limits by name: "any" and every precision.
LIMIT_NAMES = ("any", *PRECISION_NAMES)


def precision_limit(value: object) -> str:
    """``value`` ("any", "fp32", ... any case) as the engine spells the limit; ValueError
    naming the valid values otherwise. Kept as text in the config (it is part of its key)."""
    if not isinstance(value, str):
        raise ValueError(f"precision must be one of {', '.join(map(repr, LIMIT_NAMES))}, got {value!r}")
    try:
        return _core.precision_limit_name(_core.parse_precision_limit(value.lower()))
    except _core.InvalidArgumentError:
        raise ValueError(f"precision must be one of {', '.join(map(repr, LIMIT_NAMES))}, got {value!r}") from None


def parse_limit(text: str) -> _core.Precision | None:
    """A config's limit text (already checked by ``precision_limit``) as the engine's value:
    None for "any". The one conversion of a limit on its way into the engine."""
    return _core.parse_precision_limit(text)


def candidate_precision(name: str) -> _core.Precision:
    """A candidate precision's name ("fp32", ...) as the engine's Precision."""
    return _core.parse_precision(name)
