"""Citation markers and the number finder: scales, signs, precision, and what is not a claim."""

from __future__ import annotations

import pytest

from mainspring.scenarios.finance.citations import find_citations, find_numbers, first_number


def test_markers_of_the_three_kinds() -> None:
    text = "A [F:f-0123456789] b [D:ORBT-10K-FY2023 p.12 c.340-388] c [P:p-2] d [F:]"
    kinds = [(c.kind, c.ref) for c in find_citations(text)]
    assert kinds == [("F", "f-0123456789"), ("D", "ORBT-10K-FY2023 p.12 c.340-388"), ("P", "p-2"), ("F", "")]
    span = find_citations(text)[1]
    assert (span.doc_id, span.page, span.span_start, span.span_end) == ("ORBT-10K-FY2023", 12, 340, 388)
    assert text[span.start:span.end] == "[D:ORBT-10K-FY2023 p.12 c.340-388]"


@pytest.mark.parametrize("text,value,decimals", [
    ("$1,234.5 million", 1_234_500_000, 1), ("12.4%", 0.124, 1), ("(3.2)", -3.2, 1),
    ("1.2 billion", 1_200_000_000, 1), ("$0.45 per share", 0.45, 2), ("$(5)", -5, 0), ("3,000", 3000, 0),
    ("$2.5bn", 2_500_000_000, 1), ("-7", -7, 0), ("40 thousand", 40_000, 0), ("12 percent", 0.12, 0),
])
def test_numbers_with_scale(text: str, value: float, decimals: int) -> None:
    (number,) = find_numbers(f"It was {text} then.")
    assert number.value == pytest.approx(value)
    assert number.decimals == decimals


def test_what_is_not_a_claim() -> None:
    text = ("1. In FY2023 and Q2 2024, per the 10-K (see p. 12 and page 3, Note 7) filed on December 31, 2023, "
            "a 2-for-1 split [F:f-0123456789] [D:X p.4 c.10-20] happened.\n2) 2024 was fine.")
    assert find_numbers(text) == []


def test_matching_at_the_printed_precision() -> None:
    number = first_number("$1,234.5 million")
    assert number is not None
    assert number.matches(1_234_456_000) and number.matches(1_234_549_999)
    assert not number.matches(1_234_600_000)
    loss = first_number("$3.2 million")
    assert loss is not None and loss.matches(-3_200_000)  # a loss stated as an amount
    negative = first_number("(3.2) million")
    assert negative is not None and not negative.matches(3_200_000)
    pct = first_number("12.4%")
    assert pct is not None and pct.matches(0.1237) and not pct.matches(0.126)
