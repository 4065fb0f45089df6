"""Deadlock and livelock detection over the plans' wait-for graph, and their resolution by the plan's policy.

The graph: one edge waiter → target for every open wait (waits.py: a task's agent waiting for another task's
message). Each tick the leader (scheduler.py) first ends the waits that cannot succeed any more (their target
ended, their waiter's run is gone, their deadline passed: `waits.stale`), then looks for cycles. A cycle is
reported once (a deadlocks row, a `deadlock.detected` plan event, the cycle spelled "a → b → c → a") and
resolved by the plan's deadlock_policy:
- fail_youngest: the member dispatched last is failed (not retried: it would wait again) and its run cancelled;
  the others' waits on it then end as target_ended, and their agents go on with that error.
- ask_human: left open for a person (`resolve`: fail one member, or release one, whose wait then ends with an
  error and whose agent goes on); past the plan's approval_ttl_s, fail_youngest.

A livelock is a task handed between agents more than the plan's max_handoffs times (scheduler.py counts them):
`livelock` records it with the chain of agents, and the task fails.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy import select

from mainspring.agents.plans import store, waits
from mainspring.agents.plans.spec import PlanError
from mainspring.agents.plans.tables import DeadlockRow, PlanRow, PlanTaskRow, PlanWaitRow
from mainspring.agents.plans.transitions import ANY, ProjectScope, in_scope, open_plan
from mainspring.store.base import utcnow as now
from mainspring.store.db import session
from mainspring.store.ids import new_id

log = logging.getLogger("mainspring.plans")

OPEN, RESOLVED = "open", "resolved"
Cancel = Callable[[str], None]  # (run id): cancel that run now, and interrupt its step in flight


def spell(cycle: Sequence[str]) -> str:
    return " → ".join(cycle)


def cycles(edges: dict[str, str]) -> list[list[str]]:
    """The cycles of a graph in which each node waits on at most one other (a task's run waits on one call at a
    time), each as its nodes from its smallest key round to it again: {"a": "b", "b": "a"} -> [["a", "b", "a"]]."""
    found, seen = [], set()
    for start in sorted(edges):
        path, at = [], start
        while at in edges and at not in seen and at not in path:
            path.append(at)
            at = edges[at]
        if at in path:  # a new cycle closes here
            ring = path[path.index(at):]
            first = ring.index(min(ring))
            ring = ring[first:] + ring[:first]
            found.append(ring + [ring[0]])
        seen.update(path)
    return found


def check(db: str, cancel: Cancel, at: datetime | None = None) -> int:
    """One pass of the leader: end the stale waits, then report and resolve each new cycle. Returns how many
    deadlocks it detected."""
    at = at or now()
    live: list[tuple[PlanWaitRow, PlanTaskRow]] = []
    for wait, waiter, target in waits.open_waits(db):
        why = waits.stale(wait, waiter, target, at)
        if why is not None:
            waits.end_wait(db, wait.id, *why)
        else:
            live.append((wait, waiter))
    by_plan: dict[str, list[tuple[PlanWaitRow, PlanTaskRow]]] = {}
    for wait, waiter in live:
        by_plan.setdefault(wait.plan_id, []).append((wait, waiter))
    detected = 0
    for plan_id, rows in by_plan.items():
        edges = {w.waiter: w.target for w, _ in rows}
        of = {w.waiter: (w, t) for w, t in rows}
        for ring in cycles(edges):
            members = [of[key] for key in ring[:-1]]
            if _record(db, plan_id, ring, members, cancel, at):
                detected += 1
    _expire(db, cancel, at)
    return detected


def _record(db: str, plan_id: str, ring: list[str], members: list[tuple[PlanWaitRow, PlanTaskRow]],
            cancel: Cancel, at: datetime) -> bool:
    wait_ids = sorted(w.id for w, _ in members)
    with session(db) as s:
        tx = open_plan(s, plan_id, ANY)  # the plan locked: two leaders (a deposed one late) record it once
        for known in s.scalars(select(DeadlockRow.wait_ids_json).where(DeadlockRow.plan_id == plan_id,
                                                                       DeadlockRow.kind == "deadlock")):
            if json.loads(known) == wait_ids:
                return False
        policy = tx.spec.deadlock_policy
        row = DeadlockRow(id=new_id("dl_"), plan_id=plan_id, project_id=tx.plan.project_id, kind="deadlock",
                          cycle_json=json.dumps(ring), wait_ids_json=json.dumps(wait_ids), policy=policy,
                          status=OPEN, detected_at=at)
        s.add(row)
        tx.event("deadlock.detected", None, deadlock_id=row.id, cycle=ring, text=spell(ring), policy=policy)
        deadlock_id = row.id
    log.warning("plan %s: deadlock %s (%s)", plan_id, spell(ring), policy)
    if policy == "fail_youngest":
        victim = max(members, key=lambda m: (m[1].dispatched_at or m[1].created_at, m[1].key))[1]
        _fail_member(db, deadlock_id, victim.key, "scheduler", cancel)
    return True


def _fail_member(db: str, deadlock_id: str, key: str, actor: str, cancel: Cancel) -> DeadlockRow:
    """Fail task `key` of the deadlock (not retried) and cancel its run; the deadlock is resolved."""
    with session(db, readonly=True) as s:
        row = s.get(DeadlockRow, deadlock_id)
        assert row is not None
        ring = json.loads(row.cycle_json)
        task = s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id == row.plan_id,
                                                   PlanTaskRow.key == key)).first()
        wait_ids = json.loads(row.wait_ids_json)
        mine = s.scalars(select(PlanWaitRow.id).where(PlanWaitRow.id.in_(wait_ids), PlanWaitRow.waiter == key)).first()
    assert task is not None
    reason = f"deadlock {spell(ring)}: failed as its {'youngest member' if actor == 'scheduler' else 'victim'}"
    if mine is not None:
        waits.end_wait(db, mine, "deadlock", reason)
    try:
        store.fail_task(db, task.id, reason, retryable=False)
    except PlanError as exc:  # it ended meanwhile: the cycle is broken anyway
        log.info("deadlock %s: %s", deadlock_id, exc)
    if task.run_id is not None:
        cancel(task.run_id)
    return _resolve_row(db, deadlock_id, key, f"failed task {key!r} ({actor})")


def _resolve_row(db: str, deadlock_id: str, victim: str, resolution: str) -> DeadlockRow:
    with session(db) as s:
        row = s.get(DeadlockRow, deadlock_id)
        assert row is not None
        tx = open_plan(s, row.plan_id, ANY)
        row.status, row.victim, row.resolution, row.resolved_at = RESOLVED, victim, resolution, now()
        tx.event("deadlock.resolved", victim, deadlock_id=row.id, resolution=resolution)
        s.flush()
        s.expunge(row)
        return row


def _expire(db: str, cancel: Cancel, at: datetime) -> None:
    """An ask_human deadlock left undecided past its plan's approval_ttl_s is resolved as fail_youngest."""
    with session(db, readonly=True) as s:
        pending = list(s.execute(select(DeadlockRow, PlanRow).join(PlanRow, PlanRow.id == DeadlockRow.plan_id)
                                 .where(DeadlockRow.status == OPEN, DeadlockRow.kind == "deadlock")).all())
    for row, plan in pending:
        ttl = store.load_spec(plan).approval_ttl_s
        if ttl is None or (at - row.detected_at).total_seconds() <= ttl:
            continue
        with session(db, readonly=True) as s:
            members = list(s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id == row.plan_id,
                                                               PlanTaskRow.key.in_(json.loads(row.cycle_json)))))
        victim = max(members, key=lambda t: (t.dispatched_at or t.created_at, t.key))
        _fail_member(db, row.id, victim.key, "expiry", cancel)


