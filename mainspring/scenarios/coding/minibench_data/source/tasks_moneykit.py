# ruff: noqa: E501  (the edits are code quoted verbatim, at its own line lengths)
"""The moneykit tasks: each a problem statement, the gold edits and the hidden tests as (file, exact text or None to
append, replacement); build.py turns them into instances."""

TASKS = []

TASKS.append(dict(
    instance_id="moneykit-1", repo="moneykit", kind="rounding mode", difficulty="easy",
    problem_statement=(
        "round_minor() in moneykit/rounding.py rounds halves to even: Decimal('2.675') becomes 2.67 and "
        "Decimal('0.125') becomes 0.12. Invoices need commercial rounding, as its docstring says: halves go away "
        "from zero, so 2.675 -> 2.68, 0.125 -> 0.13 and -0.125 -> -0.13."),
    hints_text="Decimal's rounding modes: ROUND_HALF_UP rounds halves away from zero.",
    gold=[("moneykit/rounding.py", "from decimal import ROUND_HALF_EVEN, Decimal", "from decimal import ROUND_HALF_UP, Decimal"),
          ("moneykit/rounding.py", "rounding=ROUND_HALF_EVEN)", "rounding=ROUND_HALF_UP)")],
    tests=[("tests/test_money.py", None, '''

def test_round_minor_halves_away_from_zero():
    assert round_minor(Decimal("2.675")) == Decimal("2.68")
    assert round_minor(Decimal("0.125")) == Decimal("0.13")
    assert round_minor(Decimal("-0.125")) == Decimal("-0.13")
    assert round_minor(Decimal("0.0005"), "KWD") == Decimal("0.001")


def test_line_totals_round_half_up():
    from datetime import date

    from moneykit.invoice import Invoice

    inv = Invoice("R1", date(2024, 5, 1))
    inv.add("fee", 1, Money("0.125"))
    assert inv.total() == Money("0.13")
''')]))

TASKS.append(dict(
    instance_id="moneykit-2", repo="moneykit", kind="off-by-one", difficulty="easy",
    problem_statement=(
        "allocate(Money('100'), 3) in moneykit/split.py returns 33.34, 33.34, 33.33, which adds up to 100.01, and "
        "allocate(Money('9'), 3) gives 3.01, 3.00, 3.00. The parts must add up to the total exactly: only the "
        "first `remainder` parts get one extra cent. Invoice.split() uses it too."),
    hints_text="",
    gold=[("moneykit/split.py", "(1 if i <= extra else 0)", "(1 if i < extra else 0)")],
    tests=[("tests/test_money.py", None, '''

def test_allocate_sums_to_the_total():
    assert allocate(Money("100"), 3) == [Money("33.34"), Money("33.33"), Money("33.33")]
    assert allocate(Money("9"), 3) == [Money("3"), Money("3"), Money("3")]
    for total in ("0.05", "10", "99.99", "1234.57"):
        for parts in (1, 2, 3, 7):
            amounts = [m.amount for m in allocate(Money(total), parts)]
            assert sum(amounts) == Decimal(total)
            assert max(amounts) - min(amounts) <= Decimal("0.01")
'''), ("tests/test_invoice.py", None, '''

def test_invoice_split():
    inv = _invoice("S", date(2024, 1, 1), "10")
    assert inv.split(4) == [Money("2.50")] * 4
''')]))

TASKS.append(dict(
    instance_id="moneykit-3", repo="moneykit", kind="missing edge case", difficulty="easy",
    problem_statement=(
        "sum() does not work on Money: sum([Money('1'), Money('2')]) raises TypeError ('cannot combine Money "
        "with int') because sum() starts from 0. Make sum() of a list of Money work (in any one currency). "
        "Adding any other number to Money must still raise TypeError, and mixing currencies ValueError."),
    hints_text="int + Money calls Money.__radd__.",
    gold=[("moneykit/money.py", '''    def __sub__(self, other: Money) -> Money:''', '''    def __radd__(self, other: object) -> Money:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:  # sum() starts from 0
            return self
        return self.__add__(other)  # type: ignore[arg-type]

    def __sub__(self, other: Money) -> Money:''')],
    tests=[("tests/test_money.py", None, '''

def test_sum_of_money():
    assert sum([Money("1.10"), Money("2.20"), Money("0.05")]) == Money("3.35")
    assert sum([Money("5", "EUR")]) == Money("5", "EUR")
    with pytest.raises(TypeError):
        5 + Money("1")
    with pytest.raises(ValueError):
        sum([Money("1", "USD"), Money("1", "EUR")])
''')]))

