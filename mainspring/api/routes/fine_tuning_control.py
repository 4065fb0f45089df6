"""Cancel, pause and resume a fine-tuning job (OpenAI's /v1/fine_tuning/jobs/{id}/cancel|pause|resume).

Each is a conditional status change (job_store.move) the runner reads between two steps: cancel and pause
stop the trainer at the next step boundary, after it has checkpointed. A paused job waits (a restart does
not pick it up) until resume queues it again; the runner then continues it from its newest checkpoint.
Cancel and pause of a job already in that state answer the job as it is, like OpenAI's cancel; a change the
job's state does not allow is a 400 naming that state.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import case

from mainspring.api.errors import bad_request
from mainspring.api.project_policy import training_refusal
from mainspring.api.routes.fine_tuning_objects import db, get_owned, job_objects, not_found, wake
from mainspring.store.data_policy import get_policy
from mainspring.store.db import session
from mainspring.store.tables import FineTuningJobRow
from mainspring.train import job_store

router = APIRouter()


def _change(request: Request, job_id: str, from_: tuple[str, ...], to: str, refusal: str, code: str,
            message: str, idempotent: bool, **values: Any) -> dict[str, Any]:
    """from_ -> to on a job the caller may see; the job object afterwards. A worker thread."""
    with session(db(request), readonly=True) as s:
        get_owned(s, job_id, request.state.principal)  # 404 unless the caller may see it
    moved = job_store.move(db(request), job_id, from_, to, message=message, **values)
    with session(db(request), readonly=True) as s:
        row = s.get(FineTuningJobRow, job_id)
        if row is None:  # deleted in between
            raise not_found(job_id)
        if not moved and not (idempotent and row.status == to):
            raise bad_request(f"fine-tuning job {job_id} is {row.status} and {refusal}", param="fine_tuning_job_id",
                              code=code)
        return job_objects(s, [row])[0]


def _training_allowed(request: Request, job_id: str) -> bool:
    """May the job's project's data be trained on (store/data_policy.py)? 404 unless the caller may see the job.
    The runner checks again when it starts the job; this makes a resume's refusal the answer to the resume."""
    with session(db(request), readonly=True) as s:
        return get_policy(s, get_owned(s, job_id, request.state.principal).project_id).training_allowed


@router.post("/v1/fine_tuning/jobs/{job_id}/cancel")
async def cancel_job(job_id: str, request: Request) -> dict:
    job = await asyncio.to_thread(_change, request, job_id, job_store.CANCELLABLE, "cancelled",
                                  "can no longer be cancelled", "job_not_cancellable", "Fine-tuning job cancelled",
                                  True, finished_at=job_store.now(), estimated_finish=None)
    wake(request)
    return job


@router.post("/v1/fine_tuning/jobs/{job_id}/pause")
async def pause_job(job_id: str, request: Request) -> dict:
    # the trainer sees the status between two steps, checkpoints and returns; the runner goes on to other jobs
    return await asyncio.to_thread(_change, request, job_id, job_store.PENDING, "paused",
                                   "cannot be paused (only a queued or running job can)", "job_not_pausable",
                                   "Job paused", True, estimated_finish=None)


@router.post("/v1/fine_tuning/jobs/{job_id}/resume")
async def resume_job(job_id: str, request: Request) -> dict:
    if not await asyncio.to_thread(_training_allowed, request, job_id):  # the project's policy, as it is now
        raise training_refusal()
    # a pause is a clean stop, not a crash: the runner's restart count (attempts, capped at MAX_ATTEMPTS) starts
    # again, while attempts > 0 still tells it to resume from the checkpoint rather than start over
    attempts = case((FineTuningJobRow.attempts > 1, 1), else_=FineTuningJobRow.attempts)
    job = await asyncio.to_thread(_change, request, job_id, ("paused",), "queued",
                                  "cannot be resumed (only a paused job can)", "job_not_resumable", "Job resumed",
                                  False, attempts=attempts)
    wake(request)
    return job
