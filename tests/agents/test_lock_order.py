"""One worker's journal threads write the same run rows at once: a group commit fences each of its runs (SELECT ...
FOR UPDATE) while the heartbeat extends all their leases. Both lock the rows in run-id order, so they cannot
deadlock (they did on Postgres: the group commit lost, and its runs failed in the kill -9 test under CI's load).
A batch that still loses to the database's contention is written again, once, in a fresh transaction."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select, text

from mainspring.agents import leases, writes
from mainspring.agents.tables import EventRow
from mainspring.store.db import get_engine, session
from tests.agents.conftest import PolicyModel, make_runtime, spec
from tests.databases import is_postgres

OWNER = "host:1:a"


def _two_claimed_runs(tmp_path, db_url) -> tuple[str, str]:
    rt = make_runtime(tmp_path, db_url, PolicyModel(), {})
    rt.put_agent(spec(tools=()))
    for i in range(2):
        rt.start_run("tester", f"job {i}")
    taken = sorted(run_id for run_id, _ in leases.claim(db_url, OWNER, 2, 30))
    assert len(taken) == 2
    return taken[0], taken[1]


def _pings(db_url: str, run_id: str) -> int:
    with session(db_url, readonly=True) as s:
        return len(s.scalars(select(EventRow.id).where(EventRow.run_id == run_id, EventRow.type == "test.ping")).all())


def _batch(run_id: str) -> writes.Batch:
    batch = writes.Batch(run_id)
    batch.event("test.ping")
    return batch


def _locks_first_row_first(db_url: str, low: str, high: str, write) -> None:
    """Hold `low` locked elsewhere, start `write` (over both runs, `high` named first) in a thread: once it waits
    for `low`, `high` must still be free (it locks in id order), and it finishes when `low` is released."""
    engine = get_engine(db_url)
    holder, prober = engine.raw_connection(), engine.raw_connection()
    done: list[object] = []
    try:
        holder.cursor().execute("SELECT id FROM runs WHERE id = %s FOR UPDATE", (low,))
        thread = threading.Thread(target=lambda: done.append(write()))
        thread.start()
        deadline = time.monotonic() + 30
        cur = prober.cursor()
        while True:  # until the writer waits on a row lock
            cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            if cur.fetchone()[0]:
                break
            assert time.monotonic() < deadline and thread.is_alive(), "the writer never waited for the held row"
            time.sleep(0.01)
        prober.rollback()
        cur.execute("SELECT id FROM runs WHERE id = %s FOR UPDATE NOWAIT", (high,))  # raises if the writer holds it
        assert cur.fetchone()[0] == high
        prober.rollback()
        holder.rollback()  # let the writer through
        thread.join(30)
        assert not thread.is_alive() and done
    finally:
        holder.close()
        prober.close()


def _postgres_only(db_url: str) -> None:
    if not is_postgres(db_url):
        pytest.skip("SQLite has one writer at a time (BEGIN IMMEDIATE): there are no row locks to order")


def test_a_group_commit_fences_its_runs_in_id_order(tmp_path, db_url):
    _postgres_only(db_url)
    low, high = _two_claimed_runs(tmp_path, db_url)
    outcomes: list = []
    _locks_first_row_first(db_url, low, high,
                           lambda: outcomes.extend(writes.commit_group(db_url, OWNER, [_batch(high), _batch(low)])))
    assert outcomes == [None, None]  # reported in the order given, whatever order they were written in
    assert _pings(db_url, low) == _pings(db_url, high) == 1


def test_the_heartbeat_locks_its_runs_in_id_order(tmp_path, db_url):
    _postgres_only(db_url)
    low, high = _two_claimed_runs(tmp_path, db_url)
    orders: list = []
    _locks_first_row_first(db_url, low, high, lambda: orders.append(leases.heartbeat(db_url, OWNER, [high, low], 30)))
    assert orders == [{}]  # both leases still ours and extended, nothing for the loops to do


class FakeDeadlock(Exception):
    sqlstate = "40P01"  # what psycopg's DeadlockDetected carries


def test_a_batch_that_lost_a_deadlock_is_written_again_once(tmp_path, db_url, monkeypatch):
    low, high = _two_claimed_runs(tmp_path, db_url)
    real_apply, lost = writes._apply, []

    def apply(cur, dialect, batch, owner):
        if batch.run_id == high and not lost:
            lost.append(batch.run_id)
            raise FakeDeadlock("deadlock detected")
        return real_apply(cur, dialect, batch, owner)

    monkeypatch.setattr(writes, "_apply", apply)
    assert writes.commit_group(db_url, OWNER, [_batch(high), _batch(low)]) == [None, None]
    assert lost == [high]
    assert _pings(db_url, low) == _pings(db_url, high) == 1  # the other batch was not written twice


def test_a_batch_that_keeps_failing_gets_its_error(tmp_path, db_url, monkeypatch):
    low, _ = _two_claimed_runs(tmp_path, db_url)
    tries = []

    def apply(cur, dialect, batch, owner):
        tries.append(batch.run_id)
        raise FakeDeadlock("deadlock detected")

    monkeypatch.setattr(writes, "_apply", apply)
    monkeypatch.setattr(writes.time, "sleep", lambda s: None)
    [outcome] = writes.commit_group(db_url, OWNER, [_batch(low)])
    assert isinstance(outcome, FakeDeadlock) and len(tries) == writes.TRANSIENT_RETRIES + 1
    assert _pings(db_url, low) == 0


def test_a_lost_lease_is_not_retried(tmp_path, db_url):
    low, _ = _two_claimed_runs(tmp_path, db_url)
    [outcome] = writes.commit_group(db_url, "host:9:other", [_batch(low)])
    assert isinstance(outcome, writes.LeaseLost)
    with session(db_url, readonly=True) as s:
        assert s.execute(text("SELECT count(*) FROM events WHERE type = 'test.ping'")).scalar() == 0
