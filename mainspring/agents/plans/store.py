"""The plan store: every change of a plan is one transaction over its rows that also appends its plan events, so
a crash between two changes loses nothing and repeats nothing.

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
  "fail" fails it and the plan at once, cancelling every task not started; "retry" exhausted and "replan" fail
  the task and cancel what depends on it, the rest of the plan goes on and the plan ends failed ("replan" also
  appends task.replan_requested with the error: the planner integration comes later and will revise the plan
  from that event instead). A failed item fails its fan-out task.
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

from mainspring.agents.journal import project_is
from mainspring.agents.plans.spec import (PlanError, PlanGraph, PlanSpec, TaskSpec, artifact_bytes, check_artifact,
                                          plan_graph, validate_plan)
from mainspring.agents.plans.tables import (NOT_STARTED, PLAN_TERMINAL, TASK_DONE, TASK_TERMINAL, PlanEventRow,
                                            PlanRow, PlanStatus, PlanTaskRow, TaskStatus)
from mainspring.agents.tables import AgentRow
from mainspring.store.base import utcnow as now
from mainspring.store.db import session
from mainspring.store.ids import new_id


class Scope(Enum):
    ANY = "any"  # internal callers (the scheduler): no project check


ANY = Scope.ANY
# tasks with a run; a preempted one's may still end on its own (the pause lands after its last step): recorded then
_IN_FLIGHT = {TaskStatus.DISPATCHED, TaskStatus.RUNNING, TaskStatus.PREEMPTED}
ProjectScope = int | None | Scope  # the API passes its caller's project (None: anonymous, auth off)

_graphs: OrderedDict[str, tuple[PlanSpec, PlanGraph]] = OrderedDict()  # plan id -> its (immutable) spec, parsed
_graphs_lock = threading.Lock()


def _graph(plan: PlanRow) -> tuple[PlanSpec, PlanGraph]:
    with _graphs_lock:
        found = _graphs.get(plan.id)
        if found is not None:
            _graphs.move_to_end(plan.id)
            return found
    spec = PlanSpec.model_validate_json(plan.spec_json)
    found = (spec, plan_graph(spec))
    with _graphs_lock:
        _graphs[plan.id] = found
        while len(_graphs) > 256:
            _graphs.popitem(last=False)
    return found


def load_spec(plan: PlanRow) -> PlanSpec:
    """The plan's spec as accepted (parsed once per process: a plan's spec never changes)."""
    return _graph(plan)[0]


def _json_kind(value: Any) -> str:
    return {dict: "an object", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


@dataclass
class _Tx:
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


def _in_scope(plan: PlanRow, project_id: ProjectScope) -> bool:
    return project_id is ANY or plan.project_id == project_id


def _open_plan(s: Session, plan_id: str, project_id: ProjectScope) -> _Tx:
    plan = s.scalars(select(PlanRow).where(PlanRow.id == plan_id).with_for_update()).first()
    if plan is None or not _in_scope(plan, project_id):
        raise PlanError(f"no plan {plan_id!r}", status=404)  # another project's plan is not found either
    spec, graph = _graph(plan)
    return _Tx(s, plan, spec, graph)


def _plan_of_task(s: Session, task_id: str) -> str:
    plan_id = s.scalar(select(PlanTaskRow.plan_id).where(PlanTaskRow.id == task_id))
    if plan_id is None:
        raise PlanError(f"no task {task_id!r}", status=404)
    return plan_id


def _open_task(s: Session, task_id: str, project_id: ProjectScope) -> tuple[_Tx, PlanTaskRow]:
    plan_id = _plan_of_task(s, task_id)
    try:
        tx = _open_plan(s, plan_id, project_id)
    except PlanError:
        raise PlanError(f"no task {task_id!r}", status=404)
    task = s.get(PlanTaskRow, task_id)
    assert task is not None
    tx.tasks[task.key] = task
    return tx, task


# ---- transitions inside one transaction ---------------------------------------------------------------------
def _end_task(tx: _Tx, task: PlanTaskRow, status: TaskStatus, error: str | None) -> None:
    task.status, task.error, task.finished_at = status, error, now()
    task.updated_at = task.finished_at
    tx.event(f"task.{status}", task.key, error=error, attempt=task.attempt)


def _store_artifact(task: PlanTaskRow, value: Any) -> None:
    data = artifact_bytes(value)
    task.artifact_json, task.artifact_sha256 = data.decode(), hashlib.sha256(data).hexdigest()


def _succeed(tx: _Tx, task: PlanTaskRow, value: Any) -> list[PlanTaskRow]:
    _store_artifact(task, value)
    task.status, task.error, task.finished_at = TaskStatus.SUCCEEDED, None, now()
    task.updated_at = task.finished_at
    tx.event("task.succeeded", task.key, sha256=task.artifact_sha256, bytes=len(task.artifact_json or ""),
             attempt=task.attempt, run_id=task.run_id)
    return [task]


def _set_ready(tx: _Tx, task: PlanTaskRow) -> None:
    task.status, task.ready_at = TaskStatus.READY, now()
    task.updated_at = task.ready_at
    tx.event("task.ready", task.key, attempt=task.attempt)


def _fan_out(tx: _Tx, parent: PlanTaskRow) -> list[PlanTaskRow]:
    mapped = tx.get(tx.spec_of(parent).map_over or "")
    items = json.loads(mapped.artifact_json) if mapped.artifact_json is not None else None
    if not isinstance(items, list):
        why = " (it was skipped)" if mapped.status == TaskStatus.SKIPPED else ""
        return _fail(tx, parent, f"map_over {mapped.key!r}: its artifact is not a JSON array, it is "
                                 f"{_json_kind(items)}{why}", retryable=False)
    if not items:
        return _succeed(tx, parent, [])
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


def _start(tx: _Tx, task: PlanTaskRow) -> list[PlanTaskRow]:
    """Dependencies done (and approved, if asked): ready, or fanned out. Returns the tasks that finished."""
    if tx.is_fan_out(task):
        return _fan_out(tx, task)
    _set_ready(tx, task)
    return []


def _promote(tx: _Tx, task: PlanTaskRow) -> list[PlanTaskRow]:
    if tx.spec_of(task).requires_approval and task.item_index is None:
        task.status, task.updated_at = TaskStatus.AWAITING_APPROVAL, now()
        tx.event("task.awaiting_approval", task.key)
        return []
    return _start(tx, task)


def _done(tx: _Tx, finished: list[PlanTaskRow]) -> None:
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
                queue += _succeed(tx, parent, values)
            continue
        for key in tx.graph.dependents[t.key]:
            d = tx.get(key)
            if d.status == TaskStatus.WAITING and all(
                    u.status in TASK_DONE for u in tx.load(tx.graph.by_key[key].depends_on)):
                queue += _promote(tx, d)


def _cascade(tx: _Tx, task: PlanTaskRow) -> None:
    """`task` will never succeed: cancel everything waiting downstream of it."""
    stack = [task]
    while stack:
        t = stack.pop()
        for key in tx.graph.dependents[t.spec_key]:
            d = tx.get(key)
            if d.status == TaskStatus.WAITING:
                _end_task(tx, d, TaskStatus.CANCELLED, f"upstream task {t.key!r} did not succeed")
                stack.append(d)


def _fail(tx: _Tx, task: PlanTaskRow, error: str, *, retryable: bool = True) -> list[PlanTaskRow]:
    """The task's attempt failed with `error`: apply its on_failure. Returns the tasks that finished as done
    (a skip), for `_done`."""
    spec = tx.spec_of(task)
    if tx.plan.status in PLAN_TERMINAL:  # the plan ended meanwhile: record, change nothing else
        _end_task(tx, task, TaskStatus.FAILED, error)
        return []
    if spec.on_failure == "retry" and retryable and task.attempt < spec.max_attempts:
        previous, task.run_id, task.dispatched_at = task.run_id, None, None
        task.status, task.error, task.attempt, task.ready_at = TaskStatus.READY, error, task.attempt + 1, now()
        task.updated_at = task.ready_at
        tx.event("task.retrying", task.key, attempt=task.attempt, error=error, previous_run_id=previous)
        return []
    if spec.on_failure == "skip":
        _store_artifact(task, None)
        _end_task(tx, task, TaskStatus.SKIPPED, error)
        return [task]
    _end_task(tx, task, TaskStatus.FAILED, error)
    if spec.on_failure == "replan":
        tx.event("task.replan_requested", task.key, error=error, attempt=task.attempt)
    if spec.on_failure == "fail":
        _end_plan(tx, PlanStatus.FAILED, f"task {task.key!r} failed: {error}")
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


def _end_plan(tx: _Tx, status: PlanStatus, error: str | None, **data: Any) -> None:
    """The plan ends: its tasks not started are cancelled; those in flight are listed for the scheduler."""
    plan = tx.plan
    plan.status, plan.error, plan.finished_at = status, error, now()
    in_flight = []
    for t in tx.s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id == plan.id,
                                                    PlanTaskRow.status.in_(NOT_STARTED | _IN_FLIGHT))):
        tx.tasks.setdefault(t.key, t)
        if t.status in NOT_STARTED or tx.is_fan_out(t) or t.status == TaskStatus.PREEMPTED:
            # a preempted task's run is paused: nothing would ever finish it (the scheduler cancels the run)
            _end_task(tx, t, TaskStatus.CANCELLED, f"the plan {status}")
        elif t.run_id is not None:
            in_flight.append({"task": t.key, "run_id": t.run_id})
    tx.event(f"plan.{status}", error=error, in_flight=in_flight, **data)


def _settle(tx: _Tx) -> None:
    """End a running (or paused) plan once every task is terminal."""
    if tx.plan.status not in (PlanStatus.RUNNING, PlanStatus.PAUSED):
        return
    counts = {status: n for status, n in tx.s.execute(
        select(PlanTaskRow.status, func.count()).where(PlanTaskRow.plan_id == tx.plan.id).group_by(PlanTaskRow.status))}
    if any(status not in TASK_TERMINAL for status in counts):
        return
    if all(status in TASK_DONE for status in counts):
        _end_plan(tx, PlanStatus.SUCCEEDED, None)
        return
    failed = list(tx.s.scalars(select(PlanTaskRow.key).where(PlanTaskRow.plan_id == tx.plan.id,
                                                             PlanTaskRow.status == TaskStatus.FAILED)
                               .order_by(PlanTaskRow.key).limit(5)))
    _end_plan(tx, PlanStatus.FAILED, f"tasks failed: {', '.join(failed)}" if failed else "tasks were cancelled")


# ---- creating and reading ------------------------------------------------------------------------------------
def _stored_agents(s: Session, project_id: int | None) -> dict[str, set[str]]:
    """The project's agents (newest version of each name) and their tools."""
    found: dict[str, set[str]] = {}
    for name, body in s.execute(select(AgentRow.name, AgentRow.spec_json).where(
            project_is(AgentRow.project_id, project_id)).order_by(AgentRow.version)):
        found[name] = set(json.loads(body).get("tools") or [])
    return found


