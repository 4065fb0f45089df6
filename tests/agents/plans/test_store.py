"""plans/store.py driven by hand on a real SQLite database (no model, no scheduler): each transition is one
transaction with its events; dependents are promoted as their upstream succeeds; fan-out/fan-in keeps item order
and the exact bytes; failures follow on_failure; dispatch has exactly one winner; approvals gate; projects are
kept apart; cancel stops what has not started and still records what was in flight."""

import hashlib
import json
import threading

import pytest
from sqlalchemy import select

from mainspring.agents import journal
from mainspring.agents.plans import store
from mainspring.agents.plans.spec import PlanError, PlanSpec, artifact_bytes, artifact_hash
from mainspring.agents.plans.tables import PlanRow
from mainspring.agents.spec import AgentSpec
from mainspring.store.db import session
from mainspring.store.tables import Project

AGENT_ID: dict[tuple[str, int | None], str] = {}


def agent(db, name="worker", project_id=None):
    row = journal.put_agent(db, AgentSpec(name=name, model="policy"), project_id)
    AGENT_ID[(name, project_id)] = row.id
    return row.id


def make(db, *tasks, project_id=None, **kw):
    """A stored plan of tasks given as dicts (agent "worker", prompt "do it" unless given)."""
    agent(db, project_id=project_id)
    spec = PlanSpec(goal=kw.pop("goal", "the goal"),
                    tasks=[{"agent": "worker", "prompt": "do it", **t} for t in tasks], **kw)
    return store.create_plan(db, spec, project_id=project_id)


def by_key(db, plan_id):
    return {t.key: t for t in store.tasks(db, plan_id)}


def start(db, task, project_id=None):
    """Dispatch `task` (a row or its id) to a fresh run and mark it running, as the scheduler and worker will."""
    task_id = getattr(task, "id", task)
    run = journal.create_run(db, AGENT_ID[("worker", project_id)], "run of a plan task", project_id=project_id)
    store.mark_dispatched(db, task_id, run.id)
    return store.mark_running(db, task_id)


def types(db, plan_id):
    return [(e.type, e.task_key) for e in store.events(db, plan_id)]


def test_a_three_stage_pipeline_driven_by_hand(db_url):
    p = make(db_url, {"id": "fetch"}, {"id": "analyse", "depends_on": ["fetch"]},
             {"id": "report", "depends_on": ["analyse"], "output_schema": {"type": "string"}}, priority=2)
    assert p.status == "running"
    assert [ts.id for ts in store.load_spec(p).tasks] == ["fetch", "analyse", "report"]
    t = by_key(db_url, p.id)
    assert {k: r.status for k, r in t.items()} == {"fetch": "ready", "analyse": "waiting", "report": "waiting"}
    assert [r.key for r in store.ready_tasks(db_url)] == ["fetch"] and t["fetch"].priority == 2000

    running = start(db_url, t["fetch"])
    assert running.status == "running" and running.run_id is not None
    assert store.ready_tasks(db_url) == []
    done = store.complete_task(db_url, t["fetch"].id, {"rows": [3, 1, 2], "source": "db"})
    assert done.status == "succeeded"
    assert done.artifact_json == '{"rows":[3,1,2],"source":"db"}'
    assert done.artifact_sha256 == artifact_hash({"source": "db", "rows": [3, 1, 2]})
    assert [r.key for r in store.ready_tasks(db_url)] == ["analyse"]
    assert by_key(db_url, p.id)["report"].status == "waiting"

    inputs = store.task_inputs(db_url, t["analyse"].id)
    assert inputs["goal"] == "the goal" and inputs["upstream"] == {"fetch": {"rows": [3, 1, 2], "source": "db"}}
    assert inputs["hashes"] == {"fetch": done.artifact_sha256}
    start(db_url, t["analyse"])
    store.complete_task(db_url, t["analyse"].id, {"mean": 2})
    start(db_url, t["report"])
    assert store.plan(db_url, p.id).status == "running"
    store.complete_task(db_url, t["report"].id, "all good")
    final = store.plan(db_url, p.id)
    assert final.status == "succeeded" and final.finished_at is not None and final.error is None

    evs = store.events(db_url, p.id)
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))  # numbered per plan, no gap
    assert types(db_url, p.id) == [
        ("plan.created", None), ("task.dispatched", "fetch"), ("task.running", "fetch"),
        ("task.succeeded", "fetch"), ("task.ready", "analyse"), ("task.dispatched", "analyse"),
        ("task.running", "analyse"), ("task.succeeded", "analyse"), ("task.ready", "report"),
        ("task.dispatched", "report"), ("task.running", "report"), ("task.succeeded", "report"),
        ("plan.succeeded", None)]
    assert [e.seq for e in store.events(db_url, p.id, after=10)] == [11, 12, 13]  # resuming after seq 10


