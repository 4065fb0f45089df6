"""facts.json in the SEC company-facts shape, collected from what each filing prints, and an index of the same
facts (with the doc_id and page that print them) for the question generator."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date
from typing import Any

from mainspring.scenarios.finance.corpus.builders import BALANCE, CASH, INCOME
from mainspring.scenarios.finance.corpus.fiscal_calendar import Period, calendar_frame
from mainspring.scenarios.finance.corpus.document import Document, PrintedFact
from mainspring.scenarios.finance.corpus.schedule import PlannedFiling

LABELS = {c: name for name, c in (*INCOME, *BALANCE, *CASH)}
LABELS["EntityCommonStockSharesOutstanding"] = "Entity common stock, shares outstanding"


@dataclass(frozen=True)
class Reported:
    """One value one filing printed."""

    val: int | float
    accn: str
    filed: date
    form: str
    doc_id: str
    page: int


FactKey = tuple[str, str, date | None, date]  # concept, unit, start, end


class FactIndex:
    def __init__(self) -> None:
        self.by_key: dict[FactKey, list[Reported]] = defaultdict(list)
        self.passages: dict[tuple[str, str, str], tuple[int, str]] = {}  # (doc_id, concept, label) -> page, text

    def add(self, f: PlannedFiling, doc: Document) -> None:
        for fact, page in doc.printed():
            self.by_key[(fact.concept, fact.unit, fact.period.start, fact.period.end)].append(
                Reported(fact.val, f.accn, f.filed, f.form, f.doc_id, page))
        for (concept, label), passage in doc.passages.items():
            self.passages[(f.doc_id, concept, label)] = passage

    def reports(self, key: FactKey) -> list[Reported]:
        return sorted(self.by_key.get(key, []), key=lambda r: (r.filed, r.accn))

    def latest(self, key: FactKey) -> Reported | None:
        rs = self.reports(key)
        return rs[-1] if rs else None


def company_facts(cik: str, name: str, printed: list[tuple[PlannedFiling, PrintedFact]]) -> dict[str, Any]:
    """The companyfacts JSON: one entry per (filing, concept, period); the latest-filed entry of a period gets
    the SEC `frame`, as data.sec.gov frames one value per period."""
    facts: dict[str, dict[str, Any]] = {"us-gaap": {}, "dei": {}}
    entries: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    seen: set[tuple[str, str, date | None, date, str]] = set()
    for f, fact in printed:
        key = (fact.concept, fact.unit, fact.period.start, fact.period.end, f.accn)
        if key in seen:
            continue
        seen.add(key)
        e: dict[str, Any] = {}
        if fact.period.start is not None:
            e["start"] = fact.period.start.isoformat()
        e.update(end=fact.period.end.isoformat(), val=fact.val, accn=f.accn, fy=f.fy, fp=f.fp, form=f.form,
                 filed=f.filed.isoformat())
        ns, concept = fact.concept.split(":")
        entries[(ns, concept, fact.unit)].append(e)
    for (ns, concept, unit), rows in sorted(entries.items()):
        by_period: dict[tuple[str | None, str], dict[str, Any]] = {}
        for e in rows:
            k = (e.get("start"), e["end"])
            if k not in by_period or (e["filed"], e["accn"]) > (by_period[k]["filed"], by_period[k]["accn"]):
                by_period[k] = e
        for (start, end), e in by_period.items():
            frame = calendar_frame(Period("", date.fromisoformat(start) if start else None, date.fromisoformat(end)))
            if frame:
                e["frame"] = frame
        label = LABELS.get(concept, concept)
        node = facts[ns].setdefault(concept, {"label": label, "description": f"{label}, as reported.", "units": {}})
        node["units"][unit] = sorted(rows, key=lambda e: (e["end"], e.get("start") or "", e["filed"], e["accn"]))
    return {"cik": int(cik), "entityName": name, "facts": facts}
