"""What a given filing prints for a concept and period: the ledger as that filing presents it.

Two things make the same period print differently in different filings: a 2-for-1 split (filings for periods
from the split on restate every period's shares and EPS) and the 10-K/A (filings filed before it print the
original, mis-classified cost of revenue; the 10-K/A and later filings print the restated figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from mainspring.scenarios.finance.corpus.fiscal_calendar import Period, period_of
from mainspring.scenarios.finance.corpus.companies import CompanySpec, quarter_index
from mainspring.scenarios.finance.corpus.statements import Ledger

RESTATED = ("CostOfRevenue", "GrossProfit", "SellingGeneralAndAdministrativeExpense", "OperatingExpenses")
SHARE_CONCEPTS = ("WeightedAverageNumberOfSharesOutstandingBasic", "WeightedAverageNumberOfDilutedSharesOutstanding",
                  "EntityCommonStockSharesOutstanding")
EPS_CONCEPTS = ("EarningsPerShareBasic", "EarningsPerShareDiluted")


@dataclass(frozen=True)
class FilingView:
    quarter_index: int  # the filing's own period, 0 = FY2021 Q1
    filed: date


def quarters_of(label: str) -> list[int]:
    """Quarter indexes a label sums over (a flow) or ends at (the last one, for an instant)."""
    fy = int(label[2:6])
    if len(label) == 6:
        return [quarter_index(fy, q) for q in range(1, 5)]
    q = int(label[7])
    if label.endswith("YTD"):
        return [quarter_index(fy, k) for k in range(1, q + 1)]
    return [quarter_index(fy, q)]


class CompanyView:
    def __init__(self, spec: CompanySpec, led: Ledger, restatement_filed: date | None) -> None:
        self.spec, self.led, self.restatement_filed = spec, led, restatement_filed
        self.reclass = 0
        if spec.restates is not None:  # an expense mis-classified as SG&A in the restated year's fourth quarter
            self.reclass = round(led.flows["SellingGeneralAndAdministrativeExpense"][quarter_index(spec.restates, 4)]
                                 * 0.12)

    def period(self, label: str, instant: bool) -> Period:
        return period_of(self.spec.fiscal_year_end, label, instant)

    def split_factor(self, view: FilingView) -> int:
        s = self.spec.split_at
        return 2 if s is not None and view.quarter_index >= quarter_index(*s) else 1

    def original(self, view: FilingView) -> bool:
        return self.restatement_filed is not None and view.filed < self.restatement_filed

    def flow(self, concept: str, label: str, view: FilingView) -> int:
        qs = quarters_of(label)
        val = sum(self.led.flows[concept][i] for i in qs)
        if concept in RESTATED and self.spec.restates is not None and self.original(view) \
                and quarter_index(self.spec.restates, 4) in qs:
            val += -self.reclass if concept == "CostOfRevenue" else self.reclass
        return val

    def instant(self, concept: str, label: str) -> int:
        return self.led.instants[concept][quarters_of(label)[-1]]

    def shares(self, concept: str, label: str, view: FilingView) -> int:
        qs = quarters_of(label)
        if concept == "EntityCommonStockSharesOutstanding":
            series = self.led.outstanding_shares
            return series[qs[-1]] * self.split_factor(view)
        series = self.led.basic_shares if concept.endswith("Basic") else self.led.diluted_shares
        return round(sum(series[i] for i in qs) / len(qs)) * self.split_factor(view)

    def eps(self, concept: str, label: str, view: FilingView) -> float:
        shares_concept = SHARE_CONCEPTS[0] if concept.endswith("Basic") else SHARE_CONCEPTS[1]
        return round(self.flow("NetIncomeLoss", label, view) / self.shares(shares_concept, label, view), 2)