def create_plan(db: str, spec: PlanSpec, *, project_id: int | None, api_key_id: str | None = None,
                agents: dict[str, set[str]] | None = None, tools: set[str] | None = None) -> PlanRow:
    """Store a plan after `validate_plan` accepted it, against `agents` (default: the project's stored agents
    and their tools) and `tools` (the known tool names; None: not checked). Tasks without dependencies are ready
    (or awaiting_approval); the plan is running, or awaiting_approval with approve_plan."""
    from mainspring.billing.prices import usd_to_micro

    with session(db) as s:
        validate_plan(spec, agents=_stored_agents(s, project_id) if agents is None else agents, tools=tools)
        graph, t = plan_graph(spec), now()
        status = PlanStatus.AWAITING_APPROVAL if spec.approve_plan else PlanStatus.RUNNING
        row = PlanRow(id=new_id("plan_"), project_id=project_id, api_key_id=api_key_id, name=spec.name,
                      goal=spec.goal, spec_json=spec.model_dump_json(), status=status, priority=spec.priority,
                      token_budget=spec.token_budget,
                      cost_budget_u=usd_to_micro(spec.cost_budget_usd) if spec.cost_budget_usd else None,
                      prompt_tokens=0, completion_tokens=0, cost_u=0, error=None, created_at=t, updated_at=t)
        s.add(row)
        s.flush()  # no ORM relationship orders the inserts: the plan goes first
        tx = _Tx(s, row, spec, graph, seq=0)
        for ts in spec.tasks:
            st = (TaskStatus.WAITING if ts.depends_on else
                  TaskStatus.AWAITING_APPROVAL if ts.requires_approval else TaskStatus.READY)
            tx.tasks[ts.id] = PlanTaskRow(
                id=new_id("ptask_"), plan_id=row.id, project_id=project_id, key=ts.id, spec_key=ts.id,
                status=st, priority=spec.priority * 1000 + ts.priority, attempt=1, created_at=t, updated_at=t,
                ready_at=t if st == TaskStatus.READY else None)
        s.add_all(tx.tasks.values())
        by_status = {st: [k for k, r in tx.tasks.items() if r.status == st] for st in TaskStatus}
        tx.event("plan.created", name=spec.name, status=status, tasks=len(spec.tasks),
                 ready=by_status[TaskStatus.READY], awaiting_approval=by_status[TaskStatus.AWAITING_APPROVAL])
    with _graphs_lock:
        _graphs[row.id] = (spec, graph)
    return row


