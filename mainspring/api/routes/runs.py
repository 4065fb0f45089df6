"""What a run has produced, over HTTP: its events (a resumable SSE stream, or JSON pages), its steps, its
artifacts and its audit trail (verdict and JSONL export). All reads of `request.app.state.agents`.

The event stream is the journal's append-only event log: event ids only grow, so a client that reconnects with
`Last-Event-ID: N` (or `?after=N`) gets exactly the events after N, none lost and none twice.
"""

from __future__ import annotations

import json
import time
from typing import AsyncIterator

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import FileResponse, Response
from pydantic import BaseModel

from mainspring.agents.status import TERMINAL
from mainspring.agents.tables import EventRow
from mainspring.api.errors import APIError
from mainspring.api.routes.agents import MAX_INT, page, read, runtime, ts
from mainspring.api.sse import EventStreamResponse

router = APIRouter()

PING_S = 10.0  # an SSE comment when idle, so proxies keep the connection and a gone client is noticed
PAGE = 500


class EventObject(BaseModel):
    id: int
    run_id: str
    type: str
    data: dict
    created_at: int | None


def event_object(row: EventRow) -> EventObject:
    return EventObject(id=row.id, run_id=row.run_id, type=row.type, data=json.loads(row.data_json),
                       created_at=ts(row.created_at))


def sse(ev: EventObject) -> str:
    return f"id: {ev.id}\nevent: {ev.type}\ndata: {ev.model_dump_json()}\n\n"


def resume_point(last_event_id: str | None, after: int | None) -> int:
    """Where to start: after the client's Last-Event-ID (a reconnecting EventSource sends it), else `after`."""
    if last_event_id is None or not last_event_id.strip():
        return after or 0
    try:
        n = int(last_event_id.strip())
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_INT:
        raise APIError(400, f"Last-Event-ID {last_event_id!r} is not an event id (a non-negative integer)",
                       param="Last-Event-ID", code="invalid_value")
    return n


async def follow(request: Request, run_id: str, after: int) -> AsyncIterator[str]:
    """Every event after `after`, then new ones as they are written, until the run has ended and its last
    events are out. A run waiting for approval or paused has not ended: the stream stays open. Between reads
    the stream sleeps on the runtime's event bus, which wakes it when its run has new events: an idle
    follower costs nothing (agents/event_bus.py)."""
    rt = runtime(request)
    cursor, last_sent = after, time.monotonic()
    yield "retry: 1000\n\n"
    while True:
        horizon = rt.event_bus.horizon
        status = (await read(rt.run, run_id)).status  # read before the events: a final status implies its events
        batch = await read(rt.events, run_id, cursor, PAGE)
        for row in batch:
            cursor = row.id
            yield sse(event_object(row))
        if batch:
            last_sent = time.monotonic()
            if len(batch) == PAGE or status in TERMINAL:
                continue  # more to read, or the run has ended: its last events may be out now
        elif status in TERMINAL:
            return
        if await request.is_disconnected():
            return
        if time.monotonic() - last_sent >= PING_S:
            last_sent = time.monotonic()
            yield ": ping\n\n"
        await rt.event_bus.wait(run_id, horizon, timeout=max(0.0, PING_S - (time.monotonic() - last_sent)))


@router.get("/v1/runs/{run_id}/events", response_model=None)
async def run_events(run_id: str, request: Request,
                     after: int | None = Query(None, ge=0, le=MAX_INT, description="events with a larger id"),
                     limit: int = Query(100, ge=1, le=PAGE),
                     stream: bool | None = Query(None, description="SSE; default: when Accept has text/event-stream"),
                     last_event_id: str | None = Header(None)) -> dict | EventStreamResponse:
    """SSE (`id`, `event`, `data` per event) or a JSON page of events in order."""
    rt = runtime(request)
    start = resume_point(last_event_id, after)
    if stream is None:
        stream = "text/event-stream" in request.headers.get("accept", "")
    if not stream:
        rows = await read(rt.events, run_id, start, limit + 1)
        body = page([event_object(r) for r in rows[:limit]])
        return {**body, "has_more": len(rows) > limit, "last_id": rows[:limit][-1].id if rows else start}
    await read(rt.run, run_id)  # an unknown run is a 404 here, not an error inside a 200 stream
    return EventStreamResponse(follow(request, run_id, start))


@router.get("/v1/runs/{run_id}/steps")
async def run_steps(run_id: str, request: Request) -> dict:
    """The run's journal, in order: each model step with its output, usage, cost and tool calls."""
    steps = await read(runtime(request).steps, run_id)
    return {"object": "list", "data": steps}


# ---- artifacts -------------------------------------------------------------------------------------------
class ArtifactObject(BaseModel):
    id: str
    run_id: str
    name: str
    mime: str
    bytes: int
    sha256: str
    created_at: int | None
    url: str


@router.get("/v1/runs/{run_id}/artifacts")
async def run_artifacts(run_id: str, request: Request) -> dict:
    rows = await read(runtime(request).artifacts, run_id)
    return page([ArtifactObject(id=a.id, run_id=a.run_id, name=a.name, mime=a.mime, bytes=a.bytes, sha256=a.sha256,
                                created_at=ts(a.created_at), url=f"/v1/artifacts/{a.id}/content") for a in rows])


@router.get("/v1/artifacts/{artifact_id}/content", response_class=FileResponse)
async def artifact_content(artifact_id: str, request: Request) -> FileResponse:
    rt = runtime(request)
    row, path = await read(rt.artifact_path, artifact_id)
    root = rt.settings.data_dir.resolve()
    path = path.resolve()
    if not path.is_relative_to(root):  # rows are written by the runtime; refuse one that points elsewhere anyway
        raise APIError(404, f"artifact {artifact_id} is not under the data directory", code="not_found")
    if not path.is_file():
        raise APIError(410, f"the file of artifact {artifact_id} is gone from the data directory",
                       code="artifact_content_missing")
    return FileResponse(path, media_type=row.mime, filename=row.name)


# ---- audit -----------------------------------------------------------------------------------------------
class AuditVerdict(BaseModel):
    run_id: str
    ok: bool
    entries: int
    head: str
    broken_at: int | None
    reason: str


@router.get("/v1/runs/{run_id}/audit")
async def run_audit(run_id: str, request: Request) -> AuditVerdict:
    """Checks the run's hash chain: `ok`, or the first entry (`broken_at`, a seq) that fails and why."""
    v = await read(runtime(request).verify_audit, run_id)
    return AuditVerdict(run_id=run_id, ok=v.ok, entries=v.entries, head=v.head, broken_at=v.broken_at,
                        reason=v.reason)


@router.get("/v1/runs/{run_id}/audit.jsonl", response_class=Response)
async def export_audit(run_id: str, request: Request) -> Response:
    """One JSON object per entry, in order, with its prev_hash and hash, to verify the chain elsewhere."""
    lines = await read(lambda: list(runtime(request).export_audit(run_id)))
    return Response("".join(line + "\n" for line in lines), media_type="application/x-ndjson",
                    headers={"Content-Disposition": f'attachment; filename="{run_id}.audit.jsonl"'})
