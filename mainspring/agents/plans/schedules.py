"""Schedules and triggers: a plan or an agent run started on a cron schedule, or by a signed webhook, durably.

A cron schedule keeps `next_fire_at`, its next slot. The plan scheduler's leader calls `fire_due` every tick:
each schedule whose slot has come is fired ONCE for the latest slot that has passed, however many were missed
while no server ran (Temporal's catch-up limited to one), and moves on to the first slot after now. A webhook
fires on `POST /v1/hooks/{id}` signed like GitHub's X-Hub-Signature-256 ("sha256=" + hex HMAC-SHA256 of the
body under the schedule's secret); its delivery id makes a redelivery start nothing new.

Exactly-once, across crashes and processes, in two transactions: the first claims the fire (a schedule_fires
row, unique per schedule and slot or delivery id, holding the id of the plan or run it starts, chosen in
advance) and advances the schedule; the second creates the plan or run under that id. A crash in between leaves
a pending fire, which the next `fire_due` creates (under the same id: a second creation hits the primary key).
A fire that cannot start (its agent deleted, its plan no longer valid) is recorded failed with why, never retried.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from sqlalchemy import CursorResult, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from mainspring.agents import journal
from mainspring.agents.journal import JournalError, project_is
from mainspring.agents.plans import store
from mainspring.agents.plans.schedule_tables import FireStatus, ScheduleFireRow, ScheduleRow
from mainspring.agents.plans.spec import PlanError, PlanSpec
from mainspring.agents.plans.tables import PlanRow
from mainspring.agents.tables import AgentRow, RunRow
from mainspring.store.db import session
from mainspring.store.ids import new_id

log = logging.getLogger("mainspring.schedules")

MAX_WEBHOOK_BODY = 64 * 1024  # bytes; a bigger body is refused (413) rather than cut
MAX_DELIVERY_ID = 128
DUE_PER_TICK = 100  # schedules fired per call; the rest at the next tick


class ScheduleError(PlanError):
    """A schedule refused or not found; `status` and `param` as PlanError's (the API answers them the same way)."""


@dataclass
class Fired:
    fire: ScheduleFireRow
    duplicate: bool  # a redelivery: nothing new started, the first delivery's ids answered


# ---- cron -----------------------------------------------------------------------------------------------------
def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown timezone {name!r}; an IANA name like 'Europe/Paris' or 'UTC'",
                            param="timezone") from None


def check_cron(expr: str, tz: str) -> None:
    zone(tz)
    if not croniter.is_valid(expr):
        raise ScheduleError(f"invalid cron expression {expr!r}; five fields: minute hour day-of-month month "
                            "day-of-week, e.g. '*/15 * * * *'", param="cron")
    try:  # valid fields can still name no day at all ("0 0 31 2 *"): croniter gives up searching for one
        slot_after(expr, tz, journal.now())
    except (CroniterError, ValueError, OverflowError):
        raise ScheduleError(f"cron expression {expr!r} never fires", param="cron") from None


def slot_after(expr: str, tz: str, t: datetime) -> datetime:
    """The first slot strictly after `t` (aware, UTC), the cron's fields read in zone `tz`."""
    return croniter(expr, t.astimezone(zone(tz))).get_next(datetime).astimezone(ZoneInfo("UTC"))


def slot_at_or_before(expr: str, tz: str, t: datetime) -> datetime:
    """The latest slot at or before `t`: the one a schedule late at `t` fires for."""
    prev = croniter(expr, t.astimezone(zone(tz))).get_prev(datetime)  # strictly before t
    nxt = croniter(expr, prev).get_next(datetime)
    return (nxt if nxt <= t else prev).astimezone(ZoneInfo("UTC"))


