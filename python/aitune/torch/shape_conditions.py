"""The conditions on input shapes an exported graph holds under, read from torch.export.

A model's code may decide on a size (``if x.shape[0] == 3:``, ``if seq % 3 == 0:``); the
export records the branch its example took, and torch.export notes the decision as a guard
(``Ne(s0, 3)``) or, captured with ``prefer_deferred_runtime_asserts_over_guards``, as a
runtime assert, neither of which the ONNX graph keeps. Each is translated here into the
engine's ShapeCondition (``include/aitune/shape_condition.hpp``) over the graph's input
names, so that every session of the graph, in this process, a loaded checkpoint or a C++
consumer, refuses a call outside them instead of computing another model there. Which
conditions to keep (those every recorded sample satisfies) the engine decides
(``GraphTuner.set_shape_conditions``)."""
from __future__ import annotations

import json
import logging
from typing import Any

import torch

from .. import _core

logger = logging.getLogger(__name__)


class _Unreadable(Exception):
    """An expression with no ShapeCondition form (a float, a symbol of no input axis)."""


# sympy and torch.utils._sympy classes by name: the names are stable across torch releases,
# the modules that define them are not.
_RELATIONS = {"Equality": "eq", "Unequality": "ne", "StrictLessThan": "lt", "LessThan": "le",
              "StrictGreaterThan": "gt", "GreaterThan": "ge"}
_VARIADIC = {"Add": "add", "Mul": "mul", "Min": "min", "Max": "max", "And": "and", "Or": "or"}
_BINARY = {"Pow": "pow", "Mod": "mod", "PythonMod": "mod", "FloorDiv": "floordiv", "CleanDiv": "floordiv",
           "CeilDiv": "ceildiv"}


def _tree(expr: Any, axes: dict) -> Any:
    """``expr`` (sympy, over the size symbols of ``axes``: symbol -> the JSON tree of its
    value, an input's extent or an expression of one) as a ShapeCondition JSON tree."""
    if expr is True or expr is False:
        return expr
    if getattr(expr, "is_Boolean", False) and expr.is_Atom and not expr.is_Symbol:  # sympy's true / false
        return bool(expr)
    if getattr(expr, "is_Integer", False):
        return int(expr)
    if getattr(expr, "is_Symbol", False):
        if expr not in axes:
            raise _Unreadable(f"symbol {expr} is no input's extent")
        return axes[expr]
    name = type(expr).__name__
    # math.ceil(s / 2), math.floor(s / 2) of sizes: exact integer divisions, not floats
    if name in ("CeilToInt", "FloorToInt") and len(expr.args) == 1 \
            and type(expr.args[0]).__name__ == "IntTrueDiv" and len(expr.args[0].args) == 2:
        return ["ceildiv" if name == "CeilToInt" else "floordiv", *(_tree(a, axes) for a in expr.args[0].args)]
    args = [_tree(arg, axes) for arg in expr.args]
    if name in _RELATIONS and len(args) == 2:
        return [_RELATIONS[name], *args]
    if name in _VARIADIC:
        return [_VARIADIC[name], *args]
    if name in _BINARY and len(args) == 2:
        return [_BINARY[name], *args]
    if name == "Not" and len(args) == 1:
        return ["not", *args]
    if name == "Abs" and len(args) == 1:
        return ["abs", *args]
    if name == "ModularIndexing" and len(args) == 3:  # (base // divisor) % modulus
        return ["mod", ["floordiv", args[0], args[1]], args[2]]
    raise _Unreadable(f"{name} has no shape-condition form")


def _is_batch_axis(tree: Any, spec: _core.GraphSpec) -> bool:
    return isinstance(tree, list) and tree[:1] == ["dim"] and any(
        t.name == tree[1] and t.batch_axis == tree[2] for t in spec.inputs)


def _readable(expr: Any, axes: dict) -> str:
    """``expr`` printed with each size symbol of an input's extent named as the extent
    (``input_x.shape[1]``), for a message."""
    import sympy

    names = {symbol: sympy.Symbol(f"{tree[1]}.shape[{tree[2]}]") for symbol, tree in axes.items()
             if isinstance(tree, list) and tree[:1] == ["dim"]}
    try:
        return str(expr.xreplace(names))
    except Exception:  # a printer's failure must not hide the condition itself
        return str(expr)


