"""Plans over HTTP: a DAG of agent tasks, created from a plan document, run by the plan scheduler.

    POST /v1/plans                          create (the body is a plan: goal, tasks, ...)
    GET  /v1/plans                          the caller's plans, newest first
    GET  /v1/plans/{id}                     the graph: every task's state, run, artifact and hash; usage and cost
    POST /v1/plans/{id}/{action}            approve | reject | cancel | pause | resume
    POST /v1/plans/{id}/tasks/{key}/{action} approve | reject (a task's approval gate)
    GET  /v1/plans/{id}/events              a resumable SSE stream (Last-Event-ID / ?after=seq), or JSON pages

Every route goes through `runtime(request).plans`: the caller's project sees its own plans only.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Literal

from fastapi import APIRouter, Header, Query, Request
from pydantic import BaseModel, Field

from mainspring.agents.plans.spec import PlanError, PlanSpec, TaskSpec
from mainspring.agents.plans.store import load_spec
from mainspring.agents.plans.tables import PLAN_TERMINAL, PlanEventRow, PlanRow, PlanTaskRow
from mainspring.api.errors import APIError
from mainspring.api.routes.agents import MAX_INT, actor, page, runtime, ts, usd
from mainspring.api.routes.runs import PING_S, resume_point
from mainspring.api.sse import EventStreamResponse

router = APIRouter()
PAGE = 500
_CODES = {400: "invalid_value", 404: "not_found", 409: "invalid_state"}


def plan_error(exc: PlanError) -> APIError:
    return APIError(exc.status, str(exc), param=exc.param, code=_CODES.get(exc.status))


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """A plan store call: blocking SQL, so off the event loop; a PlanError becomes its HTTP error."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except PlanError as exc:
        raise plan_error(exc) from None


class TaskObject(BaseModel):
    id: str
    key: str
    status: str
    agent: str
    depends_on: list[str]
    map_over: str | None
    item_index: int | None
    attempt: int
    run_id: str | None
    artifact: Any = None
    artifact_sha256: str | None
    input_hashes: dict[str, str | None] | None
    error: str | None
    ready_at: int | None
    finished_at: int | None


class PlanUsageObject(BaseModel):
    runs: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost_u: int
    cost_usd: str | None


class PlanObject(BaseModel):
    id: str
    object: Literal["plan"] = "plan"
    name: str | None
    goal: str
    status: str
    priority: int
    error: str | None
    created_at: int | None
    finished_at: int | None
    tasks: list[TaskObject] | None = None
    usage: PlanUsageObject | None = None


def task_object(row: PlanTaskRow, spec: TaskSpec) -> TaskObject:
    return TaskObject(id=row.id, key=row.key, status=row.status, agent=spec.agent, depends_on=spec.depends_on,
                      map_over=spec.map_over, item_index=row.item_index, attempt=row.attempt, run_id=row.run_id,
                      artifact=json.loads(row.artifact_json) if row.artifact_json is not None else None,
                      artifact_sha256=row.artifact_sha256,
                      input_hashes=json.loads(row.input_hashes_json) if row.input_hashes_json else None,
                      error=row.error, ready_at=ts(row.ready_at), finished_at=ts(row.finished_at))


def plan_object(row: PlanRow, tasks: list[PlanTaskRow] | None = None, usage: Any = None) -> PlanObject:
    specs = {t.id: t for t in load_spec(row).tasks}
    return PlanObject(
        id=row.id, name=row.name, goal=row.goal, status=row.status, priority=row.priority, error=row.error,
        created_at=ts(row.created_at), finished_at=ts(row.finished_at),
        tasks=None if tasks is None else [task_object(t, specs[t.spec_key]) for t in tasks],
        usage=None if usage is None else PlanUsageObject(**vars(usage), cost_usd=usd(usage.cost_u)))


@router.post("/v1/plans", response_model=PlanObject)
async def create_plan(body: PlanSpec, request: Request) -> PlanObject:
    plans = runtime(request).plans
    row = await call(plans.create, body)
    return plan_object(row, await call(plans.tasks, row.id))


