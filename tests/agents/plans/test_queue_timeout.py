"""A task's bound on its wait for capacity (agents/plans/queue_wait.py): queue_timeout_s, or the plan's. Ticks driven
by hand as in test_admission.py, with no worker: a dispatched task's run stays queued, so it holds its slot. The
scheduler's clock is moved forward (journal.now) rather than slept past, so no test depends on machine load."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from pydantic import ValidationError
from sqlalchemy import update

from mainspring.agents import journal
from mainspring.agents.plans import store
from mainspring.agents.plans.admission import SANDBOX, Admission
from mainspring.agents.plans.queue_wait import EVENT, queue_timeout
from mainspring.agents.plans.scheduler import PlanScheduler
from mainspring.agents.plans.spec import TEN_YEARS_S, PlanSpec, TaskSpec
from mainspring.agents.plans.tables import PlanEventRow, PlanTaskRow
from mainspring.agents.spec import AgentSpec
from mainspring.agents.tables import RunRow
from mainspring.store.db import session

WAITED = re.compile(r"^waited (\d+(?:\.\d)?) s for capacity, past its queue_timeout_s of 30 s")


@pytest.fixture
def clock(monkeypatch):
    """Set the scheduler's clock `skew` seconds ahead of the real one (what the store writes stays real)."""
    real_now = journal.now
    skew = {"s": 0.0}
    monkeypatch.setattr(journal, "now", lambda: real_now() + timedelta(seconds=skew["s"]))

    def ahead(seconds: float) -> None:
        skew["s"] = seconds
    return ahead


def _agent(db: str, name: str = "w", tools=()) -> None:
    journal.put_agent(db, AgentSpec(name=name, model="stage", instructions="work", tools=list(tools)), None)


def _plan(db: str, *tasks: dict, **kw):
    return store.create_plan(db, PlanSpec(goal="g", tasks=[{"agent": "w", "prompt": "x", **t} for t in tasks], **kw),
                             project_id=None)


def _by_key(db: str, plan_id: str) -> dict:
    return {t.key: t for t in store.tasks(db, plan_id)}


def _timed_out_events(db: str, plan_id: str) -> list[dict]:
    return [{"task": e.task_key, **json.loads(e.data_json)} for e in store.events(db, plan_id) if e.type == EVENT]


def test_the_bound_is_the_tasks_own_else_the_plans_and_is_checked():
    plan = PlanSpec(goal="g", queue_timeout_s=60, tasks=[
        {"id": "a", "agent": "w", "prompt": "x"}, {"id": "b", "agent": "w", "prompt": "x", "queue_timeout_s": 5}])
    assert [queue_timeout(plan, t) for t in plan.tasks] == [60, 5]
    assert queue_timeout(PlanSpec(goal="g", tasks=[{"id": "a", "agent": "w", "prompt": "x"}]),
                         TaskSpec(id="a", agent="w", prompt="x")) is None
    for bad in (0, -1, TEN_YEARS_S + 1):
        with pytest.raises(ValidationError):
            TaskSpec(id="a", agent="w", prompt="x", queue_timeout_s=bad)
        with pytest.raises(ValidationError):
            PlanSpec(goal="g", queue_timeout_s=bad, tasks=[{"id": "a", "agent": "w", "prompt": "x"}])


def test_a_task_held_back_by_a_full_system_fails_past_its_bound_and_its_dependent_is_cancelled(db_url, clock):
    _agent(db_url)
    plan = _plan(db_url, {"id": "busy", "priority": 5}, {"id": "late", "queue_timeout_s": 30},
                 {"id": "after", "depends_on": ["late"]})
    sched = PlanScheduler(db_url, "host:1:a", max_running=1)
    first = sched.tick()
    assert first.dispatched == 1 and first.queue_timed_out == 0  # busy took the one slot; late waits
    clock(20)
    assert sched.tick().queue_timed_out == 0  # not yet
    clock(31)
    report = sched.tick()
    assert report.queue_timed_out == 1
    by = _by_key(db_url, plan.id)
    assert by["late"].status == "failed" and by["late"].attempt == 1  # on_failure retry: not retried
    found = WAITED.match(by["late"].error)
    assert found and 31 <= float(found.group(1)) < 60, by["late"].error
    assert "held back by" not in by["late"].error  # admission never held it back: it waited for a slot
    assert by["after"].status == "cancelled"
    assert by["busy"].status == "dispatched"  # the task in flight is untouched
    with session(db_url, readonly=True) as s:
        assert s.get(RunRow, by["busy"].run_id).status == "queued"
    [event] = _timed_out_events(db_url, plan.id)
    assert event["task"] == "late" and event["reason"] is None and event["waited_s"] >= 31
    assert event["queue_timeout_s"] == 30 and event["error"] == by["late"].error
    types = [e.type for e in store.events(db_url, plan.id) if e.task_key == "late"]
    assert types[-2:] == [EVENT, "task.failed"]  # journaled with the failure, just before it
    assert sched.tick().queue_timed_out == 0  # once
    assert store.plan(db_url, plan.id).status == "running"  # busy still runs; the plan ends failed after it