# ---- creating and changing schedules --------------------------------------------------------------------------
def create_schedule(db: str, *, name: str, kind: str, cron: str | None, timezone: str, target: dict[str, Any],
                    project_id: int | None, api_key_id: str | None, now: datetime) -> tuple[ScheduleRow, str | None]:
    """A schedule (the target already checked by the caller) and, for a webhook, its secret: the only time it is
    returned."""
    secret = None
    if kind == "cron":
        assert cron is not None
        check_cron(cron, timezone)
    else:
        secret = "whsec_" + secrets.token_hex(24)
    row = ScheduleRow(id=new_id("sched_"), project_id=project_id, api_key_id=api_key_id, name=name, kind=kind,
                      cron=cron, timezone=timezone, target_json=json.dumps(target, sort_keys=True), secret=secret,
                      enabled=True, next_fire_at=slot_after(cron, timezone, now) if cron else None,
                      last_fired_at=None, fire_count=0, last_error=None, created_at=now, updated_at=now)
    with session(db) as s:
        s.add(row)
    return row, secret


def schedule(db: str, schedule_id: str, project_id: store.ProjectScope) -> ScheduleRow:
    with session(db, readonly=True) as s:
        row = s.get(ScheduleRow, schedule_id)
    if row is None or not (project_id is store.ANY or row.project_id == project_id):
        raise ScheduleError(f"no schedule {schedule_id!r}", status=404)  # another project's: not found either
    return row


def schedules(db: str, project_id: store.ProjectScope, limit: int = 100) -> list[ScheduleRow]:
    q = select(ScheduleRow)
    if project_id is not store.ANY:
        q = q.where(project_is(ScheduleRow.project_id, project_id))  # type: ignore[arg-type]
    with session(db, readonly=True) as s:
        return list(s.scalars(q.order_by(ScheduleRow.created_at.desc(), ScheduleRow.id.desc()).limit(limit)))


def fires(db: str, schedule_id: str, limit: int = 20) -> list[ScheduleFireRow]:
    """The schedule's latest fires, newest first."""
    with session(db, readonly=True) as s:
        return list(s.scalars(select(ScheduleFireRow).where(ScheduleFireRow.schedule_id == schedule_id)
                              .order_by(ScheduleFireRow.id.desc()).limit(limit)))


def set_enabled(db: str, schedule_id: str, enabled: bool, project_id: store.ProjectScope, now: datetime) -> ScheduleRow:
    """Pause or resume. Resuming a cron schedule moves on to its first slot after now: slots missed while paused
    were skipped on purpose, so none of them fires."""
    with session(db) as s:
        row = s.scalars(select(ScheduleRow).where(ScheduleRow.id == schedule_id).with_for_update()).first()
        if row is None or not (project_id is store.ANY or row.project_id == project_id):
            raise ScheduleError(f"no schedule {schedule_id!r}", status=404)
        if enabled and not row.enabled and row.cron:
            row.next_fire_at = slot_after(row.cron, row.timezone, now)
        row.enabled, row.updated_at = enabled, now
        return row


def delete_schedule(db: str, schedule_id: str, project_id: store.ProjectScope) -> None:
    """The schedule and its fire history; what it started (plans, runs) stays."""
    with session(db) as s:
        row = s.get(ScheduleRow, schedule_id)
        if row is None or not (project_id is store.ANY or row.project_id == project_id):
            raise ScheduleError(f"no schedule {schedule_id!r}", status=404)
        for fire in s.scalars(select(ScheduleFireRow).where(ScheduleFireRow.schedule_id == schedule_id)):
            s.delete(fire)
        s.flush()  # the fires before the schedule they refer to
        s.delete(row)


# ---- firing ---------------------------------------------------------------------------------------------------
def _new_fire(row: ScheduleRow, key: str, now: datetime, body: str | None = None) -> ScheduleFireRow:
    is_plan = "plan" in json.loads(row.target_json)
    return ScheduleFireRow(schedule_id=row.id, fire_key=key, plan_id=new_id("plan_") if is_plan else None,
                           run_id=None if is_plan else new_id("run_"), body=body, status=FireStatus.PENDING.value,
                           error=None, created_at=now)