def test_fan_out_and_fan_in_of_20_items_keep_order_and_bytes(db_url):
    items = [{"n": i, "text": f"paragraph {i} — é", "weights": [i / 3, -i]} for i in range(20)]
    p = make(db_url, {"id": "split"},
             {"id": "work", "depends_on": ["split"], "map_over": "split", "prompt": "summarise {item}",
              "output_schema": {"type": "object", "required": ["summary"]}},
             {"id": "merge", "depends_on": ["work", "split"]})
    split = by_key(db_url, p.id)["split"]
    start(db_url, split)
    store.complete_task(db_url, split.id, items)

    t = by_key(db_url, p.id)
    children = [t[f"work[{i}]"] for i in range(20)]
    assert t["work"].status == "running" and t["merge"].status == "waiting"
    assert [c.item_index for c in children] == list(range(20)) and {c.status for c in children} == {"ready"}
    assert len(store.ready_tasks(db_url)) == 20
    assert [k for k in t] == ["split", "work"] + [f"work[{i}]" for i in range(20)] + ["merge"]

    for i in reversed(range(20)):  # finishing out of order: the fan-in still gets item order
        child = children[i]
        inputs = store.task_inputs(db_url, child.id)
        assert inputs["item"] == items[i] and inputs["item_index"] == i
        assert inputs["item_sha256"] == artifact_hash(items[i]) == hashlib.sha256(
            inputs["item_json"].encode()).hexdigest()
        assert "split" not in inputs["upstream"]  # an item reads its item, not the whole list
        dispatched = start(db_url, child)
        assert json.loads(dispatched.input_json)["item"] == items[i]
        assert store.complete_task(db_url, child.id, {"summary": f"s{i}", "i": i}).status == "succeeded"
        assert by_key(db_url, p.id)["work"].status == ("succeeded" if i == 0 else "running")

    t = by_key(db_url, p.id)
    expected = [{"summary": f"s{i}", "i": i} for i in range(20)]
    assert json.loads(t["work"].artifact_json) == expected
    assert t["merge"].status == "ready"
    inputs = store.task_inputs(db_url, t["merge"].id)
    assert inputs["upstream"]["work"] == expected and inputs["upstream"]["split"] == items
    for key in ("work", "split"):  # the bytes the dependent reads are the bytes upstream stored, by hash
        stored = t[key]
        assert inputs["upstream_json"][key] == stored.artifact_json
        assert hashlib.sha256(inputs["upstream_json"][key].encode()).hexdigest() == stored.artifact_sha256
        assert inputs["hashes"][key] == stored.artifact_sha256
    assert t["split"].artifact_sha256 == hashlib.sha256(artifact_bytes(items)).hexdigest()
    merge = start(db_url, t["merge"])
    assert json.loads(merge.input_hashes_json) == {"split": t["split"].artifact_sha256,
                                                   "work": t["work"].artifact_sha256}
    store.complete_task(db_url, merge.id, "merged")
    assert store.plan(db_url, p.id).status == "succeeded"
    assert ("task.fanned_out", "work") in types(db_url, p.id)


