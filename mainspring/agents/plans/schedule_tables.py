"""Durable schedules: what starts a plan or an agent run on a cron schedule or on a signed webhook, and each fire.

A fire is exactly-once because (schedule_id, fire_key) is unique: the cron slot it fires for, or the webhook's
delivery id. The fire row, with the id of the plan or run it starts chosen in advance, is written in the same
transaction that advances the schedule; the plan or run is then created under that id (schedules.py), so a crash
or a second process in between can create it at most once. Mapped on the store's Base, collected for Alembic by
mainspring/schema.py, migrated by 0008_schedules.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mainspring.agents.plans import tables as _plan_tables  # noqa: F401  (the plans and runs fires start)
from mainspring.store.base import Base, UTCDateTime, utcnow


class FireStatus(StrEnum):
    PENDING = "pending"  # claimed, its plan or run not created yet (a crash here: created at the next tick)
    STARTED = "started"
    FAILED = "failed"  # could not start (agent deleted, plan no longer valid): `error` says why; never retried


class ScheduleRow(Base):
    __tablename__ = "schedules"
    __table_args__ = (Index("ix_schedules_due", "enabled", "next_fire_at"),
                      Index("ix_schedules_project_created", "project_id", "created_at"))

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "sched_<hex>"
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True)  # None: anonymous
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True)  # its fires charge it
    name: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))  # "cron" | "webhook"
    cron: Mapped[str | None] = mapped_column(String(255), nullable=True)
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")  # IANA: the zone the cron fields are read in
    target_json: Mapped[str] = mapped_column(Text)  # {"plan": PlanSpec} | {"agent": name, "goal": text}
    # A webhook's shared secret, kept as is: verifying an HMAC needs the key itself (as GitHub's webhook secrets
    # do), so a hash would not do. It is shown once, when the schedule is created, and never returned again.
    secret: Mapped[str | None] = mapped_column(String(128), nullable=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    next_fire_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)  # cron: the next slot
    last_fired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    fire_count: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)  # the last fire's, None once one starts
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ScheduleFireRow(Base):
    __tablename__ = "schedule_fires"
    __table_args__ = (UniqueConstraint("schedule_id", "fire_key"),
                      Index("ix_schedule_fires_status", "status"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule_id: Mapped[str] = mapped_column(ForeignKey("schedules.id"))
    fire_key: Mapped[str] = mapped_column(String(128))  # cron: the slot's UTC ISO time; webhook: the delivery id
    # what it starts; no foreign keys: the ids are written down before the plan or run is created
    plan_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    body: Mapped[str | None] = mapped_column(Text, nullable=True)  # a webhook's JSON body, appended to the goal
    status: Mapped[str] = mapped_column(String(16), default=FireStatus.PENDING.value)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
