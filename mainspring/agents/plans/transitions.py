"""The plan store's in-transaction machinery: every change of a plan is one transaction over its rows that also
appends its plan events, so a crash between two changes loses nothing and repeats nothing. store.py is the public
API that opens those transactions (and defines the functions named below); the helpers here run inside one
(a `Tx`).

A transition first locks the plan's row (SELECT … FOR UPDATE on Postgres; SQLite's write sessions hold the
database's write lock from BEGIN IMMEDIATE), which serialises the plan's changes and its event numbering.
Dispatch is additionally a guarded `UPDATE … WHERE status = 'ready'`: of two schedulers racing for a task,
exactly one sees its row change, so no two agents ever run the same task.

Rules (the scheduler and the API build on them):
- A task becomes ready when all its dependencies succeeded or were skipped (a skipped task's artifact is null);
  with requires_approval it waits in awaiting_approval for `approve_task` first.
- A `map_over` task does not run itself: when its dependencies are done it fans out into one task per item of
  the mapped artifact ("key[i]", ready at once; requires_approval gates the fan-out once, not each item) and is
  "running" until every item is done; its artifact is then the items' artifacts in item order (a skipped item
  gives null). Its output_schema applies to each item. A mapped artifact that is not an array fails it without
  retry (a retry would read the same artifact); an empty array makes it succeed at once with [].
- On failure (`fail_task`, an artifact failing its schema, a rejection) per on_failure: "retry" puts the task
  back to ready with attempt + 1 while attempt < max_attempts (rejections are never retried); "skip" skips it;
  "fail" fails it and the plan at once, cancelling every task not started; "retry" exhausted fails the task and
  cancels what depends on it, the rest of the plan goes on and the plan ends failed. "replan" puts the task in
  replanning (task.replan_requested) while it has revisions left (max_replans; not for a failure that is not
  retried): its dependents keep waiting while the leader has the planner model revise its agent and prompt
  (replan.py), and it is then ready again with attempt + 1; with none left it fails as "retry" exhausted does
  (task.replan_requested says it was refused). A failed item fails its fan-out task.
- `reject_plan` cancels the plan; `reject_task` counts as a failure that is not retried.
- A plan ends succeeded when every task succeeded or was skipped, failed when a task failed and nothing else
  can run. Ending or cancelling a plan cancels its tasks not started; tasks in flight (dispatched/running,
  listed with their run ids in the plan event for the scheduler to stop) are still recorded when their outcome
  arrives, but nothing is promoted, retried or ended after that.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, cast

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session

from mainspring.agents.plans.spec import PlanError, PlanGraph, PlanSpec, TaskSpec, artifact_bytes, plan_graph
from mainspring.agents.plans.tables import (NOT_STARTED, PLAN_TERMINAL, TASK_DONE, TASK_TERMINAL, PlanEventRow,
                                            PlanRow, PlanStatus, PlanTaskRow, TaskStatus)
from mainspring.store.base import utcnow as now
from mainspring.store.ids import new_id


class Scope(Enum):
    ANY = "any"  # internal callers (the scheduler): no project check


ANY = Scope.ANY
# tasks with a run; a preempted one's may still end on its own (the pause lands after its last step): recorded then
IN_FLIGHT = {TaskStatus.DISPATCHED, TaskStatus.RUNNING, TaskStatus.PREEMPTED}
ProjectScope = int | None | Scope  # the API passes its caller's project (None: anonymous, auth off)

graphs: OrderedDict[str, tuple[PlanSpec, PlanGraph]] = OrderedDict()  # plan id -> its (immutable) spec, parsed
graphs_lock = threading.Lock()


def graph(plan: PlanRow) -> tuple[PlanSpec, PlanGraph]:
    with graphs_lock:
        found = graphs.get(plan.id)
        if found is not None:
            graphs.move_to_end(plan.id)
            return found
    spec = PlanSpec.model_validate_json(plan.spec_json)
    found = (spec, plan_graph(spec))
    with graphs_lock:
        graphs[plan.id] = found
        while len(graphs) > 256:
            graphs.popitem(last=False)
    return found


def _json_kind(value: Any) -> str:
    return {dict: "an object", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


@dataclass
class Tx:
    """One transition: its session, the plan (locked), the plan's graph, the tasks read so far (by key) and the
    next event number."""
    s: Session
    plan: PlanRow
    spec: PlanSpec
    graph: PlanGraph
    tasks: dict[str, PlanTaskRow] = field(default_factory=dict)
    seq: int | None = None

    def event(self, type_: str, task_key: str | None = None, **data: Any) -> None:
        if self.seq is None:
            self.seq = self.s.scalar(select(func.max(PlanEventRow.seq))
                                     .where(PlanEventRow.plan_id == self.plan.id)) or 0
        self.seq += 1
        t = now()
        self.plan.updated_at = t
        self.s.add(PlanEventRow(plan_id=self.plan.id, seq=self.seq, type=type_, task_key=task_key,
                                data_json=json.dumps(data, default=str), created_at=t))

    def load(self, keys: list[str]) -> list[PlanTaskRow]:
        missing = [k for k in keys if k not in self.tasks]
        if missing:
            for row in self.s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id == self.plan.id,
                                                                PlanTaskRow.key.in_(missing))):
                self.tasks[row.key] = row
        return [self.tasks[k] for k in keys]

    def get(self, key: str) -> PlanTaskRow:
        return self.load([key])[0]

    def items(self, parent_key: str) -> list[PlanTaskRow]:
        rows = list(self.s.scalars(select(PlanTaskRow).where(
            PlanTaskRow.plan_id == self.plan.id, PlanTaskRow.spec_key == parent_key,
            PlanTaskRow.item_index.is_not(None)).order_by(PlanTaskRow.item_index)))
        self.tasks.update((r.key, r) for r in rows)
        return rows

    def spec_of(self, task: PlanTaskRow) -> TaskSpec:
        return self.graph.by_key[task.spec_key]

    def is_fan_out(self, task: PlanTaskRow) -> bool:
        return task.item_index is None and self.spec_of(task).map_over is not None


def in_scope(plan: PlanRow, project_id: ProjectScope) -> bool:
    return project_id is ANY or plan.project_id == project_id


def open_plan(s: Session, plan_id: str, project_id: ProjectScope) -> Tx:
    plan = s.scalars(select(PlanRow).where(PlanRow.id == plan_id).with_for_update()).first()
    if plan is None or not in_scope(plan, project_id):
        raise PlanError(f"no plan {plan_id!r}", status=404)  # another project's plan is not found either
    spec, plan_g = graph(plan)
    return Tx(s, plan, spec, plan_g)


def _plan_of_task(s: Session, task_id: str) -> str:
    plan_id = s.scalar(select(PlanTaskRow.plan_id).where(PlanTaskRow.id == task_id))
    if plan_id is None:
        raise PlanError(f"no task {task_id!r}", status=404)
    return plan_id


def open_task(s: Session, task_id: str, project_id: ProjectScope) -> tuple[Tx, PlanTaskRow]:
    plan_id = _plan_of_task(s, task_id)
    try:
        tx = open_plan(s, plan_id, project_id)
    except PlanError:
        raise PlanError(f"no task {task_id!r}", status=404)
    task = s.get(PlanTaskRow, task_id)
    assert task is not None
    tx.tasks[task.key] = task
    return tx, task


# ---- transitions inside one transaction ---------------------------------------------------------------------
def _end_task(tx: Tx, task: PlanTaskRow, status: TaskStatus, error: str | None) -> None:
    task.status, task.error, task.finished_at = status, error, now()
    task.updated_at = task.finished_at
    tx.event(f"task.{status}", task.key, error=error, attempt=task.attempt)


def _store_artifact(task: PlanTaskRow, value: Any) -> None:
    data = artifact_bytes(value)
    task.artifact_json, task.artifact_sha256 = data.decode(), hashlib.sha256(data).hexdigest()


def succeed(tx: Tx, task: PlanTaskRow, value: Any) -> list[PlanTaskRow]:
    _store_artifact(task, value)
    task.status, task.error, task.finished_at = TaskStatus.SUCCEEDED, None, now()
    task.updated_at = task.finished_at
    tx.event("task.succeeded", task.key, sha256=task.artifact_sha256, bytes=len(task.artifact_json or ""),
             attempt=task.attempt, run_id=task.run_id)
    return [task]


def _set_ready(tx: Tx, task: PlanTaskRow) -> None:
    task.status, task.ready_at = TaskStatus.READY, now()
    task.updated_at = task.ready_at
    tx.event("task.ready", task.key, attempt=task.attempt)


def _fan_out(tx: Tx, parent: PlanTaskRow) -> list[PlanTaskRow]:
    mapped = tx.get(tx.spec_of(parent).map_over or "")
    items = json.loads(mapped.artifact_json) if mapped.artifact_json is not None else None
    if not isinstance(items, list):
        why = " (it was skipped)" if mapped.status == TaskStatus.SKIPPED else ""
        return fail(tx, parent, f"map_over {mapped.key!r}: its artifact is not a JSON array, it is "
                                f"{_json_kind(items)}{why}", retryable=False)
    if not items:
        return succeed(tx, parent, [])
    t = now()
    parent.status, parent.updated_at = TaskStatus.RUNNING, t
    children = [PlanTaskRow(id=new_id("ptask_"), plan_id=parent.plan_id, project_id=parent.project_id,
                            key=f"{parent.key}[{i}]", spec_key=parent.key, item_index=i, status=TaskStatus.READY,
                            priority=parent.priority, attempt=1, input_json=artifact_bytes({"item": item}).decode(),
                            created_at=t, ready_at=t, updated_at=t) for i, item in enumerate(items)]
    tx.s.add_all(children)
    tx.tasks.update((c.key, c) for c in children)
    tx.event("task.fanned_out", parent.key, items=len(children), over=mapped.key)
    for c in children:
        tx.event("task.ready", c.key, attempt=1)
    return []


def start(tx: Tx, task: PlanTaskRow) -> list[PlanTaskRow]:
    """Dependencies done (and approved, if asked): ready, or fanned out. Returns the tasks that finished."""
    if tx.is_fan_out(task):
        return _fan_out(tx, task)
    _set_ready(tx, task)
    return []


def _promote(tx: Tx, task: PlanTaskRow) -> list[PlanTaskRow]:
    if tx.spec_of(task).requires_approval and task.item_index is None:
        task.status, task.updated_at = TaskStatus.AWAITING_APPROVAL, now()
        tx.event("task.awaiting_approval", task.key)
        return []
    return start(tx, task)


def done(tx: Tx, finished: list[PlanTaskRow]) -> None:
    """Tasks just succeeded or skipped: complete fan-out tasks whose items are all done, promote dependents whose
    dependencies are all done (which may finish more: an empty fan-out, a skip), until nothing changes."""
    queue = list(finished)
    while queue and tx.plan.status not in PLAN_TERMINAL:
        t = queue.pop(0)
        if t.item_index is not None:
            parent = tx.get(t.spec_key)
            left = tx.s.scalar(select(func.count()).select_from(PlanTaskRow).where(
                PlanTaskRow.plan_id == tx.plan.id, PlanTaskRow.spec_key == parent.key,
                PlanTaskRow.item_index.is_not(None), PlanTaskRow.status.not_in(TASK_DONE)))
            if parent.status == TaskStatus.RUNNING and left == 0:
                values = [json.loads(c.artifact_json or "null") for c in tx.items(parent.key)]
                queue += succeed(tx, parent, values)
            continue
        for key in tx.graph.dependents[t.key]:
            d = tx.get(key)
            if d.status == TaskStatus.WAITING and all(
                    u.status in TASK_DONE for u in tx.load(tx.graph.by_key[key].depends_on)):
                queue += _promote(tx, d)


def _cascade(tx: Tx, task: PlanTaskRow) -> None:
    """`task` will never succeed: cancel everything waiting downstream of it."""
    stack = [task]
    while stack:
        t = stack.pop()
        for key in tx.graph.dependents[t.spec_key]:
            d = tx.get(key)
            if d.status == TaskStatus.WAITING:
                _end_task(tx, d, TaskStatus.CANCELLED, f"upstream task {t.key!r} did not succeed")
                stack.append(d)


def fail(tx: Tx, task: PlanTaskRow, error: str, *, retryable: bool = True) -> list[PlanTaskRow]:
    """The task's attempt failed with `error`: apply its on_failure. Returns the tasks that finished as done
    (a skip), for `done`."""
    spec = tx.spec_of(task)
    if tx.plan.status in PLAN_TERMINAL:  # the plan ended meanwhile: record, change nothing else
        _end_task(tx, task, TaskStatus.FAILED, error)
        return []
    if spec.on_failure == "retry" and retryable and task.attempt < spec.max_attempts:
        previous, task.run_id, task.dispatched_at = task.run_id, None, None
        task.status, task.error, task.attempt, task.ready_at = TaskStatus.READY, error, task.attempt + 1, now()
        task.agent_override, task.handoffs = None, 0  # a retry starts over with the task's own agent
        task.updated_at = task.ready_at
        tx.event("task.retrying", task.key, attempt=task.attempt, error=error, previous_run_id=previous)
        return []
    if spec.on_failure == "skip":
        _store_artifact(task, None)
        _end_task(tx, task, TaskStatus.SKIPPED, error)
        return [task]
    if spec.on_failure == "replan" and retryable and task.replans < spec.max_replans:
        # the run stays named on the row until the revision: the failed attempt is still the task's latest
        task.status, task.error, task.updated_at = TaskStatus.REPLANNING, error, now()
        tx.event("task.replan_requested", task.key, error=error, attempt=task.attempt, replan=task.replans + 1,
                 run_id=task.run_id)
        return []
    _end_task(tx, task, TaskStatus.FAILED, error)
    if spec.on_failure == "replan" and retryable:
        tx.event("task.replan_requested", task.key, error=error, attempt=task.attempt, replan=None,
                 refused=f"no replans left ({task.replans} of max_replans {spec.max_replans} used)")
    if spec.on_failure == "fail":
        end_plan(tx, PlanStatus.FAILED, f"task {task.key!r} failed: {error}")
    elif task.item_index is not None:  # an item failed: its fan-out task cannot complete
        parent = tx.get(task.spec_key)
        if parent.status == TaskStatus.RUNNING:
            for item in tx.items(parent.key):
                if item.status in NOT_STARTED:
                    _end_task(tx, item, TaskStatus.CANCELLED, f"item {task.key!r} failed")
            _end_task(tx, parent, TaskStatus.FAILED, f"item {task.key!r} failed: {error}")
            _cascade(tx, parent)
    else:
        _cascade(tx, task)
    return []


def end_plan(tx: Tx, status: PlanStatus, error: str | None, **data: Any) -> None:
    """The plan ends: its tasks not started are cancelled; those in flight are listed for the scheduler."""
    plan = tx.plan
    plan.status, plan.error, plan.finished_at = status, error, now()
    in_flight = []
    for t in tx.s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id == plan.id,
                                                    PlanTaskRow.status.in_(NOT_STARTED | IN_FLIGHT))):
        tx.tasks.setdefault(t.key, t)
        if t.status in NOT_STARTED or tx.is_fan_out(t) or t.status == TaskStatus.PREEMPTED:
            # a preempted task's run is paused: nothing would ever finish it (the scheduler cancels the run)
            _end_task(tx, t, TaskStatus.CANCELLED, f"the plan {status}")
        elif t.run_id is not None:
            in_flight.append({"task": t.key, "run_id": t.run_id})
    tx.event(f"plan.{status}", error=error, in_flight=in_flight, **data)


def settle(tx: Tx) -> None:
    """End a running (or paused) plan once every task is terminal."""
    if tx.plan.status not in (PlanStatus.RUNNING, PlanStatus.PAUSED):
        return
    counts = {status: n for status, n in tx.s.execute(
        select(PlanTaskRow.status, func.count()).where(PlanTaskRow.plan_id == tx.plan.id).group_by(PlanTaskRow.status))}
    if any(status not in TASK_TERMINAL for status in counts):
        return
    if all(status in TASK_DONE for status in counts):
        end_plan(tx, PlanStatus.SUCCEEDED, None)
        return
    failed = list(tx.s.scalars(select(PlanTaskRow.key).where(PlanTaskRow.plan_id == tx.plan.id,
                                                             PlanTaskRow.status == TaskStatus.FAILED)
                               .order_by(PlanTaskRow.key).limit(5)))
    end_plan(tx, PlanStatus.FAILED, f"tasks failed: {', '.join(failed)}" if failed else "tasks were cancelled")


# ---- what a task reads, and the scheduler's guarded moves -----------------------------------------------------
def inputs(tx: Tx, task: PlanTaskRow) -> dict[str, Any]:
    spec = tx.spec_of(task)
    deps = [d for d in spec.depends_on if not (task.item_index is not None and d == spec.map_over)]
    done = [u for u in tx.load(deps) if u.status in TASK_DONE]
    out: dict[str, Any] = {"plan_id": tx.plan.id, "task": task.key, "attempt": task.attempt, "goal": tx.plan.goal,
                           "prompt": task.prompt_override or spec.prompt,  # the planner's revision, if any
                           "upstream": {u.key: json.loads(u.artifact_json or "null") for u in done},
                           "upstream_json": {u.key: u.artifact_json or "null" for u in done},
                           "hashes": {u.key: u.artifact_sha256 for u in done}}
    if task.item_index is not None:
        item = json.loads(task.input_json or "{}").get("item")
        item_json = artifact_bytes(item)
        out.update(item=item, item_index=task.item_index, item_json=item_json.decode(),
                   item_sha256=hashlib.sha256(item_json).hexdigest())
    return out


def guarded(s: Session, task_id: str, source: TaskStatus, action: str, *, when: tuple[Any, ...] = (),
            **values: Any) -> tuple[Tx, PlanTaskRow]:
    """Lock the task's plan, then move the task from `source` with one guarded UPDATE (also guarded by the
    conditions `when`): (tx, the task) when this caller moved it, else PlanError 409 (another caller did first,
    or it was never in `source`)."""
    tx = open_plan(s, _plan_of_task(s, task_id), ANY)
    if action in ("dispatch", "resume") and tx.plan.status != PlanStatus.RUNNING:
        raise PlanError(f"cannot {action} a task of plan {tx.plan.id}: it is {tx.plan.status}", status=409)
    result = s.execute(update(PlanTaskRow).where(PlanTaskRow.id == task_id, PlanTaskRow.status == source, *when)
                       .values(**values).execution_options(synchronize_session=False))
    moved = cast(CursorResult, result).rowcount
    task = s.get(PlanTaskRow, task_id)  # read after the UPDATE: not in this session before it
    assert task is not None
    if moved != 1:
        why = "it changed meanwhile" if task.status == source else f"it is {task.status}, not {source}"
        raise PlanError(f"cannot {action} task {task.key!r}: {why}", status=409)
    tx.tasks[task.key] = task
    return tx, task