def test_an_empty_fan_out_succeeds_at_once_and_a_non_array_fails_it(db_url):
    p = make(db_url, {"id": "a"}, {"id": "m", "depends_on": ["a"], "map_over": "a", "prompt": "{item}"},
             {"id": "z", "depends_on": ["m"]})
    a = by_key(db_url, p.id)["a"]
    start(db_url, a)
    store.complete_task(db_url, a.id, [])
    t = by_key(db_url, p.id)
    assert (t["m"].status, t["m"].artifact_json, t["z"].status) == ("succeeded", "[]", "ready")

    p = make(db_url, {"id": "a"}, {"id": "m", "depends_on": ["a"], "map_over": "a", "prompt": "{item}"},
             {"id": "z", "depends_on": ["m"]})
    a = by_key(db_url, p.id)["a"]
    start(db_url, a)
    store.complete_task(db_url, a.id, {"not": "a list"})
    t = by_key(db_url, p.id)
    assert t["m"].status == "failed" and t["m"].attempt == 1  # not retried: a retry would read the same artifact
    assert t["m"].error == "map_over 'a': its artifact is not a JSON array, it is an object"
    assert t["z"].status == "cancelled"
    final = store.plan(db_url, p.id)
    assert final.status == "failed" and final.error == "tasks failed: m"


def test_a_schema_failure_is_retried_then_fails_the_task_and_its_dependents(db_url):
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}
    p = make(db_url, {"id": "a", "output_schema": schema, "max_attempts": 2}, {"id": "b", "depends_on": ["a"]},
             {"id": "side"})
    a = by_key(db_url, p.id)["a"]
    first = start(db_url, a)
    got = store.complete_task(db_url, a.id, {"answer": 42})
    assert (got.status, got.attempt, got.run_id, got.artifact_json) == ("ready", 2, None, None)
    assert got.error == ("the artifact does not match the output schema at artifact.answer: 42 is not of type "
                         "'string'")
    retry = [e for e in store.events(db_url, p.id) if e.type == "task.retrying"]
    assert json.loads(retry[0].data_json)["previous_run_id"] == first.run_id
    second = start(db_url, a)
    assert second.run_id != first.run_id
    got = store.complete_task(db_url, a.id, {"no": "answer"})
    assert (got.status, got.attempt) == ("failed", 2) and "'answer' is a required property" in got.error
    t = by_key(db_url, p.id)
    assert t["b"].status == "cancelled" and t["b"].error == "upstream task 'a' did not succeed"
    assert store.plan(db_url, p.id).status == "running"  # "side" can still run: its result is not lost
    start(db_url, t["side"])
    store.complete_task(db_url, t["side"].id, "kept")
    final = store.plan(db_url, p.id)
    assert final.status == "failed" and final.error == "tasks failed: a"
    assert by_key(db_url, p.id)["side"].artifact_json == '"kept"'


def test_a_retry_that_succeeds(db_url):
    p = make(db_url, {"id": "a", "max_attempts": 3})
    a = by_key(db_url, p.id)["a"]
    start(db_url, a)
    assert store.fail_task(db_url, a.id, "model timed out").status == "ready"
    start(db_url, a)
    done = store.complete_task(db_url, a.id, 7)
    assert (done.status, done.attempt, done.error) == ("succeeded", 2, None)
    assert store.plan(db_url, p.id).status == "succeeded"


def test_skip_lets_dependents_go_on_with_null(db_url):
    p = make(db_url, {"id": "a", "on_failure": "skip"}, {"id": "b", "depends_on": ["a"]})
    a = by_key(db_url, p.id)["a"]
    start(db_url, a)
    skipped = store.fail_task(db_url, a.id, "no data today")
    assert (skipped.status, skipped.error, skipped.artifact_json) == ("skipped", "no data today", "null")
    b = by_key(db_url, p.id)["b"]
    assert b.status == "ready"
    assert store.task_inputs(db_url, b.id)["upstream"] == {"a": None}
    start(db_url, b)
    store.complete_task(db_url, b.id, "fine without it")
    assert store.plan(db_url, p.id).status == "succeeded"


