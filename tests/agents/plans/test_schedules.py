"""Schedules: a cron schedule missed during downtime fires once, exactly once across concurrent callers and a
crash between claiming and starting; a fire that cannot start is recorded and never loops; webhooks are
signed and deduplicated by delivery id; and the real scheduler tick fires what is due."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from mainspring.agents import journal
from mainspring.agents.plans import schedules
from mainspring.agents.plans.schedule_tables import ScheduleFireRow, ScheduleRow
from mainspring.agents.plans.scheduler import PlanScheduler
from mainspring.agents.plans.schedules import ScheduleError
from mainspring.agents.plans.tables import PlanRow, PlanTaskRow
from mainspring.agents.spec import AgentSpec
from mainspring.agents.tables import RunRow
from mainspring.store.db import session

T0 = datetime(2026, 3, 2, 12, 0, 20, tzinfo=timezone.utc)
PLAN = {"goal": "the nightly report", "tasks": [{"id": "report", "agent": "reporter", "prompt": "write {goal}"}]}
TARGETS = {"plan": {"plan": PLAN}, "agent": {"agent": "reporter", "goal": "write the nightly report"}}


@pytest.fixture
def db(db_url):
    journal.put_agent(db_url, AgentSpec(name="reporter", model="policy", instructions="report", tools=[]))
    return db_url


def count(db: str, table) -> int:
    with session(db, readonly=True) as s:
        return s.scalar(select(func.count()).select_from(table))


def started(db: str) -> int:
    return count(db, PlanRow) + count(db, RunRow)


def cron(db: str, target: dict, expr: str = "*/1 * * * *", created: datetime = T0, tz: str = "UTC") -> ScheduleRow:
    row, secret = schedules.create_schedule(db, name="nightly", kind="cron", cron=expr, timezone=tz, target=target,
                                            project_id=None, api_key_id=None, now=created)
    assert secret is None
    return row


def reread(db: str, schedule_id: str) -> ScheduleRow:
    with session(db, readonly=True) as s:
        row = s.get(ScheduleRow, schedule_id)
        assert row is not None
        return row


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_a_schedule_missed_during_downtime_runs_once_at_restart(db, kind):
    sched = cron(db, TARGETS[kind])
    assert sched.next_fire_at == datetime(2026, 3, 2, 12, 1, tzinfo=timezone.utc)
    assert schedules.fire_due(db, T0) == 0  # before its first slot: nothing

    back = T0 + timedelta(minutes=10)  # the server was down for 10 slots; this call is the restart's first tick
    assert schedules.fire_due(db, back) == 1
    assert started(db) == 1
    row = reread(db, sched.id)
    assert row.next_fire_at is not None and row.next_fire_at > back
    assert row.next_fire_at == datetime(2026, 3, 2, 12, 11, tzinfo=timezone.utc)
    assert (row.fire_count, row.last_error) == (1, None)
    (fire,) = schedules.fires(db, sched.id)
    assert fire.fire_key == "2026-03-02T12:10:00+00:00"  # the latest missed slot
    assert fire.status == "started" and (fire.plan_id or fire.run_id)

    assert schedules.fire_due(db, back) == 0  # a second call at the same moment starts nothing
    assert started(db) == 1


def test_a_schedule_in_its_timezone(db):
    sched = cron(db, TARGETS["agent"], expr="0 9 * * *", tz="Europe/Paris")  # 09:00 Paris is 08:00 UTC in March
    assert sched.next_fire_at == datetime(2026, 3, 3, 8, 0, tzinfo=timezone.utc)


def test_two_concurrent_callers_on_the_same_due_slot_start_one(db):
    sched = cron(db, TARGETS["agent"])
    back = T0 + timedelta(minutes=5)
    barrier = threading.Barrier(2)
    results: list[int] = []

    def call() -> None:
        barrier.wait()
        results.append(schedules.fire_due(db, back))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1]
    assert started(db) == 1 and count(db, ScheduleFireRow) == 1
    assert reread(db, sched.id).fire_count == 1


def test_a_crash_between_claim_and_start_starts_it_once_under_its_id(db):
    sched = cron(db, TARGETS["plan"])
    fire_id = schedules._claim_cron(db, sched.id, T0 + timedelta(minutes=3))  # the process dies right after
    assert fire_id is not None and started(db) == 0
    (fire,) = schedules.fires(db, sched.id)
    assert fire.status == "pending" and fire.plan_id

    assert schedules.fire_due(db, T0 + timedelta(minutes=3)) == 1  # the restart: the pending fire is started
    with session(db, readonly=True) as s:
        assert [p.id for p in s.scalars(select(PlanRow))] == [fire.plan_id]
    assert schedules.fire_due(db, T0 + timedelta(minutes=3)) == 0
    assert started(db) == 1


def test_a_fire_that_cannot_start_is_recorded_and_the_schedule_moves_on(db):
    sched = cron(db, {"agent": "deleted-agent", "goal": "g"})
    back = T0 + timedelta(minutes=2)
    assert schedules.fire_due(db, back) == 0
    row = reread(db, sched.id)
    assert "deleted-agent" in (row.last_error or "") and row.next_fire_at and row.next_fire_at > back
    (fire,) = schedules.fires(db, sched.id)
    assert fire.status == "failed" and "deleted-agent" in (fire.error or "")
    assert schedules.fire_due(db, back) == 0  # not retried: no loop
    assert count(db, ScheduleFireRow) == 1 and started(db) == 0


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_a_webhook_is_signed_and_a_redelivery_starts_nothing_new(db):
    sched, secret = schedules.create_schedule(db, name="on-push", kind="webhook", cron=None, timezone="UTC",
                                              target=TARGETS["agent"], project_id=None, api_key_id=None, now=T0)
    assert secret and sched.next_fire_at is None
    body = json.dumps({"ref": "main", "commits": 3}).encode()
    for bad in (None, "", "sha256=" + "0" * 64, sign("not-the-secret", body), sign(secret, body + b" ")):
        with pytest.raises(ScheduleError) as refused:
            schedules.fire_webhook(db, sched.id, body, bad, "d-1", T0)
        assert refused.value.status == 401
    with pytest.raises(ScheduleError) as unknown:  # the same answer as a wrong signature
        schedules.fire_webhook(db, "sched_nope", body, sign(secret, body), "d-1", T0)
    assert unknown.value.status == 401
    assert started(db) == 0

    fired = schedules.fire_webhook(db, sched.id, body, sign(secret, body), "d-1", T0)
    assert not fired.duplicate and fired.fire.status == "started" and fired.fire.run_id
    with session(db, readonly=True) as s:
        run = s.get(RunRow, fired.fire.run_id)
    assert run is not None and run.goal == f"write the nightly report\n\n<webhook>\n{body.decode()}\n</webhook>"

    again = schedules.fire_webhook(db, sched.id, body, sign(secret, body), "d-1", T0)
    assert again.duplicate and again.fire.run_id == fired.fire.run_id
    other = schedules.fire_webhook(db, sched.id, body, sign(secret, body), "d-2", T0)
    assert not other.duplicate and other.fire.run_id != fired.fire.run_id
    assert count(db, RunRow) == 2 and reread(db, sched.id).fire_count == 2

    # without a delivery id, the body's hash is the id: the same body again is a redelivery
    first = schedules.fire_webhook(db, sched.id, b"{}", sign(secret, b"{}"), None, T0)
    assert schedules.fire_webhook(db, sched.id, b"{}", sign(secret, b"{}"), None, T0).fire.run_id == first.fire.run_id
    big = b'"' + b"x" * schedules.MAX_WEBHOOK_BODY + b'"'
    with pytest.raises(ScheduleError) as too_big:
        schedules.fire_webhook(db, sched.id, big, sign(secret, big), None, T0)
    assert too_big.value.status == 413
    assert count(db, RunRow) == 3


def test_the_scheduler_tick_fires_a_due_schedule_and_dispatches_its_plan(db):
    # a daily slot 3 minutes ago: the second tick below cannot reach the next slot, however slow the machine (with
    # every minute's slot, a tick after a minute boundary rightly fired again)
    slot = (journal.now() - timedelta(minutes=3)).replace(second=0, microsecond=0)
    sched = cron(db, TARGETS["plan"], expr=f"{slot.minute} {slot.hour} * * *", created=slot - timedelta(minutes=2))
    woken: list[int] = []
    report = PlanScheduler(db, "host:1:a", notify=lambda: woken.append(1)).tick()
    assert report.leader and report.fired == 1
    assert report.dispatched == 1 and woken  # the plan's first task became a run in the same tick
    (fire,) = schedules.fires(db, sched.id)
    with session(db, readonly=True) as s:
        (task,) = s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id == fire.plan_id))
    assert task.status == "dispatched" and task.run_id
    assert PlanScheduler(db, "host:1:a").tick().fired == 0
