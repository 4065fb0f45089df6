"""Which worker drives which run: leases with heartbeats, and reclaiming runs whose worker died.

An owner id is `host:pid:nonce`. A lease is free when it expired, or at once when its owner was a process on
this host that no longer exists (kill -9, then `mainspring up`: recovery does not wait for the lease to run out).
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select, update

from mainspring.agents.journal import agent_spec, now
from mainspring.agents.status import RunStatus
from mainspring.agents.tables import RunRow
from mainspring.agents.writes import Batch, table_of, write_in
from mainspring.store.db import is_sqlite, session

HOST = socket.gethostname()


def new_owner() -> str:
    return f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_is_dead(owner: str | None) -> bool:
    if not owner:
        return True
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != HOST or not pid.isdigit():
        return False  # another machine's worker: only its lease expiry tells
    if int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _takeable(status: str, lease_owner: str | None, expires: datetime | None, owner: str, t: datetime) -> bool:
    if status == RunStatus.QUEUED:
        return True
    if lease_owner == owner:
        return False
    return expires is None or expires < t or owner_is_dead(lease_owner)


def claim(db: str, owner: str, limit: int, lease_s: float, *, skip_locked: bool = True) -> list[tuple[str, bool]]:
    """Take up to `limit` runnable runs, highest priority first: (run id, recovered after a crash). `skip_locked`
    False waits for rows other workers are claiming instead (plain FOR UPDATE: bench/scaleout.py's baseline)."""
    if limit <= 0:
        return []
    t = now()
    # Polled every 0.2 s: look first, without the write lock and without loading rows, and go on only when
    # there is something to take (a worker busy with its own runs used to lock and load them all each poll).
    with session(db, readonly=True) as s:
        rows = s.execute(
            select(RunRow.id, RunRow.status, RunRow.lease_owner, RunRow.lease_expires_at)
            .where(or_(RunRow.status == RunStatus.QUEUED, and_(RunRow.status == RunStatus.RUNNING, or_(
                RunRow.lease_owner.is_(None), RunRow.lease_owner != owner))))
            .order_by(RunRow.priority.desc(), RunRow.created_at).limit(limit * 4)).all()
        ids = [r.id for r in rows if _takeable(r.status, r.lease_owner, r.lease_expires_at, owner, t)]
    if not ids:
        return []
    with session(db) as s:
        q = select(RunRow).where(RunRow.id.in_(ids)).order_by(RunRow.priority.desc(), RunRow.created_at)
        if not is_sqlite(s.get_bind()):
            # Lock what we take, at most `limit` rows, skipping those another worker is claiming this instant:
            # without the lock two workers read the same queued run and both "take" it (the later write wins
            # silently and both drive the run); locking every candidate would starve the other workers.
            # On SQLite BEGIN IMMEDIATE already serialises claims.
            q = q.limit(limit).with_for_update(skip_locked=skip_locked)
        candidates = s.scalars(q).all()
        taken: list[tuple[str, bool]] = []
        specs: dict[str, float] = {}  # agent id -> max_wall_s
        for run in candidates:
            if len(taken) >= limit:
                break
            if run.status not in (RunStatus.QUEUED, RunStatus.RUNNING) or not _takeable(
                    run.status, run.lease_owner, run.lease_expires_at, owner, t):
                continue  # changed since we looked
            recovered = run.status == RunStatus.RUNNING
            previous = run.lease_owner
            run.status, run.lease_owner = RunStatus.RUNNING, owner
            run.lease_expires_at = t + timedelta(seconds=lease_s)
            run.attempt += 1
            run.pause_reason = None
            run.started_at = run.started_at or t
            run.updated_at = t
            if run.deadline_at is None:
                if run.agent_id not in specs:
                    specs[run.agent_id] = agent_spec(s, run.agent_id).limits.max_wall_s
                run.deadline_at = run.started_at + timedelta(seconds=specs[run.agent_id])
            kind = "run.recovered" if recovered else "run.claimed"
            batch = Batch(run.id)
            batch.event(kind, owner=owner, attempt=run.attempt, previous_owner=previous)
            if recovered:
                batch.audit(kind, {"owner": owner, "previous_owner": previous, "attempt": run.attempt})
            write_in(s, batch)
            taken.append((run.id, recovered))
        return taken


def heartbeat(db: str, owner: str, run_ids: list[str], lease_s: float) -> dict[str, str]:
    """Extend our leases. Returns what each run's loop must do now: "lost" (another worker has it), "cancel"
    or "pause" (someone asked); runs with nothing to do are left out."""
    if not run_ids:
        return {}
    runs = table_of(RunRow)
    held = and_(runs.c.id.in_(run_ids), runs.c.lease_owner == owner, runs.c.status == RunStatus.RUNNING)
    with session(db) as s:  # one UPDATE and one SELECT however many runs: loading and flushing each row cost more
        if not is_sqlite(s.get_bind()):
            # lock the rows in id order first, as group commits fence them (writes.commit_group): an UPDATE
            # locks in whatever order its plan visits them, and deadlocked with a commit over the same runs
            s.execute(select(runs.c.id).where(held).order_by(runs.c.id).with_for_update())
        s.execute(update(runs).where(held).values(lease_expires_at=now() + timedelta(seconds=lease_s)))
        orders = {run_id: "lost" for run_id in run_ids}
        for row in s.execute(select(runs.c.id, runs.c.lease_owner, runs.c.status, runs.c.cancel_requested,
                                    runs.c.pause_requested).where(runs.c.id.in_(run_ids))):
            if row.lease_owner == owner and row.status == RunStatus.RUNNING:
                del orders[row.id]
                if row.cancel_requested:
                    orders[row.id] = "cancel"
                elif row.pause_requested:
                    orders[row.id] = "pause"
        return orders