def _range_bounds(program, axes: dict, spec: _core.GraphSpec) -> list:
    """The bounds torch.export put on an input's extent as its range rather than as a guard
    (``if 6 <= s <= 7:`` exported at 8 narrows ``s`` to [8, inf]), where tighter than the spec's
    own range of that axis."""
    bounds = []
    tensors = {t.name: t for t in spec.inputs}
    for symbol, value_range in program.range_constraints.items():
        tree = axes.get(symbol)
        if not (isinstance(tree, list) and tree[:1] == ["dim"]) or tree[1] not in tensors:
            continue
        tensor = tensors[tree[1]]
        low, high = tensor.min_shape[tree[2]], tensor.max_shape[tree[2]]
        lower, upper = value_range.lower, value_range.upper
        if getattr(lower, "is_Integer", False) or isinstance(lower, int):
            if int(lower) > low:
                bounds.append(["ge", tree, int(lower)])
        if getattr(upper, "is_Integer", False) or isinstance(upper, int):
            if high < 0 or int(upper) < high:
                bounds.append(["le", tree, int(upper)])
    return bounds


def _derived(here: list, expr: Any, axes: dict) -> Any:
    """The condition of an axis whose extent is an expression (``2*s0``: a declared
    ``2 * Dim("half")``): equal to it where its symbols are known; where one symbol is
    unknown and the expression is ``a*s + b`` in it, a multiple of ``a`` from ``b`` (the
    symbol then stands for ``(extent - b) // a`` in the conditions that follow)."""
    import sympy

    unknown = [symbol for symbol in expr.free_symbols if symbol not in axes]
    if not unknown:
        return ["eq", here, _tree(expr, axes)]
    if len(unknown) > 1:
        raise _Unreadable(f"symbols {', '.join(map(str, unknown))} are no input's extents")
    (symbol,) = unknown
    try:
        polynomial = sympy.Poly(expr, symbol)
    except sympy.PolynomialError:  # (a FloorDiv of the symbol, say): no linear form
        raise _Unreadable(f"symbol {symbol} is no input's extent") from None
    a, b = polynomial.all_coeffs() if polynomial.degree() == 1 else (None, None)
    if a is None or not getattr(a, "is_Integer", False) or int(a) < 1:
        raise _Unreadable(f"symbol {symbol} is no input's extent")
    if getattr(b, "is_Integer", False):
        offset = here if int(b) == 0 else ["add", here, -int(b)]
    else:
        offset = ["add", here, ["mul", -1, _tree(b, axes)]]
    axes[symbol] = ["floordiv", offset, int(a)]
    return ["eq", ["mod", offset, int(a)], 0]


def _pinned(expr: Any, axes: dict, checked: list[dict[str, list[int]]] | None) -> Any:
    """For a condition with no ShapeCondition form (a float: ``if s * 0.5 == 3.0``): the
    extents its input axes had in the checked samples, so that the graph takes those alone
    on these axes (where the check against eager vouches for it) rather than sizes where the
    unknown condition may not hold; None where an axis is unknown or nothing was checked."""
    dims = [axes.get(symbol) for symbol in sorted(expr.free_symbols, key=str)]
    if not checked or not dims or any(not (isinstance(d, list) and d[:1] == ["dim"]) for d in dims):
        return None
    options: list = []
    for shapes in checked:
        if any(d[1] not in shapes or d[2] >= len(shapes[d[1]]) for d in dims):
            return None
        equal = [["eq", d, shapes[d[1]][d[2]]] for d in dims]
        option = equal[0] if len(equal) == 1 else ["and", *equal]
        if option not in options:
            options.append(option)
    return ["or", *options]


