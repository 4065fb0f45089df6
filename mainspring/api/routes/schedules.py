"""Schedules over HTTP: a plan or an agent run started on a cron schedule, or by a signed webhook.

    POST   /v1/schedules                   create: name, cron | kind "webhook", timezone, plan | agent + goal
    GET    /v1/schedules                   the caller's schedules, newest first
    GET    /v1/schedules/{id}              one, with its recent fires
    DELETE /v1/schedules/{id}
    POST   /v1/schedules/{id}/pause|resume
    POST   /v1/hooks/{id}                  a webhook delivery (`hooks_router`: no API key, the signature is the auth)

The schedule routes go through `runtime(request).schedules`: the caller's project sees its own schedules only.
A webhook's secret is in the creation's answer and never again.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from mainspring.agents.plans.schedule_tables import ScheduleFireRow, ScheduleRow
from mainspring.agents.plans.spec import PlanError, PlanSpec
from mainspring.api.errors import APIError
from mainspring.api.routes.agent_policy import refuse_upstream_agents, refuse_upstream_plan
from mainspring.api.routes.agents import page, runtime, ts
from mainspring.api.routes.plans import call, plan_error

router = APIRouter()
hooks_router = APIRouter()  # mounted outside the API-key check (api/routes/__init__.py)


class ScheduleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, max_length=255)
    kind: Literal["cron", "webhook"] | None = Field(None, description="default: cron when `cron` is given")
    cron: str | None = Field(None, min_length=1, max_length=255, description="e.g. '*/15 * * * *'")
    timezone: str = Field("UTC", min_length=1, max_length=64, description="IANA zone the cron fields are read in")
    plan: PlanSpec | None = Field(None, description="the plan each fire starts")
    agent: str | None = Field(None, min_length=1, max_length=255, description="or: the agent each fire runs ...")
    goal: str | None = Field(None, min_length=1, max_length=20_000, description="... on this goal")


class FireObject(BaseModel):
    fire_key: str  # the slot's UTC time (cron) or the delivery id (webhook)
    status: str  # pending | started | failed
    plan_id: str | None
    run_id: str | None
    error: str | None
    created_at: int | None


class ScheduleObject(BaseModel):
    id: str
    object: Literal["schedule"] = "schedule"
    name: str
    kind: str
    cron: str | None
    timezone: str
    target: dict[str, Any]
    enabled: bool
    next_fire_at: int | None
    last_fired_at: int | None
    fire_count: int
    last_error: str | None
    created_at: int | None
    hook_url: str | None = None  # a webhook's endpoint path
    secret: str | None = None  # a webhook's, in the answer to its creation only
    fires: list[FireObject] | None = None


def fire_object(row: ScheduleFireRow) -> FireObject:
    return FireObject(fire_key=row.fire_key, status=row.status, plan_id=row.plan_id, run_id=row.run_id,
                      error=row.error, created_at=ts(row.created_at))


def schedule_object(row: ScheduleRow, *, secret: str | None = None,
                    fires: list[ScheduleFireRow] | None = None) -> ScheduleObject:
    return ScheduleObject(
        id=row.id, name=row.name, kind=row.kind, cron=row.cron, timezone=row.timezone,
        target=json.loads(row.target_json), enabled=row.enabled, next_fire_at=ts(row.next_fire_at),
        last_fired_at=ts(row.last_fired_at), fire_count=row.fire_count, last_error=row.last_error,
        created_at=ts(row.created_at), hook_url=f"/v1/hooks/{row.id}" if row.kind == "webhook" else None,
        secret=secret, fires=None if fires is None else [fire_object(f) for f in fires])


@router.post("/v1/schedules", response_model=ScheduleObject, status_code=201)
async def create_schedule(body: ScheduleBody, request: Request) -> ScheduleObject:
    # a local-only project's schedule may not start work on an upstream model (routes/agent_policy.py); each fire's
    # runs are checked again when they resolve their models
    if body.plan is not None:
        await refuse_upstream_plan(request, runtime(request), body.plan, "plan")
    if body.agent is not None:
        await refuse_upstream_agents(request, runtime(request), [body.agent], "agent")
    row, secret = await call(runtime(request).schedules.create, body.name, kind=body.kind, cron=body.cron,
                             timezone=body.timezone, plan=body.plan, agent=body.agent, goal=body.goal)
    return schedule_object(row, secret=secret)


@router.get("/v1/schedules")
async def list_schedules(request: Request, limit: int = Query(100, ge=1, le=500)) -> dict:
    rows = await call(runtime(request).schedules.recent, limit)
    return page([schedule_object(r) for r in rows])


@router.get("/v1/schedules/{schedule_id}", response_model=ScheduleObject)
async def get_schedule(schedule_id: str, request: Request) -> ScheduleObject:
    schedules = runtime(request).schedules
    row = await call(schedules.get, schedule_id)
    return schedule_object(row, fires=await call(schedules.fires, schedule_id))


@router.delete("/v1/schedules/{schedule_id}")
async def delete_schedule(schedule_id: str, request: Request) -> dict:
    await call(runtime(request).schedules.delete, schedule_id)
    return {"id": schedule_id, "object": "schedule.deleted", "deleted": True}


@router.post("/v1/schedules/{schedule_id}/{action}", response_model=ScheduleObject)
async def act_on_schedule(schedule_id: str, action: Literal["pause", "resume"], request: Request) -> ScheduleObject:
    schedules = runtime(request).schedules
    row = await call(schedules.pause if action == "pause" else schedules.resume, schedule_id)
    return schedule_object(row)


@hooks_router.post("/v1/hooks/{schedule_id}", status_code=202)
async def webhook(schedule_id: str, request: Request,
                  x_hub_signature_256: str | None = Header(None),
                  x_mainspring_delivery: str | None = Header(None),
                  x_github_delivery: str | None = Header(None)) -> JSONResponse:
    """A delivery signed "sha256=<hex HMAC-SHA256 of the body>" (X-Hub-Signature-256, as GitHub sends it). The
    delivery id (X-Mainspring-Delivery, or GitHub's X-GitHub-Delivery; default: the body's sha256) makes a
    redelivery start nothing new: it gets the first delivery's answer, with "duplicate": true."""
    body = await request.body()
    # the operator's view: the caller has no key; what fires runs in the schedule's own project
    try:
        fired = await asyncio.to_thread(request.app.state.agents.schedules.deliver, schedule_id, body,
                                        x_hub_signature_256, x_mainspring_delivery or x_github_delivery)
    except PlanError as exc:
        code = {401: "invalid_signature", 413: "body_too_large"}.get(exc.status)
        raise (APIError(exc.status, str(exc), param=exc.param, code=code) if code else plan_error(exc)) from None
    fire = fire_object(fired.fire)
    return JSONResponse({"object": "schedule.fire", "schedule_id": schedule_id, "duplicate": fired.duplicate,
                         **fire.model_dump()}, status_code=202)
