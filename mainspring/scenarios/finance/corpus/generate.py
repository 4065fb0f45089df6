"""generate_corpus: companies -> ledgers -> filings -> files, facts.json, manifest.json and questions.jsonl,
all from one `random.Random(seed)`, so one seed always gives the same bytes."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mainspring.scenarios.finance.corpus.companies import COMPANIES, CompanySpec
from mainspring.scenarios.finance.corpus.document import PrintedFact
from mainspring.scenarios.finance.corpus.facts import FactIndex, company_facts
from mainspring.scenarios.finance.corpus.forms import build_document
from mainspring.scenarios.finance.corpus.questions import generate_questions
from mainspring.scenarios.finance.corpus.render import render
from mainspring.scenarios.finance.corpus.schedule import PlannedFiling, plan_filings
from mainspring.scenarios.finance.corpus.statements import build_ledger, draw_drivers
from mainspring.scenarios.finance.corpus.views import CompanyView
from mainspring.scenarios.finance.corpus_format import Company, Filing, Manifest, Question


@dataclass
class CompanyData:
    spec: CompanySpec
    view: CompanyView
    filings: list[PlannedFiling]
    index: FactIndex
    pages: dict[str, int]  # doc_id -> page count


def _write(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def generate_corpus(out_dir: Path, seed: int = 0) -> Manifest:
    """Write the whole corpus for `seed` into `out_dir` (created; files of an earlier run are overwritten)."""
    if seed < 0:
        raise ValueError("seed must be a non-negative integer")
    out_dir = Path(out_dir)
    rng = random.Random(seed)
    companies: list[Company] = []
    filings: list[Filing] = []
    data: list[CompanyData] = []
    for spec in COMPANIES:
        ledger = build_ledger(rng, spec, draw_drivers(rng, spec))
        planned = plan_filings(spec)
        restated = next((f.filed for f in planned if f.form == "10-K/A"), None)
        view = CompanyView(spec, ledger, restated)
        index = FactIndex()
        printed: list[tuple[PlannedFiling, PrintedFact]] = []
        pages: dict[str, int] = {}
        for f in planned:
            doc = build_document(view, f)
            index.add(f, doc)
            printed += [(f, fact) for fact, _ in doc.printed()]
            pages[f.doc_id] = len(doc.pages)
            rel = f"{spec.ticker}/{f.doc_id}.{f.format}"
            sha = _write(out_dir / rel, render(doc, f.format))
            filings.append(Filing(doc_id=f.doc_id, cik=spec.cik, form=f.form, fy=f.fy, fp=f.fp,  # type: ignore[arg-type]
                                  period_end=f.period_end, filed=f.filed, accn=f.accn, amends=f.amends,
                                  format=f.format, path=rel, sha256=sha))  # type: ignore[arg-type]
        facts = company_facts(spec.cik, spec.name, printed)
        _write(out_dir / spec.ticker / "facts.json", (json.dumps(facts, indent=1, sort_keys=True) + "\n").encode())
        companies.append(Company(cik=spec.cik, ticker=spec.ticker, name=spec.name,
                                 fiscal_year_end=spec.fiscal_year_end, scale=spec.scale))  # type: ignore[arg-type]
        data.append(CompanyData(spec, view, planned, index, pages))
    manifest = Manifest(seed=seed, companies=companies, filings=filings)
    _write(out_dir / "manifest.json", (manifest.model_dump_json(indent=1) + "\n").encode())
    questions = generate_questions(random.Random(seed * 7919 + 1), data)
    _write(out_dir / "questions.jsonl", "".join(q.model_dump_json() + "\n" for q in questions).encode())
    return manifest


def load_manifest(corpus_dir: Path) -> Manifest:
    return Manifest.model_validate_json((Path(corpus_dir) / "manifest.json").read_text())


def load_questions(corpus_dir: Path) -> list[Question]:
    lines = (Path(corpus_dir) / "questions.jsonl").read_text().splitlines()
    return [Question.model_validate_json(line) for line in lines if line.strip()]


def load_facts(corpus_dir: Path, ticker: str) -> dict[str, Any]:
    path = Path(corpus_dir) / ticker / "facts.json"
    if not path.is_file():
        raise FileNotFoundError(f"no facts for {ticker!r} in {corpus_dir}")
    result: dict[str, Any] = json.loads(path.read_text())
    return result