def test_a_task_held_back_by_admission_names_the_reason(db_url, clock):
    _agent(db_url, "coder", tools=["python"])
    plan = _plan(db_url, {"id": "code", "agent": "coder", "queue_timeout_s": 30})
    sched = PlanScheduler(db_url, "host:1:a", max_running=4, admission=Admission(sandbox_slots=0))
    assert sched.tick().blocked == {SANDBOX: 1}
    clock(31)
    assert sched.tick().queue_timed_out == 1
    task = _by_key(db_url, plan.id)["code"]
    assert task.status == "failed" and WAITED.match(task.error)
    assert task.error.endswith(f"(last held back by: {SANDBOX})")
    assert [e["reason"] for e in _timed_out_events(db_url, plan.id)] == [SANDBOX]
    assert store.plan(db_url, plan.id).status == "failed"


def test_on_failure_skip_skips_it_and_its_dependents_go_on_with_null(db_url, clock):
    _agent(db_url)
    plan = _plan(db_url, {"id": "busy", "priority": 5}, {"id": "late", "queue_timeout_s": 30, "on_failure": "skip"},
                 {"id": "after", "depends_on": ["late"]})
    sched = PlanScheduler(db_url, "host:1:a", max_running=1)
    sched.tick()
    clock(31)
    assert sched.tick().queue_timed_out == 1
    by = _by_key(db_url, plan.id)
    assert by["late"].status == "skipped" and by["late"].artifact_json == "null" and WAITED.match(by["late"].error)
    assert by["after"].status == "ready"  # it goes on, reading null (no bound of its own: it waits on)
    assert store.task_inputs(db_url, by["after"].id)["upstream"] == {"late": None}


def test_the_plans_default_applies_a_tasks_own_overrides_it_and_none_waits_forever(db_url, clock):
    _agent(db_url)
    bounded = _plan(db_url, {"id": "busy", "priority": 5}, {"id": "inherit"},
                    {"id": "short", "queue_timeout_s": 10}, {"id": "long", "queue_timeout_s": 120},
                    queue_timeout_s=60)
    forever = _plan(db_url, {"id": "patient"}, priority=-1)  # behind every task of the other plan
    sched = PlanScheduler(db_url, "host:1:a", max_running=1)
    assert sched.tick().dispatched == 1

    def statuses() -> dict:
        return {k: t.status for k, t in _by_key(db_url, bounded.id).items()}

    clock(11)
    assert sched.tick().queue_timed_out == 1
    assert statuses() == {"busy": "dispatched", "inherit": "ready", "short": "failed", "long": "ready"}
    clock(61)
    assert sched.tick().queue_timed_out == 1
    assert statuses() == {"busy": "dispatched", "inherit": "failed", "short": "failed", "long": "ready"}
    clock(121)
    assert sched.tick().queue_timed_out == 1
    assert statuses()["long"] == "failed"
    clock(2 * TEN_YEARS_S)  # well past any bound: a task without one waits on
    assert sched.tick().queue_timed_out == 0
    assert _by_key(db_url, forever.id)["patient"].status == "ready"
    assert _timed_out_events(db_url, forever.id) == []


def test_a_task_dispatched_in_time_is_never_timed_out_by_this_check(db_url, clock):
    _agent(db_url)
    plan = _plan(db_url, {"id": "a", "queue_timeout_s": 30}, {"id": "b", "queue_timeout_s": 30, "depends_on": ["a"]})
    sched = PlanScheduler(db_url, "host:1:a", max_running=1)
    assert sched.tick().dispatched == 1
    clock(3600)
    assert sched.tick().queue_timed_out == 0
    by = _by_key(db_url, plan.id)
    assert (by["a"].status, by["b"].status) == ("dispatched", "waiting")  # waiting for a dependency is no queue
    assert _timed_out_events(db_url, plan.id) == []


