"""The plan store's public API: every durable change of a plan (creating, approving, rejecting, cancelling,
pausing and resuming it; approving, dispatching, preempting, completing and failing its tasks) and the reads of
plans, tasks, events and task inputs. Each change is one transaction; the machinery that runs inside it, and the
rules the scheduler and the API build on, are in transitions.py.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session

from mainspring.agents.journal import project_is
from mainspring.agents.plans.spec import PlanError, PlanSpec, artifact_bytes, check_artifact, plan_graph, validate_plan
from mainspring.agents.plans.tables import PlanEventRow, PlanRow, PlanStatus, PlanTaskRow, TaskStatus
from mainspring.agents.plans.transitions import (ANY, IN_FLIGHT, ProjectScope, Tx, done, end_plan, fail, graph, graphs,
                                                 graphs_lock, guarded, in_scope, inputs, open_plan, open_task, settle,
                                                 start, succeed)
from mainspring.agents.plans.transitions import Scope as Scope  # re-exported: part of this module's API
from mainspring.agents.tables import AgentRow
from mainspring.store.base import utcnow as now
from mainspring.store.db import session
from mainspring.store.ids import new_id


def load_spec(plan: PlanRow) -> PlanSpec:
    """The plan's spec as accepted (parsed once per process: a plan's spec never changes)."""
    return graph(plan)[0]


# ---- creating and reading ------------------------------------------------------------------------------------
def _stored_agents(s: Session, project_id: int | None) -> dict[str, set[str]]:
    """The project's agents (newest version of each name) and their tools."""
    found: dict[str, set[str]] = {}
    for name, body in s.execute(select(AgentRow.name, AgentRow.spec_json).where(
            project_is(AgentRow.project_id, project_id)).order_by(AgentRow.version)):
        found[name] = set(json.loads(body).get("tools") or [])
    return found


def create_plan(db: str, spec: PlanSpec, *, project_id: int | None, api_key_id: str | None = None,
                agents: dict[str, set[str]] | None = None, tools: set[str] | None = None,
                plan_id: str | None = None, origin: dict[str, Any] | None = None) -> PlanRow:
    """Store a plan after `validate_plan` accepted it, against `agents` (default: the project's stored agents
    and their tools) and `tools` (the known tool names; None: not checked). Tasks without dependencies are ready
    (or awaiting_approval); the plan is running, or awaiting_approval with approve_plan. `plan_id` is for a caller
    that wrote the id down first (a schedule's fire), so a crash in between cannot make two plans. `origin` (how
    the plan was made, e.g. {"planned_by": {...}}) goes into the data of its first event, plan.created."""
    from mainspring.billing.prices import usd_to_micro

    with session(db) as s:
        validate_plan(spec, agents=_stored_agents(s, project_id) if agents is None else agents, tools=tools)
        graph, t = plan_graph(spec), now()
        status = PlanStatus.AWAITING_APPROVAL if spec.approve_plan else PlanStatus.RUNNING
        row = PlanRow(id=plan_id or new_id("plan_"), project_id=project_id, api_key_id=api_key_id, name=spec.name,
                      goal=spec.goal, spec_json=spec.model_dump_json(), status=status, priority=spec.priority,
                      token_budget=spec.token_budget,
                      cost_budget_u=usd_to_micro(spec.cost_budget_usd) if spec.cost_budget_usd else None,
                      prompt_tokens=0, completion_tokens=0, cost_u=0, error=None, created_at=t, updated_at=t)
        s.add(row)
        s.flush()  # no ORM relationship orders the inserts: the plan goes first
        tx = Tx(s, row, spec, graph, seq=0)
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
                 ready=by_status[TaskStatus.READY], awaiting_approval=by_status[TaskStatus.AWAITING_APPROVAL],
                 **(origin or {}))
    with graphs_lock:
        graphs[row.id] = (spec, graph)
    return row


def _read_plan(s: Session, plan_id: str, project_id: ProjectScope) -> PlanRow:
    row = s.get(PlanRow, plan_id)
    if row is None or not in_scope(row, project_id):
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
        rank = graph(_read_plan(s, plan_id, project_id))[1].rank
        rows = s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id == plan_id))
        return sorted(rows, key=lambda r: (rank[r.spec_key], -1 if r.item_index is None else r.item_index))


def events(db: str, plan_id: str, after: int = 0, limit: int = 500, *,
           project_id: ProjectScope = ANY) -> list[PlanEventRow]:
    """The plan's events with seq > `after`, oldest first (resumable SSE: after = the last seq seen)."""
    with session(db, readonly=True) as s:
        _read_plan(s, plan_id, project_id)
        return list(s.scalars(select(PlanEventRow).where(PlanEventRow.plan_id == plan_id, PlanEventRow.seq > after)
                              .order_by(PlanEventRow.seq).limit(limit)))


