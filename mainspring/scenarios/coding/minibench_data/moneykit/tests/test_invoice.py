from datetime import date

from moneykit import Money
from moneykit.fiscal import fiscal_quarter, fiscal_year, quarter_start
from moneykit.invoice import Invoice, quarterly_totals


def _invoice(number, issued, *prices):
    inv = Invoice(number, issued)
    for p in prices:
        inv.add("item", 1, Money(p))
    return inv


def test_invoice_total():
    inv = Invoice("A1", date(2024, 3, 1))
    inv.add("widget", 3, Money("1.10"))
    inv.add("bolt", 10, Money("0.05"))
    assert inv.total() == Money("3.80")


def test_fiscal_quarters_calendar_year():
    assert [fiscal_quarter(date(2024, m, 15)) for m in (1, 4, 7, 10, 12)] == [1, 2, 3, 4, 4]


def test_fiscal_quarters_april_start():
    assert fiscal_quarter(date(2024, 4, 1), start_month=4) == 1
    assert fiscal_quarter(date(2024, 3, 31), start_month=4) == 4
    assert fiscal_year(date(2024, 4, 1), start_month=4) == 2025
    assert fiscal_year(date(2024, 3, 31), start_month=4) == 2024
    assert quarter_start(2025, 2, start_month=4) == date(2024, 7, 1)


def test_quarterly_totals():
    invoices = [_invoice("A", date(2024, 1, 5), "10"), _invoice("B", date(2024, 2, 5), "5"),
                _invoice("C", date(2024, 8, 1), "1.50")]
    assert quarterly_totals(invoices) == {1: Money("15"), 3: Money("1.50")}
