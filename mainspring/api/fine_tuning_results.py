"""A fine-tuning job's result file (OpenAI's `result_files`): a CSV of its per-step metrics, kept in the Files
store (`files` rows, content under `data_dir/files/`) like a batch's output file.

One file per job under a deterministic id, rewritten in place as the job goes (the runner calls `write` after
every checkpoint and before the job succeeds), so `result_files` names the same id throughout. The rows come
from the job's step events in the database, not from the run folder: they are what the API already showed,
they survive a restart, and a step redone after a crash appears once (the newest report of it wins).

Like every file, it belongs to the key that created the job (the Files API's ownership is per key):
another project's keys get a 404 for it, as for the job.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from typing import Any, BinaryIO, Iterable

from sqlalchemy import select
from sqlalchemy.engine import Engine

from mainspring.api.routes.files import write_atomic
from mainspring.config import Settings
from mainspring.store.db import session
from mainspring.store.tables import FileRow, FineTuningEventRow, FineTuningJobRow

PURPOSE = "fine-tune-results"
FILENAME = "step_metrics.csv"
# the trainer's names -> the CSV's (OpenAI's result files say train_loss; reward is ours)
RENAMED = {"reward": "train_reward_mean", "loss": "train_loss"}
LEADING = ("kl", "entropy", "tokens")  # after step, rewards and loss; the other metrics follow by name
SKIPPED = ("step", "total_steps")


def file_id(job_id: str) -> str:
    """The job's result file id: the same on every rewrite and after a restart (the batch runner's scheme)."""
    return "file-" + hashlib.sha256(f"{job_id}:results".encode()).hexdigest()[:24]


def existing(s: Any, job_ids: Iterable[str]) -> set[str]:
    """The result file ids, of those jobs', that exist (a job has one from its first checkpoint on)."""
    ids = [file_id(j) for j in job_ids]
    return set(s.scalars(select(FileRow.id).where(FileRow.id.in_(ids)))) if ids else set()


def step_rows(s: Any, job_id: str) -> list[dict[str, float]]:
    """Each step's metrics, by step; a step reported twice (redone after a restart) keeps its last report."""
    events = s.scalars(select(FineTuningEventRow.data_json).where(FineTuningEventRow.job_id == job_id,
                                                                 FineTuningEventRow.type == "metrics")
                       .order_by(FineTuningEventRow.id))
    by_step: dict[int, dict[str, float]] = {}
    for raw in events:
        data = json.loads(raw) if raw else {}
        step = data.get("step")  # an int, or the trainer's own float copy of it
        if "total_steps" in data and isinstance(step, (int, float)):  # a step, not an evaluation
            by_step[int(step)] = data
    return [by_step[k] for k in sorted(by_step)]


def _column(key: str) -> str:
    if key.startswith("reward_"):
        return "train_" + key  # reward_<domain> -> train_reward_<domain>
    return RENAMED.get(key, key)


def _cell(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return ""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def render(rows: list[dict[str, Any]]) -> bytes:
    keys = {k for r in rows for k in r if k not in SKIPPED}
    domains = sorted(k for k in keys if k.startswith("reward_"))
    head = [k for k in ("reward", *domains, "loss", *LEADING) if k in keys]
    order = head + sorted(keys - set(head))
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["step", *(_column(k) for k in order)])
    for r in rows:
        w.writerow([_cell(r["step"]), *(_cell(r.get(k)) for k in order)])
    return out.getvalue().encode()


def write(db: Engine, settings: Settings, job_id: str) -> str | None:
    """Write (or rewrite) the job's result file; its id, or None before the job's first step."""
    with session(db, readonly=True) as s:
        job = s.get(FineTuningJobRow, job_id)
        rows = step_rows(s, job_id) if job is not None else []
    if job is None or not rows:
        return None
    content = render(rows)
    fid = file_id(job_id)
    rel = f"files/{fid}"

    def put(fh: BinaryIO) -> None:
        fh.write(content)

    # content first, then the row (the Files store's order): a row always points at a whole file
    size, sha = write_atomic(settings.data_dir / rel, put)
    with session(db) as s:
        row = s.get(FileRow, fid)
        if row is None:  # the first write, or the caller deleted the file: it comes back with the next one
            s.add(FileRow(id=fid, purpose=PURPOSE, filename=FILENAME, bytes=size, sha256=sha, path=rel,
                          api_key_id=job.api_key_id))
        else:
            row.bytes, row.sha256 = size, sha
    return fid
