"""The research pipeline as a plan of four agents over one filings folder (the plan's `docs` attachment):

1. collect  — finds the filings and facts the question needs (list_filings, get_fact, search_filings,
              read_filing) and hands on their fact ids and cited passages;
2. analyse  — states each number the answer needs as a program over those fact ids (compute checks them);
              its artifact holds the programs' text, so the verifier re-executes them rather than trusting values;
3. report   — writes the Markdown answer, every number followed by its citation: [F:fact_id], [D:doc p.N c.S-E]
              or [P:p-K] (the K-th finding's program);
4. verify   — one tool call (tool_choice "required"): verify_research_report reads the report and the programs
              from the run's own input artifacts (hash-checked), re-executes every program, resolves every
              citation and ends the run with the verdict. It fails closed: an uncited or unresolvable number marks
              the report unverified and lists the claims that failed.

Each stage is an ordinary durable run, so its tool calls, programs, citations and the verdict are in its
hash-chained audit trail; `audit_jsonl` joins the four runs' trails into one file per report.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from mainspring.agents.plans.spec import PlanSpec, TaskSpec
from mainspring.agents.spec import AgentLimits, AgentSpec

STAGES = ("collect", "analyse", "report", "verify")
AGENT_PREFIX = "finance-"
VERIFY_TOOL = "verify_research_report"

COLLECT = """\
You collect evidence from a company's filings for a financial question. Find the filings with
list_filings(company, form, fy), the reported numbers with get_fact(concept, company, period, unit) — concepts
such as us-gaap:Revenues, us-gaap:NetIncomeLoss, us-gaap:GrossProfit; periods FY2023, FY2023Q2, FY2023Q2YTD —
and passages with search_filings(query, company, period) and read_filing(doc_id, page). Answer with the fact ids
and passages the question needs, each with a few words on what it is."""
ANALYSE = """\
You compute what a financial question needs from the collected facts. Never do arithmetic yourself: write
each number as a program over fact ids, e.g. growth(F:f-0123456789, F:f-9876543210) or
divide(subtract(F:f-aaaaaaaaaa, F:f-bbbbbbbbbb), F:f-bbbbbbbbbb); check a program with compute(program).
Answer with one finding per number: a sentence saying what it is and its program."""
REPORT = """\
You write a short Markdown answer to a financial question from the analysis. Every number you write must be
followed at once by its citation: [F:fact_id] for a reported fact, [P:p-K] for the K-th finding's program
(p-1 is the first), [D:doc_id p.N c.S-E] for a passage. Write no number you cannot cite. Give the answer
itself as `answer`: whole dollars or shares, a ratio or growth as a percent, null when it is not reported."""
VERIFY = f"Call {VERIFY_TOOL}() to check the report. It ends the task with the verdict."

COLLECT_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["facts"], "properties": {
    "facts": {"type": "array", "maxItems": 8, "items": {
        "type": "object", "additionalProperties": False, "required": ["fact_id", "about"],
        "properties": {"fact_id": {"type": "string", "maxLength": 24}, "about": {"type": "string", "maxLength": 80}}}},
    "passages": {"type": "array", "maxItems": 4, "items": {
        "type": "object", "additionalProperties": False, "required": ["citation", "about"],
        "properties": {"citation": {"type": "string", "maxLength": 60},
                       "about": {"type": "string", "maxLength": 80}}}}}}
ANALYSE_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["findings"], "properties": {
    "findings": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "additionalProperties": False, "required": ["statement", "program"],
        "properties": {"statement": {"type": "string", "maxLength": 100},
                       "program": {"type": "string", "maxLength": 200}}}}}}
REPORT_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "markdown"], "properties": {
    "answer": {"type": ["number", "null"], "description": "the answer in whole units (dollars, shares; a ratio "
               "as a percent, e.g. 12.5); null when the filings do not report it"},
    "markdown": {"type": "string", "maxLength": 1200}}}
VERIFY_SCHEMA = {"type": "object", "required": ["verified", "claims"],
                 "properties": {"verified": {"type": "boolean"}, "claims": {"type": "array"}}}


# The artifacts' bounds keep every stage's answer (at most ~1,250 characters of JSON, about 3 a token) inside
# one model call of MIN_MAX_TOKENS, so a constrained answer always closes its JSON instead of being cut off.
MIN_MAX_TOKENS = 448


def finance_agents(model: str = "smollm2", max_tokens: int = 512, tool_steps: int = 8) -> list[AgentSpec]:
    """The four stage agents, named finance-<stage>; put them into the project before the first plan.
    `tool_steps`: the model steps collect may take (analyse gets two fewer, at least two)."""
    if max_tokens < MIN_MAX_TOKENS:
        raise ValueError(f"max_tokens must be at least {MIN_MAX_TOKENS}: a stage's answer must fit one call")
    def agent(stage: str, instructions: str, tools: list[str], steps: int, **extra: Any) -> AgentSpec:
        return AgentSpec(name=AGENT_PREFIX + stage, model=model, instructions=instructions, tools=tools,
                         limits=AgentLimits(max_steps=steps, max_tokens=max_tokens), **extra)
    return [agent("collect", COLLECT, ["list_filings", "get_fact", "search_filings", "read_filing"], tool_steps),
            agent("analyse", ANALYSE, ["get_fact", "compute"], max(2, tool_steps - 2)),
            agent("report", REPORT, [], 2),
            agent("verify", VERIFY, [VERIFY_TOOL], 2, tool_choice="required")]


def research_plan(question: str, corpus: str, *, name: str | None = None,
                  token_budget: int | None = None) -> PlanSpec:
    """The plan that answers `question` over the filings folder `corpus` (a server path under the operator's
    attach roots, or uploaded file ids)."""
    tasks = [
        TaskSpec(id="collect", agent=AGENT_PREFIX + "collect", prompt="Question: {goal}",
                 output_schema=COLLECT_SCHEMA, on_failure="fail", max_attempts=1),
        TaskSpec(id="analyse", agent=AGENT_PREFIX + "analyse", prompt="Question: {goal}", depends_on=["collect"],
                 output_schema=ANALYSE_SCHEMA, on_failure="fail", max_attempts=1),
        TaskSpec(id="report", agent=AGENT_PREFIX + "report", prompt="Question: {goal}",
                 depends_on=["collect", "analyse"], output_schema=REPORT_SCHEMA, on_failure="fail", max_attempts=1),
        TaskSpec(id="verify", agent=AGENT_PREFIX + "verify", prompt="Verify the report for: {goal}",
                 depends_on=["analyse", "report"], output_schema=VERIFY_SCHEMA, on_failure="fail",
                 max_attempts=1),
    ]
    return PlanSpec(goal=question, name=name or "finance research", tasks=tasks, attachments={"docs": corpus},
                    token_budget=token_budget)


@dataclass
class ResearchOutcome:
    plan_id: str
    status: str  # the plan's: succeeded, failed, cancelled
    markdown: str = ""
    answer: float | None = None
    verified: bool = False  # fail closed: False unless the verifier ran and passed every claim
    verdict: dict[str, Any] | None = None
    runs: dict[str, str] = field(default_factory=dict)  # stage -> run id
    error: str | None = None
    usage: dict[str, Any] | None = None

    @property
    def failing_claims(self) -> list[dict]:
        return [c for c in (self.verdict or {}).get("claims", []) if c.get("status") != "ok"]


def put_agents(client: httpx.Client, model: str, max_tokens: int = 512, tool_steps: int = 8) -> None:
    for spec in finance_agents(model, max_tokens, tool_steps):
        r = client.post("/v1/agents", json=spec.model_dump(mode="json"))
        r.raise_for_status()


def start_research(client: httpx.Client, question: str, corpus: str, **options: Any) -> str:
    r = client.post("/v1/plans", json=research_plan(question, corpus, **options).model_dump(mode="json",
                                                                                         exclude_none=True))
    r.raise_for_status()
    return r.json()["id"]


def wait_research(client: httpx.Client, plan_id: str, timeout_s: float = 1800.0,
                  poll_s: float = 0.5) -> ResearchOutcome:
    deadline = time.monotonic() + timeout_s
    while True:
        plan = client.get(f"/v1/plans/{plan_id}").raise_for_status().json()
        if plan["status"] in ("succeeded", "failed", "cancelled"):
            return outcome_of(plan)
        if time.monotonic() > deadline:
            raise TimeoutError(f"plan {plan_id} still {plan['status']} after {timeout_s:g} s")
        time.sleep(poll_s)


def outcome_of(plan: dict) -> ResearchOutcome:
    """A finished plan's report and verdict; a report the verifier did not pass (or never saw) is unverified."""
    tasks = {t["key"]: t for t in plan.get("tasks") or []}
    report = (tasks.get("report") or {}).get("artifact") or {}
    verdict = (tasks.get("verify") or {}).get("artifact")
    errors = [f"{k}: {t['error']}" for k, t in tasks.items() if t.get("error")]
    return ResearchOutcome(
        plan_id=plan["id"], status=plan["status"],
        markdown=report.get("markdown", "") if isinstance(report, dict) else "",
        answer=report.get("answer") if isinstance(report, dict) else None,
        verified=isinstance(verdict, dict) and verdict.get("verified") is True,
        verdict=verdict if isinstance(verdict, dict) else None,
        runs={k: t["run_id"] for k, t in tasks.items() if t.get("run_id")},
        error="; ".join(errors) or plan.get("error"), usage=plan.get("usage"))


def audit_jsonl(client: httpx.Client, outcome: ResearchOutcome) -> str:
    """The report's reasoning chain: each stage run's audit trail in plan order (one JSON object per line, each
    with its stage), then the plan's chain head over all of them."""
    lines = []
    for stage in STAGES:
        run_id = outcome.runs.get(stage)
        if run_id is None:
            continue
        text = client.get(f"/v1/runs/{run_id}/audit.jsonl").raise_for_status().text
        for line in text.splitlines():
            if line.strip():
                lines.append(json.dumps({"stage": stage, "run_id": run_id, **json.loads(line)}, sort_keys=True))
    head = client.get(f"/v1/plans/{outcome.plan_id}/audit").raise_for_status().json()
    lines.append(json.dumps({"stage": "plan", "plan_id": outcome.plan_id, "audit": head}, sort_keys=True))
    return "\n".join(lines) + "\n"
