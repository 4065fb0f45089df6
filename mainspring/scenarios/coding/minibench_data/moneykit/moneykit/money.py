"""Money: a decimal amount in a currency. Arithmetic keeps full precision; `rounded()` goes to the minor unit."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from moneykit.rounding import round_minor


@dataclass(frozen=True)
class Money:
    amount: Decimal
    currency: str = "USD"

    def __post_init__(self) -> None:
        object.__setattr__(self, "amount", Decimal(str(self.amount)))

    def _check(self, other: Money) -> None:
        if not isinstance(other, Money):
            raise TypeError(f"cannot combine Money with {type(other).__name__}")
        if other.currency != self.currency:
            raise ValueError(f"currency mismatch: {self.currency} and {other.currency}")

    def __add__(self, other: Money) -> Money:
        self._check(other)
        return Money(self.amount + other.amount, self.currency)

    def __sub__(self, other: Money) -> Money:
        self._check(other)
        return Money(self.amount - other.amount, self.currency)

    def __mul__(self, factor: int | Decimal | str) -> Money:
        return Money(self.amount * Decimal(str(factor)), self.currency)

    def __neg__(self) -> Money:
        return Money(-self.amount, self.currency)

    def rounded(self) -> Money:
        return Money(round_minor(self.amount, self.currency), self.currency)

    def __str__(self) -> str:
        return f"{self.amount} {self.currency}"
