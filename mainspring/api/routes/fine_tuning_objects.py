"""What the fine-tuning routes share: the OpenAI objects (job, event, checkpoint) and who may see a job.

A job belongs to its creator's project: any key of the project sees it, another project's key gets a 404
as if it did not exist.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from sqlalchemy import select

from mainspring.api import fine_tuning_results
from mainspring.api.errors import APIError
from mainspring.store.tables import FineTuningCheckpointRow, FineTuningEventRow, FineTuningJobRow
from mainspring.train import job_store


# ---- objects -----------------------------------------------------------------------------------------------
def _ts(t) -> int | None:
    return None if t is None else int(t.timestamp())


def _org(project_id: int | None) -> str:
    return f"project-{project_id}" if project_id is not None else "anonymous"


def job_object(row: FineTuningJobRow, result_files: list[str]) -> dict[str, Any]:
    method = json.loads(row.method_json)
    hp = method["reinforcement"]["hyperparameters"]
    return {
        "id": row.id, "object": "fine_tuning.job", "created_at": _ts(row.created_at), "model": row.model,
        "status": row.status, "fine_tuned_model": row.fine_tuned_model, "finished_at": _ts(row.finished_at),
        "error": json.loads(row.error_json) if row.error_json else None, "organization_id": _org(row.project_id),
        "hyperparameters": {k: hp[k] for k in ("batch_size", "learning_rate_multiplier", "n_epochs")},
        "method": method, "result_files": result_files, "seed": row.seed, "trained_tokens": row.trained_tokens,
        "training_file": row.training_file, "validation_file": row.validation_file,
        "estimated_finish": _ts(row.estimated_finish), "integrations": [],
        "metadata": json.loads(row.metadata_json) if row.metadata_json else None,
        "user_provided_suffix": row.suffix,
    }


def job_objects(s: Any, rows: list[FineTuningJobRow]) -> list[dict[str, Any]]:
    """The rows as job objects, each with its result file once the runner has written one (one query)."""
    have = fine_tuning_results.existing(s, [r.id for r in rows])
    return [job_object(r, [f for f in (fine_tuning_results.file_id(r.id),) if f in have]) for r in rows]


def event_object(row: FineTuningEventRow) -> dict[str, Any]:
    return {"id": f"ftevent-{row.id}", "object": "fine_tuning.job.event", "created_at": _ts(row.created_at),
            "level": row.level, "message": row.message, "type": row.type,
            "data": json.loads(row.data_json) if row.data_json else {}}


def checkpoint_object(row: FineTuningCheckpointRow, job: FineTuningJobRow) -> dict[str, Any]:
    name = job_store.model_name(job.model, job.suffix, job.id)
    return {"id": row.id, "object": "fine_tuning.job.checkpoint", "created_at": _ts(row.created_at),
            "fine_tuned_model_checkpoint": f"{name}:ckpt-step-{row.step_number}", "fine_tuning_job_id": job.id,
            "step_number": row.step_number, "metrics": json.loads(row.metrics_json)}


# ---- ownership -------------------------------------------------------------------------------------------
def project_of(principal: Any) -> int | None:
    return principal.project_id if principal is not None else None


def visible(principal: Any):
    pid = project_of(principal)
    return FineTuningJobRow.project_id == pid if pid is not None else FineTuningJobRow.project_id.is_(None)


def not_found(job_id: str) -> APIError:
    return APIError(404, f"No such fine-tuning job: {job_id}", param="fine_tuning_job_id",
                    code="fine_tuning_job_not_found")


def get_owned(s: Any, job_id: str, principal: Any) -> FineTuningJobRow:
    row = s.scalar(select(FineTuningJobRow).where(FineTuningJobRow.id == job_id, visible(principal)))
    if row is None:
        raise not_found(job_id)
    return row


def db(request: Request):
    return request.app.state.economics.db


def wake(request: Request) -> None:
    runner = getattr(request.app.state, "fine_tuning", None)
    if runner is not None:
        runner.notify()
