"""A tiny hand-written filings corpus in the corpus_format.py contract: one company (fiscal year ends in June,
tables in thousands), a 10-K in Markdown, a 10-Q in HTML and a 10-K/A in PDF that restates revenue."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from mainspring.scenarios.finance.corpus_format import PAGE_BREAK, Company, Filing, Manifest
from mainspring.scenarios.finance.filings import FilingsStore

CIK = "9900000001"
TICKER = "ORBT"
ACCN_10K = "0000000001-23-000001"
ACCN_10Q = "0000000001-24-000002"
ACCN_10KA = "0000000001-23-000003"

TEN_K_MD = f"""# Orbital Dynamics Inc. — Form 10-K for fiscal 2023

Fiscal year ended June 30, 2023. (in thousands, except per share amounts)

| | FY2023 | FY2022 |
|---|---|---|
| Revenues | 1,234,456 | 1,100,000 |
| Net loss | (3,200) | 1,500 |
{PAGE_BREAK}
## Management's discussion

Revenues were $1,234.5 million in fiscal 2023. Diluted earnings per share were $0.45 per share.
Cash and equivalents at year end were $500.0 million.
"""

TEN_Q_HTML = f"""<html><head><title>ORBT 10-Q</title><style>p {{color: red}}</style></head><body>
<h1>Orbital Dynamics Inc. Form 10-Q</h1>
<p>Second quarter of fiscal 2024, ended December 31, 2023.</p>
{PAGE_BREAK}
<table><tr><th>Item</th><th>Three months</th><th>Six months</th></tr>
<tr><td>Revenues</td><td>330,000</td><td>640,000</td></tr></table>
<p>Quarterly revenues reached $330.0 million.</p>
</body></html>
"""


def _make_pdf(path: Path) -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    pdf.add_page()
    pdf.cell(0, 10, "Orbital Dynamics Inc. Form 10-K/A amendment No. 1")
    pdf.add_page()
    pdf.cell(0, 10, "Restated revenues for fiscal 2023 were 1,250,000 (in thousands).")
    pdf.output(str(path))


def _row(start: str | None, end: str, val: float, accn: str, fy: int, fp: str, form: str, filed: str) -> dict:
    row = {"end": end, "val": val, "accn": accn, "fy": fy, "fp": fp, "form": form, "filed": filed}
    if start:
        row["start"] = start
    return row


FACTS = {"cik": int(CIK), "entityName": "Orbital Dynamics Inc.", "facts": {
    "us-gaap": {
        "Revenues": {"label": "Revenues", "description": "", "units": {"USD": [
            _row("2021-07-01", "2022-06-30", 1_100_000_000, ACCN_10K, 2023, "FY", "10-K", "2023-08-20"),
            _row("2022-07-01", "2023-06-30", 1_234_456_000, ACCN_10K, 2023, "FY", "10-K", "2023-08-20"),
            _row("2022-07-01", "2023-06-30", 1_250_000_000, ACCN_10KA, 2023, "FY", "10-K/A", "2023-11-01"),
            _row("2023-10-01", "2023-12-31", 330_000_000, ACCN_10Q, 2024, "Q2", "10-Q", "2024-02-05"),
            _row("2023-07-01", "2023-12-31", 640_000_000, ACCN_10Q, 2024, "Q2", "10-Q", "2024-02-05")]}},
        "NetIncomeLoss": {"label": "Net income (loss)", "description": "", "units": {"USD": [
            _row("2022-07-01", "2023-06-30", -3_200_000, ACCN_10K, 2023, "FY", "10-K", "2023-08-20")]}},
        "EarningsPerShareDiluted": {"label": "EPS diluted", "description": "", "units": {"USD/shares": [
            _row("2022-07-01", "2023-06-30", 0.45, ACCN_10K, 2023, "FY", "10-K", "2023-08-20")]}},
        "CashAndCashEquivalentsAtCarryingValue": {"label": "Cash", "description": "", "units": {"USD": [
            _row(None, "2023-06-30", 500_000_000, ACCN_10K, 2023, "FY", "10-K", "2023-08-20"),
            _row(None, "2023-12-31", 520_000_000, ACCN_10Q, 2024, "Q2", "10-Q", "2024-02-05")]}},
    }}}


def write_corpus(root: Path) -> Manifest:
    """Write the fixture corpus into `root` and return its manifest."""
    folder = root / TICKER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ORBT-10K-FY2023.md").write_text(TEN_K_MD, encoding="utf-8")
    (folder / "ORBT-10Q-FY2024Q2.html").write_text(TEN_Q_HTML, encoding="utf-8")
    _make_pdf(folder / "ORBT-10KA-FY2023.pdf")
    (folder / "facts.json").write_text(json.dumps(FACTS, indent=1))

    def filing(doc_id: str, fmt: str, **kw) -> Filing:
        rel = f"{TICKER}/{doc_id}.{fmt}"
        return Filing(doc_id=doc_id, cik=CIK, format=fmt, path=rel,
                      sha256=hashlib.sha256((root / rel).read_bytes()).hexdigest(), **kw)

    manifest = Manifest(seed=0, companies=[Company(cik=CIK, ticker=TICKER, name="Orbital Dynamics Inc.",
                                                   fiscal_year_end="0630", scale=1000)],
                        filings=[filing("ORBT-10K-FY2023", "md", form="10-K", fy=2023, fp="FY",
                                        period_end="2023-06-30", filed="2023-08-20", accn=ACCN_10K),
                                 filing("ORBT-10KA-FY2023", "pdf", form="10-K/A", fy=2023, fp="FY",
                                        period_end="2023-06-30", filed="2023-11-01", accn=ACCN_10KA,
                                        amends=ACCN_10K),
                                 filing("ORBT-10Q-FY2024Q2", "html", form="10-Q", fy=2024, fp="Q2",
                                        period_end="2023-12-31", filed="2024-02-05", accn=ACCN_10Q)])
    (root / "manifest.json").write_text(manifest.model_dump_json(indent=1))
    (root / "questions.jsonl").write_text("")
    return manifest


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    write_corpus(root)
    return root


@pytest.fixture
def store(corpus_dir: Path, tmp_path: Path):
    opened = FilingsStore.open(corpus_dir, tmp_path / "cache")
    yield opened
    opened.close()
