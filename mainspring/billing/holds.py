"""Holds in flight: a reservation never expires while its request still runs, and one left behind by a process
that died (kill -9 in the middle of a stream) is released when the server starts again.

`budgets.hold` gives every reservation an expiry, so that a hold nobody will ever settle stops blocking its
budget. But a request may run far longer than any fixed expiry (a windowed request can generate for an hour),
and a hold that expires while its request still runs lets concurrent calls spend the same money twice. So the
process that took a hold keeps it alive until it settles it:

- `track` notes each hold this process took (through `metering.Meter`), `forget` drops it at settle/release;
- `keep_alive` pushes the expiry of this process's holds that are getting old one TTL forward. The Meter calls
  it before every reservation, so an admission in this process never overlooks a running hold of its own, and
  a daemon thread calls it every TTL/4, so other processes sharing the database see them alive too. A process
  that dies stops extending: its holds expire within one TTL (HOLD_TTL_S, short because of the heartbeat);
- `release_stale` at server start releases at once every open hold this process does not hold and that was
  created before it started (settled at 0: the reservation knows only the worst case, not how many tokens the
  cut-off request produced, so nothing is billed for it). Only on SQLite, where one server process owns the data
  directory and such a hold can only be a dead process's; a shared database (Postgres, several processes) may
  hold a live peer's, and relies on the expiry.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import select, update
from sqlalchemy.engine import Engine, make_url

from mainspring.billing.budgets import Reservation
from mainspring.store.db import is_sqlite, session
from mainspring.store.tables import Reservation as ReservationRow

log = logging.getLogger(__name__)
HOLD_TTL_S = 300.0  # how long a dead process's hold blocks a shared database; a live one is extended
_CHUNK = 500  # request ids per UPDATE (SQLite's bound-parameter limit)


@dataclass
class _Live:
    db: Engine | str
    expires_at: datetime


_lock = threading.Lock()
_live: dict[str, _Live] = {}  # request_id -> the hold this process keeps alive
_beat: threading.Thread | None = None


def db_key(db: Engine | str) -> str:
    """One name per database, whether it is given as an engine or a URL."""
    url = db.url if isinstance(db, Engine) else make_url(db)
    return url.render_as_string(hide_password=False)


def track(db: Engine | str, reservation: Reservation) -> None:
    """Keep `reservation` alive until `forget`: its request runs in this process."""
    if not reservation.budget_ids:
        return  # no budget (anonymous caller): nothing is held in the database
    with _lock:
        _live[reservation.request_id] = _Live(db, reservation.expires_at)
    _start_heartbeat()


def forget(request_id: str) -> None:
    with _lock:
        _live.pop(request_id, None)


def live_ids(db: Engine | str) -> set[str]:
    """Request ids of the holds this process keeps alive on `db`."""
    name = db_key(db)
    with _lock:
        return {rid for rid, h in _live.items() if db_key(h.db) == name}


def keep_alive(db: Engine | str | None = None, now: datetime | None = None, ttl_s: float = HOLD_TTL_S) -> int:
    """Extend this process's holds (on `db`, or on every database) whose expiry is less than half a TTL away to
    `now + ttl_s`; returns how many. Cheap when nothing is due: no write at all."""
    now = now or datetime.now(timezone.utc)
    soon = now + timedelta(seconds=ttl_s / 2)
    name = db_key(db) if db is not None else None
    with _lock:
        due: dict[str, tuple[Engine | str, list[str]]] = {}
        for rid, h in _live.items():
            if h.expires_at < soon and (name is None or db_key(h.db) == name):
                due.setdefault(db_key(h.db), (h.db, []))[1].append(rid)
    new_expiry, n = now + timedelta(seconds=ttl_s), 0
    for target, ids in due.values():
        with session(target) as s:
            for i in range(0, len(ids), _CHUNK):
                s.execute(update(ReservationRow)
                          .where(ReservationRow.request_id.in_(ids[i:i + _CHUNK]), ReservationRow.settled.is_(False))
                          .values(expires_at=new_expiry))
        with _lock:  # after the commit: a failed extension is retried at the next call
            for rid in ids:
                if rid in _live:
                    _live[rid].expires_at = new_expiry
        n += len(ids)
    return n


@dataclass(frozen=True)
class Released:
    request_ids: tuple[str, ...]
    reserved_u: int  # summed over every budget row that was held


def release_stale(db: Engine | str, started: datetime) -> Released:
    """At server start: release every open hold created before `started` that this process does not hold (see
    the module's docstring for why only on SQLite, and why nothing is billed)."""
    live = live_ids(db)
    with session(db) as s:
        if not is_sqlite(s.get_bind()):
            return Released((), 0)
        rows = [r for r in s.scalars(select(ReservationRow).where(
            ReservationRow.settled.is_(False), ReservationRow.created_at < started)) if r.request_id not in live]
        for r in rows:
            r.settled, r.settled_u = True, 0
    released = Released(tuple(sorted({r.request_id for r in rows})), sum(r.reserved_u for r in rows))
    if rows:
        log.warning("released %d budget hold(s) of %d request(s) cut off by an earlier server process "
                    "(%d micro-USD held; their tokens are unknown and not billed): %s",
                    len(rows), len(released.request_ids), released.reserved_u, ", ".join(released.request_ids[:20]))
    return released


def _start_heartbeat() -> None:
    global _beat
    with _lock:
        if _beat is not None and _beat.is_alive():
            return
        _beat = threading.Thread(target=_heartbeat, name="budget-holds", daemon=True)
        _beat.start()


def _heartbeat() -> None:
    while True:
        time.sleep(HOLD_TTL_S / 4)
        try:
            keep_alive()
        except Exception:  # a busy or vanished database: try again at the next beat, never die
            log.exception("could not extend the budget holds of requests in flight")
