"""The Batch API (OpenAI's /v1/batches): create, retrieve, list, cancel. The work itself is the
BatchRunner's (mainspring/api/batch_runner.py); these routes only read and write the `batches` rows
and wake the runner. A batch belongs to the key that created it, and is billed to that key.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import select, update

from mainspring.api.batch_lines import ENDPOINTS
from mainspring.api.errors import APIError
from mainspring.api.routes import new_id
from mainspring.api.routes.files import get_owned
from mainspring.store.db import newest_first_page, session
from mainspring.store.tables import BatchRow

router = APIRouter()

WINDOW = timedelta(hours=24)
CANCELLABLE = ("validating", "in_progress")


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. output_expires_after: accepted, not applied
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = Field(None, max_length=16)

    @field_validator("metadata")
    @classmethod
    def _sizes(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for k, val in (v or {}).items():
            if len(k) > 64 or len(val) > 512:
                raise ValueError("metadata keys are at most 64 characters and values at most 512")
        return v


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: dict[str, Any] | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


def _ts(t: datetime | None) -> int | None:
    return None if t is None else int(t.timestamp())


def batch_object(row: BatchRow) -> Batch:
    stamps = {f"{n}_at": _ts(getattr(row, f"{n}_at")) for n in (
        "created", "in_progress", "expires", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")}
    return Batch(id=row.id, endpoint=row.endpoint, errors=json.loads(row.errors_json) if row.errors_json else None,
                 input_file_id=row.input_file_id, completion_window=row.completion_window, status=row.status,
                 output_file_id=row.output_file_id, error_file_id=row.error_file_id,
                 request_counts=RequestCounts(total=row.request_counts_total,
                                              completed=row.request_counts_completed,
                                              failed=row.request_counts_failed),
                 metadata=json.loads(row.metadata_json) if row.metadata_json else None, **stamps)


def _visible(principal: Any):
    return BatchRow.api_key_id == principal.id if principal is not None else BatchRow.api_key_id.is_(None)


def _get_owned(s: Any, batch_id: str, principal: Any) -> BatchRow:
    row = s.scalar(select(BatchRow).where(BatchRow.id == batch_id, _visible(principal)))
    if row is None:
        raise APIError(404, f"No such Batch object: {batch_id}", param="batch_id", code="batch_not_found")
    return row


def _wake(request: Request) -> None:
    runner = getattr(request.app.state, "batch_runner", None)
    if runner is not None:
        runner.notify()


def _db(request: Request):
    return request.app.state.economics.db


@router.post("/v1/batches")
async def create_batch(body: CreateBatch, request: Request) -> Batch:
    if body.endpoint not in ENDPOINTS:
        raise APIError(400, f"endpoint {body.endpoint!r} is not supported for batches; use one of "
                       f"{', '.join(ENDPOINTS)}", param="endpoint", code="invalid_value")
    if body.completion_window != "24h":
        raise APIError(400, "completion_window must be \"24h\"", param="completion_window", code="invalid_value")
    principal = request.state.principal

    def create() -> BatchRow:
        with session(_db(request)) as s:
            f = get_owned(s, body.input_file_id, principal)
            if f.purpose != "batch":
                raise APIError(400, f"file {f.id} has purpose {f.purpose!r}; a batch input needs purpose \"batch\"",
                               param="input_file_id", code="invalid_file_purpose")
            now = datetime.now(timezone.utc)
            row = BatchRow(id=new_id("batch_"), input_file_id=f.id, endpoint=body.endpoint, status="validating",
                           completion_window="24h", created_at=now, expires_at=now + WINDOW,
                           metadata_json=json.dumps(body.metadata) if body.metadata else None,
                           request_counts_total=0, request_counts_completed=0, request_counts_failed=0,
                           api_key_id=principal.id if principal is not None else None)
            s.add(row)
        return row

    row = await asyncio.to_thread(create)
    _wake(request)
    return batch_object(row)


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(batch_id: str, request: Request) -> Batch:
    def get() -> BatchRow:
        with session(_db(request), readonly=True) as s:
            return _get_owned(s, batch_id, request.state.principal)

    return batch_object(await asyncio.to_thread(get))


@router.get("/v1/batches")
async def list_batches(request: Request, after: str | None = None, limit: int = Query(20, ge=1, le=100)) -> dict:
    """Newest first; `after` is the last id of the previous page."""
    principal = request.state.principal

    def query() -> tuple[list[BatchRow], bool]:
        with session(_db(request), readonly=True) as s:
            return newest_first_page(s, BatchRow, _visible(principal),
                                     _get_owned(s, after, principal) if after else None, limit)

    rows, more = await asyncio.to_thread(query)
    return {"object": "list", "data": [batch_object(r).model_dump() for r in rows],
            "first_id": rows[0].id if rows else None, "last_id": rows[-1].id if rows else None, "has_more": more}


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request) -> Batch:
    """validating / in_progress -> cancelling; the runner stops the batch and sets it cancelled."""
    def cancel() -> BatchRow:
        with session(_db(request)) as s:
            row = _get_owned(s, batch_id, request.state.principal)
            if row.status in CANCELLABLE:
                # conditional, so a runner that moved the batch on meanwhile is never overwritten
                s.execute(update(BatchRow).where(BatchRow.id == batch_id, BatchRow.status.in_(CANCELLABLE))
                          .values(status="cancelling", cancelling_at=datetime.now(timezone.utc)))
                s.refresh(row)
            elif row.status != "cancelling":
                raise APIError(400, f"batch {batch_id} is {row.status} and can no longer be cancelled",
                               param="batch_id", code="batch_not_cancellable")
            return row

    row = await asyncio.to_thread(cancel)
    _wake(request)
    return batch_object(row)
