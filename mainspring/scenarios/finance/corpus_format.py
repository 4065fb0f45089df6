"""The synthetic filings corpus on disk: the contract between the generator (corpus/), the filings store
(filings.py) and the evaluation (questions.jsonl).

A corpus is one folder, written deterministically from a seed:

    manifest.json                 Manifest: the companies and every filing
    <TICKER>/facts.json           the company's truth in the SEC company-facts shape (below)
    <TICKER>/<doc_id>.md|.html|.pdf   one file per filing
    questions.jsonl               one Question per line

Pages. A PDF's pages are its pages. Markdown and HTML filings mark a page break with the line
`<!-- page-break -->` (a comment in both); page numbers start at 1. A citation's character offsets
(`[D:doc_id p.12 c.340-388]`) count within the page's text as the filings store extracts it.

facts.json follows data.sec.gov's `companyfacts/CIK##########.json`:
`{cik: int, entityName, facts: {"us-gaap"|"dei": {Concept: {label, description,
units: {"USD"|"shares"|"USD/shares"|"pure": [{start?, end, val, accn, fy, fp, form, filed, frame?}]}}}}}`.
Values are in whole units (dollars, shares), whatever scale the filing's tables print in; `fy` is the
fiscal year of the filing that reported the value (so a prior-year comparative carries the later fy);
`start` is absent for instants. A restated value appears twice, under the original and the amending `accn`.
"""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, Field

CORPUS_VERSION: Literal["finance-corpus/1"] = "finance-corpus/1"
PAGE_BREAK = "<!-- page-break -->"

Form = Literal["10-K", "10-Q", "10-K/A", "8-K"]  # 8-K: the quarter's earnings release (exhibit 99.1)
FiscalPeriod = Literal["Q1", "Q2", "Q3", "Q4", "FY"]
Unit = Literal["USD", "shares", "USD/shares", "pure"]
Trap = Literal["fiscal_year", "split", "scale", "non_gaap", "restatement", "amendment"]
QuestionType = Literal["extraction", "arithmetic", "cross_company", "chain", "trap", "unanswerable"]


class Company(BaseModel):
    cik: str = Field(pattern=r"^99000000\d\d$")  # 10 digits, fictional
    ticker: str
    name: str
    fiscal_year_end: str = Field(pattern=r"^\d{4}$")  # MMDD, as the SEC's `fiscalYearEnd` ("1231", "0630")
    scale: Literal[1, 1000, 1_000_000]  # how the filing tables print amounts ("in thousands" = 1000)


class Filing(BaseModel):
    doc_id: str  # e.g. "ORBT-10Q-FY2023Q2": unique in the corpus, the same for every seed
    cik: str
    form: Form
    fy: int  # the fiscal year the filing covers
    fp: FiscalPeriod
    period_end: date
    filed: date
    accn: str = Field(pattern=r"^\d{10}-\d{2}-\d{6}$")
    amends: str | None = None  # the accn this filing amends or restates (a 10-K/A)
    format: Literal["md", "html", "pdf"]
    path: str  # relative to the corpus folder
    sha256: str  # of the file's bytes


class Manifest(BaseModel):
    version: Literal["finance-corpus/1"] = CORPUS_VERSION
    seed: int
    companies: list[Company]
    filings: list[Filing]


class FactRef(BaseModel):
    """A fact named the way `get_fact` takes it. `period`: `FY2023` (the fiscal year), `FY2023Q2` (the fiscal
    quarter's three months; for an instant concept, its end), `FY2023Q2YTD` (year to date). `accn` picks one
    filing's value; None means the latest filed (a restatement supersedes)."""

    cik: str
    concept: str  # "us-gaap:Revenues", "dei:EntityCommonStockSharesOutstanding"
    period: str = Field(pattern=r"^FY\d{4}(Q[1-4](YTD)?)?$")
    unit: Unit
    accn: str | None = None
    fact_id: str | None = None  # the store's id of the very fact meant (filings.fact_id_of): a program names it


class Evidence(BaseModel):
    doc_id: str
    page: int | None = None
    fact: FactRef | None = None
    text: str = ""  # the passage that states it, where one does


class Question(BaseModel):
    """One evaluation question: FinanceBench's fields, FinQA's program, TAT-QA's scale, and a tolerance."""

    id: str  # "fin-0001"
    companies: list[str]  # tickers
    question_type: QuestionType
    question_reasoning: str  # how one answers it, in a sentence
    question: str
    answer: float | None  # None: not reported (the right answer is to say so)
    answer_text: str  # as a person would write it: "$1,234.5 million", "12.3%", "not reported"
    unit: Literal["USD", "shares", "USD/shares", "pure", "percent"]
    scale: Literal["", "thousand", "million", "billion", "percent"] = ""  # how answer_text states it
    tolerance: float = 0.005  # relative
    program: str = ""  # in programs.py's syntax over the evidence's fact ids: "divide(subtract(F:f-…, F:f-…), F:f-…)"
    evidence: list[Evidence] = Field(default_factory=list)
    trap: Trap | None = None
