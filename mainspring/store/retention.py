"""The retention sweeper: a project's stored prompts and outputs older than its `retention_days` are deleted.

What is swept, for each project whose policy sets `retention_days` (mainspring/store/data_policy.py):

* `responses` (the Responses API's stored input and output items),
* `scene_threads` (the 3D design dialogue's stored conversations) not written to since the cutoff,
* `batches` that have finished (completed, failed, expired, cancelled), their rows only,
* `files` (uploads, batch input/output/error files, fine-tuning files) and their content on disk, except a file
  that a batch still kept references, or that a fine-tuning job still queued, running or paused reads.

What stays: the ledger, usage, budgets and the audit trail (books and records, which hold counts and costs, not
text), fine-tuning jobs and their events, and every other project's rows. Agent run journals (steps, tool calls)
are not swept here: they are the audit trail's evidence, and the runtime above this layer owns them.

Each pass deletes at most `limit` rows per table per project (a backlog clears over several passes, and no pass
holds the database's one writer for long); the counts are logged and returned.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import delete, or_, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from mainspring.store.db import session
from mainspring.store.tables import ApiKey, BatchRow, FileRow, FineTuningJobRow, Project, ResponseRow, SceneThreadRow

log = logging.getLogger(__name__)

BATCH_DONE = ("completed", "failed", "expired", "cancelled")
JOB_READING = ("validating_files", "queued", "running", "paused")  # a resumed job reads its files again
DEFAULT_LIMIT = 1000


@dataclass
class ProjectSweep:
    project: str
    retention_days: int
    cutoff: datetime
    responses: int = 0
    batches: int = 0
    files: int = 0
    scene_threads: int = 0
    file_paths: list[str] = field(default_factory=list)  # relative to data_dir, deleted after the commit

    @property
    def total(self) -> int:
        return self.responses + self.batches + self.files + self.scene_threads


def _old_responses(s: Session, project_id: int, cutoff: datetime, limit: int) -> list[str]:
    return list(s.scalars(select(ResponseRow.id).where(ResponseRow.project_id == project_id,
                                                       ResponseRow.created_at < cutoff).limit(limit)))


def _old_scene_threads(s: Session, project_id: int, cutoff: datetime, limit: int) -> list[str]:
    # a thread still being talked to is not old: its last turn counts, not its first
    return list(s.scalars(select(SceneThreadRow.id).where(SceneThreadRow.project_id == project_id,
                                                          SceneThreadRow.updated_at < cutoff).limit(limit)))


def _project_keys(project_id: int):
    return select(ApiKey.id).where(ApiKey.project_id == project_id).scalar_subquery()


def _old_batches(s: Session, project_id: int, cutoff: datetime, limit: int) -> list[str]:
    return list(s.scalars(select(BatchRow.id).where(BatchRow.api_key_id.in_(_project_keys(project_id)),
                                                    BatchRow.created_at < cutoff,
                                                    BatchRow.status.in_(BATCH_DONE)).limit(limit)))


def _old_files(s: Session, project_id: int, cutoff: datetime, limit: int, dropped_batches: set[str]) -> list[FileRow]:
    """The project's files older than `cutoff` that nothing kept still reads (a batch not swept in this pass, a
    fine-tuning job that may run again); those wait for a later pass."""
    q = select(FileRow).where(FileRow.api_key_id.in_(_project_keys(project_id)), FileRow.created_at < cutoff)
    candidates = list(s.scalars(q.order_by(FileRow.created_at).limit(limit)))
    ids = [f.id for f in candidates]
    if not ids:
        return []
    in_use: set[str] = set()
    refs = select(BatchRow).where(or_(BatchRow.input_file_id.in_(ids), BatchRow.output_file_id.in_(ids),
                                      BatchRow.error_file_id.in_(ids)))
    for b in s.scalars(refs):
        if b.id not in dropped_batches:
            in_use.update(f for f in (b.input_file_id, b.output_file_id, b.error_file_id) if f)
    jobs = select(FineTuningJobRow).where(FineTuningJobRow.status.in_(JOB_READING),
                                          or_(FineTuningJobRow.training_file.in_(ids),
                                              FineTuningJobRow.validation_file.in_(ids)))
    for j in s.scalars(jobs):
        in_use.update(f for f in (j.training_file, j.validation_file) if f)
    return [f for f in candidates if f.id not in in_use]


def _sweep_project(s: Session, project: Project, now: datetime, limit: int, dry_run: bool) -> ProjectSweep:
    days = project.retention_days
    assert days is not None
    out = ProjectSweep(project.name, days, now - timedelta(days=days))
    responses = _old_responses(s, project.id, out.cutoff, limit)
    batches = _old_batches(s, project.id, out.cutoff, limit)
    files = _old_files(s, project.id, out.cutoff, limit, set(batches))
    threads = _old_scene_threads(s, project.id, out.cutoff, limit)
    out.responses, out.batches, out.files = len(responses), len(batches), len(files)
    out.scene_threads = len(threads)
    out.file_paths = [f.path for f in files]
    if not dry_run:
        if responses:
            s.execute(delete(ResponseRow).where(ResponseRow.id.in_(responses)))
        if batches:
            s.execute(delete(BatchRow).where(BatchRow.id.in_(batches)))
        if files:
            s.execute(delete(FileRow).where(FileRow.id.in_([f.id for f in files])))
        if threads:
            s.execute(delete(SceneThreadRow).where(SceneThreadRow.id.in_(threads)))
    return out


def sweep(db: Engine | str, data_dir: Path, *, project: str | None = None, dry_run: bool = False,
          limit: int = DEFAULT_LIMIT, now: datetime | None = None) -> list[ProjectSweep]:
    """One pass over every project with a retention setting (or only `project`); what was (or, with `dry_run`,
    would be) deleted, per project. File contents go after the rows' commit: a crash between the two leaves an
    orphan file on disk, never a row whose content is missing."""
    now = now or datetime.now(timezone.utc)
    results: list[ProjectSweep] = []
    with session(db, readonly=dry_run) as s:
        q = select(Project).where(Project.retention_days.is_not(None))
        if project is not None:
            q = q.where(Project.name == project)
        for p in s.scalars(q.order_by(Project.id)):
            results.append(_sweep_project(s, p, now, limit, dry_run))
    for r in results:
        if not dry_run:
            for rel in r.file_paths:
                (data_dir / rel).unlink(missing_ok=True)
        if r.total:
            log.info("retention%s: project %s (%d days): %d responses, %d batches, %d files, %d scene threads "
                     "older than %s", " (dry run)" if dry_run else "", r.project, r.retention_days, r.responses,
                     r.batches, r.files, r.scene_threads, r.cutoff.isoformat(timespec="seconds"))
    return results
