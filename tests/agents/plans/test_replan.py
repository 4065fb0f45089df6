"""Replanning a failed task (on_failure "replan", plans/replan.py) with scripted models: through a real HTTP
server the failed task is revised by the planner and reruns with the revision, its dependents waiting and then
reading its artifact; replans run out; a planner answering garbage twice fails the task with the reason; a stale
revision is refused (compare-and-set); a task left replanning by a dead leader is revised by the next one."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time

import pytest
from sqlalchemy import select

from mainspring.agents import journal
from mainspring.agents.leases import HOST
from mainspring.agents.plans import leader, replan, store
from mainspring.agents.plans.scheduler import PlanScheduler
from mainspring.agents.plans.spec import PlanError, PlanSpec
from mainspring.agents.spec import AgentSpec
from mainspring.agents.tables import AgentRow, RunRow
from mainspring.engine.outputs import Usage
from mainspring.models import ChatModel, Completion
from mainspring.store.db import session
from tests.agents.plans.test_plan_budget import plans_cli
from tests.api.test_agent_routes import agent_server, ok

ARTIFACT = re.compile(r'<artifact task="([^"]+)" sha256="([0-9a-f]{64})">\n(.*?)\n</artifact>', re.S)
OK = {"type": "object", "properties": {"ok": {"const": True}}, "required": ["ok"]}
USAGE = Usage(prompt_tokens=10, cached_tokens=0, completion_tokens=5)


class Reviser(ChatModel):
    """TEST-ONLY: a planner call (schema "revision") gets the next scripted answer, after `gate` is set when
    there is one; a task's run answers {"ok": false} while its goal says "the wrong way", else {"ok": true} with
    the hash of each artifact it read (declared and as seen)."""

    model = "reviser"

    def __init__(self, *answers: dict | str, gate: threading.Event | None = None) -> None:
        self.answers, self.gate = list(answers), gate
        self.calls: list[dict] = []
        self.goals: list[str] = []

    async def chat(self, messages, **kwargs) -> Completion:
        schema = (kwargs.get("response_format") or {}).get("json_schema") or {}
        if schema.get("name") == "revision":
            self.calls.append({"messages": [dict(m) for m in messages], "schema": schema["schema"]})
            if self.gate is not None:
                await asyncio.to_thread(self.gate.wait, 30)
            answer = self.answers.pop(0)
            return Completion(answer if isinstance(answer, str) else json.dumps(answer), [], "stop", USAGE,
                              self.model)
        goal = next(m["content"] for m in messages if m["role"] == "user")
        self.goals.append(goal)
        value = {"ok": "the wrong way" not in goal,
                 "read": [[t, h, hashlib.sha256(b.encode()).hexdigest()] for t, h, b in ARTIFACT.findall(goal)]}
        return Completion(json.dumps(value), [], "stop", USAGE, self.model)

    async def stream(self, messages, **kwargs):  # pragma: no cover - only chat() is called
        raise NotImplementedError


def two_tasks(**a) -> dict:
    return {"goal": "count the rivers", "tasks": [
        {"id": "a", "agent": "solver", "prompt": "Do it the wrong way.", "on_failure": "replan",
         "output_schema": OK, **a},
        {"id": "b", "agent": "reader", "prompt": "Read it.", "depends_on": ["a"], "output_schema": OK}]}


def wait_http(http, plan_id: str, done, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        plan = ok(http.get(f"/v1/plans/{plan_id}"))
        if done(plan):
            return plan
        assert time.monotonic() < deadline, plan
        time.sleep(0.05)


def test_a_failed_task_is_revised_by_the_planner_and_reruns_with_the_revision(tmp_path, monkeypatch):
    gate = threading.Event()
    model = Reviser({"agent": "fixer", "prompt": "Do it the right way."}, gate=gate)
    with agent_server(tmp_path, models=lambda name, project=None: model, tools={}) as srv:
        for name in ("solver", "fixer", "reader"):
            ok(srv.http.post("/v1/agents", json={"name": name, "model": "m", "tools": []}), 201)
        plan_id = ok(srv.http.post("/v1/plans", json=two_tasks()))["id"]
        # the planner is asked (and held): the task is replanning, its dependent still waits
        held = wait_http(srv.http, plan_id, lambda p: p["tasks"][0]["status"] == "replanning")
        assert [t["status"] for t in held["tasks"]] == ["replanning", "waiting"]
        assert held["tasks"][0]["prompt_override"] is None and "output_schema" in held["tasks"][0]["error"]
        gate.set()
        plan = wait_http(srv.http, plan_id, lambda p: p["status"] in ("succeeded", "failed", "cancelled"))
        events = ok(srv.http.get(f"/v1/plans/{plan_id}/events", params={"limit": 500}))["data"]
        runs = {t["key"]: ok(srv.http.get(f"/v1/runs/{t['run_id']}")) for t in plan["tasks"]}
        agents = {r["id"]: r["name"] for r in ok(srv.http.get("/v1/agents"))["data"]}
        shown = plans_cli(monkeypatch, srv.url, "show", plan_id)
    assert shown.exit_code == 0 and "a revised by the planner (1×): Do it the right way." in shown.output, shown.output
    assert plan["status"] == "succeeded", plan
    a, b = plan["tasks"]
    assert (a["status"], a["attempt"], a["replans"], a["agent"], a["prompt_override"]) == \
        ("succeeded", 2, 1, "fixer", "Do it the right way.")
    # the dependent read the revised task's artifact, byte for byte
    assert b["status"] == "succeeded"
    assert b["artifact"]["read"] == [["a", a["artifact_sha256"], a["artifact_sha256"]]]
    # the second attempt ran with the revised prompt, on the revised agent
    assert "Do it the right way." in runs["a"]["goal"] and agents[runs["a"]["agent_id"]] == "fixer"
    # the planner was told the goal, the task's prompt and agent, what it reads and the error
    [call] = model.calls
    told = call["messages"][1]["content"]
    assert "count the rivers" in told and "Do it the wrong way." in told and "Agent: solver" in told
    assert "reads the results of: nothing" in told and "output_schema: at $.ok" in told
    assert call["schema"]["properties"]["agent"]["enum"] == ["fixer", "reader", "solver"]
    of_a = [(e["type"], e["data"].get("replan")) for e in events if e["task"] == "a" and e["type"] in (
        "task.dispatched", "task.replan_requested", "task.replanned", "task.succeeded")]
    assert of_a == [("task.dispatched", None), ("task.replan_requested", 1), ("task.replanned", 1),
                    ("task.dispatched", None), ("task.succeeded", None)]
    replanned = next(e for e in events if e["type"] == "task.replanned")["data"]
    assert (replanned["agent"], replanned["prompt"], replanned["model"]) == ("fixer", "Do it the right way.",
                                                                             "smollm2")
    seqs = {(e["task"], e["type"]): e["id"] for e in events}
    assert seqs[("b", "task.ready")] > seqs[("a", "task.succeeded")]  # b waited all along


# ---- the store and the replanning pass, driven by hand ----------------------------------------------------------
def make(db: str, **a) -> dict:
    """A stored two-task plan (a -> b) whose task a has failed once; its tasks by key."""
    for name in ("solver", "fixer", "reader"):
        journal.put_agent(db, AgentSpec(name=name, model="m", instructions=f"You are the {name}."), None)
    plan = store.create_plan(db, PlanSpec.model_validate(two_tasks(**a)), project_id=None)
    task = {t.key: t for t in store.tasks(db, plan.id)}["a"]
    store.mark_dispatched(db, task.id, "run_first")
    store.fail_task(db, task.id, "run run_first failed: the approach is wrong")
    return {t.key: t for t in store.tasks(db, plan.id)}


def events_of(db: str, plan_id: str) -> list[tuple[str, str | None, dict]]:
    return [(e.type, e.task_key, json.loads(e.data_json)) for e in store.events(db, plan_id)]


def run_pass(db: str, model: ChatModel | None) -> int:
    return asyncio.run(replan.replan_pending(db, (lambda name: model) if model else None, "planner-m"))


def test_a_failure_with_replans_left_waits_for_the_planner(db_url):
    t = make(db_url)
    assert (t["a"].status, t["a"].run_id, t["b"].status) == ("replanning", "run_first", "waiting")
    asked = [d for kind, key, d in events_of(db_url, t["a"].plan_id) if kind == "task.replan_requested"]
    assert asked == [{"error": "run run_first failed: the approach is wrong", "attempt": 1, "replan": 1,
                      "run_id": "run_first"}]
    assert store.plan(db_url, t["a"].plan_id).status == "running"


@pytest.mark.parametrize("max_replans", [0, 1])
def test_replans_run_out_and_the_task_fails_and_cascades(db_url, max_replans):
    t = make(db_url, max_replans=max_replans)
    model = Reviser({"agent": "fixer", "prompt": "Try again the wrong way."})
    if max_replans:
        assert run_pass(db_url, model) == 1
        a = store.tasks(db_url, t["a"].plan_id)[0]
        assert (a.status, a.attempt, a.replans, a.prompt_override) == ("ready", 2, 1, "Try again the wrong way.")
        store.mark_dispatched(db_url, a.id, "run_second")
        store.fail_task(db_url, a.id, "run run_second failed: still wrong")
    assert len(model.calls) == max_replans
    a, b = store.tasks(db_url, t["a"].plan_id)
    assert (a.status, b.status) == ("failed", "cancelled") and a.error.endswith("wrong")
    assert store.plan(db_url, a.plan_id).status == "failed"
    last = [d for kind, _, d in events_of(db_url, a.plan_id) if kind == "task.replan_requested"][-1]
    assert last["replan"] is None
    assert last["refused"] == f"no replans left ({max_replans} of max_replans {max_replans} used)"
    assert run_pass(db_url, model) == 0  # nothing left to revise


def test_a_planner_answering_garbage_twice_fails_the_task_with_the_reason(db_url):
    t = make(db_url)
    model = Reviser("this is not JSON", {"agent": "nobody", "prompt": "x"})
    assert run_pass(db_url, model) == 1
    a, b = store.tasks(db_url, t["a"].plan_id)
    assert a.status == "failed" and b.status == "cancelled"
    assert a.error == "replanning failed: the planner's revision names unknown agent 'nobody' (after 2 attempts)"
    retry = model.calls[1]["messages"]  # the refused answer went back with its error
    assert retry[-2] == {"role": "assistant", "content": "this is not JSON"}
    assert "not JSON" in retry[-1]["content"]
    assert store.plan(db_url, a.plan_id).status == "failed" and a.prompt_override is None


def test_no_planner_model_fails_the_task_saying_so(db_url):
    t = make(db_url)
    assert run_pass(db_url, None) == 1
    a = store.tasks(db_url, t["a"].plan_id)[0]
    assert a.status == "failed" and "replanning needs a planner model" in a.error


def test_a_stale_revision_is_refused(db_url):
    t = make(db_url)
    first = replan.Revision("fixer", "the first revision")
    replan.apply_revision(db_url, t["a"].id, 0, first, "planner-m")
    with pytest.raises(PlanError) as refused:  # a second scheduler's answer to the same request
        replan.apply_revision(db_url, t["a"].id, 0, replan.Revision("solver", "the second"), "planner-m")
    assert refused.value.status == 409 and "it is ready, not replanning" in refused.value.message
    a = store.tasks(db_url, t["a"].plan_id)[0]
    store.mark_dispatched(db_url, a.id, "run_second")
    store.fail_task(db_url, a.id, "run run_second failed: again")  # replanning again, now with replans=1
    for stale in (lambda: replan.apply_revision(db_url, a.id, 0, first, "planner-m"),
                  lambda: replan.fail_replanning(db_url, a.id, 0, "late")):
        with pytest.raises(PlanError, match="changed meanwhile"):
            stale()
    a = store.tasks(db_url, t["a"].plan_id)[0]
    assert (a.status, a.replans, a.prompt_override, a.agent_override) == ("replanning", 1, "the first revision",
                                                                          "fixer")
    assert [k for k, _, _ in events_of(db_url, a.plan_id)].count("task.replanned") == 1


def test_cancelling_the_plan_cancels_a_replanning_task(db_url):
    t = make(db_url)
    store.cancel_plan(db_url, t["a"].plan_id)
    assert [x.status for x in store.tasks(db_url, t["a"].plan_id)] == ["cancelled", "cancelled"]
    assert run_pass(db_url, Reviser()) == 0


def test_a_task_left_replanning_by_a_dead_leader_is_revised_by_the_next(db_url):
    t = make(db_url)
    # the leader died (kill -9) while its planner call was out: nothing of that call was stored
    assert leader.hold(db_url, leader.SCHEDULER_LEASE, f"{HOST}:999999999:dead", 300) == 1
    model = Reviser({"agent": "fixer", "prompt": "Do it the right way."})
    sched = PlanScheduler(db_url, f"{HOST}:1:next", poll_s=0.05, replanner=lambda name: model,
                          replan_model="planner-m")

    async def body():
        await sched.start()
        try:
            deadline = time.monotonic() + 30
            while store.tasks(db_url, t["a"].plan_id)[0].status != "dispatched":
                assert time.monotonic() < deadline, store.tasks(db_url, t["a"].plan_id)
                await asyncio.sleep(0.05)
        finally:
            await sched.stop()

    asyncio.run(body())
    a = store.tasks(db_url, t["a"].plan_id)[0]
    assert (a.attempt, a.replans, a.agent_override) == (2, 1, "fixer") and a.run_id != "run_first"
    with session(db_url, readonly=True) as s:  # its new run has the revised prompt and agent
        run = s.get(RunRow, a.run_id)
        agent = s.scalar(select(AgentRow.name).where(AgentRow.id == run.agent_id))
    assert "Do it the right way." in run.goal and "wrong way" not in run.goal and agent == "fixer"
    assert json.loads(a.input_json)["prompt"] == "Do it the right way."
    assert len(model.calls) == 1
