"""Plan budgets split across tasks, a task over its share pausing until the plan's budget is raised, usage per
task and per plan, and what routing by complexity saved against the strongest model everywhere.

The share arithmetic is checked with the scheduler alone (runs set by hand); the pause, the raise and the cost
report end to end on a real server (scripted models whose usage per call is known, priced by the built-in sheet),
through the HTTP API and the CLI."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from mainspring.agents import journal
from mainspring.agents.plans import store
from mainspring.agents.plans.cli import plans_app
from mainspring.agents.plans.scheduler import PlanScheduler
from mainspring.agents.plans.spec import PlanSpec
from mainspring.agents.spec import AgentLimits, AgentSpec
from mainspring.agents.tables import RunRow
from mainspring.engine.outputs import Usage
from mainspring.models import ChatModel, Completion, ToolCall
from mainspring.store.db import session
from tests.agents.conftest import CountTool
from tests.api.test_agent_routes import agent_server, error, ok

STANDARD, FAST = "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct-fast"  # built-in sheet: FAST costs 2x STANDARD


# ---- the split, with the scheduler alone ---------------------------------------------------------------------
def agent(name: str, **limits: Any) -> AgentSpec:
    return AgentSpec(name=name, model="stage", instructions="work", tools=[], limits=AgentLimits(**limits))


def runs_by_task(db_url: str, plan_id: str) -> dict[str, RunRow]:
    current = {t.run_id: t.key for t in store.tasks(db_url, plan_id) if t.run_id}
    with session(db_url, readonly=True) as s:
        return {current[r.id]: r for r in s.scalars(select(RunRow).where(RunRow.id.in_(list(current))))}


def end_run(db_url: str, run_id: str, status: str, tokens: tuple[int, int], cost_u: int, result: str = "ok") -> None:
    with session(db_url) as s:
        run = s.get(RunRow, run_id)
        run.status, run.result, run.error = status, result, None if status == "succeeded" else "it broke"
        run.prompt_tokens, run.completion_tokens, run.cost_u = *tokens, cost_u


def test_each_run_gets_an_even_share_of_what_the_plan_has_left(db_url):
    journal.put_agent(db_url, agent("w"), None)
    plan = store.create_plan(db_url, PlanSpec(goal="g", token_budget=4000, cost_budget_usd="0.004", tasks=[
        {"id": "a", "agent": "w", "prompt": "x"}, {"id": "b", "agent": "w", "prompt": "x"},
        {"id": "c", "agent": "w", "prompt": "x", "depends_on": ["a"]},
        {"id": "d", "agent": "w", "prompt": "x", "depends_on": ["a"]}]), project_id=None)
    sched = PlanScheduler(db_url, "host:1:a")
    assert sched.tick().dispatched == 2
    runs = runs_by_task(db_url, plan.id)
    # four tasks to go: a quarter each, and b's share leaves a's reserved (a is in flight)
    assert {k: (r.token_budget, r.cost_budget_u) for k, r in runs.items()} == {"a": (1000, 1000), "b": (1000, 1000)}

    end_run(db_url, runs["a"].id, "succeeded", (300, 100), 100)  # used 400 of its 1000 tokens
    assert sched.tick().dispatched == 2  # c and d: what a left over goes to the tasks after it
    runs = runs_by_task(db_url, plan.id)
    assert (runs["c"].token_budget, runs["d"].token_budget) == (1300, 1300)  # (4000 - 400 - b's 1000) / 2
    assert (runs["c"].cost_budget_u, runs["d"].cost_budget_u) == (1450, 1450)  # (4000 - 100 - 1000) / 2

    end_run(db_url, runs["b"].id, "failed", (150, 50), 50)  # b fails: retried, and its first run's usage counts
    sched.tick()
    retry = runs_by_task(db_url, plan.id)["b"]
    assert retry.id != runs["b"].id
    assert (retry.token_budget, retry.cost_budget_u) == (4000 - 400 - 200 - 1300 - 1300, 4000 - 100 - 50 - 2900)


def test_the_agents_own_limit_wins_when_smaller_and_no_plan_budget_keeps_it(db_url):
    journal.put_agent(db_url, agent("tight", token_budget=500, cost_budget_usd="0.0002"), None)
    journal.put_agent(db_url, agent("w"), None)
    tasks = [{"id": "first", "agent": "tight", "prompt": "x", "priority": 1},
             {"id": "then", "agent": "w", "prompt": "x"}]
    budgeted = store.create_plan(db_url, PlanSpec(goal="g", token_budget=3000, tasks=tasks), project_id=None)
    free = store.create_plan(db_url, PlanSpec(goal="g", tasks=tasks), project_id=None)
    PlanScheduler(db_url, "host:1:a").tick()
    runs = runs_by_task(db_url, budgeted.id)
    assert (runs["first"].token_budget, runs["first"].cost_budget_u) == (500, 200)  # its own limits: below 1500
    assert (runs["then"].token_budget, runs["then"].cost_budget_u) == (2500, None)  # the plan sets no cost budget
    runs = runs_by_task(db_url, free.id)
    assert {k: (r.token_budget, r.cost_budget_u) for k, r in runs.items()} == {"first": (500, 200),
                                                                              "then": (None, None)}


def test_fan_out_items_each_count_as_a_task(db_url):
    journal.put_agent(db_url, agent("w"), None)
    plan = store.create_plan(db_url, PlanSpec(goal="g", token_budget=3000, tasks=[
        {"id": "list", "agent": "w", "prompt": "x", "output_schema": {"type": "array"}},
        {"id": "each", "agent": "w", "prompt": "on {item}", "depends_on": ["list"], "map_over": "list"}]),
        project_id=None)
    sched = PlanScheduler(db_url, "host:1:a")
    sched.tick()
    listing = runs_by_task(db_url, plan.id)["list"]
    assert listing.token_budget == 1500  # list and each: two tasks while the items are unknown
    end_run(db_url, listing.id, "succeeded", (200, 100), 0, result="[1, 2, 3]")
    sched.tick()
    runs = runs_by_task(db_url, plan.id)
    assert {k: r.token_budget for k, r in runs.items() if k != "list"} == {f"each[{i}]": 900 for i in range(3)}


# ---- end to end on a server ------------------------------------------------------------------------------------
class MeterModel(ChatModel):
    """TEST-ONLY: every call uses `usage` and answers as `name`. Instructions "count N": calls the count tool
    until N results are in, then answers; otherwise answers at once."""

    def __init__(self, name: str, usage: Usage) -> None:
        self.model, self.usage, self.calls = name, usage, 0

    async def chat(self, messages: list[dict], *, tools: list[dict] | None = None, **kwargs: Any) -> Completion:
        self.calls += 1
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        wanted = re.search(r"count (\d+)", system)
        done = sum(m["role"] == "tool" for m in messages)
        if wanted and tools and done < int(wanted.group(1)):
            return Completion("", [ToolCall(f"c{done}", "count", "{}")], "tool_calls", self.usage, self.model)
        return Completion("done", [], "stop", self.usage, self.model)

    async def stream(self, messages, **kwargs):  # pragma: no cover - the runtime only calls chat()
        raise NotImplementedError


def make_agent(http, name: str, model: str, instructions: str = "answer") -> None:
    ok(http.post("/v1/agents", json={"name": name, "model": model, "instructions": instructions, "tools": ["count"],
                                     "limits": {"max_tokens": 20, "max_steps": 40}}), 201)


def wait_for(http, plan_id: str, done, what: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        plan = ok(http.get(f"/v1/plans/{plan_id}"))
        if done(plan):
            return plan
        assert time.monotonic() < deadline, f"not {what}: {plan}"
        time.sleep(0.05)


def wait_for_events(http, plan_id: str, kind: str, timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        events = ok(http.get(f"/v1/plans/{plan_id}/events", params={"limit": 500}))["data"]
        found = [e for e in events if e["type"] == kind]
        if found:
            return found
        assert time.monotonic() < deadline, f"no {kind} event: {[e['type'] for e in events]}"
        time.sleep(0.05)


def plans_cli(monkeypatch, url: str, *args: str):
    monkeypatch.setenv("MAINSPRING_HOST", "127.0.0.1")
    monkeypatch.setenv("MAINSPRING_PORT", url.rsplit(":", 1)[1])
    r = CliRunner().invoke(plans_app, list(args))
    assert not (r.exception and not isinstance(r.exception, SystemExit)), r.exception  # no traceback
    return r


def test_a_task_over_its_share_pauses_until_the_plan_budget_is_raised(tmp_path, monkeypatch):
    per_call = Usage(prompt_tokens=100, cached_tokens=0, completion_tokens=20)  # 120 tokens, 18 µ$ a call
    model = MeterModel(STANDARD, per_call)
    with agent_server(tmp_path, models=lambda name, project=None: model,
                      tools={"count": CountTool(tmp_path / "ledger")}) as srv:
        http = srv.http
        make_agent(http, "quick", STANDARD)
        make_agent(http, "long", STANDARD, "count 20")  # 21 calls: 2520 tokens, far over a third of 1800
        body = {"goal": "g", "token_budget": 1800, "tasks": [
            {"id": "a", "agent": "quick", "prompt": "x"}, {"id": "b", "agent": "quick", "prompt": "x"},
            {"id": "c", "agent": "long", "prompt": "x"}]}
        plan_id = ok(http.post("/v1/plans", json=body))["id"]
        paused = wait_for(http, plan_id, lambda p: [t["status"] for t in p["tasks"][:2]] == ["succeeded"] * 2
                          and p["tasks"][2]["pause_reason"] == "budget", "a and b done, c paused for its budget")
        c = paused["tasks"][2]
        assert paused["status"] == "running" and c["run_status"] == "paused"
        assert c["status"] in ("dispatched", "running")  # in flight: it keeps its run
        run = ok(http.get(f"/v1/runs/{c['run_id']}"))
        share = run["budget"]["token_budget"]
        used = run["usage"]["total_tokens"]
        assert 1800 // 3 <= share <= 1800 - 240 and used <= share  # at least an even third; a and b used 120 each
        assert used % 120 == 0 and used < 2520  # stopped short of its 21 calls, before the call over its share
        # the run pauses itself; the scheduler's next tick sees the pause and journals it on the plan
        over = wait_for_events(http, plan_id, "task.over_budget")
        assert len(over) == 1 and over[0]["task"] == "c"
        assert (over[0]["data"]["used_tokens"], over[0]["data"]["token_budget"]) == (used, share)
        # the plan spends no more: everything its runs used is within its budget, and c's run is where it paused
        assert paused["usage"]["prompt_tokens"] + paused["usage"]["completion_tokens"] == 240 + used <= 1800
        again = ok(http.get(f"/v1/plans/{plan_id}"))
        assert ok(http.get(f"/v1/runs/{c['run_id']}"))["usage"]["total_tokens"] == used
        assert [e["type"] for e in ok(http.get(f"/v1/plans/{plan_id}/events", params={"limit": 500}))["data"]
                ].count("task.over_budget") == 1 and again["tasks"][2]["pause_reason"] == "budget"  # noted once

        # bad raises change nothing
        assert error(http.post(f"/v1/plans/{plan_id}/budget", json={}), 400)["param"] == "token_budget"
        error(http.post(f"/v1/plans/{plan_id}/budget", json={"token_budget": 0}), 400)
        error(http.post(f"/v1/plans/{plan_id}/budget", json={"token_budget": "lots"}), 400)
        error(http.post(f"/v1/plans/{plan_id}/budget", json={"cost_budget_usd": "-1"}), 400)
        assert "only be raised" in error(http.post(f"/v1/plans/{plan_id}/budget", json={"token_budget": 1000}),
                                         400)["message"]
        error(http.post("/v1/plans/plan_nope/budget", json={"token_budget": 5000}), 404)
        assert ok(http.get(f"/v1/plans/{plan_id}"))["token_budget"] == 1800

        r = plans_cli(monkeypatch, srv.url, "budget", plan_id, "--tokens", "5000")
        assert r.exit_code == 0, r.output
        raised = ok(http.get(f"/v1/runs/{c['run_id']}"))
        assert raised["budget"]["token_budget"] == 5000 - 240  # the plan's rest: a and b are done, c is the only one
        done = wait_for(http, plan_id, lambda p: p["status"] not in ("running", "paused"), "finished")
        assert done["status"] == "succeeded" and done["token_budget"] == 5000

    events = [e["type"] for e in ok_events(tmp_path, plan_id)]
    assert events.count("plan.budget_raised") == 1 and events.count("task.over_budget") == 1
    by = {t["key"]: t for t in done["tasks"]}
    for key in ("a", "b"):
        assert {k: by[key]["usage"][k] for k in ("runs", "prompt_tokens", "completion_tokens", "cost_u")} == \
            {"runs": 1, "prompt_tokens": 100, "completion_tokens": 20, "cost_u": 18}
    assert (by["c"]["usage"]["prompt_tokens"], by["c"]["usage"]["completion_tokens"]) == (2100, 420)  # 21 calls
    total = done["usage"]
    assert total["runs"] == 3 and total["cost_u"] == 21 * 18 + 2 * 18 == sum(t["usage"]["cost_u"] for t in by.values())
    assert (total["prompt_tokens"], total["completion_tokens"]) == (2300, 460)
    assert total["saved_u"] == 0 and total["cost_strongest_u"] == total["cost_u"]  # no routing: nothing saved
    assert len((tmp_path / "ledger").read_text().split()) == 20  # c went on from its pause, nothing repeated


def ok_events(tmp_path, plan_id: str) -> list[dict]:
    db_url = f"sqlite:///{tmp_path}/db.sqlite"
    return [{"type": e.type, "task": e.task_key} for e in store.events(db_url, plan_id)]


def test_routing_to_the_simple_model_reports_what_it_saved(tmp_path, monkeypatch):
    per_call = Usage(prompt_tokens=1000, cached_tokens=0, completion_tokens=500)  # 300 µ$ on STANDARD, 600 on FAST
    models = {name: MeterModel(name, per_call) for name in (STANDARD, FAST)}

    def resolve(name: str, project=None) -> ChatModel:
        return models[name]  # an unknown name: KeyError, "unknown model"

    with agent_server(tmp_path, models=resolve, tools={"count": CountTool(tmp_path / "ledger")}) as srv:
        http = srv.http
        make_agent(http, "w", FAST)
        body = {"goal": "g", "simple_model": STANDARD, "tasks": [
            {"id": "easy1", "agent": "w", "prompt": "say it"}, {"id": "easy2", "agent": "w", "prompt": "say it"},
            {"id": "hard", "agent": "w", "prompt": "think", "complexity": "hard"}]}
        plan_id = ok(http.post("/v1/plans", json=body))["id"]
        done = wait_for(http, plan_id, lambda p: p["status"] != "running", "finished")
        assert done["status"] == "succeeded"
        usage, by = done["usage"], {t["key"]: t["usage"] for t in done["tasks"]}
        assert (usage["cost_u"], usage["cost_strongest_u"], usage["saved_u"]) == (1200, 1800, 600)
        assert (usage["cost_usd"], usage["cost_strongest_usd"], usage["saved_usd"]) == ("0.0012", "0.0018", "0.0006")
        assert usage["saved_u"] == usage["cost_strongest_u"] - usage["cost_u"]
        assert {k: (u["cost_u"], u["cost_strongest_u"], u["saved_u"]) for k, u in by.items()} == {
            "easy1": (300, 600, 300), "easy2": (300, 600, 300), "hard": (600, 600, 0)}
        assert models[STANDARD].calls == 2 and models[FAST].calls == 1

        shown = plans_cli(monkeypatch, srv.url, "show", plan_id)
        assert shown.exit_code == 0 and "routing saved $0.0006" in shown.output, shown.output
        r = http.post(f"/v1/plans/{plan_id}/budget", json={"token_budget": 100})
        assert error(r, 409)["code"] == "invalid_state"  # a finished plan's budget is final
        r = plans_cli(monkeypatch, srv.url, "budget", plan_id, "--tokens", "100")
        assert r.exit_code == 2 and "succeeded" in r.output
        r = plans_cli(monkeypatch, srv.url, "budget", plan_id)
        assert r.exit_code == 2 and "--tokens" in r.output


@pytest.mark.parametrize("raise_by", ["tokens", "usd"])
def test_a_raise_in_either_unit_stores_it_with_its_event(db_url, raise_by):
    from mainspring.agents.plans import budget

    journal.put_agent(db_url, agent("w"), None)
    plan = store.create_plan(db_url, PlanSpec(goal="g", token_budget=100, cost_budget_usd="0.01",
                                              tasks=[{"id": "a", "agent": "w", "prompt": "x"}]), project_id=None)
    change = {"token_budget": 500} if raise_by == "tokens" else {"cost_budget_u": 20_000}
    row, resumed = budget.raise_budget(db_url, plan.id, actor="ops", **change)
    assert resumed == []  # nothing was paused
    assert (row.token_budget, row.cost_budget_u) == ((500, 10_000) if raise_by == "tokens" else (100, 20_000))
    raised = [json.loads(e.data_json) for e in store.events(db_url, plan.id) if e.type == "plan.budget_raised"]
    assert len(raised) == 1 and raised[0]["actor"] == "ops"
    assert raised[0]["before"] == {"token_budget": 100, "cost_budget_u": 10_000}
