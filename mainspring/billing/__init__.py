"""Billing: price sheets, the normalised usage record, the ledger, budgets, API keys and reports.

Money is integer micro-USD everywhere (1 USD = 1_000_000); prices are decimal strings per 1M tokens.
"""

from mainspring.billing.budgets import BudgetExceeded, Reservation, reserve, settle
from mainspring.billing.prices import Cost, PriceError, PriceSheet, UnknownModel, UnknownTier, load_price_sheet, price
from mainspring.billing.usage import UsageRecord, from_anthropic, from_engine, from_openai

__all__ = [
    "BudgetExceeded", "Cost", "PriceError", "PriceSheet", "Reservation", "UnknownModel", "UnknownTier",
    "UsageRecord", "from_anthropic", "from_engine", "from_openai", "load_price_sheet", "price", "reserve", "settle",
]
