"""Plan tasks coordinating: messages between tasks, the wait-for graph and its deadlocks (detected, spelled out,
resolved by policy or by a person), wait timeouts, handoffs between agents and the livelock of a task handed
back and forth. Scripted models (TEST-ONLY) drive the real runtime, scheduler and worker."""

from __future__ import annotations

import asyncio
import json
import re
import time

from sqlalchemy import select

from mainspring.agents.plans import deadlocks
from mainspring.agents.plans.deadlocks import cycles, spell
from mainspring.agents.plans.spec import PlanSpec
from mainspring.agents.plans.tables import DeadlockRow, PlanEventRow, PlanWaitRow
from mainspring.agents.spec import AgentSpec
from mainspring.engine.outputs import Usage
from mainspring.models import ChatModel, Completion, ToolCall
from mainspring.store.db import session
from tests.agents.conftest import drive, make_runtime
from tests.agents.plans.test_scheduler import wait_plan

TOOLS = ["send_message", "wait_for_message", "handoff", "ask_agent"]


class Scripted(ChatModel):
    """TEST-ONLY: each agent's instructions are its script, one action per "|" part ("wait a", "send b: text",
    "handoff editor: note", "ask helper: question"); the part acted on is the number of tool results the run has
    had. Past the script it answers {"by": agent, "last": <the last tool result>}. Records every goal it got."""

    model = "scripted"

    def __init__(self) -> None:
        self.goals: dict[str, list[str]] = {}

    async def chat(self, messages, **kwargs) -> Completion:
        system = next(m["content"] for m in messages if m["role"] == "system")
        name = re.search(r"agent=(\w+)", system).group(1)
        goal = next(m["content"] for m in messages if m["role"] == "user")
        results = [m for m in messages if m["role"] == "tool"]
        if not results:
            self.goals.setdefault(name, []).append(goal)
        script = [line.strip() for line in system.split("|")[1:]]
        usage = Usage(prompt_tokens=10, cached_tokens=0, completion_tokens=3)
        if len(results) < len(script) and kwargs.get("tools"):
            verb, _, rest = script[len(results)].partition(" ")
            if verb == "wait":  # "wait b" or "wait b 0.5" (seconds, under the plan's message timeout)
                sender, _, seconds = rest.partition(" ")
                args = {"sender": sender, **({"timeout_s": float(seconds)} if seconds else {})}
                call = ToolCall("w", "wait_for_message", json.dumps(args))
            elif verb == "send":
                to, _, text = rest.partition(": ")
                call = ToolCall("s", "send_message", json.dumps({"to": to, "text": text}))
            elif verb == "ask":
                to, _, question = rest.partition(": ")
                call = ToolCall("q", "ask_agent", json.dumps({"agent": to, "question": question}))
            else:
                to, _, note = rest.partition(": ")
                call = ToolCall("h", "handoff", json.dumps({"agent": to, "note": note}))
            return Completion("", [call], "tool_calls", usage, self.model)
        last = results[-1]["content"] if results else ""
        return Completion(json.dumps({"by": name, "last": last}), [], "stop", usage, self.model)

    async def stream(self, messages, **kwargs):  # pragma: no cover - the runtime only calls chat()
        raise NotImplementedError


def agent(name: str, *script: str) -> AgentSpec:
    return AgentSpec(name=name, model="scripted", instructions="|".join([f"agent={name}", *script]), tools=TOOLS)


def task(key: str, agent_name: str, **kw) -> dict:
    return {"id": key, "agent": agent_name, "prompt": f"do {key}", "on_failure": "fail",
            "output_schema": {"type": "object"}, **kw}


def events(db_url: str, plan_id: str, kind: str) -> list[dict]:
    with session(db_url, readonly=True) as s:
        rows = s.scalars(select(PlanEventRow).where(PlanEventRow.plan_id == plan_id, PlanEventRow.type == kind)
                         .order_by(PlanEventRow.seq))
        return [{"task": r.task_key, **json.loads(r.data_json)} for r in rows]


def test_cycles_are_found_once_each_and_spelled_from_their_smallest_key():
    assert cycles({"a": "b", "b": "c", "c": "a"}) == [["a", "b", "c", "a"]]
    assert cycles({"c": "a", "a": "b", "b": "c", "x": "a", "y": "y"}) == [["a", "b", "c", "a"], ["y", "y"]]
    assert cycles({"a": "b", "b": "c"}) == []  # a chain waits, but it is no deadlock
    assert spell(["a", "b", "a"]) == "a → b → a"


