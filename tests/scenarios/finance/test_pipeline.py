"""The research pipeline as a plan of four agents on the real runtime, tools and verifier, over a generated
corpus: a scripted analyst (TEST-ONLY stage answers) whose report is right is verified; the same report with a
wrong number, a wrong period or an uncited figure is not, and the verifier lists the claim. The verify stage
reads its inputs from its own goal (hash-checked), so the model copies nothing."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from mainspring.agents import audit
from mainspring.agents.plans.tables import PlanTaskRow
from mainspring.engine.outputs import Usage
from mainspring.models import ChatModel, Completion, ToolCall
from mainspring.scenarios.finance.corpus import generate_corpus
from mainspring.scenarios.finance.filings import FilingsStore
from mainspring.scenarios.finance.pipeline import finance_agents, outcome_of, research_plan
from mainspring.scenarios.finance.pipeline_tools import program_table, verify_stage_tools
from mainspring.scenarios.finance.tools import finance_tools
from mainspring.store.db import session
from tests.agents.conftest import drive, make_runtime

QUESTION = "How much did Orbital Dynamics' revenue grow in fiscal 2024?"
FACT_ID = re.compile(r"\bf-[0-9a-f]{10}\b")


@pytest.fixture
def db_url(sqlite_database_url):
    return sqlite_database_url  # the plan machinery is tested on both databases in tests/agents/plans


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("allowed")
    generate_corpus(root / "corpus", seed=0)
    return root


@pytest.fixture(scope="module")
def revenue(corpus, tmp_path_factory):
    store = FilingsStore.open(corpus / "corpus", tmp_path_factory.mktemp("cache"))
    try:
        return {fy: store.get_fact("us-gaap:Revenues", "ORBT", fy).fact for fy in ("FY2023", "FY2024")}
    finally:
        store.close()


class StageModel(ChatModel):
    """TEST-ONLY: each stage's answer, keyed by its instructions; `report` is the Markdown the writer returns."""

    model = "stages"

    def __init__(self, report: str, answer: float | None = None):
        self.report, self.answer = report, answer

    async def chat(self, messages, tools=None, tool_choice=None, **kwargs) -> Completion:
        system = messages[0]["content"]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        usage = Usage(prompt_tokens=100, cached_tokens=0, completion_tokens=10)
        if "You collect evidence" in system and tools and len(results) < 2:
            fy = ("FY2023", "FY2024")[len(results)]
            args = {"concept": "us-gaap:Revenues", "company": "ORBT", "period": fy}
            return Completion("", [ToolCall(f"g{fy}", "get_fact", json.dumps(args))], "tool_calls", usage, self.model)
        if "You collect evidence" in system:
            ids = [FACT_ID.search(r).group(0) for r in results]
            body = {"facts": [{"fact_id": i, "about": f"revenue {fy}"} for i, fy in zip(ids, ("FY2023", "FY2024"))]}
            return Completion(json.dumps(body), [], "stop", usage, self.model)
        if "You compute" in system:
            ids = FACT_ID.findall(messages[1]["content"])
            body = {"findings": [{"statement": "revenue growth in fiscal 2024",
                                  "program": f"growth(F:{ids[1]}, F:{ids[0]})"}]}
            return Completion(json.dumps(body), [], "stop", usage, self.model)
        if "You write" in system:
            body = {"answer": self.answer, "markdown": self.report}
            return Completion(json.dumps(body), [], "stop", usage, self.model)
        assert tool_choice == "required" and [t["function"]["name"] for t in tools] == ["verify_research_report"]
        return Completion("", [ToolCall("v", "verify_research_report", "{}")], "tool_calls", usage, self.model)

    async def stream(self, messages, **kwargs):  # pragma: no cover - the runtime calls chat()
        raise NotImplementedError


