"""The synthetic filings corpus: deterministic, internally consistent, every planted trap present, filings as
the manifest says, the PDF states what facts.json says it prints, and every question's program over its cited
facts gives its answer."""

from __future__ import annotations

import ast
import hashlib
import re
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from pypdf import PdfReader
from typer.testing import CliRunner

from mainspring.scenarios.finance.cli import finance_app
from mainspring.scenarios.finance.corpus import generate_corpus, load_facts, load_manifest, load_questions
from mainspring.scenarios.finance.corpus.fiscal_calendar import period_of
from mainspring.scenarios.finance.corpus.statements import INSTANTS
from mainspring.scenarios.finance.corpus_format import PAGE_BREAK, FactRef, Manifest, Question


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("corpus") / "seed0"
    generate_corpus(out, seed=0)
    return out


@pytest.fixture(scope="module")
def manifest(corpus: Path) -> Manifest:
    return load_manifest(corpus)


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def entries(facts: dict[str, Any], concept: str, unit: str) -> list[dict[str, Any]]:
    ns, name = concept.split(":")
    return facts["facts"].get(ns, {}).get(name, {}).get("units", {}).get(unit, [])


def value(facts: dict[str, Any], concept: str, unit: str, start: date | None, end: date,
          accn: str | None = None) -> float:
    """The latest-filed value of a period, or the one filing `accn` reported."""
    rows = [e for e in entries(facts, concept, unit) if e["end"] == end.isoformat()
            and e.get("start") == (start.isoformat() if start else None) and (accn is None or e["accn"] == accn)]
    assert rows, f"{concept} {start}..{end} {accn or ''} missing"
    return max(rows, key=lambda e: (e["filed"], e["accn"]))["val"]


def resolve(facts: dict[str, Any], fiscal_year_end: str, ref: FactRef) -> float:
    instant = ref.concept.split(":")[1] in (*INSTANTS, "EntityCommonStockSharesOutstanding")
    p = period_of(fiscal_year_end, ref.period, instant)
    return value(facts, ref.concept, ref.unit, p.start, p.end, ref.accn)


def run(program: str, fact_ids: list[str], values: list[float]) -> float:
    """A tiny FinQA evaluator, independent of the pipeline's: the program as a Python call tree, walked, with
    `F:<fact_id>` read as the value of the evidence that names that fact."""
    cited = re.findall(r"F:([A-Za-z0-9_.-]+)", program)
    assert cited and set(cited) <= set(fact_ids), (program, fact_ids)
    program = re.sub(r"F:([A-Za-z0-9_.-]+)", lambda m: f"v{fact_ids.index(m.group(1))}", program)
    ops = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
           "divide": lambda a, b: a / b}

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2:
            return ops[node.func.id](walk(node.args[0]), walk(node.args[1]))
        if isinstance(node, ast.Name) and node.id.startswith("v"):
            return values[int(node.id[1:])]
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        raise AssertionError(f"unexpected program node {ast.dump(node)}")

    return walk(ast.parse(program, mode="eval").body)


# determinism and files

def test_same_seed_same_bytes_other_seed_differs(corpus: Path, tmp_path: Path) -> None:
    generate_corpus(tmp_path / "again", seed=0)
    generate_corpus(tmp_path / "other", seed=1)
    first, again, other = files_of(corpus), files_of(tmp_path / "again"), files_of(tmp_path / "other")
    assert first == again
    assert set(first) == set(other)  # doc_ids do not depend on the seed
    assert first["questions.jsonl"] != other["questions.jsonl"]
    assert first["ORBT/facts.json"] != other["ORBT/facts.json"]
    assert first["KSFH/KSFH-10K-FY2023.pdf"] != other["KSFH/KSFH-10K-FY2023.pdf"]


