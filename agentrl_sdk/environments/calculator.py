"""A safe calculator tool: the expression is parsed with `ast`, never executed."""

from __future__ import annotations

import ast
import operator

from langchain_core.tools import tool

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPONENT = 64
_MAX_LENGTH = 200


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression of numbers and ``+ - * / // % **``.

    Raises:
        ValueError: anything else (names, calls, attributes...), a too long expression or a
            too large exponent (a model could otherwise stall the rollout on ``9**9**9``).
    """
    if len(expression) > _MAX_LENGTH:
        raise ValueError(f"expression longer than {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    raise ValueError(f"unsupported element {type(node).__name__} in expression")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as (12+7)*3."""
    value = calculate(expression)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.6g}"
