"""Calendar arithmetic: months, business days, a month as an interval."""

from __future__ import annotations

from datetime import date, timedelta

from spans.interval import Interval

ONE_DAY = timedelta(days=1)


def add_months(d: date, months: int) -> date:
    """The same day `months` later (earlier when negative); a day the target month lacks becomes its last day
    (31 January + 1 month = 28 or 29 February)."""
    total = d.year * 12 + d.month - 1 + months
    year, month = divmod(total, 12)
    return date(year, month + 1, d.day)


def month_span(d: date) -> Interval:
    """The month holding `d` as [first day, first day of the next month)."""
    first = d.replace(day=1)
    return Interval(first, add_months(first, 1))


def is_business_day(d: date) -> bool:
    return d.weekday() < 5


def business_days(start: date, end: date) -> int:
    """The business days in [start, end)."""
    count, d = 0, start
    while d < end:
        count += is_business_day(d)
        d += ONE_DAY
    return count
