"""~300 questions from the facts: 30% extraction, 30% arithmetic, 10% each cross-company, chain, trap and
unanswerable. Each question's program is written over its evidence's fact ids in the pipeline's own program
language (programs.py), and its answer is that program run by the pipeline's interpreter over those facts' values:
a report that cites the same facts with the same program is right by construction."""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING

from mainspring.scenarios.finance.programs import run_program
from mainspring.scenarios.finance.corpus.question_refs import Ref, is_instant, ref, unit_of
from mainspring.scenarios.finance.corpus.question_traps import TrapMaker
from mainspring.scenarios.finance.corpus.views import EPS_CONCEPTS, RESTATED, SHARE_CONCEPTS
from mainspring.scenarios.finance.corpus.wording import METRIC, answer_text, instant_words, period_words
from mainspring.scenarios.finance.corpus_format import Question

if TYPE_CHECKING:
    from mainspring.scenarios.finance.corpus.generate import CompanyData

MIX = {"extraction": 90, "arithmetic": 90, "cross_company": 30, "chain": 30, "trap": 30, "unanswerable": 30}
YEARS = (2022, 2023, 2024)
QUARTER_LABELS = [f"FY{y}Q{q}" for y in YEARS for q in range(1, 5)]
FLOW_LABELS = [f"FY{y}" for y in YEARS] + QUARTER_LABELS + [f"FY{y}Q{q}YTD" for y in YEARS for q in (2, 3)]
EXTRACT = [c for c in METRIC if c != "EntityCommonStockSharesOutstanding"]
UNREPORTED = (("number of full-time employees", "pure"), ("order backlog", "USD"),
              ("revenue from customers in Europe", "USD"), ("revenue guidance for the next fiscal year", "USD"),
              ("customer churn rate", "percent"), ("dividends declared per share", "USD/shares"),
              ("number of customers", "pure"), ("research and development headcount", "pure"))


