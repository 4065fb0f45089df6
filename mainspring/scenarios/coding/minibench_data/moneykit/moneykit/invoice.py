"""Invoices: lines of quantity x unit price, each rounded to the minor unit, and quarterly totals."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

from moneykit.fiscal import fiscal_quarter
from moneykit.money import Money
from moneykit.split import allocate


@dataclass
class Line:
    description: str
    quantity: int
    unit_price: Money

    def total(self) -> Money:
        return (self.unit_price * self.quantity).rounded()


@dataclass
class Invoice:
    number: str
    issued: date
    currency: str = "USD"
    lines: list[Line] = field(default_factory=list)

    def add(self, description: str, quantity: int, unit_price: Money) -> Line:
        if unit_price.currency != self.currency:
            raise ValueError(f"invoice {self.number} is in {self.currency}, not {unit_price.currency}")
        line = Line(description, quantity, unit_price)
        self.lines.append(line)
        return line

    def total(self) -> Money:
        out = Money(0, self.currency)
        for line in self.lines:
            out = out + line.total()
        return out

    def split(self, parts: int) -> list[Money]:
        return allocate(self.total(), parts)


def quarterly_totals(invoices: list[Invoice], start_month: int = 1) -> dict[int, Money]:
    """Each fiscal quarter's total of the invoices issued in it, by quarter, in order."""
    out: dict[int, Money] = {}
    for inv in invoices:
        q = fiscal_quarter(inv.issued, start_month)
        out[q] = out[q] + inv.total() if q in out else inv.total()
    return dict(sorted(out.items()))
