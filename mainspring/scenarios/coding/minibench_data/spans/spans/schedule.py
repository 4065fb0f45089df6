"""Due dates counted in business days."""

from __future__ import annotations

from datetime import date

from spans.dates import ONE_DAY, is_business_day


def due_date(start: date, days: int) -> date:
    """The date `days` business days after `start` (start itself does not count)."""
    if days < 0:
        raise ValueError("days must not be negative")
    d, left = start, days
    while left > 0:
        d += ONE_DAY
        if is_business_day(d):
            left -= 1
    return d
