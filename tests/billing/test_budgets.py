"""billing/budgets: worst-case reservation before the call, settle after, never overspend under concurrency."""

import random
import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import event, select

from mainspring.billing import budgets, ledger
from mainspring.billing.budgets import BudgetExceeded, reserve, settle
from mainspring.billing.keys import create_key
from mainspring.billing.prices import UnknownModel, price
from mainspring.billing.usage import UsageRecord
from mainspring.store.db import get_engine, session
from mainspring.store.tables import Reservation as ReservationRow
from tests.databases import is_postgres

SMOL = "SmolLM2-135M-Instruct"


def _key(db, project="acme", **budget):
    with session(db) as s:
        key = create_key(s, project).key
        if budget:
            budgets.set_budget(s, budget.get("scope", "key"),
                               key.id if budget.get("scope", "key") == "key" else key.project_id,
                               budget.get("period", "total"), budget["limit_u"], budget.get("soft_u"))
    return key


def _reserve(db, sheet, rid, key, n_in=1000, max_out=1000, **kw):
    with session(db) as s:
        return reserve(s, rid, key, sheet=sheet, model=SMOL, input_tokens=n_in, max_output_tokens=max_out, **kw)


def _finish(db, sheet, res, key, n_in=1000, n_out=10):
    rec = UsageRecord(model=SMOL, input_total=n_in, output_total=n_out)
    cost = price(rec, sheet)
    with session(db) as s:
        ledger.record(s, res.request_id, key, rec, cost)
        settle(s, res, cost.total_u)
    return cost.total_u


def test_worst_case_is_input_plus_max_output(sheet):
    # 1000 × 0.10 + 500 × 0.40 micro-USD
    assert budgets.worst_case_u(sheet, SMOL, "standard", 1000, 500) == 100 + 200
    assert budgets.worst_case_u(sheet, SMOL, "batch", 1000, 500) == 150
    cap = sheet.model(SMOL).max_output_tokens
    assert budgets.worst_case_u(sheet, SMOL, "standard", 0, None) == round(cap * 0.4)
    assert budgets.worst_case_u(sheet, SMOL, "standard", 0, 3 * cap) == round(3 * cap * 0.4)  # n=3 choices
    with pytest.raises(UnknownModel):
        budgets.worst_case_u(sheet, "nope", "standard", 1, 1)
    with pytest.raises(budgets.BudgetError):
        budgets.worst_case_u(sheet, SMOL, "standard", -1, 1)


def test_reject_names_budget_spent_and_possible_cost(db, sheet):
    key = _key(db, limit_u=1000)
    res = _reserve(db, sheet, "r1", key)  # 500 held
    assert res.reserved_u == 500 and len(res.budget_ids) == 1
    spent = _finish(db, sheet, res, key)  # 100 + 4 actually spent
    _reserve(db, sheet, "r2", key)  # 104 + 500 <= 1000
    with pytest.raises(BudgetExceeded) as exc:
        _reserve(db, sheet, "r3", key)  # 104 + 500 + 500 > 1000
    e = exc.value
    assert (e.hard_limit_u, e.spent_u, e.outstanding_u, e.reserve_u) == (1000, spent, 500, 500)
    assert e.http_status == 402
    msg = str(e)
    assert f"key {key.id}" in msg and "$0.001" in msg and "spent $0.000104" in msg and "up to $0.0005" in msg


def test_settle_releases_and_expired_holds_stop_counting(db, sheet):
    key = _key(db, limit_u=1000)
    now = datetime.now(timezone.utc)
    _reserve(db, sheet, "a", key, now=now, ttl_s=60)
    _reserve(db, sheet, "b", key, now=now, ttl_s=60)
    with pytest.raises(BudgetExceeded):
        _reserve(db, sheet, "c", key, now=now)
    later = now + timedelta(seconds=61)  # "a" and "b" were never settled: a crashed worker
    c = _reserve(db, sheet, "c", key, now=later)
    with session(db) as s:
        budgets.release(s, c)
        budgets.release(s, c)  # idempotent
    _reserve(db, sheet, "d", key, now=later)
    with session(db, readonly=True) as s:
        st = budgets.status(s, "key", key.id, now=later)[0]
        assert (st.spent_u, st.outstanding_u, st.remaining_u) == (0, 500, 500)
        assert s.scalar(select(ReservationRow.settled_u).where(ReservationRow.request_id == "c")) == 0


def test_same_request_id_reserves_once(db, sheet):
    key = _key(db, limit_u=600)
    a = _reserve(db, sheet, "r1", key)
    assert _reserve(db, sheet, "r1", key).reserved_u == a.reserved_u  # a retry does not hold twice