def test_a_message_passes_from_one_task_to_another(tmp_path, db_url):
    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    rt.put_agent(agent("sender", "send reader: the code is 7731"))
    rt.put_agent(agent("reader", "wait writer"))
    plan = PlanSpec(goal="g", tasks=[task("writer", "sender"), task("reader", "reader")])

    async def body():
        row = rt.plans.create(plan)
        return await wait_plan(rt, row.id), rt.plans.tasks(row.id)

    done, tasks = drive(rt, body)
    assert done.status == "succeeded"
    by = {t.key: t for t in tasks}
    assert "the code is 7731" in json.loads(by["reader"].artifact_json)["last"]
    assert [e["to"] for e in events(db_url, done.id, "message.sent")] == ["reader"]


def test_a_three_agent_wait_for_cycle_is_detected_and_its_youngest_member_failed(tmp_path, db_url):
    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    for name, waits_on in (("ag_a", "b"), ("ag_b", "c"), ("ag_c", "a")):
        rt.put_agent(agent(name, f"wait {waits_on}"))
    plan = PlanSpec(goal="g", tasks=[task("a", "ag_a", on_failure="retry"), task("b", "ag_b", on_failure="retry"),
                                     task("c", "ag_c", on_failure="retry")])

    async def body():
        row = rt.plans.create(plan)
        return await wait_plan(rt, row.id, timeout=60), rt.plans.tasks(row.id)

    done, tasks = drive(rt, body)
    by = {t.key: t for t in tasks}
    with session(db_url, readonly=True) as s:
        found = list(s.scalars(select(DeadlockRow)))
        waits = {w.waiter: w for w in s.scalars(select(PlanWaitRow))}
    assert len(found) == 1, "the cycle is reported once, not on every tick"
    dl = found[0]
    assert json.loads(dl.cycle_json) == ["a", "b", "c", "a"] and dl.status == "resolved"
    youngest = max(tasks, key=lambda t: (t.dispatched_at, t.key)).key
    assert dl.victim == youngest
    assert by[youngest].status == "failed" and "deadlock a → b → c → a" in by[youngest].error
    assert by[youngest].attempt == 1, "a deadlock's victim is not retried into the same wait"
    assert waits[youngest].outcome == "deadlock"
    others = [k for k in "abc" if k != youngest]
    for key in others:  # their waits on the victim ended, and their agents went on with the reason
        assert by[key].status == "succeeded", (key, by[key].error)
    waited_on_victim = next(k for k in others if waits[k].target == youngest)
    assert waits[waited_on_victim].outcome == "target_ended"
    assert done.status == "failed"
    detected = events(db_url, done.id, "deadlock.detected")
    assert [e["text"] for e in detected] == ["a → b → c → a"]
    assert (dl.detected_at - max(w.since for w in waits.values())).total_seconds() < 30


def test_ask_human_leaves_the_deadlock_open_until_a_person_releases_a_member(tmp_path, db_url):
    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    for name, waits_on in (("ag_a", "b"), ("ag_b", "c"), ("ag_c", "a")):
        rt.put_agent(agent(name, f"wait {waits_on}"))
    plan = PlanSpec(goal="g", deadlock_policy="ask_human",
                    tasks=[task("a", "ag_a"), task("b", "ag_b"), task("c", "ag_c")])

    async def body():
        row = rt.plans.create(plan)
        deadline = time.monotonic() + 30
        while not (found := deadlocks.listing(db_url, None, plan_id=row.id)):
            assert time.monotonic() < deadline, "no deadlock reported"
            await asyncio.sleep(0.05)
        assert found[0].status == "open"
        await asyncio.sleep(1.0)  # a few ticks: nobody resolves it for the person
        assert deadlocks.get(db_url, found[0].id, None).status == "open"
        assert rt.plans.get(row.id).status == "running"
        resolved = deadlocks.resolve(db_url, found[0].id, "release", "b", "alice", None, lambda run_id: None)
        return resolved, await wait_plan(rt, row.id, timeout=60), rt.plans.tasks(row.id)

    resolved, done, tasks = drive(rt, body)
    assert resolved.victim == "b" and "alice" in resolved.resolution
    assert done.status == "succeeded", [(t.key, t.status, t.error) for t in tasks]
    by = {t.key: json.loads(t.artifact_json)["last"] for t in tasks}
    assert "released by alice" in by["b"]
    assert "sent no message" in by["a"] and "sent no message" in by["c"]