def test_on_failure_fail_ends_the_plan_and_cancels_what_has_not_started(db_url):
    p = make(db_url, {"id": "a", "on_failure": "fail"}, {"id": "b"}, {"id": "c"}, {"id": "d", "depends_on": ["a"]})
    t = by_key(db_url, p.id)
    start(db_url, t["a"])
    busy = start(db_url, t["b"])
    store.fail_task(db_url, t["a"].id, "broken")
    final = store.plan(db_url, p.id)
    assert final.status == "failed" and final.error == "task 'a' failed: broken"
    t = by_key(db_url, p.id)
    assert {k: r.status for k, r in t.items()} == {"a": "failed", "b": "running", "c": "cancelled", "d": "cancelled"}
    failed = [e for e in store.events(db_url, p.id) if e.type == "plan.failed"]
    assert json.loads(failed[0].data_json)["in_flight"] == [{"task": "b", "run_id": busy.run_id}]
    assert store.complete_task(db_url, t["b"].id, "late").status == "succeeded"  # recorded, nothing else moves
    assert store.plan(db_url, p.id).status == "failed" and store.ready_tasks(db_url) == []


def test_replan_asks_the_planner_and_without_replans_left_fails_the_task(db_url):
    p = make(db_url, {"id": "a", "on_failure": "replan", "max_attempts": 5},
             {"id": "b", "on_failure": "replan", "max_replans": 0})
    a, b = by_key(db_url, p.id)["a"], by_key(db_url, p.id)["b"]
    start(db_url, a)
    start(db_url, b)
    assert store.fail_task(db_url, a.id, "the approach is wrong").status == "replanning"  # tests/.../test_replan.py
    assert store.fail_task(db_url, b.id, "the approach is wrong").status == "failed"
    asked = [e for e in store.events(db_url, p.id) if e.type == "task.replan_requested"]
    assert [(e.task_key, json.loads(e.data_json)["error"], json.loads(e.data_json)["replan"]) for e in asked] == \
        [("a", "the approach is wrong", 1), ("b", "the approach is wrong", None)]
    assert store.plan(db_url, p.id).status == "running"  # a is still to be revised


def test_two_threads_dispatching_the_same_task_exactly_one_wins(db_url):
    p = make(db_url, *[{"id": f"t{i}"} for i in range(8)])
    for task in store.tasks(db_url, p.id):
        runs = [journal.create_run(db_url, AGENT_ID[("worker", None)], "race").id for _ in range(2)]
        barrier, outcomes = threading.Barrier(2), []

        def grab(run_id, task_id=task.id, barrier=barrier, outcomes=outcomes):
            barrier.wait()
            try:
                outcomes.append(("won", store.mark_dispatched(db_url, task_id, run_id).run_id))
            except PlanError as e:
                outcomes.append(("lost", e.status))

        threads = [threading.Thread(target=grab, args=(r,)) for r in runs]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        won = [o for o in outcomes if o[0] == "won"]
        assert len(won) == 1 and [o for o in outcomes if o[0] == "lost"] == [("lost", 409)]
        row = by_key(db_url, p.id)[task.key]
        assert row.status == "dispatched" and row.run_id == won[0][1]
        assert types(db_url, p.id).count(("task.dispatched", task.key)) == 1  # one dispatch event, not two


def test_approval_gates_for_the_plan_and_for_a_task(db_url):
    p = make(db_url, {"id": "a"}, {"id": "send", "depends_on": ["a"], "requires_approval": True}, approve_plan=True)
    assert p.status == "awaiting_approval"
    a = by_key(db_url, p.id)["a"]
    assert a.status == "ready" and store.ready_tasks(db_url) == []  # nothing runs before the plan is approved
    run = journal.create_run(db_url, AGENT_ID[("worker", None)], "too early")
    with pytest.raises(PlanError, match="it is awaiting_approval") as e:
        store.mark_dispatched(db_url, a.id, run.id)
    assert e.value.status == 409
    assert store.approve_plan(db_url, p.id, "alice").status == "running"
    with pytest.raises(PlanError) as e:
        store.approve_plan(db_url, p.id, "alice")
    assert e.value.status == 409
    start(db_url, a)
    store.complete_task(db_url, a.id, "draft")
    send = by_key(db_url, p.id)["send"]
    assert send.status == "awaiting_approval" and store.ready_tasks(db_url) == []
    assert store.approve_task(db_url, send.id, "bob").status == "ready"
    assert [r.key for r in store.ready_tasks(db_url)] == ["send"]
    approved = [json.loads(e.data_json) for e in store.events(db_url, p.id) if e.type.endswith(".approved")]
    assert approved == [{"actor": "alice"}, {"actor": "bob"}]


