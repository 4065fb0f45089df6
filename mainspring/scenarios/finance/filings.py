"""The local filings store: a corpus folder (corpus_format.py) ingested into one SQLite file.

It is a derived cache, not platform state: built on first use under `<cache_dir>/finance/`, named by the hash
of the corpus's manifest.json, written to a temporary file and renamed into place so concurrent openers never
see half a store, and reused after. Tables: filings, pages (each page's text as citations count it), chunks
(character spans within a page, for search) and facts (facts.json's rows, each with a short deterministic id,
its fiscal period label and, when a later filing restated it, the id of the value that replaced it).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from mainspring.agents.tools.doc_index import Chunk, DocumentIndex, chunk_spans
from mainspring.scenarios.finance.citations import first_number
from mainspring.scenarios.finance.corpus_format import Manifest
from mainspring.scenarios.finance.page_text import filing_pages
from mainspring.scenarios.finance.periods import instant_label, label_of, parse_label

STORE_VERSION = 1  # bump when the schema or page extraction changes: older caches are rebuilt

_SCHEMA = """
CREATE TABLE companies (cik TEXT PRIMARY KEY, ticker TEXT, name TEXT, fiscal_year_end TEXT, scale INTEGER);
CREATE TABLE filings (doc_id TEXT PRIMARY KEY, cik TEXT, ticker TEXT, company TEXT, form TEXT, fy INTEGER,
    fp TEXT, period_end TEXT, filed TEXT, accn TEXT, amends TEXT, format TEXT, sha256 TEXT);
CREATE TABLE pages (doc_id TEXT, page INTEGER, text TEXT, PRIMARY KEY (doc_id, page));
CREATE TABLE chunks (id INTEGER PRIMARY KEY, doc_id TEXT, page INTEGER, start INTEGER, "end" INTEGER);
CREATE TABLE facts (fact_id TEXT PRIMARY KEY, cik TEXT, concept TEXT, unit TEXT, start TEXT, "end" TEXT,
    val REAL, accn TEXT, fy INTEGER, fp TEXT, form TEXT, filed TEXT, frame TEXT, period TEXT,
    superseded_by TEXT);
