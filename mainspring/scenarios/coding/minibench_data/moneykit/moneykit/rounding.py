"""Rounding decimal amounts to a currency's minor unit (cents, or none for yen)."""

from decimal import ROUND_HALF_EVEN, Decimal

MINOR_UNITS = {"USD": 2, "EUR": 2, "GBP": 2, "JPY": 0, "KWD": 3}


def quantum(currency: str) -> Decimal:
    """The smallest amount of the currency: 0.01 for USD, 1 for JPY, 0.001 for KWD."""
    return Decimal(1).scaleb(-MINOR_UNITS.get(currency, 2))


def round_minor(value: Decimal, currency: str = "USD") -> Decimal:
    """Round to the currency's minor unit, halves away from zero (commercial rounding)."""
    return Decimal(value).quantize(quantum(currency), rounding=ROUND_HALF_EVEN)
