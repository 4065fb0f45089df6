"""How questions name metrics and periods, and how answers are written, the way an analyst would."""

from __future__ import annotations

from mainspring.scenarios.finance.corpus.builders import long_date
from mainspring.scenarios.finance.corpus.fiscal_calendar import period_of

METRIC = {
    "Revenues": "revenue", "CostOfRevenue": "cost of revenue", "GrossProfit": "gross profit",
    "ResearchAndDevelopmentExpense": "research and development expense",
    "SellingGeneralAndAdministrativeExpense": "selling, general and administrative expense",
    "OperatingExpenses": "total operating expenses", "OperatingIncomeLoss": "operating income",
    "InterestExpense": "interest expense", "IncomeTaxExpenseBenefit": "provision for income taxes",
    "NetIncomeLoss": "net income", "EarningsPerShareBasic": "basic earnings per share",
    "EarningsPerShareDiluted": "diluted earnings per share",
    "WeightedAverageNumberOfSharesOutstandingBasic": "basic weighted-average share count",
    "WeightedAverageNumberOfDilutedSharesOutstanding": "diluted weighted-average share count",
    "DepreciationDepletionAndAmortization": "depreciation and amortization",
    "ShareBasedCompensation": "share-based compensation expense",
    "NetCashProvidedByUsedInOperatingActivities": "cash from operating activities",
    "PaymentsToAcquirePropertyPlantAndEquipment": "capital expenditures",
    "CashAndCashEquivalentsAtCarryingValue": "cash and cash equivalents",
    "AccountsReceivableNetCurrent": "accounts receivable", "InventoryNet": "inventory",
    "AssetsCurrent": "total current assets", "Assets": "total assets",
    "LiabilitiesCurrent": "total current liabilities", "LongTermDebtNoncurrent": "long-term debt",
    "Liabilities": "total liabilities", "StockholdersEquity": "total stockholders' equity",
    "EntityCommonStockSharesOutstanding": "shares of common stock outstanding",
}
ORDINAL = {1: "first", 2: "second", 3: "third", 4: "fourth"}


def period_words(label: str) -> str:
    """'fiscal 2023', 'the fiscal 2023 second quarter', 'the first six months of fiscal 2023'."""
    fy = label[2:6]
    if len(label) == 6:
        return f"fiscal {fy}"
    q = int(label[7])
    if label.endswith("YTD"):
        return f"the first {['three', 'six', 'nine', 'twelve'][q - 1]} months of fiscal {fy}"
    return f"the fiscal {fy} {ORDINAL[q]} quarter"


def instant_words(fiscal_year_end: str, label: str) -> str:
    end = period_of(fiscal_year_end, label, True).end
    return f"as of {long_date(end)} (the end of {period_words(label)})"


def usd_text(val: float) -> tuple[str, str]:
    sign = "-" if val < 0 else ""
    if abs(val) >= 1e9:
        return f"{sign}${abs(val) / 1e9:,.2f} billion", "billion"
    return f"{sign}${abs(val) / 1e6:,.1f} million", "million"


def answer_text(val: float, unit: str) -> tuple[str, str]:
    """(answer_text, scale) for a value in whole units."""
    if unit == "USD":
        return usd_text(val)
    if unit == "USD/shares":
        return f"{'-' if val < 0 else ''}${abs(val):.2f}", ""
    if unit == "shares":
        return f"{val / 1e6:,.2f} million shares", "million"
    if unit == "percent":
        return f"{val:.1f}%", "percent"
    return f"{val:.2f}", ""
