"""The arithmetic of a multi grader's `calculate_output`, e.g. "0.5 * name + 0.5 * min(email, 1)".

Parsed with `ast` and checked node by node, then walked by our own evaluator: no `eval`, no attribute
access, no calls except the few math functions OpenAI documents (min, max, abs, floor, ceil, exp, sqrt,
log), and every number is a float, so `9 ** 9 ** 9` overflows at once instead of building a huge int.
`^` means power, as in OpenAI's formulas (Python's `**` is accepted too).
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass
from typing import Callable

MAX_LENGTH = 1000

FUNCTIONS: dict[str, tuple[Callable[..., float], int, int]] = {  # name -> (function, min args, max args)
    "min": (min, 2, 32), "max": (max, 2, 32), "abs": (abs, 1, 1), "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1), "exp": (math.exp, 1, 1), "sqrt": (math.sqrt, 1, 1), "log": (math.log, 1, 2),
}
_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {ast.Add: operator.add, ast.Sub: operator.sub,
                                                                      ast.Mult: operator.mul, ast.Div: operator.truediv,
                                                                      ast.Pow: operator.pow}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class FormulaError(ValueError):
    """A formula that does not parse, uses something not allowed, or names an unknown grader."""


@dataclass(frozen=True)
class Formula:
    text: str
    tree: ast.expr
    names: frozenset[str]

    def evaluate(self, values: dict[str, float]) -> float:
        """The formula's value; raises FormulaError for a math error (division by zero, log(0), overflow)."""
        try:
            out = float(_eval(self.tree, values))
        except (ArithmeticError, ValueError, TypeError) as exc:  # TypeError: (-1) ^ 0.5 is complex
            raise FormulaError(f"calculate_output {self.text!r} failed: {exc}") from None
        if not math.isfinite(out):
            raise FormulaError(f"calculate_output {self.text!r} gave {out}")
        return out


def parse_formula(text: str, names: set[str] | frozenset[str]) -> Formula:
    """Check `text` once (at job creation); `names` are the grader names it may use."""
    if not isinstance(text, str) or not text.strip():
        raise FormulaError("calculate_output is empty; write an expression over the grader names")
    if len(text) > MAX_LENGTH:
        raise FormulaError(f"calculate_output is longer than {MAX_LENGTH} characters")
    try:
        # "^" is power in OpenAI's formulas, binding tighter than * (Python's "^" is xor, looser than +)
        tree = ast.parse(text.strip().replace("^", "**"), mode="eval").body
    except (SyntaxError, RecursionError, MemoryError, ValueError) as exc:
        raise FormulaError(f"calculate_output {text!r} is not an arithmetic expression: "
                           f"{getattr(exc, 'msg', exc)}") from None
    used: set[str] = set()
    _check(tree, set(names), used)
    return Formula(text, tree, frozenset(used))


def _check(node: ast.AST, names: set[str], used: set[str]) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise FormulaError(f"calculate_output: only numbers are allowed as constants, not {node.value!r}")
    elif isinstance(node, ast.Name):
        if node.id not in names:
            raise FormulaError(f"calculate_output uses {node.id!r}, which is not one of the graders "
                               f"({', '.join(sorted(names)) or 'none'})")
        used.add(node.id)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        _check(node.left, names, used)
        _check(node.right, names, used)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        _check(node.operand, names, used)
    elif isinstance(node, ast.Call):
        fn = node.func.id if isinstance(node.func, ast.Name) else None
        if fn not in FUNCTIONS or node.keywords:
            raise FormulaError(f"calculate_output: the functions allowed are {', '.join(FUNCTIONS)}")
        _, lo, hi = FUNCTIONS[fn]
        if not lo <= len(node.args) <= hi:
            raise FormulaError(f"calculate_output: {fn}() takes {lo if lo == hi else f'{lo} to {hi}'} arguments")
        for arg in node.args:
            _check(arg, names, used)
    else:
        raise FormulaError(f"calculate_output: {ast.unparse(node)!r} is not allowed; use numbers, grader names, "
                           f"+ - * / ^ and {', '.join(FUNCTIONS)}")


def _eval(node: ast.expr, values: dict[str, float]) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):  # _check allows numbers only
        return float(node.value)
    if isinstance(node, ast.Name):
        return float(values[node.id])
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_eval(node.left, values), _eval(node.right, values))
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, values))
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)  # _check let nothing else through
    return float(FUNCTIONS[node.func.id][0](*(_eval(a, values) for a in node.args)))
