"""The bound on a task's wait for capacity: a task's `queue_timeout_s` (or its plan's, for a task without its own).

A task waits for capacity while it is ready (its wait began at `ready_at`: when its dependencies were done, it was
approved, retried or replanned), and while it is preempted with its run paused, waiting to resume (its wait began
when it was preempted: the row's `updated_at`, which nothing else moves while it is preempted). In both it waits
for the same things: a free slot of the scheduler's `max_running`, and admission (admission.py). Only a running
plan's tasks wait for capacity: a paused plan's, or one awaiting approval, wait for a person, so the clock starts
again when the plan last became running (its last plan.resumed or plan.approved event), if that came later.

Each tick the leader (scheduler.py) looks for tasks waiting longer than their bound, and fails each with what it
waited for: "waited 31 s for capacity, past its queue_timeout_s of 30 s (last held back by: sandbox slots full)",
the reason being the task's last `task.admission_blocked` event, if one was said since it was last dispatched
(none: it waited for a slot, or behind higher-priority tasks). The plan journals `task.queue_timed_out` (waited_s,
reason) with the failure, which is never retried: a retry would wait in the same queue again. So on_failure
"skip" skips it, "fail", "retry" and "replan" fail it, and its dependents are cancelled as for any failure. A
preempted task's paused run is cancelled first (a leader that dies between the two leaves a preempted task with a
cancelled run, which the next tick fails, retried per on_failure, as any run that ended so).

Cost per tick: one query for the running plans with waiting tasks; only when one of them has a bound, one query
for their tasks already waiting longer than the smallest such bound, and per plan with a task past its bound one
read of when it last became running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, func, or_, select

from mainspring.agents import journal
from mainspring.agents.plans import store
from mainspring.agents.plans.admission import last_reason
from mainspring.agents.plans.spec import PlanError, PlanSpec, TaskSpec
from mainspring.agents.plans.tables import PlanEventRow, PlanRow, PlanStatus, PlanTaskRow, TaskStatus
from mainspring.agents.status import RunStatus
from mainspring.agents.tables import RunRow
from mainspring.store.db import session

log = logging.getLogger("mainspring.plans")

EVENT = "task.queue_timed_out"
RUNNING_AGAIN = ("plan.resumed", "plan.approved")  # a plan's wait for a person ended: its tasks' waits start again
Cancel = Callable[[str], None]  # (run id): cancel that run now (the scheduler's cancel_run)


def queue_timeout(plan: PlanSpec, task: TaskSpec) -> float | None:
    """The task's bound on its wait for capacity: its own, else its plan's; None: no bound."""
    return task.queue_timeout_s if task.queue_timeout_s is not None else plan.queue_timeout_s


def _waiting_since(before: datetime) -> ColumnElement[bool]:
    """Ready tasks, and preempted ones whose run has paused, whose wait began at `before` or earlier."""
    paused = select(RunRow.id).where(RunRow.status == RunStatus.PAUSED)
    return or_(and_(PlanTaskRow.status == TaskStatus.READY,
                    func.coalesce(PlanTaskRow.ready_at, PlanTaskRow.updated_at) <= before),
               and_(PlanTaskRow.status == TaskStatus.PREEMPTED, PlanTaskRow.updated_at <= before,
                    PlanTaskRow.run_id.in_(paused)))


def check(db: str, cancel: Cancel) -> int:
    """Fail every task that has waited for capacity past its bound; how many were failed."""
    t = journal.now()
    with session(db, readonly=True) as s:
        plans = list(s.scalars(select(PlanRow).where(
            PlanRow.status == PlanStatus.RUNNING, PlanRow.id.in_(
                select(PlanTaskRow.plan_id).where(PlanTaskRow.status.in_([TaskStatus.READY, TaskStatus.PREEMPTED]))))))
        bounds: dict[str, dict[str, float]] = {}  # plan id -> spec key -> its bound (tasks with one only)
        for plan in plans:
            spec = store.load_spec(plan)
            found = {k.id: b for k in spec.tasks if (b := queue_timeout(spec, k)) is not None}
            if found:
                bounds[plan.id] = found
        if not bounds:
            return 0
        before = t - timedelta(seconds=min(min(b.values()) for b in bounds.values()))
        late = list(s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id.in_(list(bounds)),
                                                        _waiting_since(before))))
        resumed: dict[str, datetime | None] = {}
        out: list[tuple[PlanTaskRow, float, float, str | None]] = []
        for task in late:
            bound = bounds[task.plan_id].get(task.spec_key)
            since = (task.ready_at if task.status == TaskStatus.READY else None) or task.updated_at
            if bound is None or (t - since).total_seconds() <= bound:
                continue
            if task.plan_id not in resumed:
                resumed[task.plan_id] = s.scalar(select(func.max(PlanEventRow.created_at)).where(
                    PlanEventRow.plan_id == task.plan_id, PlanEventRow.type.in_(RUNNING_AGAIN)))
            again = resumed[task.plan_id]
            waited = (t - max(since, again) if again is not None else t - since).total_seconds()
            if waited > bound:
                out.append((task, bound, waited, last_reason(s, task)))
    return sum(_time_out(db, task, bound, waited, reason, cancel) for task, bound, waited, reason in out)


def _time_out(db: str, task: PlanTaskRow, bound: float, waited: float, reason: str | None, cancel: Cancel) -> bool:
    waited = round(waited, 1)
    error = f"waited {waited:g} s for capacity, past its queue_timeout_s of {bound:g} s" + (
        f" (last held back by: {reason})" if reason else "")
    if task.status == TaskStatus.PREEMPTED and task.run_id is not None:
        cancel(task.run_id)  # first: a failed task's paused run would never end
    try:
        store.time_out_wait(db, task.id, error, seen=task.updated_at, waited_s=waited, reason=reason,
                            queue_timeout_s=bound, waited_as=task.status)
    except PlanError as exc:  # dispatched, or its plan ended, meanwhile
        log.info("plan task %s: not timed out: %s", task.key, exc)
        return False
    return True
