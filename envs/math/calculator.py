"""A safe arithmetic calculator tool: parses with ``ast``, never ``eval``s model text."""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_MAX_ABS = 10**30  # keeps ``9**9**9``-style inputs from eating the CPU
_MAX_EXPONENT = 100
# An error echoes at most this much of the expression: the model reads the error, and a 5,000-digit
# expression echoed whole filled its context with its own input.
_ECHO_CHARS = 200


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if abs(node.value) > _MAX_ABS:
            raise ValueError("number too large")
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval(node.operand)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > _MAX_EXPONENT:
                raise ValueError("exponent must be an integer between -100 and 100")
            if left == 0 and right < 0:
                raise ZeroDivisionError("division by zero")
            out = left ** int(right)
        elif isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ZeroDivisionError("division by zero")
        else:
            out = _BINOPS[type(node.op)](left, right)
        out = Fraction(out)
        if abs(out) > _MAX_ABS:
            raise ValueError("result too large")
        return out
    raise ValueError(f"unsupported syntax: {ast.dump(node)[:60]}")


def format_number(x: Fraction) -> str:
    """Integers print exactly; other values as a decimal rounded to 10 significant places."""
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.10g}"


def _echo(expression: str) -> str:
    """``expression`` quoted, cut to its first ``_ECHO_CHARS`` characters (then "…" and its length)."""
    if len(expression) <= _ECHO_CHARS:
        return repr(expression)
    return f"{expression[:_ECHO_CHARS]!r}… ({len(expression):,} characters)"


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: The expression to evaluate, for example "(12 + 7) * 3".
    """
    # Raises ValueError/ZeroDivisionError; the tool runner turns them into an error observation.
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot parse {_echo(expression)}: {exc.msg}") from None
    return format_number(_eval(tree))