def _read_plan(s: Session, plan_id: str, project_id: ProjectScope) -> PlanRow:
    row = s.get(PlanRow, plan_id)
    if row is None or not _in_scope(row, project_id):
        raise PlanError(f"no plan {plan_id!r}", status=404)
    return row


def plan(db: str, plan_id: str, *, project_id: ProjectScope = ANY) -> PlanRow:
    with session(db, readonly=True) as s:
        return _read_plan(s, plan_id, project_id)


def plans(db: str, project_id: int | None, limit: int = 50, status: str | None = None) -> list[PlanRow]:
    """The project's plans, newest first."""
    q = select(PlanRow).where(project_is(PlanRow.project_id, project_id))
    if status is not None:
        q = q.where(PlanRow.status == status)
    with session(db, readonly=True) as s:
        return list(s.scalars(q.order_by(PlanRow.created_at.desc(), PlanRow.id.desc()).limit(limit)))


def tasks(db: str, plan_id: str, *, project_id: ProjectScope = ANY) -> list[PlanTaskRow]:
    """The plan's tasks in run order (a fan-out task's items right after it, in item order)."""
    with session(db, readonly=True) as s:
        rank = _graph(_read_plan(s, plan_id, project_id))[1].rank
        rows = s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id == plan_id))
        return sorted(rows, key=lambda r: (rank[r.spec_key], -1 if r.item_index is None else r.item_index))