class QuestionMaker:
    def __init__(self, rng: random.Random, data: list[CompanyData]) -> None:
        self.rng, self.data = rng, data
        self.questions: list[Question] = []
        self.seen: set[str] = set()

    def add(self, qtype: str, companies: list[CompanyData], reasoning: str, text: str, refs: list[Ref],
            template: str, unit: str, trap: str | None = None, tolerance: float = 0.005) -> Question | None:
        """`template` is the program with `#k` for refs[k]'s fact; "" for a question the filings cannot answer."""
        if text in self.seen:
            return None
        self.seen.add(text)
        program, answer = over_facts(template, refs), None
        if program:
            answer = run_program(program, _RefValues(refs)).value
        atext, scale = ("not reported", "") if answer is None else answer_text(answer, unit)
        q = Question(id=f"fin-{len(self.questions) + 1:04d}", companies=[c.spec.ticker for c in companies],
                     question_type=qtype, question_reasoning=reasoning, question=text,  # type: ignore[arg-type]
                     answer=None if answer is None else round(answer, 6), answer_text=atext, unit=unit,  # type: ignore[arg-type]
                     scale=scale, tolerance=tolerance, program=program,  # type: ignore[arg-type]
                     evidence=[r.evidence for r in refs], trap=trap)  # type: ignore[arg-type]
        self.questions.append(q)
        return q

    def trap_free(self, cd: CompanyData, concept: str, label: str) -> bool:
        """Extraction and arithmetic stay off the trapped figures: the split-affected share counts and EPS and
        the restated year's reclassified lines belong to the trap questions."""
        s = cd.spec
        if s.split_at is not None and (concept in EPS_CONCEPTS or concept in SHARE_CONCEPTS):
            return False
        return not (s.restates is not None and concept in RESTATED and label.startswith(f"FY{s.restates}")
                    and (len(label) == 6 or label[7] == "4" or label.endswith("YTD")))

    def company(self) -> CompanyData:
        return self.rng.choice(self.data)

    def wording(self, cd: CompanyData, concept: str, label: str) -> str:
        if is_instant(concept):
            return f"{cd.spec.possessive} {METRIC[concept]} {instant_words(cd.spec.fiscal_year_end, label)}"
        return f"{cd.spec.possessive} {METRIC[concept]} for {period_words(label)}"

    # the types
    def extraction(self) -> None:
        cd, concept = self.company(), self.rng.choice(EXTRACT)
        labels = QUARTER_LABELS + [f"FY{y}" for y in YEARS] if is_instant(concept) else FLOW_LABELS
        label = self.rng.choice(labels)
        r = ref(cd, concept, label)
        if r is None or not self.trap_free(cd, concept, label):
            return
        self.add("extraction", [cd], f"Read {METRIC[concept]} from the {r.evidence.doc_id} filing; tables are in "
                 f"{'millions' if cd.spec.scale == 1_000_000 else 'thousands'}, so scale to whole units.",
                 f"What was {self.wording(cd, concept, label)}?", [r], "#0", unit_of(concept))

    def arithmetic(self) -> None:
        cd = self.company()
        kind = self.rng.choice(["gross_margin", "operating_margin", "yoy", "ttm", "fcf", "net_debt",
                                "current_ratio", "dso"])
        fy = self.rng.choice(YEARS)
        label = self.rng.choice([f"FY{fy}", f"FY{fy}Q{self.rng.randint(1, 4)}"])
        refs: list[Ref | None]
        name = cd.spec.possessive
        when = instant_words(cd.spec.fiscal_year_end, label)
        if kind in ("gross_margin", "operating_margin"):
            num = "GrossProfit" if kind == "gross_margin" else "OperatingIncomeLoss"
            refs = [ref(cd, num, label), ref(cd, "Revenues", label)]
            text = f"What was {name} {kind.replace('_', ' ')} for {period_words(label)}, as a percentage of revenue?"
            program, unit, how = "multiply(divide(#0, #1), 100)", "percent", f"{METRIC[num]} / revenue x 100"
            if not self.trap_free(cd, num, label):
                return
        elif kind == "yoy":
            concept = self.rng.choice(["Revenues", "NetIncomeLoss", "OperatingIncomeLoss"])
            prior = f"FY{int(label[2:6]) - 1}{label[6:]}"
            refs = [ref(cd, concept, label), ref(cd, concept, prior)]
            text = (f"By what percentage did {name} {METRIC[concept]} change in {period_words(label)} compared "
                    f"with {period_words(prior)}?")
            program, unit = "multiply(divide(subtract(#0, #1), #1), 100)", "percent"
            how = "(current - prior) / prior x 100"
        elif kind == "ttm":
            end = self.rng.choice([lab for lab in QUARTER_LABELS if lab >= "FY2022Q4"])
            i = QUARTER_LABELS.index(end)
            window = QUARTER_LABELS[i - 3:i + 1] if i >= 3 else []
            if len(window) < 4:
                return
            refs = [ref(cd, "Revenues", lab) for lab in window]
            text = f"What was {name} trailing-twelve-month revenue as of the end of {period_words(end)}?"
            program, unit, how = "add(add(add(#0, #1), #2), #3)", "USD", "sum of the four quarters' revenue"
        elif kind == "fcf":
            refs = [ref(cd, "NetCashProvidedByUsedInOperatingActivities", label),
                    ref(cd, "PaymentsToAcquirePropertyPlantAndEquipment", label)]
            text = (f"What was {name} free cash flow (operating cash flow minus capital expenditures) for "
                    f"{period_words(label)}?")
            program, unit, how = "subtract(#0, #1)", "USD", "CFO - capex"
        elif kind == "net_debt":
            refs = [ref(cd, "LongTermDebtNoncurrent", label), ref(cd, "CashAndCashEquivalentsAtCarryingValue", label)]
            text = f"What was {name} net debt (long-term debt minus cash) {when}?"
            program, unit, how = "subtract(#0, #1)", "USD", "long-term debt - cash"
        elif kind == "current_ratio":
            refs = [ref(cd, "AssetsCurrent", label), ref(cd, "LiabilitiesCurrent", label)]
            text = f"What was {name} current ratio {when}?"
            program, unit, how = "divide(#0, #1)", "pure", "current assets / current liabilities"
        else:
            label = f"FY{fy}"
            refs = [ref(cd, "AccountsReceivableNetCurrent", label), ref(cd, "Revenues", label)]
            text = (f"What were {name} days sales outstanding for {period_words(label)} (year-end receivables over "
                    "revenue, times 365)?")
            program, unit, how = "multiply(divide(#0, #1), 365)", "pure", "receivables / revenue x 365"
        found = [r for r in refs if r is not None]
        if len(found) != len(refs):
            return
        self.add("arithmetic", [cd], f"Compute {how} from the reported figures.", text, found, program,
                 unit)

    def cross_company(self) -> None:
        a, b = self.rng.sample(self.data, 2)
        fy = self.rng.choice(YEARS)
        label = f"FY{fy}"
        if self.rng.random() < 0.5:
            concept = self.rng.choice(["Revenues", "NetIncomeLoss", "OperatingIncomeLoss"])
            refs = [ref(a, concept, label), ref(b, concept, label)]
            text = (f"By how much did {a.spec.possessive} {METRIC[concept]} for fiscal {fy} exceed (or fall short "
                    f"of) {b.spec.possessive}?")
            program, unit, how = "subtract(#0, #1)", "USD", "the difference"
        else:
            refs = [ref(a, "GrossProfit", label), ref(a, "Revenues", label), ref(b, "GrossProfit", label),
                    ref(b, "Revenues", label)]
            if not (self.trap_free(a, "GrossProfit", label) and self.trap_free(b, "GrossProfit", label)):
                return
            text = (f"How many percentage points higher was {a.spec.possessive} fiscal {fy} gross margin than "
                    f"{b.spec.possessive}?")
            program = "subtract(multiply(divide(#0, #1), 100), multiply(divide(#2, #3), 100))"
            unit, how = "percent", "the difference of the two gross margins"
        found = [r for r in refs if r is not None]
        if len(found) != len(refs):
            return
        fye = "" if a.spec.fiscal_year_end == b.spec.fiscal_year_end else \
            " Their fiscal years end on different dates; compare fiscal years as each reports them."
        self.add("cross_company", [a, b], f"Take each company's figure and compute {how}.{fye}", text, found,
                 program, unit)

    def chain(self, previous: list[Question]) -> None:
        base = self.rng.choice(previous)
        ev = base.evidence[0]
        assert ev.fact is not None
        concept, label = ev.fact.concept.split(":")[1], ev.fact.period
        cd = next(c for c in self.data if c.spec.ticker == base.companies[0])
        prior = f"FY{int(label[2:6]) - 1}{label[6:]}"
        cur, old = ref(cd, concept, label), ref(cd, concept, prior)
        if cur is None or old is None or old.val == 0:
            return
        program = "multiply(divide(subtract(#0, #1), #1), 100)"
        self.add("chain", [cd], f"Builds on {base.id} ({base.question}): take that answer and the same figure "
                 f"for {period_words(prior)}, then (current - prior) / prior x 100.",
                 f"Following up on the previous question ({base.question} Answer: {base.answer_text}): by what "
                 f"percentage did it change from {period_words(prior)}?", [cur, old], program,
                 "percent")

    def unanswerable(self) -> None:
        cd = self.company()
        metric, unit = self.rng.choice(UNREPORTED)
        when = self.rng.choice([period_words(lab) for lab in FLOW_LABELS] + ["fiscal 2020", "fiscal 2025"])
        self.add("unanswerable", [cd], "The filings do not report this figure; the right answer says so.",
                 f"What was {cd.spec.possessive} {metric} for {when}?", [], "", unit)


