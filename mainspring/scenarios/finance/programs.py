"""A deterministic interpreter for FinQA-style programs over cited inputs:

    subtract(F:f-1a2b3c4d5e, F:f-9f8e7d6c5b), divide(#0, F:f-9f8e7d6c5b)

Steps are separated by commas at depth 0 and may nest calls; the program's value is its last step's. Arguments:
`F:<fact_id>` (a fact's value in whole units), `D:<doc_id> p.<n> c.<s>-<e>` (the number that span of a page
states, scale applied), `#k` (step k's result, 0-based), or a numeric constant. The parser is hand-written (no
eval): the model's text is data, never code. Every input the program used is returned with its value, so a
verifier or an auditor sees what the number rests on.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Protocol


class ProgramError(ValueError):
    """A program that does not parse or cannot be evaluated; `position` is the character it failed at."""

    def __init__(self, message: str, position: int):
        super().__init__(f"{message} (at character {position})")
        self.position = position


class InputSource(Protocol):
    """Where a program's cited inputs come from (the filings store; a dict in tests). Raise KeyError or
    LookupError when an input does not resolve."""

    def fact_value(self, fact_id: str) -> float: ...

    def span_value(self, doc_id: str, page: int, start: int, end: int) -> float: ...


@dataclass(frozen=True)
class ProgramInput:
    ref: str  # as written: "F:f-1a2b3c4d5e" or "D:ORBT-10K-FY2023 p.3 c.10-40"
    kind: str  # "fact" | "span"
    value: float
    fact_id: str | None = None
    doc_id: str | None = None
    page: int | None = None
    start: int | None = None
    end: int | None = None


@dataclass
class ProgramResult:
    program: str
    value: float
    steps: list[float] = field(default_factory=list)
    inputs: list[ProgramInput] = field(default_factory=list)


def _two(name: str) -> Callable[[list[float]], float]:
    fns: dict[str, Callable[[float, float], float]] = {
        "add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
        "divide": lambda a, b: a / b, "greater": lambda a, b: 1.0 if a > b else 0.0,
        "exp": lambda a, b: a ** b, "growth": lambda a, b: a / b - 1.0}
    fn = fns[name]
    return lambda xs: fn(xs[0], xs[1])


# name -> (min args, max args or None for variadic, function)
OPS: dict[str, tuple[int, int | None, Callable[[list[float]], float]]] = {
    **{name: (2, 2, _two(name)) for name in ("add", "subtract", "multiply", "divide", "greater", "exp", "growth")},
    "average": (1, None, lambda xs: sum(xs) / len(xs)),
    "sum": (1, None, sum), "table_sum": (1, None, sum),
    "min": (1, None, min), "max": (1, None, max),
    "abs": (1, 1, lambda xs: abs(xs[0])), "negate": (1, 1, lambda xs: -xs[0]),
}
_DIVIDES = {"divide", "growth"}  # the second argument is a divisor

_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_FACT = re.compile(r"F:([A-Za-z0-9_.-]+)")
_SPAN = re.compile(r"D:(\S+?)\s+p\.(\d+)\s+c\.(\d+)-(\d+)")
_STEP = re.compile(r"#(\d+)")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


# ---- parsing ---------------------------------------------------------------------------------------------------
@dataclass
class _Call:
    name: str
    args: list[_Node]
    pos: int


@dataclass
class _Arg:
    kind: str  # fact | span | step | const
    text: str
    pos: int
    groups: tuple[str, ...] = ()


_Node = _Call | _Arg


class _Parser:
    def __init__(self, text: str):
        self.text, self.i = text, 0

    def skip(self) -> None:
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1

    def program(self) -> list[_Node]:
        steps = [self.expr()]
        self.skip()
        while self.i < len(self.text):
            if self.text[self.i] != ",":
                raise ProgramError(f"expected ',' between steps, found {self.text[self.i]!r}", self.i)
            self.i += 1
            steps.append(self.expr())
            self.skip()
        return steps

    def expr(self) -> _Node:
        self.skip()
        pos = self.i
        if pos >= len(self.text):
            raise ProgramError("expected an operation or an argument, found the end", pos)
        for kind, pattern in (("fact", _FACT), ("span", _SPAN), ("step", _STEP), ("const", _NUMBER)):
            m = pattern.match(self.text, pos)
            if m:
                self.i = m.end()
                return _Arg(kind, m.group(0), pos, m.groups())
        m = _NAME.match(self.text, pos)
        if not m:
            raise ProgramError(f"unexpected {self.text[pos]!r}", pos)
        name = m.group(0)
        if name not in OPS:
            raise ProgramError(f"unknown operation {name!r} (known: {', '.join(sorted(OPS))})", pos)
        self.i = m.end()
        self.skip()
        if self.i >= len(self.text) or self.text[self.i] != "(":
            raise ProgramError(f"expected '(' after {name}", self.i)
        self.i += 1
        args: list[_Node] = []
        self.skip()
        if self.i < len(self.text) and self.text[self.i] == ")":
            self.i += 1
        else:
            while True:
                args.append(self.expr())
                self.skip()
                if self.i >= len(self.text):
                    raise ProgramError(f"unclosed '(' of {name}", self.i)
                if self.text[self.i] == ")":
                    self.i += 1
                    break
                if self.text[self.i] != ",":
                    raise ProgramError(f"expected ',' or ')' in {name}(...), found {self.text[self.i]!r}", self.i)
                self.i += 1
        low, high = OPS[name][0], OPS[name][1]
        if len(args) < low or (high is not None and len(args) > high):
            want = f"{low}" if high == low else f"at least {low}"
            raise ProgramError(f"{name} takes {want} arguments, got {len(args)}", pos)
        return _Call(name, args, pos)


def parse_program(text: str) -> list[_Node]:
    """The program's steps, or ProgramError naming where it went wrong."""
    if not text.strip():
        raise ProgramError("the program is empty", 0)
    return _Parser(text).program()


