"""The FinQA-style program interpreter: operations, nesting, step references, inputs, errors with positions."""

from __future__ import annotations

import math

import pytest

from mainspring.scenarios.finance.programs import ProgramError, parse_program, run_program


class Inputs:
    facts = {"f-aaaaaaaaaa": 120.0, "f-bbbbbbbbbb": 100.0, "f-zero000000": 0.0}

    def fact_value(self, fact_id: str) -> float:
        return self.facts[fact_id]

    def span_value(self, doc_id: str, page: int, start: int, end: int) -> float:
        if (doc_id, page, start, end) == ("ORBT-10K-FY2023", 2, 10, 30):
            return 1_234_500_000.0
        raise LookupError(f"no span {doc_id} p.{page}")


@pytest.mark.parametrize("program,value", [
    ("add(1, 2)", 3.0), ("subtract(10, 4)", 6.0), ("multiply(3, 2.5)", 7.5), ("divide(9, 3)", 3.0),
    ("greater(3, 2)", 1.0), ("greater(2, 3)", 0.0), ("exp(2, 10)", 1024.0), ("growth(120, 100)", 0.2),
    ("average(1, 2, 3, 4)", 2.5), ("sum(1, 2, 3)", 6.0), ("table_sum(5, 5)", 10.0), ("min(3, -1, 2)", -1.0),
    ("max(3, -1, 2)", 3.0), ("abs(-4)", 4.0), ("negate(4)", -4.0), ("add(-1.5, 1e3)", 998.5),
])
def test_each_operation(program: str, value: float) -> None:
    assert run_program(program, Inputs()).value == pytest.approx(value)


def test_facts_steps_and_nesting_with_inputs_listed_once() -> None:
    result = run_program("subtract(F:f-aaaaaaaaaa, F:f-bbbbbbbbbb), divide(#0, F:f-bbbbbbbbbb)", Inputs())
    assert result.steps == [20.0, 0.2]
    assert result.value == pytest.approx(0.2)
    assert [(i.fact_id, i.value) for i in result.inputs] == [("f-aaaaaaaaaa", 120.0), ("f-bbbbbbbbbb", 100.0)]
    nested = run_program("divide(subtract(F:f-aaaaaaaaaa, F:f-bbbbbbbbbb), F:f-bbbbbbbbbb)", Inputs())
    assert nested.value == pytest.approx(0.2) and len(nested.steps) == 1


def test_span_argument_uses_the_stated_number() -> None:
    result = run_program("divide(D:ORBT-10K-FY2023 p.2 c.10-30, 1000000)", Inputs())
    assert result.value == pytest.approx(1234.5)
    (span,) = result.inputs
    assert (span.kind, span.doc_id, span.page, span.start, span.end) == ("span", "ORBT-10K-FY2023", 2, 10, 30)


@pytest.mark.parametrize("program,position,words", [
    ("add(1, 2", 8, "unclosed"),
    ("add(1 2)", 6, "expected ','"),
    ("frobnicate(1, 2)", 0, "unknown operation"),
    ("add(1, 2), divide(#1, 2)", 18, "#1"),
    ("add(1, 2) x", 10, "between steps"),
    ("subtract(1)", 0, "takes 2 arguments"),
    ("", 0, "empty"),
    ("add(1, ?)", 7, "unexpected"),
    ("add(1, F:f-missing000)", 7, "does not resolve"),
])
def test_errors_name_the_position(program: str, position: int, words: str) -> None:
    with pytest.raises(ProgramError) as info:
        run_program(program, Inputs())
    assert info.value.position == position
    assert words in str(info.value)


def test_division_by_zero_is_a_program_error() -> None:
    with pytest.raises(ProgramError, match="division by zero") as info:
        run_program("add(1, 1), divide(#0, F:f-zero000000)", Inputs())
    assert info.value.position == 11
    with pytest.raises(ProgramError, match="division by zero"):
        run_program("growth(5, 0)", Inputs())


def test_no_eval_of_python() -> None:
    with pytest.raises(ProgramError):
        parse_program("__import__('os')")
    assert not math.isnan(run_program("sum(1)", Inputs()).value)
