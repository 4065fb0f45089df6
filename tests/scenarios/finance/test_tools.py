"""The finance tools called directly with a ToolContext over the fixture corpus: each tool's answer and data,
compute's ids kept across a re-run of the same call, the verdict saved, and the errors a model sees."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from mainspring.agents.tools.base import ToolContext, ToolResult
from mainspring.agents.tools.registry import builtin_registry
from mainspring.config import Settings
from mainspring.scenarios.finance.tools import TOOL_NAMES, finance_tools, load_programs


@pytest.fixture
def tools(tmp_path: Path) -> dict:
    return {t.name: t for t in finance_tools(Settings(data_dir=tmp_path / "data"))}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return tmp_path / "ws"


def _ctx(workspace: Path, corpus: Path | None, key: str = "k1") -> ToolContext:
    return ToolContext(run_id="run_f", call_id=key, idempotency_key=key, workspace=workspace,
                       attachments={"docs": str(corpus)} if corpus else {})


def call(tools: dict, name: str, args: dict, ctx: ToolContext) -> ToolResult:
    return asyncio.run(tools[name].call(args, ctx))


def test_list_filings(tools, ws, corpus_dir) -> None:
    r = call(tools, "list_filings", {"company": "orbt", "form": "10-K/A"}, _ctx(ws, corpus_dir))
    assert not r.is_error
    assert [f["doc_id"] for f in r.data["filings"]] == ["ORBT-10KA-FY2023"]
    assert "amends 0000000001-23-000001" in r.content and "2 pages" in r.content
    bad = call(tools, "list_filings", {"company": "ACME"}, _ctx(ws, corpus_dir))
    assert bad.is_error and "ORBT" in bad.content


def test_get_fact_names_source_and_superseded(tools, ws, corpus_dir) -> None:
    r = call(tools, "get_fact", {"concept": "us-gaap:Revenues", "company": "ORBT", "period": "FY2023"},
             _ctx(ws, corpus_dir))
    assert not r.is_error
    assert r.data["fact"]["val"] == 1_250_000_000 and r.data["fact"]["doc_id"] == "ORBT-10KA-FY2023"
    assert r.content.startswith(r.data["fact"]["fact_id"])
    assert "1,250,000,000 USD" in r.content and "supersedes" in r.content
    assert r.data["superseded"][0]["val"] == 1_234_456_000
    wrong = call(tools, "get_fact", {"concept": "Revenues", "company": "ORBT", "period": "2023"},
                 _ctx(ws, corpus_dir))
    assert wrong.is_error and "FY2023Q2" in wrong.content


def test_search_and_read_give_citable_spans(tools, ws, corpus_dir) -> None:
    r = call(tools, "search_filings", {"query": "restated revenues", "company": "ORBT"}, _ctx(ws, corpus_dir))
    top = r.data["passages"][0]
    assert top["doc_id"] == "ORBT-10KA-FY2023" and f"[D:ORBT-10KA-FY2023 p.{top['page']} c." in r.content
    page = call(tools, "read_filing", {"doc_id": "ORBT-10K-FY2023", "page": 2}, _ctx(ws, corpus_dir))
    text = page.data["text"]
    line = next(ln for ln in page.content.splitlines() if "$1,234.5 million" in ln)
    offset = int(line.split("|")[0][2:])
    assert text[offset:].startswith(line.split("| ", 1)[1])
    missing = call(tools, "read_filing", {"doc_id": "ORBT-10K-FY2023", "page": 5}, _ctx(ws, corpus_dir))
    assert missing.is_error and "pages 1-2" in missing.content


def test_compute_numbers_programs_once_per_call(tools, ws, corpus_dir) -> None:
    fact = call(tools, "get_fact", {"concept": "Revenues", "company": "ORBT", "period": "FY2023"},
                _ctx(ws, corpus_dir)).data["fact"]["fact_id"]
    prior = call(tools, "get_fact", {"concept": "Revenues", "company": "ORBT", "period": "FY2022"},
                 _ctx(ws, corpus_dir)).data["fact"]["fact_id"]
    first = call(tools, "compute", {"program": f"growth(F:{fact}, F:{prior})"}, _ctx(ws, corpus_dir, "c1"))
    assert first.data["id"] == "p-1" and first.data["value"] == pytest.approx(1.25 / 1.1 - 1)
    assert [i["fact_id"] for i in first.data["inputs"]] == [fact, prior]
    second = call(tools, "compute", {"program": "add(1, 2)"}, _ctx(ws, corpus_dir, "c2"))
    rerun = call(tools, "compute", {"program": f"growth(F:{fact}, F:{prior})"}, _ctx(ws, corpus_dir, "c1"))
    assert (second.data["id"], rerun.data["id"]) == ("p-2", "p-1")
    assert [p["id"] for p in load_programs(ws)] == ["p-1", "p-2"]
    broken = call(tools, "compute", {"program": "divide(1, 0)"}, _ctx(ws, corpus_dir, "c3"))
    assert broken.is_error and "division by zero" in broken.content
    assert len(load_programs(ws)) == 2


def test_verify_report_uses_the_runs_programs_and_saves_the_verdict(tools, ws, corpus_dir) -> None:
    q2 = call(tools, "get_fact", {"concept": "Revenues", "company": "ORBT", "period": "FY2024Q2"},
              _ctx(ws, corpus_dir)).data["fact"]["fact_id"]
    call(tools, "compute", {"program": f"divide(F:{q2}, 1000000)"}, _ctx(ws, corpus_dir, "c1"))
    good = call(tools, "verify_report", {"markdown": f"Q2 FY2024 revenues were $330.0 million [F:{q2}], "
                                                     "that is 330 [P:p-1] in millions."}, _ctx(ws, corpus_dir))
    assert good.data["verified"] is True, good.content
    bad = call(tools, "verify_report", {"markdown": "Revenues were $9.0 million [P:p-1]."}, _ctx(ws, corpus_dir))
    assert bad.data["verified"] is False and bad.data["claims"][0]["status"] == "wrong_value"
    saved = json.loads((ws / "finance" / "verdict.json").read_text())
    assert saved == bad.data


def test_without_a_corpus_the_tools_say_so(tools, ws, tmp_path) -> None:
    none = call(tools, "list_filings", {}, _ctx(ws, None))
    assert none.is_error and "attachment 'docs'" in none.content
    (tmp_path / "plain").mkdir()
    plain = call(tools, "read_filing", {"doc_id": "X", "page": 1}, _ctx(ws, tmp_path / "plain"))
    assert plain.is_error and "manifest.json" in plain.content


def test_registered_through_the_entry_point(tmp_path) -> None:
    registry = builtin_registry(Settings(data_dir=tmp_path / "data"))
    for name in TOOL_NAMES:
        assert registry.get(name).name == name