def events(db: str, plan_id: str, after: int = 0, limit: int = 500, *,
           project_id: ProjectScope = ANY) -> list[PlanEventRow]:
    """The plan's events with seq > `after`, oldest first (resumable SSE: after = the last seq seen)."""
    with session(db, readonly=True) as s:
        _read_plan(s, plan_id, project_id)
        return list(s.scalars(select(PlanEventRow).where(PlanEventRow.plan_id == plan_id, PlanEventRow.seq > after)
                              .order_by(PlanEventRow.seq).limit(limit)))


def _inputs(tx: _Tx, task: PlanTaskRow) -> dict[str, Any]:
    spec = tx.spec_of(task)
    deps = [d for d in spec.depends_on if not (task.item_index is not None and d == spec.map_over)]
    done = [u for u in tx.load(deps) if u.status in TASK_DONE]
    out: dict[str, Any] = {"plan_id": tx.plan.id, "task": task.key, "attempt": task.attempt, "goal": tx.plan.goal,
                           "prompt": spec.prompt,
                           "upstream": {u.key: json.loads(u.artifact_json or "null") for u in done},
                           "upstream_json": {u.key: u.artifact_json or "null" for u in done},
                           "hashes": {u.key: u.artifact_sha256 for u in done}}
    if task.item_index is not None:
        item = json.loads(task.input_json or "{}").get("item")
        item_json = artifact_bytes(item)
        out.update(item=item, item_index=task.item_index, item_json=item_json.decode(),
                   item_sha256=hashlib.sha256(item_json).hexdigest())
    return out