# ---- evaluation ------------------------------------------------------------------------------------------------
def run_program(text: str, source: InputSource) -> ProgramResult:
    """Evaluate `text` against `source`; the result's inputs list each cited fact or span once, in order used."""
    result = ProgramResult(program=text, value=math.nan)
    seen: set[str] = set()

    def value_of(node: _Node) -> float:
        if isinstance(node, _Call):
            args = [value_of(a) for a in node.args]
            if node.name in _DIVIDES and args[1] == 0:
                raise ProgramError(f"division by zero in {node.name}", node.pos)
            try:
                out = float(OPS[node.name][2](args))
            except (OverflowError, ZeroDivisionError, ValueError) as exc:
                raise ProgramError(f"{node.name} failed: {exc}", node.pos) from None
            if not math.isfinite(out) or isinstance(out, complex):
                raise ProgramError(f"{node.name} gives no finite number", node.pos)
            return out
        if node.kind == "const":
            return float(node.text)
        if node.kind == "step":
            k = int(node.groups[0])
            if k >= len(result.steps):
                raise ProgramError(f"#{k} refers to a step not computed yet (steps so far: {len(result.steps)})",
                                   node.pos)
            return result.steps[k]
        try:
            if node.kind == "fact":
                item = ProgramInput(node.text, "fact", float(source.fact_value(node.groups[0])),
                                    fact_id=node.groups[0])
            else:
                doc, page, s, e = node.groups[0], int(node.groups[1]), int(node.groups[2]), int(node.groups[3])
                item = ProgramInput(node.text, "span", float(source.span_value(doc, page, s, e)),
                                    doc_id=doc, page=page, start=s, end=e)
        except (LookupError, ValueError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            raise ProgramError(f"{node.text} does not resolve: {message}", node.pos) from None
        if item.ref not in seen:
            seen.add(item.ref)
            result.inputs.append(item)
        return item.value

    for step in parse_program(text):
        result.steps.append(value_of(step))
    result.value = result.steps[-1]
    return result