def test_rejections(db_url):
    p = make(db_url, {"id": "a"}, approve_plan=True)
    assert store.reject_plan(db_url, p.id, "alice", comment="too costly").status == "cancelled"
    assert by_key(db_url, p.id)["a"].status == "cancelled"
    assert store.plan(db_url, p.id).error == "rejected by alice: too costly"

    p = make(db_url, {"id": "gate", "requires_approval": True, "on_failure": "skip"},
             {"id": "after", "depends_on": ["gate"]}, {"id": "hard", "requires_approval": True})
    t = by_key(db_url, p.id)
    assert store.reject_task(db_url, t["gate"].id, "bob").status == "skipped"  # on_failure skip: skipped
    assert by_key(db_url, p.id)["after"].status == "ready"
    rejected = store.reject_task(db_url, t["hard"].id, "bob", comment="no")
    assert (rejected.status, rejected.attempt, rejected.error) == ("failed", 1, "rejected by bob: no")


def test_a_fan_out_behind_an_approval_is_approved_once(db_url):
    p = make(db_url, {"id": "a"}, {"id": "m", "depends_on": ["a"], "map_over": "a", "prompt": "{item}",
                                   "requires_approval": True})
    a = by_key(db_url, p.id)["a"]
    start(db_url, a)
    store.complete_task(db_url, a.id, [1, 2, 3])
    m = by_key(db_url, p.id)["m"]
    assert m.status == "awaiting_approval" and len(store.tasks(db_url, p.id)) == 2
    store.approve_task(db_url, m.id, "carol")
    assert [r.key for r in store.ready_tasks(db_url)] == ["m[0]", "m[1]", "m[2]"]
    with pytest.raises(PlanError, match="fan-out task"):
        store.complete_task(db_url, m.id, [])


def test_another_projects_plan_is_not_found(db_url):
    with session(db_url) as s:
        mine, theirs = Project(name="mine"), Project(name="theirs")
        s.add_all([mine, theirs])
    p = make(db_url, {"id": "a"}, {"id": "b", "depends_on": ["a"]}, project_id=mine.id, approve_plan=True)
    a = by_key(db_url, p.id)["a"]
    assert store.plan(db_url, p.id, project_id=mine.id).id == p.id
    assert [r.id for r in store.plans(db_url, mine.id)] == [p.id]
    assert store.plans(db_url, theirs.id) == [] and store.plans(db_url, None) == []
    for other in (theirs.id, None):
        for call, ref, *args in ((store.plan, p.id), (store.tasks, p.id), (store.events, p.id),
                                 (store.approve_plan, p.id, "eve"), (store.cancel_plan, p.id),
                                 (store.task_inputs, a.id), (store.fail_task, a.id, "x")):
            with pytest.raises(PlanError, match="^no (plan|task) ") as e:
                call(db_url, ref, *args, project_id=other)
            assert e.value.status == 404
    assert store.plan(db_url, p.id).status == "awaiting_approval"  # nothing was changed by the refusals
    # agents are per project too: theirs has no "worker"
    spec = PlanSpec(goal="g", tasks=[{"id": "x", "agent": "worker", "prompt": "p"}])
    with pytest.raises(PlanError, match="unknown agent 'worker'"):
        store.create_plan(db_url, spec, project_id=theirs.id)


def test_a_refused_plan_stores_nothing(db_url):
    agent(db_url)
    spec = PlanSpec(goal="g", tasks=[{"id": "a", "agent": "worker", "prompt": "p", "depends_on": ["b"]},
                                     {"id": "b", "agent": "worker", "prompt": "p", "depends_on": ["a"]}])
    with pytest.raises(PlanError, match="dependency cycle: a → b → a"):
        store.create_plan(db_url, spec, project_id=None)
    with session(db_url, readonly=True) as s:
        assert s.scalars(select(PlanRow)).all() == []