def task_inputs(db: str, task_id: str, *, project_id: ProjectScope = ANY) -> dict[str, Any]:
    """What the task reads: goal, prompt, item (a fan-out item, with item_index, item_json, item_sha256), and each
    done upstream artifact by task key as a value (upstream), as the exact stored canonical JSON (upstream_json)
    and its sha256 (hashes). A fan-out item reads its item instead of the whole mapped list."""
    with session(db, readonly=True) as s:
        row = s.get(PlanTaskRow, task_id)
        plan_row = s.get(PlanRow, row.plan_id) if row is not None else None
        if row is None or plan_row is None or not in_scope(plan_row, project_id):
            raise PlanError(f"no task {task_id!r}", status=404)
        spec, plan_g = graph(plan_row)
        return inputs(Tx(s, plan_row, spec, plan_g, {row.key: row}), row)


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
        tx = open_plan(s, plan_id, project_id)
        if tx.plan.status not in allowed:
            raise PlanError(f"cannot {action} plan {plan_id}: it is {tx.plan.status}", status=409)
        change(tx)
        return tx.plan


def _flip(db: str, plan_id: str, project_id: ProjectScope, source: PlanStatus, target: PlanStatus, action: str,
          event: str, **data: Any) -> PlanRow:
    def change(tx: Tx) -> None:
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
    def change(tx: Tx) -> None:
        tx.event("plan.rejected", actor=actor, comment=comment)
        end_plan(tx, PlanStatus.CANCELLED, f"rejected by {actor}" + (f": {comment}" if comment else ""))
    return _plan_change(db, plan_id, project_id, {PlanStatus.AWAITING_APPROVAL}, "reject", change)


def cancel_plan(db: str, plan_id: str, *, actor: str = "user", project_id: ProjectScope = ANY) -> PlanRow:
    live = {PlanStatus.AWAITING_APPROVAL, PlanStatus.RUNNING, PlanStatus.PAUSED}
    return _plan_change(db, plan_id, project_id, live, "cancel",
                        lambda tx: end_plan(tx, PlanStatus.CANCELLED, None, actor=actor))


def pause_plan(db: str, plan_id: str, *, actor: str = "user", project_id: ProjectScope = ANY) -> PlanRow:
    """Nothing new is dispatched; tasks in flight finish and are recorded."""
    return _flip(db, plan_id, project_id, PlanStatus.RUNNING, PlanStatus.PAUSED, "pause", "plan.paused", actor=actor)


def resume_plan(db: str, plan_id: str, *, actor: str = "user", project_id: ProjectScope = ANY) -> PlanRow:
    return _flip(db, plan_id, project_id, PlanStatus.PAUSED, PlanStatus.RUNNING, "resume", "plan.resumed",
                 actor=actor)


def _task_change(db: str, task_id: str, project_id: ProjectScope, allowed: set[TaskStatus], action: str,
                 change: Any) -> PlanTaskRow:
    with session(db) as s:
        tx, task = open_task(s, task_id, project_id)
        fanning = tx.is_fan_out(task) and task.status == TaskStatus.RUNNING
        if task.status not in allowed or fanning:
            what = "a fan-out task, which completes with its items" if fanning else task.status
            raise PlanError(f"cannot {action} task {task.key!r}: it is {what}", status=409)
        done(tx, change(tx, task))
        settle(tx)
        return task


def approve_task(db: str, task_id: str, actor: str, *, project_id: ProjectScope = ANY) -> PlanTaskRow:
    def change(tx: Tx, task: PlanTaskRow) -> list[PlanTaskRow]:
        tx.event("task.approved", task.key, actor=actor)
        return start(tx, task)
    return _task_change(db, task_id, project_id, {TaskStatus.AWAITING_APPROVAL}, "approve", change)


def reject_task(db: str, task_id: str, actor: str, *, comment: str | None = None,
                project_id: ProjectScope = ANY) -> PlanTaskRow:
    """A failure that is not retried: skipped with on_failure "skip", else failed (and what that entails)."""
    def change(tx: Tx, task: PlanTaskRow) -> list[PlanTaskRow]:
        tx.event("task.rejected", task.key, actor=actor, comment=comment)
        return fail(tx, task, f"rejected by {actor}" + (f": {comment}" if comment else ""), retryable=False)
    return _task_change(db, task_id, project_id, {TaskStatus.AWAITING_APPROVAL}, "reject", change)


# ---- the scheduler and workers --------------------------------------------------------------------------------
def mark_dispatched(db: str, task_id: str, run_id: str) -> PlanTaskRow:
    """ready -> dispatched with `run_id`, recording the inputs the run is given (input_json: canonical JSON of
    goal, prompt and item; input_hashes_json: upstream sha256 by key). Of concurrent callers exactly one wins;
    the others get PlanError 409."""
    with session(db) as s:
        t = now()
        tx, task = guarded(s, task_id, TaskStatus.READY, "dispatch", status=TaskStatus.DISPATCHED.value,
                           run_id=run_id, dispatched_at=t, updated_at=t)
        given = inputs(tx, task)
        task.input_json = artifact_bytes({k: given[k] for k in ("goal", "prompt", "item") if k in given}).decode()
        task.input_hashes_json = json.dumps(given["hashes"], sort_keys=True)
        tx.event("task.dispatched", task.key, run_id=run_id, attempt=task.attempt)
        return task