def _claim_cron(db: str, schedule_id: str, now: datetime) -> int | None:
    """One transaction: the fire row for the latest passed slot, and the schedule moved on past `now`. Of
    concurrent callers one claims the slot; the others find it no longer due (or its fire row already there)."""
    with session(db) as s:
        row = s.scalars(select(ScheduleRow).where(ScheduleRow.id == schedule_id).with_for_update()).first()
        if row is None or not row.enabled or row.cron is None or row.next_fire_at is None or row.next_fire_at > now:
            return None
        try:
            key = slot_at_or_before(row.cron, row.timezone, now).isoformat()
            row.next_fire_at = slot_after(row.cron, row.timezone, now)
        except (CroniterError, ValueError, KeyError, OverflowError) as exc:  # its zone since removed, its days past
            row.next_fire_at, row.enabled, row.last_error = None, False, f"cannot compute the next slot: {exc}"
            return None
        row.updated_at = now
        if s.scalar(select(ScheduleFireRow.id).where(ScheduleFireRow.schedule_id == row.id,
                                                     ScheduleFireRow.fire_key == key)) is not None:
            return None  # that slot fired already: only the schedule moves on
        fire = _new_fire(row, key, now)
        s.add(fire)
        row.fire_count += 1
        row.last_fired_at = now
        s.flush()
        return fire.id


def _goal(goal: str, body: str | None) -> str:
    return goal if not body else f"{goal}\n\n<webhook>\n{body}\n</webhook>"


def _target_exists(db: str, fire: ScheduleFireRow) -> bool:
    with session(db, readonly=True) as s:
        return (s.get(PlanRow, fire.plan_id) if fire.plan_id else s.get(RunRow, fire.run_id)) is not None


def _create_target(db: str, row: ScheduleRow, fire: ScheduleFireRow) -> None:
    target = json.loads(row.target_json)
    if "plan" in target:
        spec = PlanSpec.model_validate(target["plan"])
        spec = spec.model_copy(update={"goal": _goal(spec.goal, fire.body)})
        store.create_plan(db, spec, project_id=row.project_id, api_key_id=row.api_key_id, plan_id=fire.plan_id)
        return
    with session(db, readonly=True) as s:
        agent_id = s.scalars(select(AgentRow.id).where(AgentRow.name == target["agent"],
                                                       project_is(AgentRow.project_id, row.project_id))
                             .order_by(AgentRow.version.desc())).first()
    if agent_id is None:
        raise ScheduleError(f"no agent {target['agent']!r} in the schedule's project")
    journal.create_run(db, agent_id, _goal(target["goal"], fire.body), project_id=row.project_id,
                       api_key_id=row.api_key_id, run_id=fire.run_id)


def _start(db: str, fire_id: int) -> ScheduleFireRow:
    """Create the pending fire's plan or run under its written-down id, and record the outcome."""
    return _start_fire(db, fire_id)[0]


def _started(db: str, fire_id: int) -> bool:
    """Whether this caller started the pending fire: a concurrent caller that got there first counts it, not us."""
    fire, recorded = _start_fire(db, fire_id)
    return recorded and fire.status == FireStatus.STARTED


def _start_fire(db: str, fire_id: int) -> tuple[ScheduleFireRow, bool]:
    """_start, and whether this caller recorded the outcome."""
    with session(db, readonly=True) as s:
        fire = s.get(ScheduleFireRow, fire_id)
        assert fire is not None  # fires are deleted only with their schedule, by a person, after a claim
        row = s.get(ScheduleRow, fire.schedule_id)
    if row is None or fire.status != FireStatus.PENDING:
        return fire, False
    error = None
    try:
        _create_target(db, row, fire)
    except IntegrityError:  # another caller created it first, under the same id
        if not _target_exists(db, fire):
            raise
    except OperationalError:  # the database is busy or gone: the fire stays pending, retried next tick
        raise
    except Exception as exc:  # noqa: BLE001  anything else that stops it starting must not make it loop
        if not isinstance(exc, (PlanError, JournalError)):
            log.exception("schedule %s: fire %s could not start", row.id, fire.fire_key)
        error = f"could not start: {exc}"
    status = FireStatus.FAILED if error else FireStatus.STARTED
    with session(db) as s:
        moved = cast(CursorResult, s.execute(
            update(ScheduleFireRow)
            .where(ScheduleFireRow.id == fire_id, ScheduleFireRow.status == FireStatus.PENDING.value)
            .values(status=status.value, error=error).execution_options(synchronize_session=False))).rowcount
        if moved:  # this caller recorded it, not a concurrent one
            s.execute(update(ScheduleRow).where(ScheduleRow.id == row.id).values(last_error=error)
                      .execution_options(synchronize_session=False))
    fire.status, fire.error = status.value, error
    return fire, bool(moved)


