"""Splitting an amount into parts that add up exactly."""

from __future__ import annotations

from decimal import ROUND_HALF_UP

from moneykit.money import Money
from moneykit.rounding import quantum


def allocate(total: Money, parts: int) -> list[Money]:
    """Split `total` into `parts` amounts of whole minor units that sum to it exactly and differ by at most one
    unit; the first amounts get the extra units (100.00 in 3: 33.34, 33.33, 33.33)."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    q = quantum(total.currency)
    units = int((total.amount / q).to_integral_value(rounding=ROUND_HALF_UP))
    base, extra = divmod(units, parts)
    return [Money((base + (1 if i <= extra else 0)) * q, total.currency) for i in range(parts)]