def test_project_budget_covers_all_its_keys(db, sheet):
    k1 = _key(db, "team", scope="project", limit_u=1200)
    with session(db) as s:
        k2 = create_key(s, "team").key
    _reserve(db, sheet, "r1", k1)
    _reserve(db, sheet, "r2", k2)
    with pytest.raises(BudgetExceeded, match="project"):
        _reserve(db, sheet, "r3", k2)
    other = _key(db, "elsewhere")  # no budget at all: unlimited
    _reserve(db, sheet, "r4", other)
    assert _reserve(db, sheet, "anon", None).budget_ids == ()  # auth off: nothing to hold against


def test_daily_budget_restarts_each_day(db, sheet):
    key = _key(db, period="day", limit_u=700)
    _finish(db, sheet, _reserve(db, sheet, "r1", key), key, n_out=1000)  # 500 spent today
    with pytest.raises(BudgetExceeded):
        _reserve(db, sheet, "r2", key)
    tomorrow = datetime.now(timezone.utc) + timedelta(days=1)
    _reserve(db, sheet, "r2", key, now=tomorrow)


def test_soft_limit_warnings(db, sheet):
    key = _key(db, limit_u=10_000, soft_u=1000)
    assert _reserve(db, sheet, "r1", key).warnings == (f"key {key.id} total budget at 50% of $0.001",)
    assert "80%" in _reserve(db, sheet, "r2", key, n_in=0, max_out=750).warnings[0]  # 500 + 300 = 800


def test_bad_budgets(db):
    with session(db) as s:
        for args in (("team", "1", "total", 1), ("key", "k", "week", 1), ("key", "k", "total", -1)):
            with pytest.raises(budgets.BudgetError):
                budgets.set_budget(s, *args)


def test_concurrent_reservations_never_overspend(db, sheet):
    """8 threads × 15 calls against a budget that covers only some of them, on a real SQLite file."""
    limit = 5_000
    key = _key(db, limit_u=limit)
    worst = budgets.worst_case_u(sheet, SMOL, "standard", 1000, 1000)  # 500
    ok, rejected, errors = [], [], []
    start = threading.Barrier(8)

    def worker(t: int) -> None:
        rng = random.Random(t)
        start.wait()
        for i in range(15):
            rid = f"t{t}-{i}"
            try:
                res = _reserve(db, sheet, rid, key)
            except BudgetExceeded as exc:
                rejected.append(exc)
                continue
            except Exception as exc:  # anything else (e.g. "database is locked") fails the test
                errors.append(exc)
                continue
            try:
                ok.append(_finish(db, sheet, res, key, n_out=rng.randint(0, 1000)))
            except Exception as exc:
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    assert len(ok) + len(rejected) == 120
    assert ok and rejected  # the budget really was contended
    with session(db, readonly=True) as s:
        spent = ledger.spend(s, "key", key.id)
        settled = s.scalars(select(ReservationRow.settled_u).where(ReservationRow.settled.is_(True))).all()
        open_ = s.scalars(select(ReservationRow).where(ReservationRow.settled.is_(False))).all()
    assert spent == sum(ok) == sum(settled) <= limit
    assert not open_
    # every rejection saw a state where this call could have pushed spending over the limit
    assert all(e.spent_u + e.outstanding_u + e.reserve_u > limit and e.reserve_u == worst for e in rejected)


def test_a_settle_committed_during_admission_is_counted_once(db, sheet):
    """Postgres gives each statement of a transaction its own snapshot: a settle (held -> spent, one commit) landing
    between admission's read of spent and its read of held would count that money nowhere. Forced here by
    committing a settle just before admission's reading statement runs."""
    if not is_postgres(db):
        pytest.skip("SQLite serialises writers (BEGIN IMMEDIATE): no settle can commit inside an admission")
    key = _key(db, limit_u=900)
    first = _reserve(db, sheet, "r1", key)  # 500 held
    fired: list[bool] = []

    def settle_meanwhile(conn, cursor, statement, params, context, executemany):
        if not fired and "reservations" in statement and "sum(" in statement.lower():
            fired.append(True)
            t = threading.Thread(target=_finish, args=(db, sheet, first, key), kwargs={"n_out": 1000})  # costs 500
            t.start()
            t.join()

    event.listen(get_engine(db), "before_cursor_execute", settle_meanwhile)
    try:
        with pytest.raises(BudgetExceeded) as exc:  # 500 spent + 500 more > 900, however the settle falls
            _reserve(db, sheet, "r2", key)
    finally:
        event.remove(get_engine(db), "before_cursor_execute", settle_meanwhile)
    assert fired and (exc.value.spent_u, exc.value.outstanding_u) == (500, 0)
