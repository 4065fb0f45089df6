"""Evidence for a question: a FactRef to the fact, the filing and page that print it, the passage that states
it where one does, and its value, so each question's answer is computed from the very facts it cites."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mainspring.scenarios.finance.corpus.statements import INSTANTS
from mainspring.scenarios.finance.corpus_format import Evidence, FactRef
from mainspring.scenarios.finance.filings import fact_id_of

if TYPE_CHECKING:
    from mainspring.scenarios.finance.corpus.generate import CompanyData


def unit_of(concept: str) -> str:
    if concept.startswith("EarningsPerShare"):
        return "USD/shares"
    if "Shares" in concept:
        return "shares"
    return "USD"


def qualified(concept: str) -> str:
    return f"{'dei' if concept == 'EntityCommonStockSharesOutstanding' else 'us-gaap'}:{concept}"


def is_instant(concept: str) -> bool:
    return concept in INSTANTS or concept == "EntityCommonStockSharesOutstanding"


@dataclass
class Ref:
    evidence: Evidence
    val: float

    @property
    def fact_id(self) -> str:
        assert self.evidence.fact is not None and self.evidence.fact.fact_id is not None
        return self.evidence.fact.fact_id


def ref(cd: CompanyData, concept: str, label: str, accn: str | None = None) -> Ref | None:
    """The fact `concept` for `label` as of the latest filing (accn None) or as filing `accn` printed it."""
    if is_instant(concept) and label.endswith("Q4"):
        label = label[:6]  # a balance at the fourth quarter's end is the fiscal year's: FY2023Q4 -> FY2023
    p = cd.view.period(label, is_instant(concept))
    key = (qualified(concept), unit_of(concept), p.start, p.end)
    reports = cd.index.reports(key)
    if accn is not None:
        reports = [r for r in reports if r.accn == accn]
    if not reports:
        return None
    r = reports[-1]
    page, text = cd.index.passages.get((r.doc_id, qualified(concept), label), (r.page, ""))
    fact = FactRef(cik=cd.spec.cik, concept=qualified(concept), period=label, unit=unit_of(concept),  # type: ignore[arg-type]
                   accn=accn, fact_id=fact_id_of(cd.spec.cik, qualified(concept), unit_of(concept),
                                                 p.start.isoformat() if p.start else None, p.end.isoformat(),
                                                 r.accn))
    return Ref(Evidence(doc_id=r.doc_id, page=page, fact=fact, text=text), float(r.val))
