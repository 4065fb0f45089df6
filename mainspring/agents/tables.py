"""Durable agent state: agents (versioned), threads, runs, steps, tool calls, interrupts, events, artifacts, audit.

The journal is the run: messages are rebuilt from completed steps and tool calls, so a restart loses nothing.
Mapped on the store's Base (mainspring/store/base.py), collected for Alembic by mainspring/schema.py, migrated
by 0002_agents.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mainspring.store import tables as _store_tables  # noqa: F401  (the projects and api_keys these refer to)
from mainspring.store.base import Base, UTCDateTime, utcnow


class AgentRow(Base):
    """Agent names are unique per project: two projects may each have an agent "helper"."""

    __tablename__ = "agents"
    __table_args__ = (UniqueConstraint("project_id", "name", "version"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "agent_<name>_v<version>", + "_p<project>"
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True)  # None: anonymous
    name: Mapped[str] = mapped_column(String(128), index=True)
    version: Mapped[int] = mapped_column(Integer)
    spec_json: Mapped[str] = mapped_column(Text)  # AgentSpec, frozen for this version
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ThreadRow(Base):
    __tablename__ = "threads"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True)
    metadata_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RunRow(Base):
    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_status_priority", "status", "priority"),
                      Index("ix_runs_project_created", "project_id", "created_at"))

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # the project of the key that created the run (None: anonymous); its model calls are charged to that key
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True)
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True)
    thread_id: Mapped[str] = mapped_column(ForeignKey("threads.id"), index=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id"))  # pinned version
    goal: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(24), default="queued")
    priority: Mapped[int] = mapped_column(Integer, default=0)  # higher runs first
    # budget | user | model_stopped (agents/status.py) | interrupt
    pause_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    stop_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)  # final_answer | max_steps | …
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    result: Mapped[str | None] = mapped_column(Text, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    pause_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # leases taken (crash recoveries + resumes)
    step_count: Mapped[int] = mapped_column(Integer, default=0)  # completed steps
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_u: Mapped[int] = mapped_column(BigInteger, default=0)  # micro-USD at the price sheet's list prices
    token_budget: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cost_budget_u: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    attachments_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    # the JSON Schema its final answer must meet, over its agent's output_schema (a plan task's artifact schema)
    output_schema_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    model_override: Mapped[str | None] = mapped_column(String(255), nullable=True)  # over its agent's model
    # the run whose ask_agent call started this one (agent-as-tool); no foreign key, like a plan task's run id
    parent_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class StepRow(Base):
    """One model call (kind "model") or one compaction ("compaction"); tool calls hang off model steps."""

    __tablename__ = "steps"
    __table_args__ = (UniqueConstraint("run_id", "seq"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="started")  # started | completed | failed
    input_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    output_json: Mapped[str | None] = mapped_column(Text, nullable=True)  # assistant message / summary
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_u: Mapped[int] = mapped_column(BigInteger, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class ToolCallRow(Base):
    __tablename__ = "tool_calls"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # the model's call id, made unique per run
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    step_id: Mapped[str] = mapped_column(ForeignKey("steps.id"))
    ordinal: Mapped[int] = mapped_column(Integer)  # position within its step
    name: Mapped[str] = mapped_column(String(128))
    arguments_json: Mapped[str] = mapped_column(Text)
    idempotency_key: Mapped[str] = mapped_column(String(128), unique=True)
    # pending | waiting_approval | running | completed | failed | rejected | cancelled
    status: Mapped[str] = mapped_column(String(24), default="pending")
    result_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class InterruptRow(Base):
    __tablename__ = "interrupts"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    tool_call_id: Mapped[str | None] = mapped_column(ForeignKey("tool_calls.id"), nullable=True)
    kind: Mapped[str] = mapped_column(String(24))  # approval | in_flight (a non-idempotent call cut by a crash)
    # pending | approved | rejected | edited | expired
    status: Mapped[str] = mapped_column(String(16), default="pending")
    arguments_json: Mapped[str | None] = mapped_column(Text, nullable=True)  # edited arguments
    actor: Mapped[str | None] = mapped_column(String(128), nullable=True)
    comment: Mapped[str | None] = mapped_column(Text, nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    expiry_decision: Mapped[str] = mapped_column(String(16), default="reject")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class EventRow(Base):
    """Append-only stream of what happened; `id` is the SSE event id (Last-Event-ID resumes after it)."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    type: Mapped[str] = mapped_column(String(48))
    data_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ArtifactRow(Base):
    __tablename__ = "artifacts"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    mime: Mapped[str] = mapped_column(String(128))
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(String(512))  # relative to data_dir
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AuditRow(Base):
    """Hash-chained per run: hash = sha256(prev_hash + canonical JSON of the entry); an edit breaks the chain."""

    __tablename__ = "audit_log"
    __table_args__ = (UniqueConstraint("run_id", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    payload_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(String(40))  # ISO text, hashed as written
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