def over_facts(template: str, refs: list[Ref]) -> str:
    """The template with each `#k` replaced by refs[k]'s fact, `F:<fact_id>`."""
    return re.sub(r"#(\d+)", lambda m: f"F:{refs[int(m.group(1))].fact_id}", template)


class _RefValues:
    """The program's inputs: the values the cited facts have in the corpus being generated."""

    def __init__(self, refs: list[Ref]) -> None:
        self.values = {r.fact_id: r.val for r in refs}

    def fact_value(self, fact_id: str) -> float:
        return self.values[fact_id]

    def span_value(self, doc_id: str, page: int, start: int, end: int) -> float:
        raise LookupError("generated programs cite facts, not spans")


def generate_questions(rng: random.Random, data: list[CompanyData]) -> list[Question]:
    m = QuestionMaker(rng, data)
    for qtype, target in MIX.items():
        start, tries = len(m.questions), 0
        while len(m.questions) - start < target and tries < 5_000:
            tries += 1
            if qtype == "extraction":
                m.extraction()
            elif qtype == "arithmetic":
                m.arithmetic()
            elif qtype == "cross_company":
                m.cross_company()
            elif qtype == "chain":
                m.chain([q for q in m.questions if q.question_type == "extraction" and q.unit == "USD"
                         and not is_instant(q.evidence[0].fact.concept.split(":")[1])])  # type: ignore[union-attr]
            elif qtype == "trap":
                TrapMaker(m).one(tries)
            else:
                m.unanswerable()
    return m.questions