def task_inputs(db: str, task_id: str, *, project_id: ProjectScope = ANY) -> dict[str, Any]:
    """What the task reads: goal, prompt, item (a fan-out item, with item_index, item_json, item_sha256), and each
    done upstream artifact by task key as a value (upstream), as the exact stored canonical JSON (upstream_json)
    and its sha256 (hashes). A fan-out item reads its item instead of the whole mapped list."""
    with session(db, readonly=True) as s:
        row = s.get(PlanTaskRow, task_id)
        plan_row = s.get(PlanRow, row.plan_id) if row is not None else None
        if row is None or plan_row is None or not _in_scope(plan_row, project_id):
            raise PlanError(f"no task {task_id!r}", status=404)
        spec, graph = _graph(plan_row)
        return _inputs(_Tx(s, plan_row, spec, graph, {row.key: row}), row)


def ready_tasks(db: str, limit: int = 100) -> list[PlanTaskRow]:
    """Ready tasks of running plans, across plans: highest priority first, then longest ready (a fan-out's items,
    ready together, in item order)."""
    with session(db, readonly=True) as s:
        return list(s.scalars(select(PlanTaskRow).join(PlanRow, PlanRow.id == PlanTaskRow.plan_id)
                              .where(PlanTaskRow.status == TaskStatus.READY, PlanRow.status == PlanStatus.RUNNING)
                              .order_by(PlanTaskRow.priority.desc(), PlanTaskRow.ready_at,
                                        func.coalesce(PlanTaskRow.item_index, -1), PlanTaskRow.id)
                              .limit(limit)))


# ---- people: approvals, cancel, pause, resume -----------------------------------------------------------------
def _plan_change(db: str, plan_id: str, project_id: ProjectScope, allowed: set[PlanStatus], action: str,
                 change: Any) -> PlanRow:
    with session(db) as s:
        tx = _open_plan(s, plan_id, project_id)
        if tx.plan.status not in allowed:
            raise PlanError(f"cannot {action} plan {plan_id}: it is {tx.plan.status}", status=409)
        change(tx)
        return tx.plan


def _flip(db: str, plan_id: str, project_id: ProjectScope, source: PlanStatus, target: PlanStatus, action: str,
          event: str, **data: Any) -> PlanRow:
    def change(tx: _Tx) -> None:
        tx.plan.status = target
        tx.event(event, **data)
    return _plan_change(db, plan_id, project_id, {source}, action, change)


def approve_plan(db: str, plan_id: str, actor: str, *, project_id: ProjectScope = ANY) -> PlanRow:
    """The plan's tasks may start."""
    return _flip(db, plan_id, project_id, PlanStatus.AWAITING_APPROVAL, PlanStatus.RUNNING, "approve", "plan.approved",
                 actor=actor)


