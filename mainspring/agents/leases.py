"""Which worker drives which run: leases with heartbeats, and reclaiming runs whose worker died.

An owner id is `host:pid:nonce`. A lease is free when it expired, or at once when its owner was a process on
this host that no longer exists (kill -9, then `mainspring up`: recovery does not wait for the lease to run out).
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import timedelta

from sqlalchemy import or_, select

from mainspring.agents.journal import audit, event, now
from mainspring.agents.tables import RunRow
from mainspring.store.db import session

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


def claim(db: str, owner: str, limit: int, lease_s: float) -> list[tuple[str, bool]]:
    """Take up to `limit` runnable runs, highest priority first: (run id, recovered after a crash)."""
    if limit <= 0:
        return []
    t = now()
    with session(db, readonly=True) as s:  # polled every 0.2 s: an idle worker must not take the write lock
        if s.scalars(select(RunRow.id).where(or_(RunRow.status == "queued", RunRow.status == "running"))
                     .limit(1)).first() is None:
            return []
    with session(db) as s:
        candidates = s.scalars(
            select(RunRow).where(or_(RunRow.status == "queued", RunRow.status == "running"))
            .order_by(RunRow.priority.desc(), RunRow.created_at).limit(limit * 4)).all()
        taken = []
        for run in candidates:
            if len(taken) >= limit:
                break
            recovered = run.status == "running"
            if recovered and run.lease_owner == owner:
                continue
            if recovered and not (run.lease_expires_at is None or run.lease_expires_at < t
                                  or owner_is_dead(run.lease_owner)):
                continue
            previous = run.lease_owner
            run.status, run.lease_owner, run.lease_expires_at = "running", owner, t + timedelta(seconds=lease_s)
            run.attempt += 1
            run.pause_reason = None
            run.started_at = run.started_at or t
            run.updated_at = t
            if run.deadline_at is None:
                from mainspring.agents.journal import agent_spec

                run.deadline_at = run.started_at + timedelta(seconds=agent_spec(s, run.agent_id).limits.max_wall_s)
            kind = "run.recovered" if recovered else "run.claimed"
            event(s, run.id, kind, owner=owner, attempt=run.attempt, previous_owner=previous)
            if recovered:
                audit.append(s, run.id, kind, {"owner": owner, "previous_owner": previous, "attempt": run.attempt})
            taken.append((run.id, recovered))
        return taken


def heartbeat(db: str, owner: str, run_ids: list[str], lease_s: float) -> dict[str, str]:
    """Extend our leases. Returns what each run's loop must do now: "lost" (another worker has it), "cancel"
    or "pause" (someone asked); runs with nothing to do are left out."""
    if not run_ids:
        return {}
    with session(db) as s:
        orders = {run_id: "lost" for run_id in run_ids}
        for run in s.scalars(select(RunRow).where(RunRow.id.in_(run_ids))):
            if run.lease_owner == owner and run.status == "running":
                run.lease_expires_at = now() + timedelta(seconds=lease_s)
                del orders[run.id]
                if run.cancel_requested:
                    orders[run.id] = "cancel"
                elif run.pause_requested:
                    orders[run.id] = "pause"
        return orders
