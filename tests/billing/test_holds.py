"""billing/holds + metering: a hold never expires while its request runs (however long), a dead process's holds
expire or are released at the next start, and the Meter writes one ledger row per call and settles its hold."""

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select

from mainspring.billing import budgets, holds
from mainspring.billing.budgets import BudgetExceeded
from mainspring.billing.keys import create_key
from mainspring.billing.metering import Meter
from mainspring.engine.outputs import Usage
from mainspring.store.db import session
from mainspring.store.tables import LedgerEntry
from mainspring.store.tables import Reservation as ReservationRow
from tests.databases import is_postgres

SMOL = "SmolLM2-135M-Instruct"
ONE_CALL_U = 500  # 1000 input tokens × $0.10/M + 1000 output × $0.40/M


@pytest.fixture(autouse=True)
def _forget(db):
    """Holds a test leaves open stay tracked by this process: drop them, as if that process had ended."""
    yield
    for rid in holds.live_ids(db):
        holds.forget(rid)


@pytest.fixture
def key(db):
    """A key whose total budget covers one call's worst case, not two."""
    with session(db) as s:
        k = create_key(s, "acme").key
        budgets.set_budget(s, "key", k.id, "total", ONE_CALL_U + ONE_CALL_U // 2)
    return k


def call(meter: Meter, key, rid: str, now: datetime | None = None):
    return meter.reserve(key, rid, model=SMOL, tier="standard", input_tokens=1000, max_output_tokens=1000, now=now)


def row(db, rid: str) -> ReservationRow:
    with session(db, readonly=True) as s:
        return s.scalars(select(ReservationRow).where(ReservationRow.request_id == rid)).one()


def test_a_running_request_keeps_its_hold_past_the_expiry(db, sheet, key):
    meter = Meter(db, sheet)
    now = datetime.now(timezone.utc)
    long_one = call(meter, key, "long", now)
    assert long_one.reserved_u == ONE_CALL_U
    # an hour later the first request is still generating (a windowed request): its hold still counts
    later = now + timedelta(seconds=meter.ttl_s * 12)
    with pytest.raises(BudgetExceeded) as exc:
        call(meter, key, "concurrent", later)
    assert exc.value.outstanding_u == ONE_CALL_U
    assert row(db, "long").expires_at > later and not row(db, "long").settled
    # once it is settled the money is free again (minus what it actually cost)
    cost = meter.record(key, long_one, "long", Usage(1000, 0, 10), endpoint="/v1/chat/completions", model=SMOL,
                        tier="standard", stream=True, status="ok", finish_reason="stop")
    assert cost == 104 and row(db, "long").settled_u == 104
    call(meter, key, "next", later)


def test_the_heartbeat_shows_other_processes_the_hold_alive(db, sheet, key):
    meter = Meter(db, sheet)
    now = datetime.now(timezone.utc)
    call(meter, key, "streaming", now)
    later = now + timedelta(seconds=meter.ttl_s)
    assert holds.keep_alive(db, now=later - timedelta(seconds=meter.ttl_s / 4)) == 1  # the daemon thread's beat
    with session(db, readonly=True) as s:  # what another process sharing the database reads
        [st] = budgets.status(s, "key", key.id, now=later)
    assert st.outstanding_u == ONE_CALL_U
    assert holds.keep_alive(db, now=later - timedelta(seconds=meter.ttl_s / 4)) == 0  # nothing due: no write


def test_a_dead_process_holds_expire_and_a_restart_releases_them(db, sheet, key):
    meter = Meter(db, sheet)
    now = datetime.now(timezone.utc)
    call(meter, key, "cut-off", now)
    holds.forget("cut-off")  # the process died: nobody extends its hold any more
    # a process sharing the database sees the budget free once the hold's expiry passed
    call(Meter(db, sheet), key, "elsewhere", now + timedelta(seconds=meter.ttl_s + 1))
    holds.forget("elsewhere")

    restarted = Meter(db, sheet)  # the next server start on this data dir
    released = restarted.release_stale()
    if is_postgres(db):  # a shared database may hold a live peer's hold: only its expiry frees it (holds.py)
        assert released == holds.Released((), 0) and not row(db, "cut-off").settled
        return
    assert set(released.request_ids) == {"cut-off", "elsewhere"} and released.reserved_u == 2 * ONE_CALL_U
    for rid in ("cut-off", "elsewhere"):
        r = row(db, rid)
        assert r.settled and r.settled_u == 0  # released: the tokens it produced are unknown, nothing billed
    with session(db, readonly=True) as s:
        assert s.scalars(select(LedgerEntry)).all() == []
        [st] = budgets.status(s, "key", key.id)
    assert st.outstanding_u == 0 and st.spent_u == 0
    call(restarted, key, "at-once")  # usable at once, not after the expiry
    assert restarted.release_stale().request_ids == ()  # its own running hold is not released


def test_a_live_hold_of_this_process_survives_another_meter_starting(db, sheet, key):
    first = Meter(db, sheet)
    held = call(first, key, "mine")
    assert Meter(db, sheet).release_stale().request_ids == ()  # e.g. a second app in this process
    assert not row(db, "mine").settled
    first.release(held)
    assert row(db, "mine").settled and row(db, "mine").settled_u == 0
    assert "mine" not in holds.live_ids(db)


def test_anonymous_calls_hold_nothing_and_still_reach_the_ledger(db, sheet):
    meter = Meter(db, sheet)
    res = call(meter, None, "anon")
    assert res.budget_ids == () and "anon" not in holds.live_ids(db)
    cost = meter.record(None, res, "anon", Usage(1000, 0, 10), endpoint="agent.run", model=SMOL, tier="standard",
                        stream=False, status="ok", finish_reason="stop", custom_id="run_x")
    with session(db, readonly=True) as s:
        [entry] = s.scalars(select(LedgerEntry)).all()
    assert (entry.api_key_id, entry.endpoint, entry.custom_id, entry.cost_total_u) == (None, "agent.run", "run_x", cost)