def reject_plan(db: str, plan_id: str, actor: str, *, comment: str | None = None,
                project_id: ProjectScope = ANY) -> PlanRow:
    """The plan is cancelled, nothing having run."""
    def change(tx: _Tx) -> None:
        tx.event("plan.rejected", actor=actor, comment=comment)
        _end_plan(tx, PlanStatus.CANCELLED, f"rejected by {actor}" + (f": {comment}" if comment else ""))
    return _plan_change(db, plan_id, project_id, {PlanStatus.AWAITING_APPROVAL}, "reject", change)


def cancel_plan(db: str, plan_id: str, *, actor: str = "user", project_id: ProjectScope = ANY) -> PlanRow:
    live = {PlanStatus.AWAITING_APPROVAL, PlanStatus.RUNNING, PlanStatus.PAUSED}
    return _plan_change(db, plan_id, project_id, live, "cancel",
                        lambda tx: _end_plan(tx, PlanStatus.CANCELLED, None, actor=actor))


def pause_plan(db: str, plan_id: str, *, actor: str = "user", project_id: ProjectScope = ANY) -> PlanRow:
    """Nothing new is dispatched; tasks in flight finish and are recorded."""
    return _flip(db, plan_id, project_id, PlanStatus.RUNNING, PlanStatus.PAUSED, "pause", "plan.paused", actor=actor)


def resume_plan(db: str, plan_id: str, *, actor: str = "user", project_id: ProjectScope = ANY) -> PlanRow:
    return _flip(db, plan_id, project_id, PlanStatus.PAUSED, PlanStatus.RUNNING, "resume", "plan.resumed",
                 actor=actor)


def _task_change(db: str, task_id: str, project_id: ProjectScope, allowed: set[TaskStatus], action: str,
                 change: Any) -> PlanTaskRow:
    with session(db) as s:
        tx, task = _open_task(s, task_id, project_id)
        fanning = tx.is_fan_out(task) and task.status == TaskStatus.RUNNING
        if task.status not in allowed or fanning:
            what = "a fan-out task, which completes with its items" if fanning else task.status
            raise PlanError(f"cannot {action} task {task.key!r}: it is {what}", status=409)
        _done(tx, change(tx, task))
        _settle(tx)
        return task


def approve_task(db: str, task_id: str, actor: str, *, project_id: ProjectScope = ANY) -> PlanTaskRow:
    def change(tx: _Tx, task: PlanTaskRow) -> list[PlanTaskRow]:
        tx.event("task.approved", task.key, actor=actor)
        return _start(tx, task)
    return _task_change(db, task_id, project_id, {TaskStatus.AWAITING_APPROVAL}, "approve", change)


def reject_task(db: str, task_id: str, actor: str, *, comment: str | None = None,
                project_id: ProjectScope = ANY) -> PlanTaskRow:
    """A failure that is not retried: skipped with on_failure "skip", else failed (and what that entails)."""
    def change(tx: _Tx, task: PlanTaskRow) -> list[PlanTaskRow]:
        tx.event("task.rejected", task.key, actor=actor, comment=comment)
        return _fail(tx, task, f"rejected by {actor}" + (f": {comment}" if comment else ""), retryable=False)
    return _task_change(db, task_id, project_id, {TaskStatus.AWAITING_APPROVAL}, "reject", change)


# ---- the scheduler and workers --------------------------------------------------------------------------------
def _guarded(s: Session, task_id: str, source: TaskStatus, action: str, **values: Any) -> tuple[_Tx, PlanTaskRow]:
    """Lock the task's plan, then move the task from `source` with one guarded UPDATE: (tx, the task) when this
    caller moved it, else PlanError 409 (another caller did first, or it was never in `source`)."""
    tx = _open_plan(s, _plan_of_task(s, task_id), ANY)
    if action in ("dispatch", "resume") and tx.plan.status != PlanStatus.RUNNING:
        raise PlanError(f"cannot {action} a task of plan {tx.plan.id}: it is {tx.plan.status}", status=409)
    result = s.execute(update(PlanTaskRow).where(PlanTaskRow.id == task_id, PlanTaskRow.status == source)
                       .values(**values).execution_options(synchronize_session=False))
    moved = cast(CursorResult, result).rowcount
    task = s.get(PlanTaskRow, task_id)  # read after the UPDATE: not in this session before it
    assert task is not None
    if moved != 1:
        raise PlanError(f"cannot {action} task {task.key!r}: it is {task.status}, not {source}", status=409)
    tx.tasks[task.key] = task
    return tx, task