def _recover(db: str) -> int:
    """Fires claimed but not started (a crash between the two transactions, or a caller still at it): start them
    under their written-down ids."""
    with session(db, readonly=True) as s:
        pending = list(s.scalars(select(ScheduleFireRow.id).where(
            ScheduleFireRow.status == FireStatus.PENDING.value).order_by(ScheduleFireRow.id).limit(DUE_PER_TICK)))
    return sum(_started(db, fire_id) for fire_id in pending)


def fire_due(db: str, now: datetime) -> int:
    """Fire every enabled cron schedule whose slot has come, once each however many slots were missed, and any
    fire left pending; the number of plans and runs started."""
    started = _recover(db)
    with session(db, readonly=True) as s:
        due = list(s.scalars(select(ScheduleRow.id).where(
            ScheduleRow.kind == "cron", ScheduleRow.enabled.is_(True), ScheduleRow.next_fire_at <= now)
            .order_by(ScheduleRow.next_fire_at).limit(DUE_PER_TICK)))
    for schedule_id in due:
        fire_id = _claim_cron(db, schedule_id, now)
        if fire_id is not None:
            started += _started(db, fire_id)
    return started


def signature_of(secret: str, body: bytes) -> str:
    """GitHub's X-Hub-Signature-256 format: "sha256=" + hex HMAC-SHA256(secret, body)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def fire_webhook(db: str, schedule_id: str, body: bytes, signature: str | None, delivery_id: str | None,
                 now: datetime) -> Fired:
    """A signed delivery: its plan or run started (the body, JSON, appended to the goal), or, for a delivery id
    seen before, the first delivery's fire answered again with nothing new started."""
    if len(body) > MAX_WEBHOOK_BODY:
        raise ScheduleError(f"the body is {len(body)} bytes; a webhook body is at most {MAX_WEBHOOK_BODY}",
                            status=413)
    with session(db, readonly=True) as s:
        row = s.get(ScheduleRow, schedule_id)
    # An unknown id, a cron schedule's id and a wrong signature get the same 401: the endpoint is open to the
    # world, and telling them apart would confirm which ids exist to whoever guesses.
    if row is None or row.kind != "webhook" or row.secret is None or not signature or \
            not hmac.compare_digest(signature_of(row.secret, body).encode(), signature.strip().encode()):
        raise ScheduleError("missing or wrong signature: send X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of "
                            "the body under the webhook's secret>", param="signature", status=401)
    if not row.enabled:
        raise ScheduleError(f"schedule {schedule_id} is paused", status=409)
    text = None
    if body.strip():
        try:
            text = body.decode("utf-8")
            json.loads(text)
        except (UnicodeDecodeError, ValueError):
            raise ScheduleError("the webhook body must be JSON (UTF-8)", param="body") from None
    key = delivery_id or hashlib.sha256(body).hexdigest()
    if len(key) > MAX_DELIVERY_ID:
        raise ScheduleError(f"a delivery id is at most {MAX_DELIVERY_ID} characters", param="delivery_id")
    seen = select(ScheduleFireRow).where(ScheduleFireRow.schedule_id == schedule_id, ScheduleFireRow.fire_key == key)
    with session(db, readonly=True) as s:
        first = s.scalars(seen).first()
    if first is not None:  # a redelivery: nothing new (one cut short before its start is started now, its ids kept)
        return Fired(_start(db, first.id) if first.status == FireStatus.PENDING else first, duplicate=True)
    try:
        with session(db) as s:
            fire = _new_fire(row, key, now, text)
            s.add(fire)
            s.execute(update(ScheduleRow).where(ScheduleRow.id == schedule_id)
                      .values(fire_count=ScheduleRow.fire_count + 1, last_fired_at=now, updated_at=now)
                      .execution_options(synchronize_session=False))
            s.flush()
    except IntegrityError:  # the same delivery at the same moment: the other one fired it
        with session(db, readonly=True) as s:
            return Fired(s.scalars(seen).one(), duplicate=True)
    return Fired(_start(db, fire.id), duplicate=False)
