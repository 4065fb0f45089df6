"""Admission beyond max_running (agents/plans/admission.py): sandbox slots, an engine's tokens/s per run, project
budgets. Ticks driven by hand as in test_scheduler.py; a run "ends" by writing its status, as a worker would."""

from __future__ import annotations

import json

from sqlalchemy import select

from mainspring.agents import journal
from mainspring.agents.plans import store
from mainspring.agents.plans.admission import (BUDGET, ENGINE, EVENT, SANDBOX, Admission, Demand, Pass, candidates,
                                               model_cap)
from mainspring.agents.plans.scheduler import PlanScheduler
from mainspring.agents.plans.spec import PlanSpec
from mainspring.agents.spec import AgentSpec
from mainspring.agents.tables import RunRow
from mainspring.billing import budgets
from mainspring.billing.keys import create_key
from mainspring.store.db import session
from tests.agents.conftest import CountTool, drive, make_runtime
from tests.agents.plans.test_scheduler import StageModel, wait_plan


# ---- plain values ------------------------------------------------------------------------------------------------
def test_model_cap_is_the_rate_over_the_floor_and_at_least_one():
    assert model_cap(10.0, 5.0) == 2
    assert model_cap(9.9, 5.0) == 1
    assert model_cap(1.0, 5.0) == 1  # a slow engine still serves one run
    assert model_cap(0.0, 5.0) == 1
    assert model_cap(None, 5.0) is None  # unknown rate: no limit
    assert model_cap(10.0, 0.0) is None  # no floor: no limit


def _pass(slots=None, floor=0.0, rate=lambda m: None, key=lambda m: m, exhausted=lambda p: False) -> Pass:
    return Pass(slots, floor, rate, key, exhausted)


def test_a_pass_counts_sandbox_slots_and_takes_what_it_admits():
    gate = _pass(slots=2).load([Demand(1, "m", True), Demand(1, "m", False)])
    code, plain = Demand(2, "m", True), Demand(2, "m", False)
    assert gate.reason(code) is None
    gate.take(code)
    assert gate.reason(code) == SANDBOX  # two in flight now
    assert gate.reason(plain) is None  # a task without a sandboxed tool is not held back
    assert gate.taken == 1


def test_a_pass_limits_runs_per_engine_with_aliases_counted_together():
    rates = {"local": 10.0, "default": 10.0}
    gate = _pass(floor=5.0, rate=rates.get, key=lambda m: "local" if m in rates else m)
    gate.load([Demand(None, "local", False)])
    assert gate.reason(Demand(None, "default", False)) is None
    gate.take(Demand(None, "default", False))
    assert gate.reason(Demand(None, "local", False)) == ENGINE  # 2 in flight on the engine: 10 / 5
    assert gate.reason(Demand(None, "upstream", False)) is None  # no measured rate: not limited
    assert _pass(floor=0.0, rate=rates.get).load([Demand(None, "local", False)] * 9).reason(
        Demand(None, "local", False)) is None  # no floor


def test_a_pass_holds_back_charged_tasks_of_an_exhausted_project_first():
    gate = _pass(slots=0, exhausted=lambda p: p == 7)
    assert gate.reason(Demand(7, "m", True, charged=True)) == BUDGET  # the budget is said before the slots
    assert gate.reason(Demand(7, "m", False, charged=False)) is None  # a run without a key is not budgeted
    assert gate.reason(Demand(8, "m", False, charged=True)) is None


class _Row:
    def __init__(self, i: int) -> None:
        self.id = f"t{i}"


def test_candidates_widen_the_window_past_blocked_tasks_until_enough_are_taken():
    rows = [_Row(i) for i in range(10)]
    asked: list[int] = []
    taken: list[str] = []

    def next_tasks(n: int) -> list:
        asked.append(n)
        return rows[:n]

    for row in candidates(2, next_tasks, lambda: len(taken)):
        if row.id in ("t5", "t7"):  # t0..t4 blocked
            taken.append(row.id)
    assert taken == ["t5", "t7"] and asked == [2, 4, 8]
    seen = list(candidates(3, lambda n: rows[:n], lambda: 0, limit=4))
    assert [r.id for r in seen] == ["t0", "t1", "t2", "t3"]  # each once, and no further than the limit


