"""Durable plan state: plans, their tasks (one row per TaskSpec, plus one per fan-out item), the plan event
stream, and the leader lease of the one plan scheduler per deployment.

A plan survives a crash because every transition (plans/store.py, rules in plans/transitions.py) is one
transaction over these rows that also appends its plan_events. Mapped on the store's Base, collected for
Alembic by mainspring/schema.py, migrated by 0006_plans.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mainspring.agents import tables as _agent_tables  # noqa: F401  (the runs plan tasks refer to)
from mainspring.store.base import Base, UTCDateTime, utcnow


class PlanStatus(StrEnum):
    AWAITING_APPROVAL = "awaiting_approval"  # approve_plan: no task starts before a human approves
    RUNNING = "running"
    PAUSED = "paused"  # nothing new is dispatched; tasks in flight finish and are recorded
    SUCCEEDED = "succeeded"  # every task succeeded or was skipped
    FAILED = "failed"  # a task failed (on_failure "fail" at once; otherwise once nothing else can run)
    CANCELLED = "cancelled"


PLAN_TERMINAL = frozenset({PlanStatus.SUCCEEDED, PlanStatus.FAILED, PlanStatus.CANCELLED})


class TaskStatus(StrEnum):
    WAITING = "waiting"  # for its dependencies
    READY = "ready"  # the scheduler may dispatch it
    DISPATCHED = "dispatched"  # a run was created for it (run_id)
    RUNNING = "running"  # its run started; a fan-out task: its items are being worked on
    AWAITING_APPROVAL = "awaiting_approval"  # requires_approval: dependencies done, a human decides
    PREEMPTED = "preempted"  # its run paused at a step boundary for a higher-priority task; resumed later
    REPLANNING = "replanning"  # on_failure "replan": the planner model revises it (plans/replan.py), then ready
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"  # on_failure "skip": dependents go on with the artifact null
    CANCELLED = "cancelled"  # the plan ended first, or an upstream task failed


TASK_TERMINAL = frozenset({TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.SKIPPED, TaskStatus.CANCELLED})
TASK_DONE = frozenset({TaskStatus.SUCCEEDED, TaskStatus.SKIPPED})  # what lets dependents go on
# what has no run going: ending the plan (or the fan-out a failed item belongs to) cancels it
NOT_STARTED = frozenset({TaskStatus.WAITING, TaskStatus.READY, TaskStatus.AWAITING_APPROVAL, TaskStatus.REPLANNING})


class PlanRow(Base):
    __tablename__ = "plans"
    __table_args__ = (Index("ix_plans_project_created", "project_id", "created_at"),
                      Index("ix_plans_status_priority", "status", "priority"))

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "plan_<hex>"
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True)  # None: anonymous
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True)  # its runs charge it
    name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    goal: Mapped[str] = mapped_column(Text)
    spec_json: Mapped[str] = mapped_column(Text)  # the PlanSpec as accepted, never changed
    status: Mapped[str] = mapped_column(String(24), default=PlanStatus.RUNNING.value)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    token_budget: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cost_budget_u: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # micro-USD
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)  # rolled up from the tasks' runs
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_u: Mapped[int] = mapped_column(BigInteger, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class PlanTaskRow(Base):
    """One TaskSpec of a plan, or one item of a fan-out task ("key[3]", created when the list it maps over is
    known). `priority` is the plan's priority * 1000 + the task's (|task priority| <= 499), so one ORDER BY ranks
    tasks across plans, plan priority first. `input_json` is the canonical JSON of what the run was given at
    dispatch (goal, prompt, item; an item's own {"item": …} from its creation until then) and `input_hashes_json`
    the sha256 of each upstream artifact it read, by task key (the artifacts themselves stay in their own rows,
    which never change once succeeded)."""

    __tablename__ = "plan_tasks"
    __table_args__ = (UniqueConstraint("plan_id", "key"),
                      Index("ix_plan_tasks_status_priority", "status", "priority"),
                      Index("ix_plan_tasks_plan_status", "plan_id", "status"))

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "ptask_<hex>"
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id"))
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True)  # the plan's
    key: Mapped[str] = mapped_column(String(96))  # the TaskSpec id; a fan-out item "key[3]"
    spec_key: Mapped[str] = mapped_column(String(64))  # the TaskSpec id, items included
    item_index: Mapped[int | None] = mapped_column(Integer, nullable=True)  # a fan-out item's place in the list
    status: Mapped[str] = mapped_column(String(24), default=TaskStatus.WAITING.value)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    attempt: Mapped[int] = mapped_column(Integer, default=1)  # 1 on the first run; retries add one
    # the current attempt's run; no foreign key: the id is written down before the run is created (scheduler.py)
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    input_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    input_hashes_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    artifact_json: Mapped[str | None] = mapped_column(Text, nullable=True)  # canonical JSON (spec.artifact_bytes)
    artifact_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # the agent the task is with after a handoff (None: its TaskSpec's), and how many handoffs it has had
    agent_override: Mapped[str | None] = mapped_column(String(100), nullable=True)
    handoffs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # 0009 added it to old rows
    # the planner's revision of the task's prompt after a failure (replan.py; None: its TaskSpec's), and how many
    # revisions it has had; the revised agent goes in agent_override
    prompt_override: Mapped[str | None] = mapped_column(Text, nullable=True)
    replans: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # 0010 added it to old rows
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    dispatched_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class PlanEventRow(Base):
    """Append-only per plan; `seq` counts from 1 in each plan, so a follower resumes with after=seq."""

    __tablename__ = "plan_events"
    __table_args__ = (UniqueConstraint("plan_id", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id"))
    seq: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(64))  # plan.created, task.ready, task.dispatched, ...
    task_key: Mapped[str | None] = mapped_column(String(96), nullable=True)
    data_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class PlanMessageRow(Base):
    """A message from one task's agent to another's in the same plan (send_message). `taken_by_call` is the
    wait_for_message call that received it: a call re-run after a crash receives the same message again."""

    __tablename__ = "plan_messages"
    __table_args__ = (Index("ix_plan_messages_inbox", "plan_id", "to_task", "from_task"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id"))
    from_task: Mapped[str] = mapped_column(String(96))
    to_task: Mapped[str] = mapped_column(String(96))
    body: Mapped[str] = mapped_column(Text)
    sent_by_call: Mapped[str] = mapped_column(String(64), unique=True)  # a re-run send is not sent twice
    taken_by_call: Mapped[str | None] = mapped_column(String(64), nullable=True, unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class PlanWaitRow(Base):
    """One task waiting on another (wait_for_message): the edges of the plan's wait-for graph while open
    (`ended_at` None). The waiting tool call reads `outcome` back: received, timed_out, target_ended, deadlock,
    released."""

    __tablename__ = "plan_waits"
    __table_args__ = (Index("ix_plan_waits_open", "ended_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id"))
    call_id: Mapped[str] = mapped_column(String(64), unique=True)  # the waiting tool call: one wait per call
    waiter: Mapped[str] = mapped_column(String(96))  # task key
    target: Mapped[str] = mapped_column(String(96))  # task key
    run_id: Mapped[str] = mapped_column(String(64))  # the waiter's run
    since: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    deadline_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(24), nullable=True)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)


class DeadlockRow(Base):
    """A wait-for cycle (kind "deadlock") or a task handed back and forth past its plan's max_handoffs (kind
    "livelock"), as detected, and how it was resolved: `status` open (a human decides: deadlock_policy
    ask_human) or resolved, `victim` the task failed or released."""

    __tablename__ = "deadlocks"
    __table_args__ = (Index("ix_deadlocks_project_detected", "project_id", "detected_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "dl_<hex>"
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id"))
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True)
    kind: Mapped[str] = mapped_column(String(16))  # deadlock | livelock
    cycle_json: Mapped[str] = mapped_column(Text)  # task keys, the first repeated last: ["a", "b", "c", "a"]
    wait_ids_json: Mapped[str] = mapped_column(Text)  # the open waits that formed it (a cycle is reported once)
    policy: Mapped[str] = mapped_column(String(24))
    status: Mapped[str] = mapped_column(String(16))
    victim: Mapped[str | None] = mapped_column(String(96), nullable=True)
    resolution: Mapped[str | None] = mapped_column(Text, nullable=True)
    detected_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class LeaderLeaseRow(Base):
    """Who is the one scheduler ("plan-scheduler") until `expires_at`; `term` grows on every change of owner,
    so a deposed leader's late writes can be told apart."""

    __tablename__ = "leader_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128))  # host:pid:nonce, as agents.leases
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    acquired_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    term: Mapped[int] = mapped_column(Integer, default=1)
