"""Tasks of one plan talking to each other: messages, and the waits that form the plan's wait-for graph.

A task's agent sends another task a message (`send`) and waits for one from a given task (`take`, then
`open_wait` when none is there yet). Every wait is a row until it ends, so the scheduler sees who waits for
whom (deadlocks.py) and a crash loses no edge. Everything is keyed by the tool call that did it: a call re-run
after a crash sends nothing twice, receives the same message again, and finds its own wait.

How a wait ends (`outcome`): received (the message came), timed_out (past the plan's message_timeout_s or the
call's own), target_ended (the task waited on finished without sending one), deadlock (its wait was part of a
cycle and its task is the victim), released (a human broke a deadlock by letting this task go on), abandoned
(the waiting task ended first).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from mainspring.agents.plans.spec import PlanError
from mainspring.agents.plans.tables import (TASK_TERMINAL, PlanMessageRow, PlanRow, PlanTaskRow, PlanWaitRow,
                                            TaskStatus)
from mainspring.agents.plans.transitions import ANY, open_plan
from mainspring.store.base import utcnow as now
from mainspring.store.db import session

MAX_MESSAGE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Seat:
    """Where a run sits in a plan: its plan, task key and the plan's message timeout."""
    plan_id: str
    task: str
    message_timeout_s: float


def seat_of(db: str, run_id: str) -> Seat | None:
    """The plan task whose current run is `run_id`, or None (a run outside any plan)."""
    from mainspring.agents.plans.store import load_spec

    with session(db, readonly=True) as s:
        row = s.execute(select(PlanTaskRow.key, PlanRow).join(PlanRow, PlanRow.id == PlanTaskRow.plan_id)
                        .where(PlanTaskRow.run_id == run_id)).first()
    if row is None:
        return None
    key, plan = row
    return Seat(plan.id, key, load_spec(plan).message_timeout_s)


def _task(s: Session, plan_id: str, key: str) -> PlanTaskRow:
    task = s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id == plan_id, PlanTaskRow.key == key)).first()
    if task is None:
        keys = ", ".join(s.scalars(select(PlanTaskRow.key).where(PlanTaskRow.plan_id == plan_id)
                                   .order_by(PlanTaskRow.created_at)))
        raise PlanError(f"the plan has no task {key!r}; its tasks: {keys}", param="task", status=404)
    return task


def send(db: str, seat: Seat, call_id: str, to: str, body: str) -> PlanMessageRow:
    """Deliver `body` from the seat's task to task `to` of the same plan (once per call)."""
    if to == seat.task:
        raise PlanError("a task cannot send a message to itself", param="to")
    if len(body.encode()) > MAX_MESSAGE_BYTES:
        raise PlanError(f"a message is at most {MAX_MESSAGE_BYTES} bytes", param="text")
    with session(db) as s:
        sent = s.scalars(select(PlanMessageRow).where(PlanMessageRow.sent_by_call == call_id)).first()
        if sent is not None:
            return sent
        tx = open_plan(s, seat.plan_id, ANY)  # the plan locked: the event numbers stay in order
        _task(s, seat.plan_id, to)
        row = PlanMessageRow(plan_id=seat.plan_id, from_task=seat.task, to_task=to, body=body, sent_by_call=call_id,
                             created_at=now())
        s.add(row)
        tx.event("message.sent", seat.task, to=to, bytes=len(body.encode()))
        return row


def take(db: str, seat: Seat, call_id: str, sender: str) -> PlanMessageRow | None:
    """The oldest message from `sender` to the seat's task that no call has received yet, now received by
    `call_id` (or the one this call received before a crash); None when there is none."""
    with session(db) as s:
        mine = s.scalars(select(PlanMessageRow).where(PlanMessageRow.taken_by_call == call_id)).first()
        if mine is not None:
            return mine
        for row in s.scalars(select(PlanMessageRow).where(
                PlanMessageRow.plan_id == seat.plan_id, PlanMessageRow.to_task == seat.task,
                PlanMessageRow.from_task == sender, PlanMessageRow.taken_by_call.is_(None))
                .order_by(PlanMessageRow.id).limit(1)):
            won = s.execute(update(PlanMessageRow).where(PlanMessageRow.id == row.id,
                                                         PlanMessageRow.taken_by_call.is_(None))
                            .values(taken_by_call=call_id).execution_options(synchronize_session=False))
            if won.rowcount == 1:  # type: ignore[attr-defined]
                s.refresh(row)
                return row
        return None


