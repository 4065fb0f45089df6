"""SQLAlchemy 2.0 models: keys, projects, price sheets, the ledger, budgets, reservations, files, batches, fine-tuning.

Money is integer micro-USD (`*_u` columns, 1 USD = 1_000_000) so sums are exact on every backend.
Times are UTC. The migration in `migrations/versions/` is the schema's source of truth for the
database; `tests/store/test_db.py` checks these models and the migrations agree.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from mainspring.store.base import Base, UTCDateTime, utcnow


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # the project's data policy (mainspring/store/data_policy.py, docs/data-policy.md)
    training_allowed: Mapped[bool] = mapped_column(Boolean, default=True)  # False: never trained or exported on
    local_only: Mapped[bool] = mapped_column(Boolean, default=False)  # True: no upstream model gets its data
    retention_days: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: stored data is kept


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # "key_<hex>", safe to show
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    prefix: Mapped[str] = mapped_column(String(96), index=True)  # start of the secret, for display + lookup
    hashed_secret: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the whole secret
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    rpm_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None = Settings default
    tpm_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)


class PriceSheetRow(Base):
    """Every sheet ever used, by version: ledger rows point here, history is never rewritten."""

    __tablename__ = "price_sheets"

    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    body_json: Mapped[str] = mapped_column(Text)
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class LedgerEntry(Base):
    """One priced request (or a reversal of one). Append-only: triggers reject UPDATE and DELETE."""

    __tablename__ = "ledger_entries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    request_id: Mapped[str] = mapped_column(String(128), unique=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(128), nullable=True)
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True, index=True)
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True, index=True)
    model: Mapped[str] = mapped_column(String(128))
    tier: Mapped[str] = mapped_column(String(16))
    endpoint: Mapped[str] = mapped_column(String(64))
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    batch_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    custom_id: Mapped[str | None] = mapped_column(String(128), nullable=True)

    tokens_input_uncached: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens_cache_read: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens_cache_write: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens_output: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens_reasoning: Mapped[int] = mapped_column(BigInteger, default=0)  # part of tokens_output

    cost_input_u: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_cache_read_u: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_cache_write_u: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_output_u: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_total_u: Mapped[int] = mapped_column(BigInteger, default=0)

    price_sheet_version: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(24), default="ok")
    finish_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # unique: an entry is reversed at most once
    reverses_entry_id: Mapped[int | None] = mapped_column(ForeignKey("ledger_entries.id"), nullable=True, unique=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class Budget(Base):
    __tablename__ = "budgets"
    __table_args__ = (UniqueConstraint("scope", "scope_id", "period", name="uq_budgets_scope_period"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scope: Mapped[str] = mapped_column(String(16))  # "key" | "project"
    scope_id: Mapped[str] = mapped_column(String(64))  # api_keys.id, or str(projects.id)
    period: Mapped[str] = mapped_column(String(16))  # "day" | "month" | "total"
    hard_limit_u: Mapped[int] = mapped_column(BigInteger)
    soft_limit_u: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Reservation(Base):
    """Worst-case money held for a request in flight; counts against the budget until settled or expired."""

    __tablename__ = "reservations"
    __table_args__ = (
        UniqueConstraint("request_id", "budget_id", name="uq_reservations_request_budget"),
        Index("ix_reservations_open", "budget_id", "settled", "expires_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(128), index=True)
    budget_id: Mapped[int] = mapped_column(ForeignKey("budgets.id"))
    reserved_u: Mapped[int] = mapped_column(BigInteger)
    settled: Mapped[bool] = mapped_column(Boolean, default=False)
    settled_u: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class FileRow(Base):
    """An uploaded file (OpenAI Files API). Content lives on disk at `data_dir / path`, not in the
    database: batch inputs reach 200 MB and would bloat the SQLite file and its WAL."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "file-<hex>"
    purpose: Mapped[str] = mapped_column(String(32))  # "batch" | "batch_output" | ...
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    path: Mapped[str] = mapped_column(String(512))  # relative to data_dir, e.g. "files/file-abc"
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class BatchRow(Base):
    """A batch job (OpenAI Batch API); statuses and timestamps follow OpenAI's Batch object."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "batch_<hex>"
    input_file_id: Mapped[str] = mapped_column(ForeignKey("files.id"))
    endpoint: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="validating", index=True)
    completion_window: Mapped[str] = mapped_column(String(16), default="24h")
    metadata_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    errors_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    output_file_id: Mapped[str | None] = mapped_column(ForeignKey("files.id"), nullable=True)
    error_file_id: Mapped[str | None] = mapped_column(ForeignKey("files.id"), nullable=True)
    request_counts_total: Mapped[int] = mapped_column(Integer, default=0)
    request_counts_completed: Mapped[int] = mapped_column(Integer, default=0)
    request_counts_failed: Mapped[int] = mapped_column(Integer, default=0)
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class FineTuningJobRow(Base):
    """A fine-tuning job (OpenAI's fine_tuning.job); statuses follow OpenAI's. It belongs to the project of the
    key that created it (anonymous callers: project None). Data files are referenced by id, not by foreign key:
    deleting a file after the job has read it is allowed, as on OpenAI."""

    __tablename__ = "fine_tuning_jobs"
    __table_args__ = (Index("ix_fine_tuning_jobs_project_created", "project_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "ftjob-<hex>"
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True)
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True)
    model: Mapped[str] = mapped_column(String(255))  # the base model, as served
    training_file: Mapped[str] = mapped_column(String(64))
    validation_file: Mapped[str | None] = mapped_column(String(64), nullable=True)
    suffix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    seed: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(24), default="queued", index=True)
    # {"type": "reinforcement", "reinforcement": {grader, hyperparameters}}
    method_json: Mapped[str] = mapped_column(Text)
    config_json: Mapped[str] = mapped_column(Text)  # the TrainConfig the runner runs (the same one on every resume)
    metadata_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    fine_tuned_model: Mapped[str | None] = mapped_column(String(255), nullable=True, unique=True)
    trained_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    error_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # runner starts (1 + resumes after restarts)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    estimated_finish: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class FineTuningEventRow(Base):
    """What a job reported, in order (OpenAI's fine_tuning.job.event); the integer id orders and pages them."""

    __tablename__ = "fine_tuning_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tuning_jobs.id"), index=True)
    level: Mapped[str] = mapped_column(String(8), default="info")  # info | warn | error
    type: Mapped[str] = mapped_column(String(16), default="message")  # message | metrics
    message: Mapped[str] = mapped_column(Text)
    data_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class FineTuningCheckpointRow(Base):
    """A checkpoint the trainer wrote (OpenAI's fine_tuning.job.checkpoint); one per step, so a resumed run
    that writes the same step again updates it instead of adding a second."""

    __tablename__ = "fine_tuning_checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step_number", name="uq_fine_tuning_checkpoints_job_step"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "ftckpt_<hex>"
    job_id: Mapped[str] = mapped_column(ForeignKey("fine_tuning_jobs.id"), index=True)
    step_number: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(512))  # the trainer's checkpoint folder, relative to data_dir
    metrics_json: Mapped[str] = mapped_column(Text, default="{}")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ResponseRow(Base):
    """A stored response of the Responses API (POST /v1/responses with store, OpenAI's default). It belongs to
    the project of the key that created it (anonymous callers: project None). `input_json` holds every input
    item the model saw, earlier turns of a previous_response_id chain included, so a response can be continued
    even after its predecessors are deleted. previous_response_id is no foreign key for that reason."""

    __tablename__ = "responses"
    __table_args__ = (Index("ix_responses_project_created", "project_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "resp_<hex>"
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True)
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True)
    model: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(24))  # completed | incomplete
    previous_response_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    request_json: Mapped[str] = mapped_column(Text)  # the response object's echo of the request (tools, text, ...)
    input_json: Mapped[str] = mapped_column(Text)  # input items, with ids
    output_json: Mapped[str] = mapped_column(Text)  # output items
    usage_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class SceneThreadRow(Base):
    """A design thread of the 3D scenario (POST /v1/scenes/threads): a multi-turn conversation over one scene,
    stored between turns as its dialogue state (scenarios/scene3d/dialogue.py `DesignThread.to_state`). It
    belongs to the project of the key that opened it (anonymous callers: project None). `version` grows with
    every turn written: a turn is saved only over the version it started from, so two turns at once never
    lose one's update."""

    __tablename__ = "scene_threads"
    __table_args__ = (Index("ix_scene_threads_project_created", "project_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "sth_<hex>"
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"), nullable=True)
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"), nullable=True)
    model: Mapped[str] = mapped_column(String(255))  # the name asked for, resolved again on every turn
    state_json: Mapped[str] = mapped_column(Text)
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
