"""Reading amounts typed by people: '12.50', '-3', ' 7 ', and '1.234,50' where the decimal separator is a comma."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from moneykit.money import Money


def parse_amount(text: str, decimal_sep: str = ".") -> Decimal:
    """The amount `text` writes; `decimal_sep` is '.' or ','. ValueError when it is not a number."""
    if decimal_sep not in (".", ","):
        raise ValueError(f"decimal_sep must be '.' or ',', not {decimal_sep!r}")
    t = text.strip().replace(" ", "")
    if decimal_sep == ",":
        t = t.replace(".", "").replace(",", ".")
    try:
        return Decimal(t)
    except InvalidOperation:
        raise ValueError(f"not an amount: {text!r}") from None


def parse_money(text: str, currency: str = "USD", decimal_sep: str = ".") -> Money:
    """'12.50 EUR' or '12.50' (in `currency`)."""
    parts = text.split()
    if len(parts) == 2 and parts[1].isalpha():
        return Money(parse_amount(parts[0], decimal_sep), parts[1].upper())
    return Money(parse_amount(text, decimal_sep), currency)
