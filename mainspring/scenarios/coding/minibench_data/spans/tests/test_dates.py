from datetime import date

from spans import Interval
from spans.dates import add_months, business_days, month_span
from spans.schedule import due_date


def test_add_months():
    assert add_months(date(2024, 1, 15), 1) == date(2024, 2, 15)
    assert add_months(date(2024, 11, 3), 3) == date(2025, 2, 3)
    assert add_months(date(2024, 3, 10), -3) == date(2023, 12, 10)


def test_month_span():
    assert month_span(date(2024, 2, 10)) == Interval(date(2024, 2, 1), date(2024, 3, 1))


def test_business_days():
    # Monday 2024-06-03 to Monday 2024-06-10: five weekdays
    assert business_days(date(2024, 6, 3), date(2024, 6, 10)) == 5


def test_due_date_skips_weekends():
    assert due_date(date(2024, 6, 7), 1) == date(2024, 6, 10)  # Friday + 1 business day = Monday
    assert due_date(date(2024, 6, 3), 0) == date(2024, 6, 3)