def target_status(db: str, seat: Seat, key: str) -> TaskStatus:
    with session(db, readonly=True) as s:
        return TaskStatus(_task(s, seat.plan_id, key).status)


def open_wait(db: str, seat: Seat, call_id: str, run_id: str, target: str, timeout_s: float) -> PlanWaitRow:
    """The call's wait for a message from `target` (created once; a re-run call gets its own back)."""
    if target == seat.task:
        raise PlanError("a task cannot wait for a message from itself", param="from")
    with session(db) as s:
        found = s.scalars(select(PlanWaitRow).where(PlanWaitRow.call_id == call_id)).first()
        if found is not None:
            return found
        tx = open_plan(s, seat.plan_id, ANY)
        _task(s, seat.plan_id, target)
        t = now()
        row = PlanWaitRow(plan_id=seat.plan_id, call_id=call_id, waiter=seat.task, target=target, run_id=run_id,
                          since=t, deadline_at=t + timedelta(seconds=timeout_s))
        s.add(row)
        tx.event("task.waiting", seat.task, on=target, deadline_at=row.deadline_at.isoformat())
        return row


def wait(db: str, wait_id: int) -> PlanWaitRow:
    with session(db, readonly=True) as s:
        row = s.get(PlanWaitRow, wait_id)
        assert row is not None
        return row


def end_wait(db: str, wait_id: int, outcome: str, detail: str | None = None) -> bool:
    """End an open wait (False: it had ended already, and keeps its first outcome)."""
    with session(db) as s:
        row = s.get(PlanWaitRow, wait_id)
        if row is None or row.ended_at is not None:
            return False
        tx = open_plan(s, row.plan_id, ANY)
        done = s.execute(update(PlanWaitRow).where(PlanWaitRow.id == wait_id, PlanWaitRow.ended_at.is_(None))
                         .values(ended_at=now(), outcome=outcome, detail=detail)
                         .execution_options(synchronize_session=False))
        if done.rowcount != 1:  # type: ignore[attr-defined]
            return False
        tx.event("task.wait_ended", row.waiter, on=row.target, outcome=outcome, detail=detail)
        return True


def open_waits(db: str) -> list[tuple[PlanWaitRow, PlanTaskRow, PlanTaskRow | None]]:
    """Every open wait with its waiting task and the task it waits on (None: no such task any more)."""
    with session(db, readonly=True) as s:
        waits = list(s.scalars(select(PlanWaitRow).where(PlanWaitRow.ended_at.is_(None)).order_by(PlanWaitRow.id)))
        if not waits:
            return []
        plans = {w.plan_id for w in waits}
        tasks = {(t.plan_id, t.key): t for t in s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id.in_(plans)))}
    return [(w, tasks[(w.plan_id, w.waiter)], tasks.get((w.plan_id, w.target))) for w in waits
            if (w.plan_id, w.waiter) in tasks]


def stale(wait_row: PlanWaitRow, waiter: PlanTaskRow, target: PlanTaskRow | None,
          at: datetime) -> tuple[str, str] | None:
    """Why an open wait must end now, whoever notices (the waiting call, or the scheduler when that call is
    gone): (outcome, detail), or None while it may go on."""
    if waiter.status in TASK_TERMINAL or waiter.run_id != wait_row.run_id:
        return "abandoned", f"task {waiter.key!r} is {waiter.status} (attempt {waiter.attempt})"
    if target is None or target.status in TASK_TERMINAL:
        what = target.status if target is not None else "gone"
        return "target_ended", f"task {wait_row.target!r} is {what} and sent no message"
    if at > wait_row.deadline_at:
        secs = (wait_row.deadline_at - wait_row.since).total_seconds()
        return "timed_out", f"no message from task {wait_row.target!r} within {secs:g} s"
    return None