def mark_dispatched(db: str, task_id: str, run_id: str) -> PlanTaskRow:
    """ready -> dispatched with `run_id`, recording the inputs the run is given (input_json: canonical JSON of
    goal, prompt and item; input_hashes_json: upstream sha256 by key). Of concurrent callers exactly one wins;
    the others get PlanError 409."""
    with session(db) as s:
        t = now()
        tx, task = _guarded(s, task_id, TaskStatus.READY, "dispatch", status=TaskStatus.DISPATCHED.value,
                            run_id=run_id, dispatched_at=t, updated_at=t)
        inputs = _inputs(tx, task)
        task.input_json = artifact_bytes({k: inputs[k] for k in ("goal", "prompt", "item") if k in inputs}).decode()
        task.input_hashes_json = json.dumps(inputs["hashes"], sort_keys=True)
        tx.event("task.dispatched", task.key, run_id=run_id, attempt=task.attempt)
        return task


def mark_running(db: str, task_id: str) -> PlanTaskRow:
    """dispatched -> running (its run started)."""
    with session(db) as s:
        tx, task = _guarded(s, task_id, TaskStatus.DISPATCHED, "start", status=TaskStatus.RUNNING.value,
                            updated_at=now())
        tx.event("task.running", task.key, run_id=task.run_id, attempt=task.attempt)
        return task


def preempt_task(db: str, task_id: str, *, by: str) -> PlanTaskRow:
    """running -> preempted: its run is being paused at its next step boundary for task `by` (a key, or
    "plan/key" of another plan); it keeps its run, which resumes where it stopped (`resume_task`)."""
    with session(db) as s:
        tx, task = _guarded(s, task_id, TaskStatus.RUNNING, "preempt", status=TaskStatus.PREEMPTED.value,
                            updated_at=now())
        tx.event("task.preempted", task.key, run_id=task.run_id, by=by)
        return task


def resume_task(db: str, task_id: str) -> PlanTaskRow:
    """preempted -> running: its paused run is queued again and goes on from its last completed step."""
    with session(db) as s:
        tx, task = _guarded(s, task_id, TaskStatus.PREEMPTED, "resume", status=TaskStatus.RUNNING.value,
                            updated_at=now())
        tx.event("task.resumed", task.key, run_id=task.run_id)
        return task


def complete_task(db: str, task_id: str, value: Any, *, project_id: ProjectScope = ANY) -> PlanTaskRow:
    """The task's run produced `value`. Checked against its output_schema: stored (canonical JSON + sha256) and
    succeeded, its dependents promoted in the same transaction; or, failing the schema, failed per on_failure
    (the returned row's status and error say which)."""
    def change(tx: _Tx, task: PlanTaskRow) -> list[PlanTaskRow]:
        try:
            check_artifact(tx.spec_of(task).output_schema, value)
        except PlanError as e:
            return _fail(tx, task, str(e))
        return _succeed(tx, task, value)
    return _task_change(db, task_id, project_id, _IN_FLIGHT, "complete", change)


def fail_task(db: str, task_id: str, error: str, *, project_id: ProjectScope = ANY) -> PlanTaskRow:
    """The task's run failed with `error`: retried, skipped or failed per its on_failure."""
    return _task_change(db, task_id, project_id, _IN_FLIGHT, "fail", lambda tx, task: _fail(tx, task, error))
