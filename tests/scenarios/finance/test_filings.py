"""The filings store: pages of each format, offsets, facts and their ids, restatements, search, errors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from mainspring.scenarios.finance.filings import FilingsError, FilingsStore, fact_id_of
from mainspring.scenarios.finance.page_text import html_to_text, render_with_offsets

from .conftest import ACCN_10K, ACCN_10KA, CIK


def test_pages_of_each_format(store: FilingsStore) -> None:
    assert [f.doc_id for f in store.list_filings()] == ["ORBT-10K-FY2023", "ORBT-10KA-FY2023", "ORBT-10Q-FY2024Q2"]
    assert store.page_count("ORBT-10K-FY2023") == 2
    assert "| Revenues | 1,234,456 | 1,100,000 |" in store.read("ORBT-10K-FY2023", 1)  # md: the raw source
    html_page = store.read("ORBT-10Q-FY2024Q2", 2)
    assert "Revenues | 330,000 | 640,000" in html_page and "<td>" not in html_page
    assert "color: red" not in store.read("ORBT-10Q-FY2024Q2", 1)
    assert "1,250,000" in store.read("ORBT-10KA-FY2023", 2)  # pdf: pypdf's text of page 2


def test_offsets_resolve_to_the_stated_text(store: FilingsStore) -> None:
    for doc_id, page, needle in [("ORBT-10K-FY2023", 2, "$1,234.5 million"),
                                 ("ORBT-10Q-FY2024Q2", 2, "$330.0 million"),
                                 ("ORBT-10KA-FY2023", 2, "1,250,000")]:
        text = store.read(doc_id, page)
        start = text.index(needle)
        assert store.span(doc_id, page, start, start + len(needle)) == needle
    with pytest.raises(FilingsError, match="outside"):
        store.span("ORBT-10K-FY2023", 2, 0, 10_000)
    shown = render_with_offsets("ab\ncd")
    assert shown == "c.0| ab\nc.3| cd"


def test_html_text_rules() -> None:
    assert html_to_text("<p>a <b>b</b></p><table><tr><td>x</td><td>1</td></tr></table>") == "a b\nx | 1"


def test_fact_ids_are_stable_across_two_ingests(corpus_dir: Path, tmp_path: Path) -> None:
    first = FilingsStore.open(corpus_dir, tmp_path / "one")
    second = FilingsStore.open(corpus_dir, tmp_path / "two")
    ids = [sorted(r[0] for r in sqlite3.connect(s.path).execute("SELECT fact_id FROM facts")) for s in (first, second)]
    assert ids[0] == ids[1] and len(ids[0]) == 9
    assert all(i.startswith("f-") and len(i) == 12 for i in ids[0])
    answer = first.get_fact("Revenues", "ORBT", "FY2022")
    assert answer.fact.fact_id == fact_id_of(CIK, "us-gaap:Revenues", "USD", "2021-07-01", "2022-06-30", ACCN_10K)
    again = FilingsStore.open(corpus_dir, tmp_path / "one")
    assert again.path == first.path  # reused, not rebuilt
    for s in (first, second, again):
        s.close()


def test_restated_value_wins_and_names_what_it_superseded(store: FilingsStore) -> None:
    answer = store.get_fact("us-gaap:Revenues", "orbt", "FY2023")
    assert answer.fact.val == 1_250_000_000 and answer.fact.accn == ACCN_10KA
    assert answer.fact.doc_id == "ORBT-10KA-FY2023"
    (old,) = answer.superseded
    assert old.val == 1_234_456_000 and old.superseded_by == answer.fact.fact_id
    original = store.get_fact("Revenues", "ORBT", "FY2023", accn=ACCN_10K)
    assert original.fact.val == 1_234_456_000


def test_periods_quarter_ytd_and_instants(store: FilingsStore) -> None:
    assert store.get_fact("Revenues", "Orbital Dynamics Inc.", "FY2024Q2").fact.val == 330_000_000
    assert store.get_fact("Revenues", CIK, "FY2024Q2YTD").fact.val == 640_000_000
    cash = "CashAndCashEquivalentsAtCarryingValue"
    assert store.get_fact(cash, "ORBT", "FY2023").fact.val == 500_000_000
    assert store.get_fact(cash, "ORBT", "FY2024Q2YTD").fact.val == 520_000_000
    with pytest.raises(FilingsError, match="reported periods"):
        store.get_fact("Revenues", "ORBT", "FY2019")
    with pytest.raises(FilingsError, match="known"):
        store.get_fact("Goodwill", "ORBT", "FY2023")


def test_unknown_company_lists_the_known_ones(store: FilingsStore) -> None:
    with pytest.raises(FilingsError, match=r"ORBT \(Orbital Dynamics Inc\., CIK 9900000001\)"):
        store.list_filings(company="ACME")
    assert [f.doc_id for f in store.list_filings(company="9900000001", form="10-q")] == ["ORBT-10Q-FY2024Q2"]
    assert len(store.list_filings(fy=2023)) == 2


def test_search_returns_cited_chunks(store: FilingsStore) -> None:
    hits = store.search("restated revenues", company="ORBT")
    assert hits[0].doc_id == "ORBT-10KA-FY2023" and hits[0].page == 2
    top = hits[0]
    assert store.span(top.doc_id, top.page, top.start, top.end) == top.text
    quarter = store.search("revenues", period="FY2024Q2")
    assert quarter and {h.doc_id for h in quarter} == {"ORBT-10Q-FY2024Q2"}


def test_not_a_corpus(tmp_path: Path) -> None:
    with pytest.raises(FilingsError, match="manifest.json"):
        FilingsStore.open(tmp_path, tmp_path / "cache")
