"""One plan scheduler per deployment: a leader lease in the database.

Every server process runs a scheduler loop, and each tick first holds the lease named "plan-scheduler"
(`hold`). The holder renews it each tick; the others stand by. A lease is free when it expired, or at
once when its holder was a process on this host that no longer exists (kill -9: the standby does not
wait out the lease). `term` counts changes of holder, so a log line or an event can say which
leadership did what. Decisions are journaled rows, never the leader's memory: a new leader reads the
same tables and carries on.
"""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from sqlalchemy import CursorResult, update
from sqlalchemy.exc import IntegrityError

from mainspring.agents.journal import now
from mainspring.agents.leases import owner_is_dead
from mainspring.agents.plans.tables import LeaderLeaseRow
from mainspring.store.db import session

SCHEDULER_LEASE = "plan-scheduler"


def hold(db: str, name: str, owner: str, lease_s: float) -> int | None:
    """Take or renew lease `name` for `owner`: its term while `owner` holds it, None while another does."""
    t = now()
    expires = t + timedelta(seconds=lease_s)
    try:
        with session(db) as s:
            row = s.get(LeaderLeaseRow, name)
            if row is None:
                s.add(LeaderLeaseRow(name=name, owner=owner, expires_at=expires, acquired_at=t, term=1))
                s.flush()
                return 1
            # Renewing and taking over both write only if the row is still what we read (owner and term): on
            # Postgres a standby may take an expired lease between our read and our write, and a renewal by
            # primary key alone would then make two leaders. (SQLite's BEGIN IMMEDIATE serialises them anyway.)
            same = (LeaderLeaseRow.name == name, LeaderLeaseRow.owner == row.owner, LeaderLeaseRow.term == row.term)
            if row.owner == owner:
                renewed = cast(CursorResult, s.execute(update(LeaderLeaseRow).where(*same).values(expires_at=expires)
                                                       .execution_options(synchronize_session=False))).rowcount
                return row.term if renewed == 1 else None
            if row.expires_at >= t and not owner_is_dead(row.owner):
                return None
            taken = cast(CursorResult, s.execute(update(LeaderLeaseRow).where(*same)
                              .values(owner=owner, expires_at=expires, acquired_at=t, term=row.term + 1)
                              .execution_options(synchronize_session=False))).rowcount
            return row.term + 1 if taken == 1 else None
    except IntegrityError:  # two processes created the row at once: the other one holds it
        return None


def release(db: str, name: str, owner: str) -> None:
    """Give the lease up now (a clean shutdown), so a standby takes over at its next tick."""
    with session(db) as s:
        s.execute(update(LeaderLeaseRow).where(LeaderLeaseRow.name == name, LeaderLeaseRow.owner == owner)
                  .values(expires_at=now() - timedelta(seconds=1)).execution_options(synchronize_session=False))


def holder(db: str, name: str) -> LeaderLeaseRow | None:
    with session(db, readonly=True) as s:
        return s.get(LeaderLeaseRow, name)
