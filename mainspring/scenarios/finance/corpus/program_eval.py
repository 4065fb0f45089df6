"""A minimal FinQA-style program evaluator: add, subtract, multiply, divide over #k (the k-th evidence value)
and numeric constants. The generator computes answers with it; the official interpreter is the pipeline's."""

from __future__ import annotations

import re

_TOKEN = re.compile(r"\s*(?:(#\d+)|([a-z_]+)\(|(\))|(,)|(-?\d+(?:\.\d+)?))")
OPS = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
       "divide": lambda a, b: a / b}


def run_program(program: str, values: list[float]) -> float:
    pos = 0

    def expr() -> float:
        nonlocal pos
        m = _TOKEN.match(program, pos)
        if not m:
            raise ValueError(f"bad program at {pos}: {program!r}")
        pos = m.end()
        ref, op, _, _, num = m.groups()
        if ref:
            return values[int(ref[1:])]
        if num:
            return float(num)
        if op not in OPS:
            raise ValueError(f"unknown operation {op!r}")
        a = expr()
        comma = _TOKEN.match(program, pos)
        if not comma or not comma.group(4):
            raise ValueError(f"expected ',' at {pos}: {program!r}")
        pos = comma.end()
        b = expr()
        close = _TOKEN.match(program, pos)
        if not close or not close.group(3):
            raise ValueError(f"expected ')' at {pos}: {program!r}")
        pos = close.end()
        return float(OPS[op](a, b))

    result = expr()
    if program[pos:].strip():
        raise ValueError(f"trailing text in program: {program!r}")
    return result