def from_program(program: torch.export.ExportedProgram, spec: _core.GraphSpec,
                 checked: list[dict[str, list[int]]] | None = None) -> tuple[list, list[str]]:
    """(ShapeConditions, texts of the guards with no ShapeCondition form) of ``program``,
    whose user inputs are ``spec.inputs`` in order: its guards and deferred runtime asserts,
    the extents its input shapes tie together (one symbol on two axes), and the axes it fixed
    that the spec lets vary. A guard with no ShapeCondition form pins the axes it reads to
    the extents they had in ``checked`` (per checked sample, input name -> shape), where the
    check against eager vouches for the graph."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    user_inputs = list(program.graph_signature.user_inputs)
    if len(user_inputs) != len(spec.inputs):
        return [], [f"the program takes {len(user_inputs)} inputs, the graph {len(spec.inputs)}"]
    axes: dict = {}  # size symbol -> its value as a tree: the extent of its first axis
    trees: list = []
    shape_env = None
    derived: list = []  # (input, axis, expression) of an axis whose extent is an expression
    for name, tensor_spec in zip(user_inputs, spec.inputs):
        value = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(value, torch.Tensor):
            continue
        for axis, size in enumerate(value.shape):
            here = ["dim", tensor_spec.name, axis]
            if isinstance(size, torch.SymInt):
                shape_env = size.node.shape_env
                expr = size.node.expr
                if expr.is_Symbol and expr not in axes:
                    axes[expr] = here
                elif expr.is_Symbol:
                    trees.append(["eq", here, axes[expr]])
                else:
                    derived.append((here, expr))
            elif tensor_spec.min_shape[axis] != tensor_spec.max_shape[axis]:
                trees.append(["eq", here, int(size)])  # specialised by the export to the example's extent
    unreadable: list[str] = []
    for here, expr in derived:
        try:
            trees.append(_derived(here, expr, axes))
        except _Unreadable as why:
            unreadable.append(f"{here[1]}.shape[{here[2]}] == {expr} ({why})")
    trees.extend(_range_bounds(program, axes, spec))
    if shape_env is not None:
        exprs = [guard.expr for guard in shape_env.guards]
        for asserts in shape_env.deferred_runtime_asserts.values():
            exprs.extend(a.expr for a in asserts)
        for expr in exprs:
            expr = shape_env.replace(expr)  # in the symbols the placeholders carry
            if free_unbacked_symbols(expr):
                # on a size computed from values (nonzero's count): torch's own runtime check
                # of the values, which the ONNX graph computes per call; no input's extent
                logger.debug("export assert on computed sizes, not input extents: %s", expr)
                continue
            try:
                tree = _tree(expr, axes)
            except _Unreadable as why:
                unreadable.append(f"{_readable(expr, axes)} ({why})")
                if (pinned := _pinned(expr, axes, checked)) is not None:
                    trees.append(pinned)
                continue
            if tree is not True:
                trees.append(tree)
    conditions, seen = [], set()
    for tree in trees:
        if tree[:1] == ["eq"] and len(tree) == 3 and all(_is_batch_axis(side, spec) for side in tree[1:]):
            continue  # batch axes agree by construction: every session checks that itself
        text = json.dumps(tree)
        if text not in seen:
            seen.add(text)
            conditions.append(_core.ShapeCondition.from_json(text))
    return conditions, unreadable


def fingerprint(program: torch.export.ExportedProgram) -> list:
    """What ``program`` computes, apart from its asserts on sizes: its nodes that reach the
    outputs, in order, each as (op, target, operands), an operand another node by its
    position, a size by its expression. Two captures of one forward at sizes on either side
    of a condition are the same graph where their fingerprints are equal."""
    nodes = list(program.graph.nodes)
    live: set = set()
    stack = [n for n in nodes if n.op == "output"]
    while stack:
        node = stack.pop()
        if node in live:
            continue
        live.add(node)
        stack.extend(node.all_input_nodes)
    order = {node: i for i, node in enumerate(n for n in nodes if n in live)}

    def operand(value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            return ("node", order.get(value, -1))
        if isinstance(value, (list, tuple)):
            return tuple(operand(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((k, operand(v)) for k, v in value.items()))
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return ("size", str(value.node.expr))
        return repr(value)

    return [(node.op, str(node.target), operand(node.args), operand(node.kwargs))
            for node in nodes if node in live and node.op != "placeholder"]