TASKS.append(dict(
    instance_id="moneykit-4", repo="moneykit", kind="signature change across two files", difficulty="medium",
    problem_statement=(
        "Quarters of different fiscal years are added together: quarterly_totals() keys its totals by the quarter "
        "number alone, so Q1 2024 and Q1 2025 end up in one sum. Change fiscal_quarter(d, start_month) to return "
        "a (fiscal_year, quarter) tuple instead of the quarter alone, and key quarterly_totals() by that tuple, in "
        "order."),
    hints_text="fiscal_quarter is in moneykit/fiscal.py; quarterly_totals is in moneykit/invoice.py.",
    gold=[("moneykit/fiscal.py", '''def fiscal_quarter(d: date, start_month: int = 1) -> int:
    """The quarter (1..4) of its fiscal year that holds `d`."""
    _check(start_month)
    return (d.month - start_month) % 12 // 3 + 1''', '''def fiscal_quarter(d: date, start_month: int = 1) -> tuple[int, int]:
    """The fiscal year that holds `d`, and the quarter (1..4) of it."""
    _check(start_month)
    return fiscal_year(d, start_month), (d.month - start_month) % 12 // 3 + 1'''),
          ("moneykit/invoice.py", '''def quarterly_totals(invoices: list[Invoice], start_month: int = 1) -> dict[int, Money]:
    """Each fiscal quarter's total of the invoices issued in it, by quarter, in order."""
    out: dict[int, Money] = {}''', '''def quarterly_totals(invoices: list[Invoice], start_month: int = 1) -> dict[tuple[int, int], Money]:
    """Each fiscal quarter's total of the invoices issued in it, by (fiscal year, quarter), in order."""
    out: dict[tuple[int, int], Money] = {}''')],
    tests=[("tests/test_invoice.py", "== [1, 2, 3, 4, 4]", "== [(2024, 1), (2024, 2), (2024, 3), (2024, 4), (2024, 4)]"),
           ("tests/test_invoice.py", "fiscal_quarter(date(2024, 4, 1), start_month=4) == 1",
            "fiscal_quarter(date(2024, 4, 1), start_month=4) == (2025, 1)"),
           ("tests/test_invoice.py", "fiscal_quarter(date(2024, 3, 31), start_month=4) == 4",
            "fiscal_quarter(date(2024, 3, 31), start_month=4) == (2024, 4)"),
           ("tests/test_invoice.py", '{1: Money("15"), 3: Money("1.50")}', '{(2024, 1): Money("15"), (2024, 3): Money("1.50")}'),
           ("tests/test_invoice.py", None, '''

def test_quarterly_totals_keep_years_apart():
    invoices = [_invoice("A", date(2024, 1, 5), "10"), _invoice("B", date(2025, 1, 5), "5"),
                _invoice("C", date(2024, 12, 1), "2")]
    assert quarterly_totals(invoices) == {(2024, 1): Money("10"), (2024, 4): Money("2"), (2025, 1): Money("5")}
    assert list(quarterly_totals(invoices, start_month=4)) == [(2024, 4), (2025, 3), (2025, 4)]
''')]))

TASKS.append(dict(
    instance_id="moneykit-5", repo="moneykit", kind="naive fix breaks a PASS_TO_PASS test", difficulty="medium",
    problem_statement=(
        "parse_amount('1,234.50') in moneykit/parse.py raises ValueError: amounts written with thousands "
        "separators cannot be read. Accept them: '1,234.50' -> 1234.50 and '12,000' -> 12000, through "
        "parse_money() as well."),
    hints_text="",
    gold=[("moneykit/parse.py", '''        t = t.replace(".", "").replace(",", ".")
''', '''        t = t.replace(".", "").replace(",", ".")
    else:  # ',' separates thousands
        t = t.replace(",", "")
''')],
    naive=[("moneykit/parse.py", '''    t = text.strip().replace(" ", "")
''', '''    t = text.strip().replace(" ", "").replace(",", "")
''')],
    tests=[("tests/test_money.py", None, '''

def test_parse_amount_thousands_separators():
    assert parse_amount("1,234.50") == Decimal("1234.50")
    assert parse_amount("12,000") == Decimal("12000")
    assert parse_money("1,000.25 USD") == Money("1000.25")
''')]))