# ---- the scheduler -----------------------------------------------------------------------------------------------
def _agent(name: str, *, tools=(), model: str = "stage") -> AgentSpec:
    return AgentSpec(name=name, model=model, instructions="work", tools=list(tools))


def _by_key(db: str, plan_id: str) -> dict:
    return {t.key: t for t in store.tasks(db, plan_id)}


def _finish(db: str, run_id: str) -> None:
    with session(db) as s:
        run = s.get(RunRow, run_id)
        run.status, run.result = "succeeded", "done"


def _blocked_events(db: str, plan_id: str) -> list[tuple[str | None, str]]:
    return [(e.task_key, json.loads(e.data_json)["reason"]) for e in store.events(db, plan_id) if e.type == EVENT]


def test_one_sandbox_slot_runs_one_code_task_at_a_time_and_lets_a_plain_task_by(db_url):
    journal.put_agent(db_url, _agent("coder", tools=["python", "files"]), None)
    journal.put_agent(db_url, _agent("writer", tools=["files"]), None)
    plan = store.create_plan(db_url, PlanSpec(goal="g", tasks=[
        {"id": "code1", "agent": "coder", "prompt": "x"},
        {"id": "code2", "agent": "coder", "prompt": "x"},
        {"id": "plain", "agent": "writer", "prompt": "x", "priority": -1}]), project_id=None)  # behind both
    # two slots in all: the blocked code task must not take the plain task's turn
    sched = PlanScheduler(db_url, "host:1:a", max_running=2, admission=Admission(sandbox_slots=1))
    first = sched.tick()
    assert first.dispatched == 2 and first.blocked == {SANDBOX: 1}
    by = _by_key(db_url, plan.id)
    assert by["plain"].status == "dispatched"
    running, waiting = sorted((by["code1"], by["code2"]), key=lambda t: t.status)
    assert (running.status, waiting.status) == ("dispatched", "ready")
    assert sched.tick().blocked == {}  # no slot free: nothing was looked at
    _finish(db_url, by["plain"].run_id)
    again = sched.tick()  # a slot free, but not the sandbox's
    assert again.completed == 1 and again.dispatched == 0 and again.blocked == {SANDBOX: 1}
    assert _blocked_events(db_url, plan.id) == [(waiting.key, SANDBOX)]  # one event, not one per tick
    _finish(db_url, running.run_id)
    third = sched.tick()
    assert third.completed == 1 and third.dispatched == 1 and third.blocked == {}
    assert _by_key(db_url, plan.id)[waiting.key].status == "dispatched"
    assert _blocked_events(db_url, plan.id) == [(waiting.key, SANDBOX)]


def test_an_engine_at_10_tokens_per_s_with_a_floor_of_5_runs_two_tasks(db_url):
    journal.put_agent(db_url, _agent("local", model="local"), None)
    journal.put_agent(db_url, _agent("alias", model="default"), None)  # the same engine under another name
    journal.put_agent(db_url, _agent("remote", model="upstream"), None)
    on_engine = {"local", "default"}
    admission = Admission(min_tokens_per_s=5.0, engine_rate=lambda m: 10.0 if m in on_engine else None,
                          engine_key=lambda m: "engine" if m in on_engine else m)
    plan = store.create_plan(db_url, PlanSpec(goal="g", tasks=[
        *({"id": f"l{i}", "agent": "local", "prompt": "x", "priority": 1} for i in range(3)),
        {"id": "a", "agent": "alias", "prompt": "x", "priority": 1},
        *({"id": f"r{i}", "agent": "remote", "prompt": "x"} for i in range(3))]), project_id=None)
    sched = PlanScheduler(db_url, "host:1:a", max_running=8, admission=admission)
    report = sched.tick()
    by = _by_key(db_url, plan.id)
    engine_tasks = [by[k] for k in ("l0", "l1", "l2", "a")]
    assert sum(t.status == "dispatched" for t in engine_tasks) == 2
    assert all(by[f"r{i}"].status == "dispatched" for i in range(3))  # another model: not held back
    assert report.dispatched == 5 and report.blocked == {ENGINE: 2}
    done = next(t for t in engine_tasks if t.status == "dispatched")
    _finish(db_url, done.run_id)
    report = sched.tick()
    assert report.completed == 1 and report.dispatched == 1 and report.blocked == {ENGINE: 1}
    in_flight = [t for k, t in _by_key(db_url, plan.id).items() if k in ("l0", "l1", "l2", "a")
                 and t.status == "dispatched"]
    assert len(in_flight) == 2
    assert sorted(k for k, _ in _blocked_events(db_url, plan.id)) == sorted(
        t.key for t in engine_tasks if t.status == "ready")  # each blocked task said once