def test_another_projects_caller_cannot_see_or_resolve_a_deadlock(tmp_path, db_url):
    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    for name, waits_on in (("ag_a", "b"), ("ag_b", "a")):
        rt.put_agent(agent(name, f"wait {waits_on}"))
    plan = PlanSpec(goal="g", deadlock_policy="ask_human", tasks=[task("a", "ag_a"), task("b", "ag_b")])

    async def body():
        row = rt.plans.create(plan)
        deadline = time.monotonic() + 30
        while not (found := deadlocks.listing(db_url, None, plan_id=row.id)):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert deadlocks.listing(db_url, 12345) == []
        try:
            deadlocks.resolve(db_url, found[0].id, "fail", "a", "mallory", 12345, lambda run_id: None)
        except ValueError as exc:
            refused = exc
        deadlocks.resolve(db_url, found[0].id, "fail", "a", "alice", None, lambda run_id: None)
        return refused, await wait_plan(rt, row.id, timeout=60)

    refused, done = drive(rt, body)
    assert getattr(refused, "status", None) == 404
    assert done.status == "failed"


def test_a_wait_times_out_and_its_agent_goes_on(tmp_path, db_url):
    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    # a's wait is the shorter (0.5 s against the plan's 3 s for slow's), so it times out before slow can end
    # whatever order the two tasks start in: with equal timeouts, slow's could fire first, end slow, and end a's
    # wait as "target_ended" instead (a clean-clone CI run did so once)
    rt.put_agent(agent("patient", "wait slow 0.5"))
    rt.put_agent(agent("slowpoke", "wait nobody"))
    rt.put_agent(agent("nobody"))
    plan = PlanSpec(goal="g", message_timeout_s=3.0, tasks=[task("a", "patient"), task("slow", "slowpoke"),
                                                            task("nobody", "nobody", depends_on=["a"])])

    async def body():
        row = rt.plans.create(plan)
        return await wait_plan(rt, row.id, timeout=60), rt.plans.tasks(row.id)

    done, tasks = drive(rt, body)
    by = {t.key: t for t in tasks}
    assert done.status == "succeeded"
    assert "timed_out" in json.loads(by["a"].artifact_json)["last"]
    assert "within 0.5 s" in json.loads(by["a"].artifact_json)["last"]


def test_a_handoff_gives_the_task_and_its_conversation_to_another_agent(tmp_path, db_url):
    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    rt.put_agent(agent("writer", "handoff editor: tighten the second paragraph"))
    rt.put_agent(agent("editor"))
    plan = PlanSpec(goal="g", tasks=[task("draft", "writer")])

    async def body():
        row = rt.plans.create(plan)
        return await wait_plan(rt, row.id), rt.plans.tasks(row.id)

    done, tasks = drive(rt, body)
    assert done.status == "succeeded"
    (t,) = tasks
    assert json.loads(t.artifact_json)["by"] == "editor"
    assert (t.agent_override, t.handoffs) == ("editor", 1)
    editor_goal = model.goals["editor"][0]
    assert editor_goal.startswith("do draft")
    assert "Note from writer: tighten the second paragraph" in editor_goal
    assert "handoff" in editor_goal and 'from="writer"' in editor_goal
    (hand,) = events(db_url, done.id, "task.handed_off")
    assert (hand["from"], hand["to"]) == ("writer", "editor") and hand["previous_run_id"] != t.run_id


def test_a_task_handed_back_and_forth_past_max_handoffs_is_a_livelock(tmp_path, db_url):
    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    rt.put_agent(agent("alice", "handoff bob: yours"))
    rt.put_agent(agent("bob", "handoff alice: no, yours"))
    plan = PlanSpec(goal="g", max_handoffs=3, tasks=[task("hot", "alice", on_failure="retry")])

    async def body():
        row = rt.plans.create(plan)
        return await wait_plan(rt, row.id), rt.plans.tasks(row.id)

    done, tasks = drive(rt, body)
    (t,) = tasks
    assert done.status == "failed" and t.status == "failed" and t.attempt == 1
    assert "livelock" in t.error and "alice → bob → alice → bob → alice" in t.error
    with session(db_url, readonly=True) as s:
        (found,) = s.scalars(select(DeadlockRow))
    assert found.kind == "livelock" and json.loads(found.cycle_json) == ["alice", "bob", "alice", "bob", "alice"]
    assert len(events(db_url, done.id, "task.handed_off")) == 3


def test_the_coordination_tools_refuse_outside_a_plan(tmp_path, db_url):
    from tests.agents.conftest import wait_status

    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    rt.put_agent(agent("loner", "wait someone"))

    async def body():
        run = rt.start_run("loner", "hello")
        return await wait_status(rt, run.id, {"succeeded", "failed"})

    run = drive(rt, body)
    assert run.status == "succeeded"
    assert "not a plan task" in json.loads(run.result)["last"]