# ---- what the API and the CLI see and do -----------------------------------------------------------------
def listing(db: str, project_id: ProjectScope, *, plan_id: str | None = None, status: str | None = None,
            limit: int = 100) -> list[DeadlockRow]:
    with session(db, readonly=True) as s:
        q = select(DeadlockRow, PlanRow).join(PlanRow, PlanRow.id == DeadlockRow.plan_id)
        if plan_id is not None:
            q = q.where(DeadlockRow.plan_id == plan_id)
        if status is not None:
            q = q.where(DeadlockRow.status == status)
        rows = s.execute(q.order_by(DeadlockRow.detected_at.desc()).limit(limit)).all()
        return [row for row, plan in rows if in_scope(plan, project_id)]


def get(db: str, deadlock_id: str, project_id: ProjectScope) -> DeadlockRow:
    with session(db, readonly=True) as s:
        found = s.execute(select(DeadlockRow, PlanRow).join(PlanRow, PlanRow.id == DeadlockRow.plan_id)
                          .where(DeadlockRow.id == deadlock_id)).first()
    if found is None or not in_scope(found[1], project_id):
        raise PlanError(f"no deadlock {deadlock_id!r}", status=404)
    return found[0]


def resolve(db: str, deadlock_id: str, action: str, task: str, actor: str, project_id: ProjectScope,
            cancel: Cancel) -> DeadlockRow:
    """A person's decision on an open deadlock: "fail" task `task` (a member), or "release" it (its wait ends
    with an error its agent sees, and it goes on)."""
    row = get(db, deadlock_id, project_id)
    if row.status != OPEN:
        raise PlanError(f"deadlock {deadlock_id} is {row.status} already ({row.resolution})", status=409)
    ring = json.loads(row.cycle_json)
    if task not in ring:
        raise PlanError(f"task {task!r} is not in the cycle {spell(ring)}", param="task")
    if action == "fail":
        return _fail_member(db, deadlock_id, task, actor, cancel)
    if action != "release":
        raise PlanError(f"unknown action {action!r}; one of fail, release", param="action")
    with session(db, readonly=True) as s:
        wait_id = s.scalars(select(PlanWaitRow.id).where(PlanWaitRow.id.in_(json.loads(row.wait_ids_json)),
                                                         PlanWaitRow.waiter == task)).first()
    if wait_id is not None:
        waits.end_wait(db, wait_id, "released", f"released by {actor} from the deadlock {spell(ring)}")
    return _resolve_row(db, deadlock_id, task, f"released task {task!r} ({actor})")


def livelock(db: str, plan_id: str, task_key: str, agents: list[str], limit: int) -> DeadlockRow:
    """Record a task handed back and forth past `limit` handoffs (the chain of agents it went through)."""
    with session(db) as s:
        tx = open_plan(s, plan_id, ANY)
        text = f"task {task_key!r} handed over {len(agents) - 1} times, past max_handoffs={limit}: {spell(agents)}"
        row = DeadlockRow(id=new_id("dl_"), plan_id=plan_id, project_id=tx.plan.project_id, kind="livelock",
                          cycle_json=json.dumps(agents), wait_ids_json="[]", policy="fail", status=RESOLVED,
                          victim=task_key, resolution=f"failed task {task_key!r}", detected_at=now(),
                          resolved_at=now())
        s.add(row)
        tx.event("livelock.detected", task_key, deadlock_id=row.id, agents=agents, text=text)
        s.flush()
        s.expunge(row)
        return row