def test_a_preempted_task_waiting_to_resume_times_out_and_its_paused_run_is_cancelled(db_url, clock):
    _agent(db_url)
    low = _plan(db_url, {"id": "count", "queue_timeout_s": 30, "on_failure": "skip"})
    sched = PlanScheduler(db_url, "host:1:a", max_running=1)
    sched.tick()
    run_id = _by_key(db_url, low.id)["count"].run_id
    with session(db_url) as s:  # a worker took the run
        s.get(RunRow, run_id).status = "running"
    sched.tick()
    assert _by_key(db_url, low.id)["count"].status == "running"
    high = _plan(db_url, {"id": "urgent"}, priority=5)
    assert sched.tick().preempted == 1
    with session(db_url) as s:  # the pause landed at a step boundary
        s.get(RunRow, run_id).status = "paused"
    clock(31)
    assert sched.tick().queue_timed_out == 1
    task = _by_key(db_url, low.id)["count"]
    assert task.status == "skipped" and WAITED.match(task.error)
    assert [e["waited_as"] for e in _timed_out_events(db_url, low.id)] == ["preempted"]
    with session(db_url, readonly=True) as s:
        assert s.get(RunRow, run_id).status == "cancelled"  # nothing would ever end it otherwise
    assert store.plan(db_url, low.id).status == "succeeded"
    assert _by_key(db_url, high.id)["urgent"].status == "dispatched"


def test_a_paused_plans_tasks_do_not_wait_for_capacity_and_its_clock_starts_again_on_resume(db_url):
    _agent(db_url)
    plan = _plan(db_url, {"id": "busy", "priority": 5}, {"id": "late", "queue_timeout_s": 30})
    sched = PlanScheduler(db_url, "host:1:a", max_running=1)
    sched.tick()
    late = _by_key(db_url, plan.id)["late"]
    store.pause_plan(db_url, plan.id)
    with session(db_url) as s:  # it became ready long ago (the store's clock, not the scheduler's)
        s.execute(update(PlanTaskRow).where(PlanTaskRow.id == late.id)
                  .values(ready_at=late.ready_at - timedelta(seconds=100)))
    assert sched.tick().queue_timed_out == 0  # paused: it waits for a person, not for capacity
    store.resume_plan(db_url, plan.id)
    assert sched.tick().queue_timed_out == 0  # its wait began again at the resume
    with session(db_url) as s:  # the resume, 31 s ago
        resumed = s.query(PlanEventRow).filter_by(plan_id=plan.id, type="plan.resumed").one()
        resumed.created_at -= timedelta(seconds=31)
    assert sched.tick().queue_timed_out == 1
    task = _by_key(db_url, plan.id)["late"]
    found = WAITED.match(task.error)
    assert task.status == "failed" and found and 31 <= float(found.group(1)) < 60, task.error


def test_a_task_that_moved_since_it_was_read_is_not_timed_out(db_url):
    from mainspring.agents.plans.spec import PlanError

    _agent(db_url)
    plan = _plan(db_url, {"id": "a", "queue_timeout_s": 30})
    task = _by_key(db_url, plan.id)["a"]
    with pytest.raises(PlanError) as exc:  # read before a retry, say: its wait began again
        store.time_out_wait(db_url, task.id, "waited", seen=task.updated_at - timedelta(seconds=1))
    assert exc.value.status == 409
    store.mark_dispatched(db_url, task.id, "run_x")
    with pytest.raises(PlanError) as exc:  # dispatched meanwhile: no longer waiting
        store.time_out_wait(db_url, task.id, "waited", seen=task.updated_at)
    assert exc.value.status == 409
    assert _by_key(db_url, plan.id)["a"].status == "dispatched" and _timed_out_events(db_url, plan.id) == []
    paused = _plan(db_url, {"id": "a", "queue_timeout_s": 30})
    task = _by_key(db_url, paused.id)["a"]
    store.pause_plan(db_url, paused.id)  # paused between the scheduler's read and its write
    with pytest.raises(PlanError):
        store.time_out_wait(db_url, task.id, "waited", seen=task.updated_at)
    assert _by_key(db_url, paused.id)["a"].status == "ready"