def run_pipeline(tmp_path, db_url, corpus, report: str, answer: float | None = None):
    rt = make_runtime(tmp_path / "data", db_url, StageModel(report, answer),
                      {t.name: t for t in finance_tools(None) + verify_stage_tools(_settings(tmp_path))},
                      agent_attach_roots=[corpus])
    for spec in finance_agents("stages"):
        rt.put_agent(spec)

    async def body():
        row = rt.plans.create(research_plan(QUESTION, str(corpus / "corpus")))
        deadline = time.monotonic() + 60
        while rt.plans.get(row.id).status not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, [(t.key, t.status, t.error) for t in rt.plans.tasks(row.id)]
            await asyncio.sleep(0.05)
        return row.id

    plan_id = drive(rt, body)
    with session(db_url, readonly=True) as s:
        tasks = s.query(PlanTaskRow).filter_by(plan_id=plan_id).all()
        plan = {"id": plan_id, "status": rt.plans.get(plan_id).status, "tasks": [
            {"key": t.key, "run_id": t.run_id, "error": t.error,
             "artifact": json.loads(t.artifact_json) if t.artifact_json else None} for t in tasks]}
    return rt, outcome_of(plan)


def _settings(tmp_path):
    from mainspring.config import Settings

    return Settings(data_dir=tmp_path / "data")


def pct(fact_new, fact_old) -> str:
    return f"{(fact_new.val / fact_old.val - 1) * 100:.1f}%"


def test_a_right_report_is_verified_and_every_stage_is_in_the_audit_trail(tmp_path, db_url, corpus, revenue):
    new, old = revenue["FY2024"], revenue["FY2023"]
    report = (f"Revenue was ${new.val / 1e6:,.1f} million in FY2024 [F:{new.fact_id}], up "
              f"{pct(new, old)} from fiscal 2023 [P:p-1].")
    rt, outcome = run_pipeline(tmp_path, db_url, corpus, report, answer=float(pct(new, old)[:-1]))
    assert outcome.status == "succeeded", outcome.error
    assert outcome.verified, outcome.verdict
    assert [c["status"] for c in outcome.verdict["claims"]] == ["ok", "ok"]
    assert set(outcome.runs) == {"collect", "analyse", "report", "verify"}
    with session(db_url, readonly=True) as s:
        for run_id in outcome.runs.values():
            assert audit.verify(s, run_id).ok
        trail = [json.loads(line) for line in audit.export_jsonl(s, outcome.runs["verify"])]
    assert any("verify_research_report" in json.dumps(e) for e in trail)  # the verdict's call, in the chain


@pytest.mark.parametrize("break_it, status", [
    (lambda new, old: f"Revenue was ${new.val / 1e6 + 50:,.1f} million in FY2024 [F:{new.fact_id}].", "wrong_value"),
    (lambda new, old: f"Revenue was ${old.val / 1e6:,.1f} million in FY2024 [F:{old.fact_id}].", "wrong_period"),
    (lambda new, old: f"Revenue was ${new.val / 1e6:,.1f} million in FY2024.", "uncited"),
    (lambda new, old: f"Revenue grew {pct(new, old)} [P:p-7].", "unresolved"),
])
def test_a_wrong_report_is_unverified_and_the_claim_is_named(tmp_path, db_url, corpus, revenue, break_it, status):
    rt, outcome = run_pipeline(tmp_path, db_url, corpus, break_it(revenue["FY2024"], revenue["FY2023"]))
    assert outcome.status == "succeeded" and not outcome.verified  # the plan ran; the report fails closed
    assert status in [c["status"] for c in outcome.failing_claims]


@pytest.mark.parametrize("report", [
    "Revenue grew strongly in fiscal 2024.",  # no number at all: nothing would be checked
    "Revenue was ${new:,.1f} million in FY2024 [F:{fact}].",  # cited, but not the answer it gives
])
def test_a_report_whose_answer_is_not_a_cited_number_is_unverified(tmp_path, db_url, corpus, revenue, report):
    new, old = revenue["FY2024"], revenue["FY2023"]
    growth = float(pct(new, old)[:-1])
    rt, outcome = run_pipeline(tmp_path, db_url, corpus, report.format(new=new.val / 1e6, fact=new.fact_id),
                               answer=growth)
    assert outcome.status == "succeeded" and not outcome.verified
    (claim,) = outcome.failing_claims
    assert claim["status"] == "answer_uncited" and f"{growth:g}" in claim["reason"]


def test_programs_are_numbered_as_the_report_cites_them():
    analysis = {"findings": [{"statement": "a", "program": "add(1, 2)"}, {"statement": "b", "program": "#0"}]}
    assert program_table(analysis) == {"p-1": "add(1, 2)", "p-2": "#0"}
    assert program_table({"findings": "not a list"}) == {} and program_table(None) == {}
