# ruff: noqa: E501  (the edits are code quoted verbatim, at its own line lengths)
"""The spans tasks: each a problem statement, the gold edits and the hidden tests as (file, exact text or None to
append, replacement); build.py turns them into instances."""

TASKS = []

TASKS.append(dict(
    instance_id="spans-1", repo="spans", kind="off-by-one", difficulty="easy",
    problem_statement=(
        "Interval.contains() in spans/interval.py says the end of an interval is inside it: Interval(1, 4)"
        ".contains(4) is True. Intervals are half-open [start, end), so the end is outside, and month_span(d) "
        "must not contain the first day of the next month."),
    hints_text="",
    gold=[("spans/interval.py", "return self.start <= point <= self.end", "return self.start <= point < self.end")],
    tests=[("tests/test_interval.py", None, '''

def test_contains_excludes_the_end():
    assert not Interval(1, 4).contains(4)
    assert not Interval(2, 2).contains(2)
'''), ("tests/test_dates.py", None, '''

def test_month_span_excludes_the_next_month():
    span = month_span(date(2024, 2, 10))
    assert span.contains(date(2024, 2, 29)) and not span.contains(date(2024, 3, 1))
''')]))

TASKS.append(dict(
    instance_id="spans-2", repo="spans", kind="missing edge case", difficulty="easy",
    problem_statement=(
        "merge([]) in spans/merge.py raises IndexError, and so does gaps([], within). The union of no intervals "
        "is empty: merge([]) should be [] (also when every interval given is empty, like Interval(3, 3)), and "
        "gaps([], Interval(0, 10)) should be [Interval(0, 10)]."),
    hints_text="",
    gold=[("spans/merge.py", '''    ordered = sorted(iv for iv in intervals if not iv.empty)
''', '''    ordered = sorted(iv for iv in intervals if not iv.empty)
    if not ordered:
        return []
''')],
    tests=[("tests/test_interval.py", None, '''

def test_merge_nothing():
    assert merge([]) == []
    assert merge([Interval(3, 3)]) == []
    assert gaps([], Interval(0, 10)) == [Interval(0, 10)]
''')]))

TASKS.append(dict(
    instance_id="spans-3", repo="spans", kind="missing edge case", difficulty="medium",
    problem_statement=(
        "add_months() in spans/dates.py crashes at month ends: add_months(date(2024, 1, 31), 1) raises "
        "ValueError ('day is out of range for month') instead of returning 2024-02-29, as its docstring "
        "promises. A day the target month lacks must become that month's last day."),
    hints_text="calendar.monthrange(year, month)[1] is the number of days in a month.",
    gold=[("spans/dates.py", "from datetime import date, timedelta\n", "import calendar\nfrom datetime import date, timedelta\n"),
          ("spans/dates.py", "    return date(year, month + 1, d.day)\n",
           "    return date(year, month + 1, min(d.day, calendar.monthrange(year, month + 1)[1]))\n")],
    tests=[("tests/test_dates.py", None, '''

def test_add_months_clamps_to_the_month_end():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)
    assert add_months(date(2024, 3, 31), -1) == date(2024, 2, 29)
    assert add_months(date(2024, 5, 31), 1) == date(2024, 6, 30)
''')]))

TASKS.append(dict(
    instance_id="spans-4", repo="spans", kind="signature change across two files", difficulty="medium",
    problem_statement=(
        "Due dates ignore public holidays. Add a `holidays` argument (a collection of dates that are not "
        "business days; default: none) to is_business_day() and business_days(), and to due_date(), which must "
        "skip those days too."),
    hints_text="is_business_day and business_days are in spans/dates.py; due_date is in spans/schedule.py.",
    gold=[("spans/dates.py", "from datetime import date, timedelta\n", "from datetime import date, timedelta\nfrom typing import Collection\n"),
          ("spans/dates.py", '''def is_business_day(d: date) -> bool:
    return d.weekday() < 5


def business_days(start: date, end: date) -> int:''', '''def is_business_day(d: date, holidays: Collection[date] = ()) -> bool:
    return d.weekday() < 5 and d not in holidays


def business_days(start: date, end: date, holidays: Collection[date] = ()) -> int:'''),
          ("spans/dates.py", "count += is_business_day(d)", "count += is_business_day(d, holidays)"),
          ("spans/schedule.py", "from datetime import date\n", "from datetime import date\nfrom typing import Collection\n"),
          ("spans/schedule.py", "def due_date(start: date, days: int) -> date:",
           "def due_date(start: date, days: int, holidays: Collection[date] = ()) -> date:"),
          ("spans/schedule.py", "if is_business_day(d):", "if is_business_day(d, holidays):")],
    tests=[("tests/test_dates.py", None, '''

def test_holidays():
    juneteenth = date(2024, 6, 19)  # a Wednesday
    assert business_days(date(2024, 6, 17), date(2024, 6, 24), holidays={juneteenth}) == 4
    assert due_date(date(2024, 6, 18), 1, holidays={juneteenth}) == date(2024, 6, 20)
    assert due_date(date(2024, 6, 14), 5, holidays=[juneteenth]) == date(2024, 6, 24)
''')]))

TASKS.append(dict(
    instance_id="spans-5", repo="spans", kind="naive fix breaks a PASS_TO_PASS test", difficulty="medium",
    problem_statement=(
        "merge() in spans/merge.py does not join intervals that touch: merge([Interval(1, 3), Interval(3, 5)]) "
        "gives both back instead of [Interval(1, 5)], although its docstring says touching intervals become one."),
    hints_text="",
    gold=[("spans/merge.py", "        if last.overlaps(iv):\n", "        if iv.start <= last.end:  # overlapping or touching\n")],
    naive=[("spans/interval.py", "return self.start < other.end and other.start < self.end",
            "return self.start <= other.end and other.start <= self.end")],
    tests=[("tests/test_interval.py", None, '''

def test_merge_joins_touching_intervals():
    assert merge([Interval(3, 5), Interval(1, 3)]) == [Interval(1, 5)]
    assert merge([Interval(1, 3), Interval(3, 5), Interval(6, 7)]) == [Interval(1, 5), Interval(6, 7)]
''')]))
