"""Fiscal calendars: which dates a fiscal period label ("FY2023", "FY2023Q2", "FY2023Q2YTD") covers.

A fiscal year is named by the calendar year it ends in (SEC practice): with fiscal_year_end "0630", FY2023 runs
from July 1, 2022 to June 30, 2023, so its second quarter is the calendar quarter ended December 31, 2022.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, timedelta

_LABEL = re.compile(r"^FY(\d{4})(?:Q([1-4])(YTD)?)?$")


def _month_end(year: int, month: int) -> date:
    return date(year, month, calendar.monthrange(year, month)[1])


def quarter_end(fiscal_year_end: str, fy: int, quarter: int) -> date:
    """The last day of fiscal quarter `quarter` (1-4) of fiscal year `fy`."""
    fye_month = int(fiscal_year_end[:2])
    months_back = 3 * (4 - quarter)
    month = fye_month - months_back
    year = fy
    while month < 1:
        month += 12
        year -= 1
    return _month_end(year, month)


def fiscal_year_start(fiscal_year_end: str, fy: int) -> date:
    return quarter_end(fiscal_year_end, fy - 1, 4) + timedelta(days=1)


@dataclass(frozen=True)
class Period:
    """A column of a statement: a duration (start set) or an instant (start None), named by its fiscal label."""

    label: str
    start: date | None
    end: date


def period_of(fiscal_year_end: str, label: str, instant: bool = False) -> Period:
    """The dates of a fiscal label; an instant concept's period is the label's end date."""
    m = _LABEL.match(label)
    if not m:
        raise ValueError(f"not a fiscal period label: {label!r}")
    fy, q, ytd = int(m.group(1)), m.group(2), m.group(3)
    if q is None:
        start, end = fiscal_year_start(fiscal_year_end, fy), quarter_end(fiscal_year_end, fy, 4)
    else:
        quarter = int(q)
        end = quarter_end(fiscal_year_end, fy, quarter)
        if ytd:
            start = fiscal_year_start(fiscal_year_end, fy)
        elif quarter == 1:
            start = fiscal_year_start(fiscal_year_end, fy)
        else:
            start = quarter_end(fiscal_year_end, fy, quarter - 1) + timedelta(days=1)
    return Period(label, None if instant else start, end)


def calendar_frame(period: Period) -> str | None:
    """The SEC `frame` of a period: CY2023Q4I for a calendar-quarter-end instant, CY2023Q4 for a calendar quarter,
    CY2023 for a calendar year; None for year-to-date and non-calendar years (the SEC frames neither)."""
    end = period.end
    if period.start is None:
        return f"CY{end.year}Q{(end.month - 1) // 3 + 1}I" if end.month % 3 == 0 else None
    days = (end - period.start).days + 1
    if 85 <= days <= 95 and end.month % 3 == 0:
        return f"CY{end.year}Q{end.month // 3}"
    if 360 <= days <= 370 and end.month == 12:
        return f"CY{end.year}"
    return None
