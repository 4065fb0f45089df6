"""The fine-tuning jobs' rows, as the runner and the routes change them: statuses, events, checkpoints.

Every status change is conditional on the status it comes from (`move`), so a cancel that lands while
the runner finishes a job is never overwritten, and the runner never resurrects a cancelled job.

`paused` is a job the runner leaves alone (it is not PENDING, so not even a restart picks it up) until a
resume puts it back to `queued`; its run folder keeps the checkpoint the trainer wrote when it stopped.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, cast

from sqlalchemy import func, select, update
from sqlalchemy.engine import CursorResult, Engine
from sqlalchemy.orm import Session

from mainspring.store.db import session
from mainspring.store.tables import FineTuningCheckpointRow, FineTuningEventRow, FineTuningJobRow
from mainspring.store.ids import new_id

STATUSES = ("validating_files", "queued", "running", "paused", "succeeded", "failed", "cancelled")
PENDING = ("validating_files", "queued", "running")  # the runner has work to do (running: resume after a restart)
CANCELLABLE = PENDING + ("paused",)
TERMINAL = ("succeeded", "failed", "cancelled")
DOMAIN = "job"  # the one domain of a job's run


def now() -> datetime:
    return datetime.now(timezone.utc)


def model_name(base: str, suffix: str | None, job_id: str) -> str:
    """OpenAI's shape, ft:<base>:<suffix>:<id>; the id part is the job's, so a model names its job."""
    return f"ft:{base}:{suffix or ''}:{job_id}"


def add_event(s: Session, job_id: str, message: str, *, level: str = "info", type: str = "message",
              data: dict[str, Any] | None = None) -> None:
    s.add(FineTuningEventRow(job_id=job_id, level=level, type=type, message=message, created_at=now(),
                             data_json=json.dumps(data, default=str) if data is not None else None))


def event(db: Engine, job_id: str, message: str, **kw: Any) -> None:
    with session(db) as s:
        add_event(s, job_id, message, **kw)


def move(db: Engine, job_id: str, from_: tuple[str, ...], to: str, *, message: str | tuple[str, ...] | None = None,
         level: str = "info", **values: Any) -> bool:
    """status from_ -> to with `values`, and the events saying so, in one transaction (a reader who sees the
    new status sees its events); False, and nothing written, if the job was not in from_."""
    with session(db) as s:
        # an UPDATE returns a CursorResult (with rowcount); Session.execute is typed as the general Result
        res = cast(CursorResult, s.execute(update(FineTuningJobRow).where(FineTuningJobRow.id == job_id,
                                                                          FineTuningJobRow.status.in_(from_))
                                           .values(status=to, **values)))
        if res.rowcount != 1:
            return False
        for text in (message,) if isinstance(message, str) else message or ():
            add_event(s, job_id, text, level=level)
        return True


def fail(db: Engine, job_id: str, code: str, message: str, param: str | None = None) -> bool:
    error = {"code": code, "message": message, "param": param}
    return move(db, job_id, PENDING, "failed", message=f"Fine-tuning job failed: {message}", level="error",
                error_json=json.dumps(error), finished_at=now(), estimated_finish=None)


def save_checkpoint(db: Engine, job_id: str, step: int, path: str, metrics: dict[str, Any]) -> None:
    """One checkpoint per step: a resumed run that writes step n again updates the row it had."""
    with session(db) as s:
        row = s.scalar(select(FineTuningCheckpointRow).where(FineTuningCheckpointRow.job_id == job_id,
                                                             FineTuningCheckpointRow.step_number == step))
        if row is None:
            s.add(FineTuningCheckpointRow(id=new_id("ftckpt_"), job_id=job_id, step_number=step,
                                          path=path, metrics_json=json.dumps(metrics), created_at=now()))
        else:
            row.path, row.metrics_json, row.created_at = path, json.dumps(metrics), now()
        add_event(s, job_id, f"Checkpoint created at step {step}", data={"step": step})


def checkpoints(db: Engine, job_id: str) -> list[FineTuningCheckpointRow]:
    with session(db, readonly=True) as s:
        return list(s.scalars(select(FineTuningCheckpointRow).where(FineTuningCheckpointRow.job_id == job_id)
                              .order_by(FineTuningCheckpointRow.step_number)))


def load(db: Engine, job_id: str) -> FineTuningJobRow | None:
    with session(db, readonly=True) as s:
        return s.get(FineTuningJobRow, job_id)


def add_progress(db: Engine, job_id: str, tokens: int, estimated_finish: datetime | None) -> None:
    values: dict[str, Any] = {"estimated_finish": estimated_finish}
    if tokens:
        values["trained_tokens"] = func.coalesce(FineTuningJobRow.trained_tokens, 0) + tokens
    with session(db) as s:
        s.execute(update(FineTuningJobRow).where(FineTuningJobRow.id == job_id).values(**values))