@router.get("/v1/plans")
async def list_plans(request: Request, limit: int = Query(50, ge=1, le=500),
                     status: str | None = Query(None)) -> dict:
    rows = await call(runtime(request).plans.recent, limit, status)
    return page([plan_object(r) for r in rows])


@router.get("/v1/plans/{plan_id}", response_model=PlanObject)
async def get_plan(plan_id: str, request: Request) -> PlanObject:
    plans = runtime(request).plans
    row = await call(plans.get, plan_id)
    return plan_object(row, await call(plans.tasks, plan_id), await call(plans.usage, plan_id))


class ActionBody(BaseModel):
    actor: str | None = Field(None, max_length=200)
    comment: str | None = Field(None, max_length=10_000)


@router.post("/v1/plans/{plan_id}/tasks/{task_key}/{action}")
async def act_on_task(plan_id: str, task_key: str, action: Literal["approve", "reject"], request: Request,
                      body: ActionBody | None = None) -> PlanObject:
    body = body or ActionBody()
    plans = runtime(request).plans
    await call(plans.act_on_task, plan_id, task_key, action, actor(request, body.actor), body.comment)
    return plan_object(await call(plans.get, plan_id), await call(plans.tasks, plan_id))


@router.post("/v1/plans/{plan_id}/{action}", response_model=PlanObject)
async def act_on_plan(plan_id: str, action: Literal["approve", "reject", "cancel", "pause", "resume"],
                      request: Request, body: ActionBody | None = None) -> PlanObject:
    body = body or ActionBody()
    plans = runtime(request).plans
    row = await call(plans.act, plan_id, action, actor(request, body.actor), body.comment)
    return plan_object(row, await call(plans.tasks, plan_id))


# ---- events ----------------------------------------------------------------------------------------------
class PlanEventObject(BaseModel):
    id: int  # the plan's seq: 1, 2, 3, ... per plan
    plan_id: str
    type: str
    task: str | None
    data: dict
    created_at: int | None


def event_object(row: PlanEventRow) -> PlanEventObject:
    return PlanEventObject(id=row.seq, plan_id=row.plan_id, type=row.type, task=row.task_key,
                           data=json.loads(row.data_json), created_at=ts(row.created_at))


async def follow(request: Request, plan_id: str, after: int) -> AsyncIterator[str]:
    """Every event after `after`, then new ones as they are written, until the plan has ended and its last
    events are out."""
    plans = runtime(request).plans
    cursor, last_sent = after, time.monotonic()
    yield "retry: 1000\n\n"
    while True:
        status = (await call(plans.get, plan_id)).status  # before the events: a final status implies its events
        batch = await call(plans.events, plan_id, cursor, PAGE)
        for row in batch:
            cursor = row.seq
            ev = event_object(row)
            yield f"id: {ev.id}\nevent: {ev.type}\ndata: {ev.model_dump_json()}\n\n"
        if batch:
            last_sent = time.monotonic()
            if len(batch) == PAGE or status in PLAN_TERMINAL:
                continue
        elif status in PLAN_TERMINAL:
            return
        if await request.is_disconnected():
            return
        if time.monotonic() - last_sent >= PING_S:
            last_sent = time.monotonic()
            yield ": ping\n\n"
        await asyncio.sleep(0.25)


@router.get("/v1/plans/{plan_id}/events", response_model=None)
async def plan_events(plan_id: str, request: Request,
                      after: int | None = Query(None, ge=0, le=MAX_INT, description="events with a larger seq"),
                      limit: int = Query(100, ge=1, le=PAGE),
                      stream: bool | None = Query(None, description="SSE; default: when Accept has text/event-stream"),
                      last_event_id: str | None = Header(None)) -> dict | EventStreamResponse:
    plans = runtime(request).plans
    start = resume_point(last_event_id, after)
    if stream is None:
        stream = "text/event-stream" in request.headers.get("accept", "")
    if not stream:
        rows = await call(plans.events, plan_id, start, limit + 1)
        body = page([event_object(r) for r in rows[:limit]])
        return {**body, "has_more": len(rows) > limit, "last_id": rows[:limit][-1].seq if rows else start}
    await call(plans.get, plan_id)  # an unknown plan is a 404 here, not an error inside a 200 stream
    return EventStreamResponse(follow(request, plan_id, start))
