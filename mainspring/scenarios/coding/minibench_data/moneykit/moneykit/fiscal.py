"""Fiscal quarters: a fiscal year starts in `start_month` (1 = the calendar year) and is named by the calendar
year in which it ends (a year starting in April 2024 is fiscal 2025)."""

from __future__ import annotations

from datetime import date


def _check(start_month: int) -> None:
    if not 1 <= start_month <= 12:
        raise ValueError(f"start_month must be 1..12, not {start_month}")


def fiscal_year(d: date, start_month: int = 1) -> int:
    _check(start_month)
    if start_month == 1:
        return d.year
    return d.year + 1 if d.month >= start_month else d.year


def fiscal_quarter(d: date, start_month: int = 1) -> int:
    """The quarter (1..4) of its fiscal year that holds `d`."""
    _check(start_month)
    return (d.month - start_month) % 12 // 3 + 1


def quarter_start(year: int, quarter: int, start_month: int = 1) -> date:
    """The first day of quarter `quarter` of fiscal year `year`."""
    _check(start_month)
    if not 1 <= quarter <= 4:
        raise ValueError(f"quarter must be 1..4, not {quarter}")
    first_year = year if start_month == 1 else year - 1
    months = first_year * 12 + start_month - 1 + 3 * (quarter - 1)
    return date(months // 12, months % 12 + 1, 1)
