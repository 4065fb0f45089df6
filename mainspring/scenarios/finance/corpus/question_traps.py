"""Trap questions: each one is easy to get wrong by reading the first matching number — a restated figure, a
pre-split share count, a table in millions, a fiscal quarter that is not the calendar quarter, a non-GAAP line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mainspring.scenarios.finance.corpus.builders import long_date
from mainspring.scenarios.finance.corpus.question_refs import ref
from mainspring.scenarios.finance.corpus.wording import METRIC, period_words

if TYPE_CHECKING:
    from mainspring.scenarios.finance.corpus.generate import CompanyData
    from mainspring.scenarios.finance.corpus.questions import QuestionMaker

KINDS = ("restatement", "amendment", "split", "scale", "fiscal_year", "non_gaap")


class TrapMaker:
    def __init__(self, m: QuestionMaker) -> None:
        self.m, self.rng = m, m.rng

    def with_trait(self, attr: str) -> CompanyData:
        return next(c for c in self.m.data if getattr(c.spec, attr) not in (None, "1231", 1000))

    def one(self, attempt: int) -> None:
        getattr(self, KINDS[attempt % len(KINDS)])()

    def accn_of(self, cd: CompanyData, form: str, fy: int) -> str:
        return next(f.accn for f in cd.filings if f.form == form and f.fy == fy)

    def restatement(self) -> None:
        cd = self.with_trait("restates")
        fy = cd.spec.restates
        assert fy is not None
        concept = self.rng.choice(["CostOfRevenue", "GrossProfit", "SellingGeneralAndAdministrativeExpense"])
        label = self.rng.choice([f"FY{fy}", f"FY{fy}Q4"])
        amended = self.accn_of(cd, "10-K/A", fy)
        if self.rng.random() < 0.5:
            r = ref(cd, concept, label, amended)
            if r is None:
                return
            self.m.add("trap", [cd], f"The 10-K/A ({amended}) restates fiscal {fy}; use its figure, not the "
                       "original 10-K's.", f"What was {cd.spec.possessive} {METRIC[concept]} for "
                       f"{period_words(label)}, as restated?", [r], "#0", "USD", trap="restatement")
            return
        new, old = ref(cd, concept, f"FY{fy}", amended), ref(cd, concept, f"FY{fy}", self.accn_of(cd, "10-K", fy))
        if new is None or old is None:
            return
        self.m.add("trap", [cd], "Restated (10-K/A) minus originally reported (10-K).",
                   f"By how much did the restatement change {cd.spec.possessive} reported {METRIC[concept]} for "
                   f"fiscal {fy}?", [new, old], "subtract(#0, #1)", "USD",
                   trap="restatement")

    def amendment(self) -> None:
        cd = self.with_trait("restates")
        fy = cd.spec.restates
        assert fy is not None
        concept = self.rng.choice(["CostOfRevenue", "GrossProfit", "OperatingExpenses",
                                   "SellingGeneralAndAdministrativeExpense"])
        annual = self.rng.random() < 0.5
        label = f"FY{fy}" if annual else f"FY{fy}Q4"
        original = self.accn_of(cd, "10-K" if annual else "8-K", fy)
        form = f"fiscal {fy} Form 10-K" if annual else f"fiscal {fy} fourth-quarter earnings release"
        r = ref(cd, concept, label, original)
        if r is None:
            return
        self.m.add("trap", [cd], f"The question asks for the figure as first filed ({original}), which the 10-K/A "
                   "later amended.", f"As originally reported in its {form}, before the amendment, what was "
                   f"{cd.spec.possessive} {METRIC[concept]} for {period_words(label)}?", [r], "#0",
                   "USD", trap="amendment")

    def split(self) -> None:
        cd = self.with_trait("split_at")
        assert cd.spec.split_at is not None
        split_fy, split_q = cd.spec.split_at
        concept = self.rng.choice(["EarningsPerShareDiluted", "WeightedAverageNumberOfDilutedSharesOutstanding",
                                   "EarningsPerShareBasic"])
        before = [f"FY{y}" for y in range(2022, split_fy)] + \
            [f"FY{y}Q{q}" for y in range(2022, split_fy + 1) for q in range(1, 5) if (y, q) < (split_fy, split_q)]
        label = self.rng.choice(before)
        fy = int(label[2:6])
        unit = "USD/shares" if concept.startswith("Earnings") else "shares"
        if self.rng.random() < 0.6:
            r = ref(cd, concept, label)
            if r is None:
                return
            self.m.add("trap", [cd], f"A 2-for-1 split took effect in fiscal {cd.spec.split_at[0]}; later filings "
                       "restate earlier periods, so use the latest (split-adjusted) figure.",
                       f"On a split-adjusted basis, what was {cd.spec.possessive} {METRIC[concept]} for "
                       f"{period_words(label)}?", [r], "#0", unit, trap="split")
            return
        first = next((f for f in cd.filings if ((len(label) == 6 and f.form == "10-K" and f.fy == fy)
                           or (len(label) > 6 and f.form == "8-K" and f.fy == fy and f.quarter == int(label[7])))),
                     None)
        r = ref(cd, concept, label, first.accn) if first else None
        if r is None or first is None:
            return
        self.m.add("trap", [cd], f"Before the 2-for-1 split; {first.doc_id} reported it on the pre-split basis.",
                   f"As originally reported (before the stock split), what was {cd.spec.possessive} "
                   f"{METRIC[concept]} for {period_words(label)}?", [r], "#0", unit, trap="split")

    def scale(self) -> None:
        cd = self.with_trait("scale")
        concept = self.rng.choice(["Revenues", "NetIncomeLoss", "Assets", "LongTermDebtNoncurrent"])
        label = f"FY{self.rng.choice((2022, 2023, 2024))}"
        r = ref(cd, concept, label)
        if r is None:
            return
        self.m.add("trap", [cd], "The tables are in millions of dollars: multiply the printed figure by 1,000,000.",
                   f"In dollars, what was {cd.spec.possessive} {METRIC[concept]} for fiscal {label[2:]}?", [r], "#0",
                   "USD", trap="scale")

    def fiscal_year(self) -> None:
        cd = self.with_trait("fiscal_year_end")
        if self.rng.random() < 0.6:
            label = f"FY{self.rng.choice((2022, 2023, 2024))}Q{self.rng.randint(1, 4)}"
            end = cd.view.period(label, False).end
            r = ref(cd, "Revenues", label)
            if r is None:
                return
            self.m.add("trap", [cd], f"The fiscal year ends June 30, so the quarter ended {long_date(end)} is "
                       f"{period_words(label)}.", f"What was {cd.spec.possessive} revenue for the three months "
                       f"ended {long_date(end)}?", [r], "#0", "USD", trap="fiscal_year")
            return
        year = self.rng.choice((2022, 2023))
        labels = [f"FY{year}Q3", f"FY{year}Q4", f"FY{year + 1}Q1", f"FY{year + 1}Q2"]
        refs = [ref(cd, "Revenues", lab) for lab in labels]
        found = [r for r in refs if r is not None]
        if len(found) != 4:
            return
        program = "add(add(add(#0, #1), #2), #3)"
        self.m.add("trap", [cd], f"Calendar {year} spans fiscal {year} Q3-Q4 and fiscal {year + 1} Q1-Q2 (fiscal "
                   "year ends June 30): add those four quarters.", f"What was {cd.spec.possessive} revenue for "
                   f"calendar year {year} (January 1 to December 31, {year})?", found, program,
                   "USD", trap="fiscal_year")

    def non_gaap(self) -> None:
        cd = self.rng.choice(self.m.data)
        label = f"FY{self.rng.choice((2022, 2023, 2024))}Q{self.rng.randint(1, 3)}"
        if self.rng.random() < 0.5:
            r = ref(cd, "OperatingIncomeLoss", label)
            if r is None:
                return
            self.m.add("trap", [cd], "The release shows Adjusted EBITDA (non-GAAP) next to GAAP figures; the "
                       "question asks for GAAP operating income.", f"What was {cd.spec.possessive} GAAP operating "
                       f"income (not Adjusted EBITDA) for {period_words(label)}?", [r], "#0", "USD",
                       trap="non_gaap")
            return
        refs = [ref(cd, c, label) for c in ("OperatingIncomeLoss", "DepreciationDepletionAndAmortization",
                                            "ShareBasedCompensation")]
        found = [r for r in refs if r is not None]
        if len(found) != 3:
            return
        program = "add(add(#0, #1), #2)"
        self.m.add("trap", [cd], "Adjusted EBITDA is non-GAAP: operating income plus depreciation and amortization "
                   "plus share-based compensation, as the release's reconciliation shows.",
                   f"What was {cd.spec.possessive} Adjusted EBITDA (non-GAAP) for {period_words(label)}?", found,
                   program, "USD", trap="non_gaap")