CREATE INDEX facts_lookup ON facts (cik, concept, period);
"""


class FilingsError(LookupError):
    """A question the store cannot answer (unknown company, concept, period, document); the message says why."""


@dataclass(frozen=True)
class FilingRow:
    doc_id: str
    cik: str
    ticker: str
    company: str
    form: str
    fy: int
    fp: str
    period_end: str
    filed: str
    accn: str
    amends: str | None
    format: str
    sha256: str


@dataclass(frozen=True)
class Fact:
    fact_id: str
    cik: str
    concept: str
    unit: str
    start: str | None
    end: str
    val: float
    accn: str
    fy: int
    fp: str
    form: str
    filed: str
    frame: str | None
    period: str  # the fiscal label of start..end: FY2023, FY2023Q2, FY2023Q2YTD
    superseded_by: str | None
    doc_id: str | None = None  # the filing the value was reported in, when the corpus has it


@dataclass
class FactAnswer:
    fact: Fact
    superseded: list[Fact] = field(default_factory=list)  # earlier filed values this one replaced


@dataclass(frozen=True)
class SearchHit:
    doc_id: str
    page: int
    start: int
    end: int
    text: str
    score: float


def fact_id_of(cik: str, concept: str, unit: str, start: str | None, end: str, accn: str) -> str:
    key = "|".join([cik, concept, unit, start or "", end, accn])
    return "f-" + hashlib.sha256(key.encode()).hexdigest()[:10]


def _norm_cik(cik: str) -> str:
    return str(int(cik)).zfill(10)


# ---- building --------------------------------------------------------------------------------------------------
def build_store(corpus_dir: Path, db_path: Path) -> None:
    """Ingest `corpus_dir` into a new SQLite file at `db_path` (which must not exist yet)."""
    manifest = Manifest.model_validate_json((corpus_dir / "manifest.json").read_text())
    con = sqlite3.connect(db_path)
    try:
        con.executescript(_SCHEMA)
        companies = {c.cik: c for c in manifest.companies}
        for c in manifest.companies:
            con.execute("INSERT INTO companies VALUES (?,?,?,?,?)", (c.cik, c.ticker, c.name, c.fiscal_year_end,
                                                                     c.scale))
        for f in manifest.filings:
            company = companies[f.cik]
            con.execute("INSERT INTO filings VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (f.doc_id, f.cik, company.ticker, company.name, f.form, f.fy, f.fp, f.period_end.isoformat(),
                         f.filed.isoformat(), f.accn, f.amends, f.format, f.sha256))
            for n, text in enumerate(filing_pages(corpus_dir / f.path, f.format), 1):
                con.execute("INSERT INTO pages VALUES (?,?,?)", (f.doc_id, n, text))
                con.executemany('INSERT INTO chunks (doc_id, page, start, "end") VALUES (?,?,?,?)',
                                [(f.doc_id, n, s, e) for s, e in chunk_spans(text)])
        for c in manifest.companies:
            path = corpus_dir / c.ticker / "facts.json"
            if path.is_file():
                _ingest_facts(con, c.cik, c.fiscal_year_end, json.loads(path.read_text()))
        con.commit()
    finally:
        con.close()


def _ingest_facts(con: sqlite3.Connection, cik: str, fiscal_year_end: str, body: dict) -> None:
    rows: list[list[Any]] = []
    for taxonomy, concepts in body.get("facts", {}).items():
        for name, concept in concepts.items():
            for unit, entries in concept.get("units", {}).items():
                for e in entries:
                    start, end = e.get("start"), e["end"]
                    label = label_of(fiscal_year_end, date.fromisoformat(start) if start else None,
                                     date.fromisoformat(end))
                    qualified = f"{taxonomy}:{name}"
                    rows.append([fact_id_of(cik, qualified, unit, start, end, e["accn"]), cik, qualified, unit,
                                 start, end, float(e["val"]), e["accn"], e.get("fy"), e.get("fp"), e.get("form"),
                                 e.get("filed"), e.get("frame"), label, None])
    # A value a later filing reported differently (a restatement) is superseded by the latest filed one; an
    # equal value in a later filing (a prior-year comparative) is the same figure, not a restatement.
    groups: dict[tuple, list[list[Any]]] = {}
    for row in rows:
        groups.setdefault((row[2], row[3], row[4], row[5]), []).append(row)
    for group in groups.values():
        group.sort(key=lambda r: (r[11] or "", r[7]))
        latest = group[-1]
        for row in group[:-1]:
            if row[6] != latest[6]:
                row[14] = latest[0]
    con.executemany("INSERT OR REPLACE INTO facts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)


# ---- the store -------------------------------------------------------------------------------------------------
class FilingsStore:
    def __init__(self, db_path: Path):
        self.path = db_path
        self._con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, check_same_thread=False)
        self._con.row_factory = sqlite3.Row
        self._lock = threading.Lock()  # one connection shared by the tools' worker threads
        self._index: tuple[DocumentIndex, list[tuple[str, int]]] | None = None

    @classmethod
    def open(cls, corpus_dir: Path, cache_dir: Path) -> FilingsStore:
        """The store of `corpus_dir`, built into `cache_dir/finance/` on first use and reused after."""
        corpus_dir = Path(corpus_dir)
        manifest = corpus_dir / "manifest.json"
        if not manifest.is_file():
            raise FilingsError(f"{corpus_dir} is not a filings corpus (no manifest.json)")
        key = hashlib.sha256(manifest.read_bytes() + f"|{STORE_VERSION}".encode()).hexdigest()[:24]
        where = Path(cache_dir) / "finance"
        db_path = where / f"filings-{key}.sqlite"
        if not db_path.is_file():
            where.mkdir(parents=True, exist_ok=True)
            tmp = where / f".filings-{key}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.unlink(missing_ok=True)
            try:
                build_store(corpus_dir, tmp)
                os.replace(tmp, db_path)  # atomic: a concurrent opener sees no file or a whole one
            finally:
                tmp.unlink(missing_ok=True)
        return cls(db_path)

    def close(self) -> None:
        self._con.close()

    def _rows(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._con.execute(sql, args).fetchall()

    # ---- companies and filings ---------------------------------------------------------------------------
    def company(self, name: str) -> sqlite3.Row:
        """A company by ticker, CIK or name (case-insensitive)."""
        wanted = name.strip().lower()
        rows = self._rows("SELECT * FROM companies")
        for row in rows:
            if wanted in (row["ticker"].lower(), row["name"].lower(), row["cik"]) or \
                    (wanted.isdigit() and _norm_cik(wanted) == row["cik"]):
                return row
        known = ", ".join(f"{r['ticker']} ({r['name']}, CIK {r['cik']})" for r in rows)
        raise FilingsError(f"unknown company {name!r}; the corpus has: {known}")

    def list_filings(self, company: str | None = None, form: str | None = None,
                     fy: int | None = None) -> list[FilingRow]:
        sql, args = "SELECT * FROM filings WHERE 1=1", []
        if company:
            sql += " AND cik = ?"
            args.append(self.company(company)["cik"])
        if form:
            sql += " AND upper(form) = ?"
            args.append(form.strip().upper())
        if fy is not None:
            sql += " AND fy = ?"
            args.append(int(fy))
        return [FilingRow(**dict(r)) for r in self._rows(sql + " ORDER BY cik, filed, doc_id", tuple(args))]

    def filing(self, doc_id: str) -> FilingRow:
        rows = self._rows("SELECT * FROM filings WHERE doc_id = ?", (doc_id,))
        if not rows:
            raise FilingsError(f"no filing {doc_id!r} in the corpus (list_filings shows them)")
        return FilingRow(**dict(rows[0]))

    def scale_of(self, doc_id: str) -> int:
        """How the filing's tables print amounts (1000: "in thousands")."""
        rows = self._rows("SELECT c.scale FROM filings f JOIN companies c ON c.cik = f.cik WHERE f.doc_id = ?",
                          (doc_id,))
        return int(rows[0]["scale"]) if rows else 1

    # ---- facts -------------------------------------------------------------------------------------------
    def _fact(self, row: sqlite3.Row) -> Fact:
        doc = self._rows("SELECT doc_id FROM filings WHERE accn = ?", (row["accn"],))
        return Fact(**dict(row), doc_id=doc[0]["doc_id"] if doc else None)

    def fact(self, fact_id: str) -> Fact:
        rows = self._rows("SELECT * FROM facts WHERE fact_id = ?", (fact_id,))
        if not rows:
            raise FilingsError(f"no fact {fact_id!r}")
        return self._fact(rows[0])

    def get_fact(self, concept: str, company: str, period: str, unit: str | None = None,
                 accn: str | None = None) -> FactAnswer:
        """The value of `concept` for `company` in fiscal `period` (FY2023, FY2023Q2, FY2023Q2YTD; an instant
        concept at the period's end). The latest filed value wins; the answer lists the values it superseded."""
        cik = self.company(company)["cik"]
        try:
            wanted = parse_label(period)
        except ValueError as exc:
            raise FilingsError(str(exc)) from None
        rows = self._rows("SELECT * FROM facts WHERE cik = ? AND (concept = ? OR concept LIKE ?)",
                          (cik, concept, f"%:{concept}"))
        if unit:
            rows = [r for r in rows if r["unit"] == unit]
        if not rows:
            known = sorted({r["concept"] for r in self._rows("SELECT concept FROM facts WHERE cik = ?", (cik,))})
            raise FilingsError(f"no concept {concept!r}{f' in {unit}' if unit else ''} for CIK {cik}; "
                               f"known: {', '.join(known)}")
        instant = all(r["start"] is None for r in rows)
        label = instant_label(wanted) if instant else wanted.label
        matching = [r for r in rows if r["period"] == label and (accn is None or r["accn"] == accn)]
        if not matching:
            periods = sorted({r["period"] for r in rows})
            raise FilingsError(f"{concept} has no value for {period}{f' in filing {accn}' if accn else ''}; "
                               f"reported periods: {', '.join(periods)}")
        matching.sort(key=lambda r: (r["filed"] or "", r["accn"]))
        chosen = matching[-1]
        superseded = [self._fact(r) for r in matching[:-1] if r["val"] != chosen["val"]]
        return FactAnswer(self._fact(chosen), superseded)

    def fact_value(self, fact_id: str) -> float:  # programs.InputSource
        return self.fact(fact_id).val

    # ---- pages -------------------------------------------------------------------------------------------
    def read(self, doc_id: str, page: int) -> str:
        """The text of page `page` (1-based) of a filing."""
        rows = self._rows("SELECT text FROM pages WHERE doc_id = ? AND page = ?", (doc_id, int(page)))
        if not rows:
            pages = self.page_count(doc_id)
            if not pages:
                raise FilingsError(f"no filing {doc_id!r} in the corpus (list_filings shows them)")
            raise FilingsError(f"{doc_id} has pages 1-{pages}, not {page}")
        return str(rows[0]["text"])

    def page_count(self, doc_id: str) -> int:
        return int(self._rows("SELECT count(*) AS n FROM pages WHERE doc_id = ?", (doc_id,))[0]["n"])

    def span(self, doc_id: str, page: int, start: int, end: int) -> str:
        text = self.read(doc_id, page)
        if not 0 <= start < end <= len(text):
            raise FilingsError(f"c.{start}-{end} is outside page {page} of {doc_id} ({len(text)} characters)")
        return text[start:end]

    def span_value(self, doc_id: str, page: int, start: int, end: int) -> float:  # programs.InputSource
        number = first_number(self.span(doc_id, page, start, end))
        if number is None:
            raise FilingsError(f"D:{doc_id} p.{page} c.{start}-{end} states no number")
        return number.value

    # ---- search ------------------------------------------------------------------------------------------
    def _search_index(self) -> tuple[DocumentIndex, list[tuple[str, int]]]:
        if self._index is None:
            rows = self._rows('SELECT c.doc_id, c.page, c.start, c."end", p.text FROM chunks c JOIN pages p '
                              "ON p.doc_id = c.doc_id AND p.page = c.page ORDER BY c.id")
            chunks = [Chunk(r["doc_id"], r["start"], r["end"], r["text"][r["start"]:r["end"]]) for r in rows]
            # BM25 only: doc_index's lexical side; the vectors are unused here
            self._index = (DocumentIndex(chunks, np.zeros((len(chunks), 0), dtype=np.float32), []),
                           [(r["doc_id"], r["page"]) for r in rows])
        return self._index

    def search(self, query: str, company: str | None = None, period: str | None = None,
               k: int = 8) -> list[SearchHit]:
        """The `k` best chunks for `query` (BM25), optionally within one company's filings or one period's."""
        index, where = self._search_index()
        allowed = {f.doc_id for f in self._filings_for(company, period)} if company or period else None
        scores = index.bm25_scores(query)
        hits: list[SearchHit] = []
        for i in np.argsort(-scores, kind="stable"):
            if scores[i] <= 0 or len(hits) >= k:
                break
            doc_id, page = where[int(i)]
            if allowed is not None and doc_id not in allowed:
                continue
            c = index.chunks[int(i)]
            hits.append(SearchHit(doc_id, page, c.start, c.end, c.text, float(scores[i])))
        return hits

    def _filings_for(self, company: str | None, period: str | None) -> list[FilingRow]:
        filings = self.list_filings(company=company)
        if period:
            try:
                wanted = parse_label(period)
            except ValueError as exc:
                raise FilingsError(str(exc)) from None
            filings = [f for f in filings if f.fy == wanted.fy and
                       (wanted.quarter is None or f.fp == f"Q{wanted.quarter}" or
                        (wanted.quarter == 4 and f.fp == "FY"))]
        return filings