def hand_off(db: str, task_id: str, previous_run_id: str, run_id: str, hand: dict[str, Any]) -> PlanTaskRow:
    """The task's run `previous_run_id` handed it to agent hand["to"]: it stays in flight with that agent and the
    fresh `run_id` (written down before the run is created, as at dispatch). Guarded on the previous run id, so
    of concurrent callers exactly one wins; the others get PlanError 409."""
    with session(db) as s:
        tx, task = open_task(s, task_id, ANY)
        moved = s.execute(update(PlanTaskRow).where(PlanTaskRow.id == task_id, PlanTaskRow.run_id == previous_run_id,
                                                    PlanTaskRow.status.in_(list(IN_FLIGHT)))
                          .values(run_id=run_id, status=TaskStatus.DISPATCHED.value, agent_override=hand["to"],
                                  handoffs=PlanTaskRow.handoffs + 1, updated_at=now())
                          .execution_options(synchronize_session=False))
        if cast(CursorResult, moved).rowcount != 1:
            raise PlanError(f"cannot hand off task {task.key!r}: its run is no longer {previous_run_id}", status=409)
        s.refresh(task)
        tx.event("task.handed_off", task.key, run_id=run_id, previous_run_id=previous_run_id,
                 attempt=task.attempt, **{k: hand.get(k) for k in ("from", "to", "note")})
        return task


def mark_running(db: str, task_id: str) -> PlanTaskRow:
    """dispatched -> running (its run started)."""
    with session(db) as s:
        tx, task = guarded(s, task_id, TaskStatus.DISPATCHED, "start", status=TaskStatus.RUNNING.value,
                           updated_at=now())
        tx.event("task.running", task.key, run_id=task.run_id, attempt=task.attempt)
        return task


def preempt_task(db: str, task_id: str, *, by: str) -> PlanTaskRow:
    """running -> preempted: its run is being paused at its next step boundary for task `by` (a key, or
    "plan/key" of another plan); it keeps its run, which resumes where it stopped (`resume_task`)."""
    with session(db) as s:
        tx, task = guarded(s, task_id, TaskStatus.RUNNING, "preempt", status=TaskStatus.PREEMPTED.value,
                           updated_at=now())
        tx.event("task.preempted", task.key, run_id=task.run_id, by=by)
        return task


def resume_task(db: str, task_id: str) -> PlanTaskRow:
    """preempted -> running: its paused run is queued again and goes on from its last completed step."""
    with session(db) as s:
        tx, task = guarded(s, task_id, TaskStatus.PREEMPTED, "resume", status=TaskStatus.RUNNING.value,
                           updated_at=now())
        tx.event("task.resumed", task.key, run_id=task.run_id)
        return task


def complete_task(db: str, task_id: str, value: Any, *, project_id: ProjectScope = ANY) -> PlanTaskRow:
    """The task's run produced `value`. Checked against its output_schema: stored (canonical JSON + sha256) and
    succeeded, its dependents promoted in the same transaction; or, failing the schema, failed per on_failure
    (the returned row's status and error say which)."""
    def change(tx: Tx, task: PlanTaskRow) -> list[PlanTaskRow]:
        try:
            check_artifact(tx.spec_of(task).output_schema, value)
        except PlanError as e:
            return fail(tx, task, str(e))
        return succeed(tx, task, value)
    return _task_change(db, task_id, project_id, IN_FLIGHT, "complete", change)


def fail_task(db: str, task_id: str, error: str, *, project_id: ProjectScope = ANY,
              retryable: bool = True) -> PlanTaskRow:
    """The task's run failed with `error`: retried, skipped or failed per its on_failure (never retried when not
    `retryable`: a deadlock's victim or a livelock would only do it again)."""
    return _task_change(db, task_id, project_id, IN_FLIGHT, "fail",
                        lambda tx, task: fail(tx, task, error, retryable=retryable))


def time_out_wait(db: str, task_id: str, error: str, *, seen: datetime, **data: Any) -> PlanTaskRow:
    """A task waiting for capacity (ready, or preempted with its run paused) past its queue_timeout_s: the plan
    journals `task.queue_timed_out` (with `data`: waited_s, reason, ...) and the task fails without a retry, since
    a retry would wait in the same queue again. Guarded on `seen`, its updated_at when the caller read it: a task
    that moved since (dispatched, resumed, retried) starts a new wait and is not failed (PlanError 409); nor is a
    task of a plan paused since (it waits for a person now)."""
    def change(tx: Tx, task: PlanTaskRow) -> list[PlanTaskRow]:
        if task.updated_at != seen or tx.plan.status != PlanStatus.RUNNING:
            raise PlanError(f"cannot time out task {task.key!r}: it or its plan changed meanwhile", status=409)
        tx.event("task.queue_timed_out", task.key, error=error, attempt=task.attempt, **data)
        return fail(tx, task, error, retryable=False)
    return _task_change(db, task_id, ANY, {TaskStatus.READY, TaskStatus.PREEMPTED}, "time out", change)
