"""Which filings each company files, when, and under which accession number and doc_id."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

from mainspring.scenarios.finance.corpus.fiscal_calendar import quarter_end
from mainspring.scenarios.finance.corpus.companies import FISCAL_YEARS, CompanySpec, quarter_index


@dataclass(frozen=True)
class PlannedFiling:
    doc_id: str
    form: str
    fy: int
    quarter: int  # 1-4; a 10-K and its 10-K/A: 4
    period_end: date
    filed: date
    accn: str
    amends: str | None
    format: str

    @property
    def fp(self) -> str:
        return "FY" if self.form in ("10-K", "10-K/A") else f"Q{self.quarter}"

    @property
    def qi(self) -> int:
        return quarter_index(self.fy, self.quarter)


def plan_filings(spec: CompanySpec) -> list[PlannedFiling]:
    rows: list[tuple[str, int, int, date, date]] = []
    for fy in FISCAL_YEARS:
        for q in range(1, 5):
            end = quarter_end(spec.fiscal_year_end, fy, q)
            rows.append(("8-K", fy, q, end, end + timedelta(days=28)))
            if q < 4:
                rows.append(("10-Q", fy, q, end, end + timedelta(days=40)))
            else:
                rows.append(("10-K", fy, q, end, end + timedelta(days=60)))
                if spec.restates == fy:
                    rows.append(("10-K/A", fy, q, end, end + timedelta(days=150)))
    rows.sort(key=lambda r: (r[4], r[0]))
    out: list[PlannedFiling] = []
    accns: dict[tuple[str, int], str] = {}
    for seq, (form, fy, q, end, filed) in enumerate(rows, start=1):
        accn = f"{spec.cik}-{filed.year % 100:02d}-{seq:06d}"
        accns[(form, fy)] = accn
        tag = {"8-K": "8K", "10-Q": "10Q", "10-K": "10K", "10-K/A": "10KA"}[form]
        period = f"FY{fy}Q{q}" if form in ("8-K", "10-Q") else f"FY{fy}"
        fmt = spec.ten_k_format if form == "10-K" else "md" if form == "10-K/A" else spec.other_format
        out.append(PlannedFiling(f"{spec.ticker}-{tag}-{period}", form, fy, q, end, filed, accn,
                                 accns[("10-K", fy)] if form == "10-K/A" else None, fmt))
    return out
