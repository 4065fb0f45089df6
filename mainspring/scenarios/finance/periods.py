"""Fiscal period labels of facts: which `FY2023` / `FY2023Q2` / `FY2023Q2YTD` a (start, end) pair is, and
the words a report uses to name a period ("fiscal 2023 second quarter", "Q2 FY2023", "FY2024").

A fiscal year is named by the calendar year it ends in (SEC practice): with fiscal_year_end "0630", FY2023 ends
June 30, 2023 and its second quarter ends December 31, 2022.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

LABEL = re.compile(r"^FY(\d{4})(?:Q([1-4])(YTD)?)?$")


@dataclass(frozen=True)
class FiscalPeriod:
    fy: int
    quarter: int | None  # None: the whole year
    ytd: bool = False

    @property
    def label(self) -> str:
        if self.quarter is None:
            return f"FY{self.fy}"
        return f"FY{self.fy}Q{self.quarter}" + ("YTD" if self.ytd else "")


def parse_label(label: str) -> FiscalPeriod:
    m = LABEL.match(label.strip().upper())
    if not m:
        raise ValueError(f"not a fiscal period: {label!r} (use FY2023, FY2023Q2 or FY2023Q2YTD)")
    return FiscalPeriod(int(m.group(1)), int(m.group(2)) if m.group(2) else None, bool(m.group(3)))


def fiscal_quarter_of(fiscal_year_end: str, day: date) -> tuple[int, int]:
    """(fiscal year, quarter 1-4) that `day` falls in."""
    fye = (int(fiscal_year_end[:2]), int(fiscal_year_end[2:]))
    fy = day.year if (day.month, day.day) <= fye else day.year + 1
    first_month = fye[0] % 12 + 1
    return fy, (day.month - first_month) % 12 // 3 + 1


def label_of(fiscal_year_end: str, start: date | None, end: date) -> str:
    """The label of a fact's period; an instant is labelled by the quarter it closes (a year end: FY2023)."""
    fy, quarter = fiscal_quarter_of(fiscal_year_end, end)
    if start is None:
        return f"FY{fy}" if quarter == 4 else f"FY{fy}Q{quarter}"
    days = (end - start).days + 1
    if days >= 300:
        return f"FY{fy}"
    if days <= 100:
        return f"FY{fy}Q{quarter}"
    return f"FY{fy}Q{quarter}YTD"


def instant_label(period: FiscalPeriod) -> str:
    """An instant concept asked for at `period` is the value at its end: FY2023Q2YTD → FY2023Q2, FY2023Q4 → FY2023."""
    if period.quarter is None or period.quarter == 4:
        return f"FY{period.fy}"
    return f"FY{period.fy}Q{period.quarter}"


_ORDINAL = {"first": 1, "second": 2, "third": 3, "fourth": 4, "1st": 1, "2nd": 2, "3rd": 3, "4th": 4}
_Q = r"(?:Q([1-4])|(first|second|third|fourth|1st|2nd|3rd|4th)\s+(?:fiscal\s+)?quarter)"
_Y = r"(?:FY\s?'?(\d{4})|fiscal\s+(?:year\s+)?(\d{4})|(\d{4}))"
_PERIOD_PATTERNS = [
    re.compile(rf"\b{_Q}\s+(?:of\s+)?{_Y}(?!\w)", re.IGNORECASE),  # Q2 FY2023, second quarter of fiscal 2023
    re.compile(rf"\b{_Y}\s+{_Q}(?!\w)", re.IGNORECASE),  # FY2023 Q2, fiscal 2023 second quarter
    re.compile(r"\bFY(\d{4})Q([1-4])(?!\w)", re.IGNORECASE),  # FY2023Q2
    re.compile(r"\b(?:FY\s?(\d{4})|fiscal\s+(?:year\s+)?(\d{4}))(?!\w)", re.IGNORECASE),  # FY2024, fiscal 2024
]


@dataclass(frozen=True)
class PeriodMention:
    period: FiscalPeriod
    start: int
    end: int


def find_periods(text: str) -> list[PeriodMention]:
    """Fiscal periods named in a text, longest reading first at each place (a bare year is not a fiscal period)."""
    found: list[PeriodMention] = []
    taken: list[tuple[int, int]] = []
    for index, pattern in enumerate(_PERIOD_PATTERNS):
        for m in pattern.finditer(text):
            if any(m.start() < e and s < m.end() for s, e in taken):
                continue
            g = m.groups()
            if index == 0:
                quarter: int | None = int(g[0]) if g[0] else _ORDINAL[g[1].lower()]
                fy = int(g[2] or g[3] or g[4])
            elif index == 1:
                fy = int(g[0] or g[1] or g[2])
                quarter = int(g[3]) if g[3] else _ORDINAL[g[4].lower()]
            elif index == 2:
                fy, quarter = int(g[0]), int(g[1])
            else:
                fy, quarter = int(g[0] or g[1]), None
            found.append(PeriodMention(FiscalPeriod(fy, quarter), m.start(), m.end()))
            taken.append((m.start(), m.end()))
    return sorted(found, key=lambda p: p.start)


def same_period(claimed: FiscalPeriod, fact_label: str) -> bool:
    """Does a fact labelled `fact_label` belong to the period a claim names? A year claim takes the year's
    figure (or its closing balance); a quarter claim takes the quarter's three-month or year-to-date figure."""
    fact = parse_label(fact_label)
    if fact.fy != claimed.fy:
        return False
    if claimed.quarter is None:
        return fact.quarter is None
    if claimed.quarter == 4:
        return fact.quarter in (4, None)  # the fourth quarter's figure or the year-end balance
    return fact.quarter == claimed.quarter
