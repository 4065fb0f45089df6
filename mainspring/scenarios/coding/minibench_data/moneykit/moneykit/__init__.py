"""moneykit: amounts of money in a currency, rounded to its minor unit, split, parsed and reported by fiscal quarter."""

from moneykit.money import Money
from moneykit.rounding import round_minor

__all__ = ["Money", "round_minor"]