def test_an_exhausted_project_budget_keeps_that_projects_tasks_ready(db_url):
    with session(db_url) as s:
        broke, paying = create_key(s, "broke").key, create_key(s, "paying").key
        budgets.set_budget(s, "project", broke.project_id, "total", 0)  # nothing left
        budgets.set_budget(s, "project", paying.project_id, "total", 1_000_000)
    plans = {}
    for key in (broke, paying):
        journal.put_agent(db_url, _agent("w"), key.project_id)
        plans[key.id] = store.create_plan(db_url, PlanSpec(goal="g", tasks=[
            {"id": f"t{i}", "agent": "w", "prompt": "x"} for i in range(2)]), project_id=key.project_id,
            api_key_id=key.id)
    sched = PlanScheduler(db_url, "host:1:a", max_running=8)  # the default admission checks budgets
    for _ in range(3):
        report = sched.tick()
        assert report.blocked == {BUDGET: 2}
    assert {t.status for t in store.tasks(db_url, plans[broke.id].id)} == {"ready"}
    assert {t.status for t in store.tasks(db_url, plans[paying.id].id)} == {"dispatched"}
    assert sorted(_blocked_events(db_url, plans[broke.id].id)) == [("t0", BUDGET), ("t1", BUDGET)]
    assert _blocked_events(db_url, plans[paying.id].id) == []
    with session(db_url) as s:  # raised: they start at the next tick
        budgets.set_budget(s, "project", broke.project_id, "total", 1_000_000)
    assert sched.tick().dispatched == 2
    assert {t.status for t in store.tasks(db_url, plans[broke.id].id)} == {"dispatched"}


def test_a_new_event_only_when_the_reason_changes_and_none_again_after_a_restart(db_url):
    journal.put_agent(db_url, _agent("w"), None)
    plan = store.create_plan(db_url, PlanSpec(goal="g", tasks=[{"id": "a", "agent": "w", "prompt": "x"}]),
                             project_id=None)
    task = store.tasks(db_url, plan.id)[0]
    gate = Admission()
    assert gate.note_blocked(db_url, task, SANDBOX)
    assert not gate.note_blocked(db_url, task, SANDBOX)
    assert gate.note_blocked(db_url, task, ENGINE)
    assert not Admission().note_blocked(db_url, task, ENGINE)  # a new leader reads what the plan says already
    assert Admission().note_blocked(db_url, task, SANDBOX)
    assert [r for _, r in _blocked_events(db_url, plan.id)] == [SANDBOX, ENGINE, SANDBOX]


def test_the_runtime_passes_the_sandbox_slots_and_a_plan_still_finishes(tmp_path, db_url):
    rt = make_runtime(tmp_path, db_url, StageModel(), {"python": CountTool(tmp_path / "ledger", name="python")},
                      sandbox_slots=1, plan_min_run_tokens_per_s=3.0)
    assert (rt.scheduler.admission.sandbox_slots, rt.scheduler.admission.min_tokens_per_s) == (1, 3.0)
    rt.put_agent(_agent("coder", tools=["python"]))

    async def body():
        plan = rt.plans.create(PlanSpec(goal="g", tasks=[
            {"id": "a", "agent": "coder", "prompt": "x"}, {"id": "b", "agent": "coder", "prompt": "x"}]))
        return await wait_plan(rt, plan.id), rt.plans.events(plan.id)

    done, events = drive(rt, body)
    assert done.status == "succeeded"
    blocked = [json.loads(e.data_json)["reason"] for e in events if e.type == EVENT]
    assert blocked == [SANDBOX]  # both ready in one tick: the second waited for the first
    with session(db_url, readonly=True) as s:
        assert len(list(s.scalars(select(RunRow)))) == 2