def test_every_filing_exists_with_its_hash_and_3_to_10_pages(corpus: Path, manifest: Manifest) -> None:
    assert len(manifest.companies) == 4
    assert all(re.fullmatch(r"99000000\d\d", c.cik) for c in manifest.companies)
    per_company = Counter((f.cik, f.form) for f in manifest.filings)
    for c in manifest.companies:
        assert (per_company[(c.cik, "10-K")], per_company[(c.cik, "10-Q")], per_company[(c.cik, "8-K")]) == (3, 9, 12)
    assert sum(1 for f in manifest.filings if f.form == "10-K/A") == 1
    assert len({f.doc_id for f in manifest.filings}) == len(manifest.filings)
    assert {f.format for f in manifest.filings} == {"md", "html", "pdf"}
    for f in manifest.filings:
        data = (corpus / f.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f.sha256, f.doc_id
        pages = len(PdfReader(corpus / f.path).pages) if f.format == "pdf" else data.decode().count(PAGE_BREAK) + 1
        assert 3 <= pages <= 10, (f.doc_id, pages)
    assert sum(p.stat().st_size for p in corpus.rglob("*") if p.is_file()) < 8_000_000


def test_filings_state_the_scale_and_some_figures_in_text(corpus: Path, manifest: Manifest) -> None:
    ksfh = (corpus / "KSFH" / "KSFH-10Q-FY2023Q2.md").read_text()
    orbt = (corpus / "ORBT" / "ORBT-10Q-FY2023Q2.md").read_text()
    assert "(in millions, except per-share data)" in ksfh
    assert "(in thousands, except per-share data)" in orbt
    assert re.search(r"Revenue (increased|decreased) \d+\.\d% to \$[\d,]+\.\d million", orbt)
    assert "<!-- page-break -->" in (corpus / "LMFS" / "LMFS-10Q-FY2023Q2.html").read_text()


# identities

def test_balance_sheet_and_cash_roll_forward_and_q4_identities(corpus: Path, manifest: Manifest) -> None:
    for c in manifest.companies:
        facts = load_facts(corpus, c.ticker)
        balance_sheets = entries(facts, "us-gaap:Liabilities", "USD")  # the full balance sheets (10-Q, 10-K)
        assert len(balance_sheets) >= 24
        for e in balance_sheets:
            end, accn = date.fromisoformat(e["end"]), e["accn"]
            assets = value(facts, "us-gaap:Assets", "USD", None, end, accn)
            equity = value(facts, "us-gaap:StockholdersEquity", "USD", None, end, accn)
            assert assets == e["val"] + equity
            assert assets == value(facts, "us-gaap:LiabilitiesAndStockholdersEquity", "USD", None, end, accn)
        for fy in (2022, 2023, 2024):
            year = period_of(c.fiscal_year_end, f"FY{fy}")
            begin = value(facts, "us-gaap:CashAndCashEquivalentsAtCarryingValue", "USD", None,
                          period_of(c.fiscal_year_end, f"FY{fy - 1}", True).end)
            flows = sum(value(facts, f"us-gaap:NetCashProvidedByUsedIn{k}Activities", "USD", year.start, year.end)
                        for k in ("Operating", "Investing", "Financing"))
            assert begin + flows == value(facts, "us-gaap:CashAndCashEquivalentsAtCarryingValue", "USD", None, year.end)
            for concept in ("us-gaap:Revenues", "us-gaap:NetIncomeLoss", "us-gaap:CostOfRevenue",
                            "us-gaap:NetCashProvidedByUsedInOperatingActivities"):
                quarters = [period_of(c.fiscal_year_end, f"FY{fy}Q{q}") for q in range(1, 5)]
                q123 = sum(value(facts, concept, "USD", p.start, p.end) for p in quarters[:3])
                q4 = value(facts, concept, "USD", quarters[3].start, quarters[3].end)
                assert q4 == value(facts, concept, "USD", year.start, year.end) - q123, (c.ticker, fy, concept)


def test_every_fact_entry_has_the_companyfacts_fields(corpus: Path, manifest: Manifest) -> None:
    accns = {f.accn: f for f in manifest.filings}
    facts = load_facts(corpus, "ORBT")
    assert facts["cik"] == 9900000001 and facts["entityName"] == "Orbital Dynamics Inc."
    assert "EntityCommonStockSharesOutstanding" in facts["facts"]["dei"]
    frames = 0
    for ns in ("us-gaap", "dei"):
        for concept in facts["facts"][ns].values():
            for rows in concept["units"].values():
                for e in rows:
                    f = accns[e["accn"]]
                    assert (e["fy"], e["fp"], e["form"], e["filed"]) == (f.fy, f.fp, f.form, f.filed.isoformat())
                    frames += "frame" in e
    assert frames > 50
    revenue = entries(facts, "us-gaap:Revenues", "USD")
    assert any(e.get("frame") == "CY2023Q2" for e in revenue) and any(e.get("frame") == "CY2023" for e in revenue)


# traps

def test_fiscal_year_not_the_calendar_year(corpus: Path, manifest: Manifest) -> None:
    lmfs = next(c for c in manifest.companies if c.ticker == "LMFS")
    assert lmfs.fiscal_year_end == "0630"
    q2 = period_of("0630", "FY2023Q2")
    assert (q2.start, q2.end) == (date(2022, 10, 1), date(2022, 12, 31))
    revenue = entries(load_facts(corpus, "LMFS"), "us-gaap:Revenues", "USD")
    years = [e for e in revenue if e["start"] == "2022-07-01" and e["end"] == "2023-06-30"]
    assert years and all(e["fy"] in (2023, 2024) for e in years)
    filing = next(f for f in manifest.filings if f.doc_id == "LMFS-10Q-FY2023Q2")
    assert filing.period_end == date(2022, 12, 31) and filing.fp == "Q2" and filing.fy == 2023


def test_split_restates_shares_and_eps_in_later_filings(corpus: Path, manifest: Manifest) -> None:
    facts = load_facts(corpus, "BWFC")
    year = period_of("1231", "FY2022")
    for concept, unit in (("us-gaap:WeightedAverageNumberOfDilutedSharesOutstanding", "shares"),
                          ("us-gaap:EarningsPerShareDiluted", "USD/shares")):
        rows = [e for e in entries(facts, concept, unit)
                if e.get("start") == str(year.start) and e["end"] == year.end.isoformat()]
        by_fy = {e["fy"]: e["val"] for e in rows}
        assert set(by_fy) == {2022, 2023}  # as first filed, and as the next 10-K restated it
        ratio = by_fy[2022] / by_fy[2023]
        assert ratio == pytest.approx(0.5 if unit == "shares" else 2.0, rel=0.03)
    assert "2-for-1" in (corpus / "BWFC" / "BWFC-10K-FY2023.md").read_text()


def test_two_scales(manifest: Manifest, corpus: Path) -> None:
    scales = {c.ticker: c.scale for c in manifest.companies}
    assert 1000 in scales.values() and 1_000_000 in scales.values()
    facts = load_facts(corpus, "KSFH")
    revenue = entries(facts, "us-gaap:Revenues", "USD")
    assert all(e["val"] % 1_000_000 == 0 for e in revenue)  # whole dollars, the printed millions times 10^6


def test_restatement_10ka_supersedes_a_figure_under_two_accns(corpus: Path, manifest: Manifest) -> None:
    amendments = [f for f in manifest.filings if f.form == "10-K/A"]
    assert len(amendments) == 1
    amended = amendments[0]
    original = next(f for f in manifest.filings if f.accn == amended.amends)
    assert (original.form, original.fy, original.cik) == ("10-K", amended.fy, amended.cik)
    assert original.filed < amended.filed
    ticker = next(c.ticker for c in manifest.companies if c.cik == amended.cik)
    facts = load_facts(corpus, ticker)
    year = period_of("1231", f"FY{amended.fy}")
    before = value(facts, "us-gaap:CostOfRevenue", "USD", year.start, year.end, original.accn)
    after = value(facts, "us-gaap:CostOfRevenue", "USD", year.start, year.end, amended.accn)
    assert before != after
    assert value(facts, "us-gaap:CostOfRevenue", "USD", year.start, year.end) == after  # the latest filed wins
    same = ("us-gaap:NetIncomeLoss", "us-gaap:OperatingIncomeLoss")  # a reclassification: profit unchanged
    for concept in same:
        assert value(facts, concept, "USD", year.start, year.end, original.accn) == \
            value(facts, concept, "USD", year.start, year.end, amended.accn)
    assert original.accn in (corpus / amended.path).read_text()


def test_non_gaap_next_to_gaap_and_reconciles(corpus: Path) -> None:
    text = (corpus / "ORBT" / "ORBT-8K-FY2023Q2.md").read_text()
    assert "Net income (GAAP)" in text and "Adjusted EBITDA (non-GAAP)" in text
    row = re.search(r"\| Adjusted EBITDA \(non-GAAP\) \| ([\d,]+) \|", text)
    assert row
    facts = load_facts(corpus, "ORBT")
    p = period_of("1231", "FY2023Q2")
    parts = ("OperatingIncomeLoss", "DepreciationDepletionAndAmortization", "ShareBasedCompensation")
    total = sum(value(facts, f"us-gaap:{c}", "USD", p.start, p.end) for c in parts)
    assert int(row.group(1).replace(",", "")) * 1000 == total


def test_pdf_round_trip_states_the_facts_it_prints(corpus: Path, manifest: Manifest) -> None:
    filing = next(f for f in manifest.filings if f.format == "pdf" and f.fy == 2023)
    company = next(c for c in manifest.companies if c.cik == filing.cik)
    text = "\n".join(page.extract_text() for page in PdfReader(corpus / filing.path).pages)
    facts = load_facts(corpus, company.ticker)
    checked = 0
    for ns in ("us-gaap", "dei"):
        for name, concept in facts["facts"][ns].items():
            for unit, rows in concept["units"].items():
                for e in rows:
                    if e["accn"] != filing.accn:
                        continue
                    if unit == "USD/shares":
                        printed = f"{e['val']:.2f}"
                    elif ns == "dei":
                        printed = f"{e['val']:,}"
                    else:
                        printed = f"{abs(e['val']) // company.scale:,}"
                    assert printed in text, (name, e)
                    checked += 1
    assert checked > 50


# questions

def test_questions_mix_programs_and_evidence(corpus: Path, manifest: Manifest) -> None:
    questions = load_questions(corpus)
    assert 280 <= len(questions) <= 320
    assert len({q.id for q in questions}) == len(questions)
    mix: Counter[str] = Counter(q.question_type for q in questions)
    target = {"extraction": 0.3, "arithmetic": 0.3, "cross_company": 0.1, "chain": 0.1, "trap": 0.1,
              "unanswerable": 0.1}
    for qtype, share in target.items():
        assert abs(mix[qtype] / len(questions) - share) <= 0.03, mix
    assert {q.trap for q in questions if q.trap} == {"fiscal_year", "split", "scale", "non_gaap", "restatement",
                                                     "amendment"}
    companies = {c.ticker: c for c in manifest.companies}
    pages = {f.doc_id: f for f in manifest.filings}
    facts = {t: load_facts(corpus, t) for t in companies}
    by_cik = {c.cik: c for c in manifest.companies}
    for q in questions:
        assert all(companies[t].name.split()[0] in q.question for t in q.companies), q.question
        if q.question_type == "unanswerable":
            assert q.answer is None and q.answer_text == "not reported" and not q.evidence
            continue
        assert q.answer is not None and q.evidence and q.program
        values, fact_ids = [], []
        for ev in q.evidence:
            assert ev.fact is not None and ev.doc_id in pages and ev.page is not None and ev.page >= 1
            assert ev.fact.fact_id is not None
            fact_ids.append(ev.fact.fact_id)
            company = by_cik[ev.fact.cik]
            if ev.fact.accn is not None:
                assert pages[ev.doc_id].accn == ev.fact.accn
            values.append(resolve(facts[company.ticker], company.fiscal_year_end, ev.fact))
        got = run(q.program, fact_ids, values)
        assert abs(got - q.answer) <= max(abs(q.answer) * q.tolerance, 1e-9), (q.id, q.program, got, q.answer)
    chains = [q for q in questions if q.question_type == "chain"]
    ids = {q.id for q in questions}
    assert all(re.search(r"fin-\d{4}", q.question_reasoning).group(0) in ids for q in chains)  # type: ignore[union-attr]


def test_evidence_page_prints_the_figure(corpus: Path, manifest: Manifest) -> None:
    """An extraction question's evidence page holds the figure as printed (scaled), so a citation can point at it."""
    pages_of = {f.doc_id: f for f in manifest.filings}
    scale = {c.cik: c.scale for c in manifest.companies}
    checked = 0
    for q in load_questions(corpus):
        if q.question_type != "extraction" or q.unit != "USD":
            continue
        ev = q.evidence[0]
        f = pages_of[ev.doc_id]
        if f.format == "pdf":
            page = PdfReader(corpus / f.path).pages[ev.page - 1].extract_text()  # type: ignore[operator]
        else:
            page = (corpus / f.path).read_text().split(PAGE_BREAK)[ev.page - 1]  # type: ignore[operator]
        assert q.answer is not None
        if ev.text:  # the passage that states it, in words ("$262.5 million"), is on the cited page
            assert ev.text in page and f"${abs(q.answer) / 1e6:,.1f} million" in ev.text, (q.id, ev)
        else:
            assert f"{int(abs(q.answer)) // scale[f.cik]:,}" in page, (q.id, ev)
        checked += 1
    assert checked > 30


def test_question_records_parse() -> None:
    with pytest.raises(ValueError):
        Question.model_validate({"id": "x"})


# CLI

def test_cli_generate_and_bad_seed(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(finance_app, ["generate", "--out", str(tmp_path / "c"), "--seed", "2"])
    assert result.exit_code == 0, result.output
    assert "questions" in result.output and "10-K/A" in result.output
    assert load_manifest(tmp_path / "c").seed == 2
    bad = runner.invoke(finance_app, ["generate", "--out", str(tmp_path / "d"), "--seed", "-1"])
    assert bad.exit_code == 2 and not (tmp_path / "d").exists()
    assert runner.invoke(finance_app, ["generate", "--seed", "abc"]).exit_code == 2
