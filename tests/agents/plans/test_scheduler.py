"""The plan scheduler with the real runtime (scripted models): tasks become runs, artifacts pass whole between
stages, fan-out/fan-in, fair share, the leader lease, and a dispatch cut short by a crash."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import select

from mainspring.agents import journal
from mainspring.agents.plans import leader, store
from mainspring.agents.plans.scheduler import PlanScheduler
from mainspring.agents.plans.spec import PlanError, PlanSpec
from mainspring.agents.plans.tables import PlanTaskRow
from mainspring.agents.spec import AgentSpec
from mainspring.agents.tables import RunRow
from mainspring.engine.outputs import Usage
from mainspring.models import ChatModel, Completion
from mainspring.store.db import session
from mainspring.store.tables import Project
from tests.agents.conftest import drive, make_runtime

ARTIFACT = re.compile(r'<artifact task="([^"]+)" sha256="([0-9a-f]{64})">\n(.*?)\n</artifact>', re.S)
ITEM = re.compile(r'<item index="(\d+)" sha256="[0-9a-f]{64}">\n(.*?)\n</item>', re.S)


class StageModel(ChatModel):
    """TEST-ONLY: answers each task at once. Instructions "emit list N" give the list 0..N-1; otherwise the
    answer reports, for every artifact in the goal, its task, its declared hash and the hash of the bytes it
    actually saw, plus the item it was given (an <item> block, or "work on <item>" where {item} was filled in)."""

    model = "stage"

    def __init__(self) -> None:
        self.goals: list[str] = []

    async def chat(self, messages, **kwargs) -> Completion:
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        goal = next(m["content"] for m in messages if m["role"] == "user")
        self.goals.append(goal)
        found = re.search(r"emit list (\d+)", system)
        if found:
            value = list(range(int(found.group(1))))
        else:
            item = ITEM.search(goal) or re.search(r"()work on (\S+)", goal)  # an item block, or {item} filled in
            value = {"read": [{"task": t, "declared": h, "seen": hashlib.sha256(b.encode()).hexdigest()}
                              for t, h, b in ARTIFACT.findall(goal)],
                     "item": json.loads(item.group(2)) if item else None}
        return Completion(json.dumps(value), [], "stop", Usage(prompt_tokens=20, cached_tokens=0,
                                                              completion_tokens=5), self.model)

    async def stream(self, messages, **kwargs):  # pragma: no cover - the runtime only calls chat()
        raise NotImplementedError


def agent(name: str, instructions: str = "work") -> AgentSpec:
    return AgentSpec(name=name, model="stage", instructions=instructions, tools=[])


OBJ = {"type": "object"}


async def wait_plan(rt, plan_id: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        row = await asyncio.to_thread(rt.plans.get, plan_id)
        if row.status in ("succeeded", "failed", "cancelled"):
            return row
        if time.monotonic() > deadline:
            tasks = await asyncio.to_thread(rt.plans.tasks, plan_id)
            raise AssertionError(f"plan {plan_id} is {row.status}: {[(t.key, t.status, t.error) for t in tasks]}")
        await asyncio.sleep(0.05)


def test_a_three_stage_pipeline_passes_each_artifact_whole(tmp_path, db_url):
    model = StageModel()
    rt = make_runtime(tmp_path, db_url, model, {})
    for name in ("research", "analyse", "report"):
        rt.put_agent(agent(name))
    plan = PlanSpec(goal="compare A and B", tasks=[
        {"id": "research", "agent": "research", "prompt": "find facts on {goal}", "output_schema": OBJ},
        {"id": "analyse", "agent": "analyse", "prompt": "analyse", "depends_on": ["research"], "output_schema": OBJ},
        {"id": "report", "agent": "report", "prompt": "write the report", "depends_on": ["research", "analyse"],
         "output_schema": OBJ}])

    async def body():
        row = rt.plans.create(plan)
        return await wait_plan(rt, row.id), rt.plans.tasks(row.id)

    done, tasks = drive(rt, body)
    assert done.status == "succeeded"
    by = {t.key: t for t in tasks}
    report = json.loads(by["report"].artifact_json)
    assert {r["task"] for r in report["read"]} == {"research", "analyse"}
    for r in report["read"]:  # what the report's run saw is byte for byte what the upstream stored
        assert r["declared"] == r["seen"] == by[r["task"]].artifact_sha256
        assert hashlib.sha256(by[r["task"]].artifact_json.encode()).hexdigest() == r["seen"]
    assert json.loads(by["report"].input_hashes_json) == {k: by[k].artifact_sha256 for k in ("research", "analyse")}
    assert "find facts on compare A and B" in model.goals[0]
    with session(db_url, readonly=True) as s:  # each task was one run, and each run a plain durable run
        runs = {r.id: r for r in s.scalars(select(RunRow))}
    assert sorted(runs) == sorted(t.run_id for t in tasks)
    assert all(r.status == "succeeded" and r.output_schema_json for r in runs.values())


def test_plan_attachments_are_checked_once_and_given_to_every_task_run(tmp_path, db_url):
    docs, outside = tmp_path / "allowed" / "filings", tmp_path / "elsewhere"
    docs.mkdir(parents=True)
    outside.mkdir()
    rt = make_runtime(tmp_path / "data", db_url, StageModel(), {}, agent_attach_roots=[tmp_path / "allowed"])
    for name in ("collect", "report"):
        rt.put_agent(agent(name))
    tasks = [{"id": "collect", "agent": "collect", "prompt": "collect", "output_schema": OBJ},
             {"id": "report", "agent": "report", "prompt": "report", "depends_on": ["collect"], "output_schema": OBJ}]

    async def body():
        row = rt.plans.create(PlanSpec(goal="g", tasks=tasks, attachments={"docs": str(docs)}))
        return await wait_plan(rt, row.id), rt.plans.tasks(row.id)

    done, rows = drive(rt, body)
    assert done.status == "succeeded"
    with session(db_url, readonly=True) as s:
        runs = {r.id: r for r in s.scalars(select(RunRow))}
    assert [json.loads(runs[t.run_id].attachments_json) for t in rows] == [{"docs": str(docs.resolve())}] * 2
    with pytest.raises(PlanError) as refused:  # a folder outside the operator's roots: nothing is stored
        rt.plans.create(PlanSpec(goal="g", tasks=tasks, attachments={"docs": str(outside)}))
    assert refused.value.param == "attachments" and refused.value.status == 400
    with session(db_url, readonly=True) as s:
        assert len(s.scalars(select(RunRow)).all()) == 2


def test_fan_out_over_twenty_items_and_fan_in_in_order(tmp_path, db_url):
    model = StageModel()
    rt = make_runtime(tmp_path, db_url, model, {}, plan_max_running=4)
    rt.put_agent(agent("lister", "emit list 20"))
    rt.put_agent(agent("worker"))
    rt.put_agent(agent("joiner"))
    plan = PlanSpec(goal="g", tasks=[
        {"id": "list", "agent": "lister", "prompt": "list", "output_schema": {"type": "array"}},
        {"id": "each", "agent": "worker", "prompt": "work on {item}", "depends_on": ["list"], "map_over": "list",
         "output_schema": OBJ},
        {"id": "join", "agent": "joiner", "prompt": "join", "depends_on": ["each"], "output_schema": OBJ}])

    async def body():
        row = rt.plans.create(plan)
        return await wait_plan(rt, row.id, timeout=120), rt.plans.tasks(row.id)

    done, tasks = drive(rt, body)
    assert done.status == "succeeded"
    by = {t.key: t for t in tasks}
    items = [by[f"each[{i}]"] for i in range(20)]
    assert all(t.status == "succeeded" for t in items)
    assert json.loads(by["each"].artifact_json) == [json.loads(t.artifact_json) for t in items]
    assert [json.loads(t.artifact_json)["item"] for t in items] == list(range(20))  # each read its own item
    joined = json.loads(by["join"].artifact_json)["read"]
    assert [(r["task"], r["seen"]) for r in joined] == [("each", by["each"].artifact_sha256)]


def _projects(db_url: str, *names: str) -> list[int]:
    with session(db_url) as s:
        rows = [Project(name=n) for n in names]
        s.add_all(rows)
        s.flush()
        return [r.id for r in rows]


def test_fair_share_lets_a_small_project_through_a_flood(tmp_path, db_url):
    """One project's 30 ready tasks and another's 3, two slots: the small project gets a slot at once."""
    big, small = _projects(db_url, "big", "small")
    for project in (big, small):
        journal.put_agent(db_url, agent("w"), project)
    flood = store.create_plan(db_url, PlanSpec(goal="flood", tasks=[
        {"id": f"t{i}", "agent": "w", "prompt": "x"} for i in range(30)]), project_id=big)
    few = store.create_plan(db_url, PlanSpec(goal="few", tasks=[
        {"id": f"t{i}", "agent": "w", "prompt": "x"} for i in range(3)]), project_id=small)
    sched = PlanScheduler(db_url, "host:1:a", max_running=2)
    first = sched.tick()
    assert first.leader and first.dispatched == 2
    with session(db_url, readonly=True) as s:
        in_flight = Counter(s.scalars(select(PlanTaskRow.plan_id).where(PlanTaskRow.status == "dispatched")))
    assert in_flight == {flood.id: 1, few.id: 1}  # not the flood's two oldest


def test_priority_goes_first_across_plans(tmp_path, db_url):
    journal.put_agent(db_url, agent("w"), None)
    low = store.create_plan(db_url, PlanSpec(goal="low", tasks=[{"id": "a", "agent": "w", "prompt": "x"}]),
                            project_id=None)
    high = store.create_plan(db_url, PlanSpec(goal="high", priority=5, tasks=[
        {"id": "a", "agent": "w", "prompt": "x"}]), project_id=None)
    PlanScheduler(db_url, "host:1:a", max_running=1).tick()
    states = {p.id: store.tasks(db_url, p.id)[0].status for p in (low, high)}
    assert states == {low.id: "ready", high.id: "dispatched"}


def test_one_leader_at_a_time_and_a_standby_takes_over(db_url):
    a = PlanScheduler(db_url, "otherhost:1:a", lease_s=30)
    b = PlanScheduler(db_url, "otherhost:2:b", lease_s=30)
    assert a.tick().leader and not b.tick().leader
    assert a.tick().term == 1  # renewing keeps the term
    leader.release(db_url, leader.SCHEDULER_LEASE, a.owner)  # or: a's lease runs out
    report = b.tick()
    assert report.leader and report.term == 2
    assert not a.tick().leader


def test_a_dead_local_leader_is_replaced_at_once(db_url):
    import mainspring.agents.leases as leases

    dead = f"{leases.HOST}:999999999:x"  # no such pid on this host
    assert leader.hold(db_url, leader.SCHEDULER_LEASE, dead, 300) == 1
    report = PlanScheduler(db_url, f"{leases.HOST}:1:b").tick()
    assert report.leader and report.term == 2


def test_a_dispatch_cut_short_gets_its_run_under_the_same_id(db_url):
    journal.put_agent(db_url, agent("w"), None)
    plan = store.create_plan(db_url, PlanSpec(goal="g", tasks=[{"id": "a", "agent": "w", "prompt": "x"}]),
                             project_id=None)
    task = store.tasks(db_url, plan.id)[0]
    store.mark_dispatched(db_url, task.id, "run_cut_short")  # the leader died before creating the run
    report = PlanScheduler(db_url, "host:1:a").tick()
    assert report.recreated == 1 and report.dispatched == 0
    with session(db_url, readonly=True) as s:
        runs = list(s.scalars(select(RunRow)))
    assert [r.id for r in runs] == ["run_cut_short"]
    assert PlanScheduler(db_url, "host:1:a").tick().recreated == 0  # and only once


@pytest.mark.parametrize("status", ["failed", "cancelled"])
def test_a_failed_run_fails_its_task_with_the_reason(db_url, status):
    journal.put_agent(db_url, agent("w"), None)
    plan = store.create_plan(db_url, PlanSpec(goal="g", tasks=[
        {"id": "a", "agent": "w", "prompt": "x", "max_attempts": 1}]), project_id=None)
    sched = PlanScheduler(db_url, "host:1:a")
    sched.tick()
    task = store.tasks(db_url, plan.id)[0]
    with session(db_url) as s:
        run = s.get(RunRow, task.run_id)
        run.status, run.error = status, "the model gave up"
    sched.tick()
    task = store.tasks(db_url, plan.id)[0]
    assert task.status == "failed" and f"{status}: the model gave up" in task.error
    assert store.plan(db_url, plan.id).status == "failed"


def test_a_plan_is_its_projects_only(tmp_path, db_url):
    from mainspring.agents.plans.spec import PlanError

    a, b = _projects(db_url, "pa", "pb")
    rt = make_runtime(tmp_path, db_url, StageModel(), {})
    mine, theirs = rt.scoped(a), rt.scoped(b)
    mine.put_agent(agent("w"))
    plan = mine.plans.create(PlanSpec(goal="g", tasks=[{"id": "a", "agent": "w", "prompt": "x"}]))
    assert [p.id for p in mine.plans.recent()] == [plan.id] and theirs.plans.recent() == []
    for call in (lambda: theirs.plans.get(plan.id), lambda: theirs.plans.tasks(plan.id),
                 lambda: theirs.plans.events(plan.id), lambda: theirs.plans.act(plan.id, "cancel", "x"),
                 lambda: theirs.plans.act_on_task(plan.id, "a", "approve", "x")):
        with pytest.raises(PlanError) as exc:
            call()
        assert exc.value.status == 404
    with pytest.raises(PlanError, match="no agent|unknown agent|'w'"):  # nor can it use the other's agents
        theirs.plans.create(PlanSpec(goal="g", tasks=[{"id": "a", "agent": "w", "prompt": "x"}]))
    assert mine.plans.get(plan.id).status == "running"


def test_a_higher_priority_task_preempts_at_a_step_boundary_and_the_preempted_one_resumes(tmp_path, db_url):
    from tests.agents.conftest import CountTool, PolicyModel

    counter = CountTool(tmp_path / "ledger", delay_s=0.3)
    rt = make_runtime(tmp_path, db_url, PolicyModel(tool="count", calls=6), {"count": counter}, plan_max_running=1)
    rt.put_agent(AgentSpec(name="slow", model="policy", tools=["count"]))
    rt.put_agent(AgentSpec(name="quick", model="policy", tools=[]))

    async def body():
        low = rt.plans.create(PlanSpec(goal="low", tasks=[{"id": "count", "agent": "slow", "prompt": "count"}]))
        deadline = time.monotonic() + 30
        while not (tmp_path / "ledger").exists() or not (tmp_path / "ledger").read_text().strip():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        low_run = rt.plans.tasks(low.id)[0].run_id
        steps_before = rt.run(low_run).step_count
        high = rt.plans.create(PlanSpec(goal="high", priority=5, tasks=[
            {"id": "urgent", "agent": "quick", "prompt": "answer now"}]))
        done_high = await wait_plan(rt, high.id)
        low_task = rt.plans.tasks(low.id)[0]
        high_run = rt.plans.tasks(high.id)[0].run_id
        started = next(e for e in rt.events(high_run) if e.type == "run.created").created_at
        steps_at_start = sum(1 for e in rt.events(low_run) if e.type == "step.completed" and e.created_at <= started)
        done_low = await wait_plan(rt, low.id)
        return done_high, done_low, low_task, low_run, steps_before, steps_at_start

    done_high, done_low, low_task, low_run, steps_before, steps_at_start = drive(rt, body)
    assert done_high.status == "succeeded" and done_low.status == "succeeded"
    assert low_task.status in ("preempted", "running")  # while the high task ran
    assert steps_at_start <= steps_before + 1  # the urgent task started within one step boundary
    events = [e.type for e in rt.plans.events(done_low.id)]
    assert "task.preempted" in events and "task.resumed" in events
    run_events = [e.type for e in rt.events(low_run)]
    assert "run.created" in run_events and run_events.count("run.created") == 1  # the same run, resumed
    steps = rt.steps(low_run)
    assert [s["seq"] for s in steps] == list(range(1, len(steps) + 1))  # no step repeated
    keys = (tmp_path / "ledger").read_text().split()
    assert len(keys) == len(set(keys)) == 6 and all(k.startswith(low_run + "/") for k in keys)


def test_a_task_past_its_timeout_has_its_run_cancelled_and_fails(tmp_path, db_url):
    from tests.agents.conftest import TERMINAL, CountTool, PolicyModel, wait_status

    rt = make_runtime(tmp_path, db_url, PolicyModel(tool="count", calls=20),
                      {"count": CountTool(tmp_path / "ledger", delay_s=0.2)})
    rt.put_agent(AgentSpec(name="slow", model="policy", tools=["count"]))

    async def body():
        plan = rt.plans.create(PlanSpec(goal="g", tasks=[
            {"id": "a", "agent": "slow", "prompt": "count", "timeout_s": 1.0, "max_attempts": 1},
            {"id": "b", "agent": "slow", "prompt": "after", "depends_on": ["a"]}]))
        t = time.monotonic()
        done = await wait_plan(rt, plan.id)
        took = time.monotonic() - t
        tasks = rt.plans.tasks(plan.id)
        # the task fails once the cancel is journaled; the worker ends the run at its next step boundary
        run = await wait_status(rt, next(t.run_id for t in tasks if t.key == "a"), TERMINAL, timeout=20)
        return done, tasks, took, run

    done, tasks, took, run_a = drive(rt, body)
    by = {t.key: t for t in tasks}
    assert done.status == "failed" and by["a"].status == "failed" and by["b"].status == "cancelled"
    assert "timed out after 1 s" in by["a"].error
    assert run_a.status == "cancelled"
    assert took < 15  # not the 20 slow steps the run would have taken
    effects = len((tmp_path / "ledger").read_text().split())
    assert 0 < effects < 20


@pytest.mark.parametrize("expiry", ["approve", "reject"])
def test_an_undecided_gate_takes_its_default_after_the_ttl(tmp_path, db_url, expiry, monkeypatch):
    journal.put_agent(db_url, agent("w"), None)
    gated = store.create_plan(db_url, PlanSpec(goal="g", approve_plan=True, approval_ttl_s=60, approval_expiry=expiry,
                                               tasks=[{"id": "a", "agent": "w", "prompt": "x"}]), project_id=None)
    task_gate = store.create_plan(db_url, PlanSpec(goal="g", approval_ttl_s=60, approval_expiry=expiry, tasks=[
        {"id": "a", "agent": "w", "prompt": "x", "requires_approval": True, "on_failure": "skip"}]), project_id=None)
    sched = PlanScheduler(db_url, "host:1:a")
    assert sched.tick().expired == 0  # not yet
    real_now = journal.now
    # the scheduler's clock past the TTL (a real sleep would make the "not yet" above depend on machine load)
    monkeypatch.setattr(journal, "now", lambda: real_now() + timedelta(seconds=61))
    assert sched.tick().expired == 2
    events = {p.id: [(e.type, json.loads(e.data_json).get("actor")) for e in store.events(db_url, p.id)]
              for p in (gated, task_gate)}
    if expiry == "approve":
        assert store.plan(db_url, gated.id).status == "running"
        assert ("plan.approved", "expiry") in events[gated.id]
        assert store.tasks(db_url, task_gate.id)[0].status in ("ready", "dispatched")
    else:
        assert store.plan(db_url, gated.id).status == "cancelled"
        assert store.tasks(db_url, task_gate.id)[0].status == "skipped"  # a rejection counts as its failure
        assert ("task.rejected", "expiry") in events[task_gate.id]


def test_a_simple_task_runs_on_the_cheap_model_and_a_retry_escalates(tmp_path, db_url):
    """The cheap model ignores the schema (its answer fails the check): the retry runs on the agent's model."""
    from mainspring.agents.plans.spec import PlanError
    from mainspring.agents.runtime import AgentRuntime
    from mainspring.config import Settings
    from tests.scripted_model import ScriptedModel

    cheap, strong = ScriptedModel(["not json at all", "still not json"]), StageModel()
    models = {"cheap": cheap, "stage": strong}

    def resolve(name, project=None):
        return models[name]

    rt = AgentRuntime(Settings(data_dir=tmp_path), models=resolve, tools={}, db_url=db_url)
    rt.put_agent(agent("w"))
    spec = PlanSpec(goal="g", simple_model="cheap", tasks=[
        {"id": "easy", "agent": "w", "prompt": "say it", "output_schema": OBJ, "max_attempts": 2},
        {"id": "hard", "agent": "w", "prompt": "think", "complexity": "hard", "output_schema": OBJ}])

    async def body():
        plan = rt.plans.create(spec)
        return await wait_plan(rt, plan.id), rt.plans.tasks(plan.id), rt.plans.events(plan.id)

    done, tasks, events = drive(rt, body)
    assert done.status == "succeeded"
    by = {t.key: t for t in tasks}
    runs = [json.loads(e.data_json)["run_id"] for e in events if e.type == "task.dispatched" and e.task_key == "easy"]
    assert len(runs) == 2 and by["easy"].attempt == 2
    first, second = (rt.run(r) for r in runs)
    assert (first.model_override, first.status, first.stop_reason) == ("cheap", "failed", "invalid_output")
    assert second.model_override is None and second.status == "succeeded"  # escalated to the agent's model
    assert rt.run(by["hard"].run_id).model_override is None  # a hard task never tries the cheap model
    assert len(cheap.calls) == 2  # the easy task's first answer and its constrained finalize step
    with pytest.raises(PlanError, match="unknown model 'nope'"):
        rt.plans.create(spec.model_copy(update={"simple_model": "nope"}))