def test_cancel_pause_and_resume(db_url):
    p = make(db_url, {"id": "a"}, {"id": "b"}, {"id": "c", "depends_on": ["a"]})
    t = by_key(db_url, p.id)
    assert store.pause_plan(db_url, p.id).status == "paused"
    assert store.ready_tasks(db_url) == []
    assert store.resume_plan(db_url, p.id).status == "running"
    assert {r.key for r in store.ready_tasks(db_url)} == {"a", "b"}
    busy = start(db_url, t["a"])
    cancelled = store.cancel_plan(db_url, p.id, actor="dave")
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    t = by_key(db_url, p.id)
    assert {k: r.status for k, r in t.items()} == {"a": "running", "b": "cancelled", "c": "cancelled"}
    ev = [json.loads(e.data_json) for e in store.events(db_url, p.id) if e.type == "plan.cancelled"]
    assert ev == [{"error": None, "in_flight": [{"task": "a", "run_id": busy.run_id}], "actor": "dave"}]
    for again in (store.cancel_plan, store.pause_plan, store.resume_plan):
        with pytest.raises(PlanError) as e:
            again(db_url, p.id)
        assert e.value.status == 409
    assert store.complete_task(db_url, t["a"].id, "finished anyway").status == "succeeded"
    t = by_key(db_url, p.id)
    assert t["c"].status == "cancelled" and store.plan(db_url, p.id).status == "cancelled"
    assert store.ready_tasks(db_url) == []


def test_ready_tasks_rank_by_plan_and_task_priority(db_url):
    low = make(db_url, {"id": "x", "priority": 499}, priority=0)
    high = make(db_url, {"id": "y"}, {"id": "z", "priority": -5}, priority=1)
    ranked = [(r.plan_id, r.key) for r in store.ready_tasks(db_url)]
    assert ranked == [(high.id, "y"), (high.id, "z"), (low.id, "x")]
    assert [r.key for r in store.ready_tasks(db_url, limit=1)] == ["y"]
    assert [r.priority for r in store.ready_tasks(db_url)] == [1000, 995, 499]


def test_a_failed_item_fails_its_fan_out_and_a_skipped_one_leaves_null(db_url):
    def fanned(on_failure):
        p = make(db_url, {"id": "a"}, {"id": "m", "depends_on": ["a"], "map_over": "a", "prompt": "{item}",
                                       "on_failure": on_failure, "max_attempts": 1},
                 {"id": "z", "depends_on": ["m"]})
        a = by_key(db_url, p.id)["a"]
        start(db_url, a)
        store.complete_task(db_url, a.id, ["x", "y", "w"])
        return p, by_key(db_url, p.id)

    p, t = fanned("retry")  # one attempt only: the first failure is final
    start(db_url, t["m[0]"])
    start(db_url, t["m[1]"])
    store.fail_task(db_url, t["m[1]"].id, "bad item")
    t = by_key(db_url, p.id)
    assert {k: r.status for k, r in t.items()} == {"a": "succeeded", "m": "failed", "m[0]": "running",
                                                   "m[1]": "failed", "m[2]": "cancelled", "z": "cancelled"}
    assert t["m"].error == "item 'm[1]' failed: bad item"
    store.complete_task(db_url, t["m[0]"].id, "late")  # recorded; the fan-out stays failed
    assert by_key(db_url, p.id)["m"].status == "failed"
    assert store.plan(db_url, p.id).status == "failed"

    p, t = fanned("skip")
    for i, outcome in enumerate(["X", None, "W"]):
        start(db_url, t[f"m[{i}]"])
        if outcome is None:
            assert store.fail_task(db_url, t[f"m[{i}]"].id, "no luck").status == "skipped"
        else:
            store.complete_task(db_url, t[f"m[{i}]"].id, outcome)
    t = by_key(db_url, p.id)
    assert t["m"].status == "succeeded" and t["m"].artifact_json == '["X",null,"W"]'
    assert t["z"].status == "ready"
