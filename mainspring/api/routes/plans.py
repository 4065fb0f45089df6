"""Plans over HTTP: a DAG of agent tasks, created from a plan document, run by the plan scheduler.

    POST /v1/plans                          create (the body is a plan: goal, tasks, ...; or a goal without tasks:
                                            the planner agent writes the tasks)
    GET  /v1/plans                          the caller's plans, newest first
    GET  /v1/plans/{id}                     the graph: every task's state, run, artifact and hash; usage and cost
    POST /v1/plans/{id}/budget              raise the plan's budget: its budget-paused runs get their share, go on
    POST /v1/plans/{id}/{action}            approve | reject | cancel | pause | resume
    POST /v1/plans/{id}/tasks/{key}/{action} approve | reject (a task's approval gate)
    GET  /v1/plans/{id}/audit               every run's audit chain verified, and the plan-level head
    GET  /v1/plans/{id}/events              a resumable SSE stream (Last-Event-ID / ?after=seq), or JSON pages

Every route goes through `runtime(request).plans`: the caller's project sees its own plans only.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any, AsyncIterator, Literal, Union

from fastapi import APIRouter, Header, Query, Request
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from mainspring.agents.plans.planner import MAX_TASKS
from mainspring.agents.plans.spec import PLAN_PRIORITY, PlanError, PlanSpec, TaskSpec
from mainspring.agents.plans.store import load_spec
from mainspring.agents.plans.tables import PLAN_TERMINAL, PlanEventRow, PlanRow, PlanTaskRow
from mainspring.api.errors import APIError
from mainspring.api.routes.agent_policy import refuse_upstream_model, refuse_upstream_plan
from mainspring.api.routes.agents import MAX_INT, actor, cost_field, cost_u, page, runtime, ts, usd
from mainspring.api.routes.runs import PING_S, resume_point
from mainspring.api.sse import EventStreamResponse

router = APIRouter()
PAGE = 500
_CODES = {400: "invalid_value", 404: "not_found", 409: "invalid_state", 422: "invalid_plan", 502: "upstream_error",
          503: "planner_unavailable"}


def plan_error(exc: PlanError) -> APIError:
    return APIError(exc.status, str(exc), param=exc.param, code=_CODES.get(exc.status))


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """A plan store call: blocking SQL, so off the event loop; a PlanError becomes its HTTP error."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except PlanError as exc:
        raise plan_error(exc) from None


class TaskUsageObject(BaseModel):
    runs: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost_u: int
    cost_usd: str | None
    cost_strongest_u: int  # the same usage on the task's agent's own model (no routing)
    saved_u: int  # cost_strongest_u - cost_u


def usage_fields(usage: Any) -> dict[str, Any]:
    return dict(runs=usage.runs, prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                cached_tokens=usage.cached_tokens, cost_u=usage.cost_u, cost_usd=usd(usage.cost_u),
                cost_strongest_u=usage.cost_strongest_u, saved_u=usage.saved_u)


class TaskObject(BaseModel):
    id: str
    key: str
    status: str
    agent: str  # the agent it is with (after a handoff, the one it was handed to; after a replan, the revised one)
    handoffs: int = 0
    prompt_override: str | None = None  # after a replan: the planner's revised prompt it runs with (None: its spec's)
    replans: int = 0  # revisions the planner made after failures (on_failure "replan")
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
    run_status: str | None = None  # its current run's (with the plan's graph: GET /v1/plans/{id})
    pause_reason: str | None = None  # "budget": the run would have gone over its share of the plan's budget
    usage: TaskUsageObject | None = None  # its runs', retries included


class PlanUsageObject(TaskUsageObject):
    cost_strongest_usd: str | None
    saved_usd: str | None


class PlanObject(BaseModel):
    id: str
    object: Literal["plan"] = "plan"
    name: str | None
    goal: str
    status: str
    priority: int
    token_budget: int | None = None
    cost_budget_usd: str | None = None
    error: str | None
    created_at: int | None
    finished_at: int | None
    tasks: list[TaskObject] | None = None
    usage: PlanUsageObject | None = None


def task_object(row: PlanTaskRow, spec: TaskSpec, runs: dict[str, tuple[str, str | None]] | None = None,
                usage: Any = None) -> TaskObject:
    run_status, pause_reason = (runs or {}).get(row.run_id or "", (None, None))
    task_usage = usage.tasks.get(row.key) if usage is not None else None
    return TaskObject(run_status=run_status, pause_reason=pause_reason,
                      usage=TaskUsageObject(**usage_fields(task_usage)) if task_usage is not None else None,
                      id=row.id, key=row.key, status=row.status, agent=row.agent_override or spec.agent,
                      handoffs=row.handoffs, prompt_override=row.prompt_override, replans=row.replans or 0,
                      depends_on=spec.depends_on,
                      map_over=spec.map_over, item_index=row.item_index, attempt=row.attempt, run_id=row.run_id,
                      artifact=json.loads(row.artifact_json) if row.artifact_json is not None else None,
                      artifact_sha256=row.artifact_sha256,
                      input_hashes=json.loads(row.input_hashes_json) if row.input_hashes_json else None,
                      error=row.error, ready_at=ts(row.ready_at), finished_at=ts(row.finished_at))


def plan_object(row: PlanRow, tasks: list[PlanTaskRow] | None = None, usage: Any = None,
                runs: dict[str, tuple[str, str | None]] | None = None) -> PlanObject:
    specs = {t.id: t for t in load_spec(row).tasks}
    total = None if usage is None else PlanUsageObject(**usage_fields(usage), saved_usd=usd(usage.saved_u),
                                                       cost_strongest_usd=usd(usage.cost_strongest_u))
    return PlanObject(
        id=row.id, name=row.name, goal=row.goal, status=row.status, priority=row.priority,
        token_budget=row.token_budget, cost_budget_usd=usd(row.cost_budget_u), error=row.error,
        created_at=ts(row.created_at), finished_at=ts(row.finished_at),
        tasks=None if tasks is None else [task_object(t, specs[t.spec_key], runs, usage) for t in tasks],
        usage=total)


class PlanFromGoal(BaseModel):
    """A plan to be written by the planner agent: a goal and no tasks (a body with tasks is a PlanSpec)."""

    model_config = ConfigDict(extra="forbid")

    goal: str = Field(..., min_length=1, max_length=20_000)
    planner_model: str | None = Field(None, min_length=1, max_length=255, description="the model that writes the "
                                      "plan; default: the server's model (MAINSPRING_MODEL)")
    max_tasks: int = Field(8, ge=1, le=MAX_TASKS, description="the most tasks the planner may write")
    name: str | None = Field(None, max_length=255)
    priority: int = Field(0, ge=-PLAN_PRIORITY, le=PLAN_PRIORITY, description="higher first, across plans")
    approve_plan: bool = Field(False, description="the plan waits for a human 'approve' before any task: review "
                                                  "what the planner wrote first")


def _body_kind(body: Any) -> str:
    has_tasks = "tasks" in body if isinstance(body, dict) else isinstance(body, PlanSpec)
    return "PlanSpec" if has_tasks else "PlanFromGoal"


# with tasks: a plan; without: a goal for the planner. Picked by that one key, so a bad body is told what is wrong
# with the kind it is, not with both (the tags are capitalised: api/errors.py leaves such names out of `param`)
CreateBody = Annotated[Union[Annotated[PlanSpec, Tag("PlanSpec")], Annotated[PlanFromGoal, Tag("PlanFromGoal")]],
                       Discriminator(_body_kind)]


@router.post("/v1/plans", response_model=PlanObject)
async def create_plan(body: CreateBody, request: Request) -> PlanObject:
    plans = runtime(request).plans
    # a local-only project's plan may not name an upstream model (api/project_policy.py); the runtime checks
    # again when each task's run, or the planner, resolves its model
    if isinstance(body, PlanFromGoal):
        await refuse_upstream_model(request, body.planner_model, "planner_model")
    else:
        await refuse_upstream_plan(request, runtime(request), body)
    if isinstance(body, PlanFromGoal):
        try:  # the planner's model call is awaited (the engine steps on its compute thread), its SQL in threads
            row = await plans.create_from_goal(body.goal, planner_model=body.planner_model, max_tasks=body.max_tasks,
                                               priority=body.priority, approve_plan=body.approve_plan, name=body.name)
        except PlanError as exc:
            raise plan_error(exc) from None
    else:
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
    return plan_object(row, await call(plans.tasks, plan_id), await call(plans.usage, plan_id),
                       await call(plans.run_states, plan_id))


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


class PlanBudgetBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token_budget: int | None = Field(None, ge=1, le=MAX_INT)
    cost_budget_usd: str | None = cost_field()
    actor: str | None = Field(None, max_length=200)


# before /{action}: "budget" would otherwise be taken for an action, and refused
@router.post("/v1/plans/{plan_id}/budget", response_model=PlanObject)
async def raise_plan_budget(plan_id: str, body: PlanBudgetBody, request: Request) -> PlanObject:
    """A higher budget for the plan (never lower); its runs paused for their budget get their new share and go
    on. 409 once the plan has ended."""
    if body.token_budget is None and body.cost_budget_usd is None:
        raise APIError(400, "give token_budget, cost_budget_usd or both", param="token_budget",
                       code="missing_required_parameter")
    plans = runtime(request).plans
    row = await call(plans.raise_budget, plan_id, token_budget=body.token_budget,
                     cost_budget_u=cost_u(body.cost_budget_usd, "cost_budget_usd"), actor=actor(request, body.actor))
    return plan_object(row, await call(plans.tasks, plan_id), await call(plans.usage, plan_id),
                       await call(plans.run_states, plan_id))


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


class RunAuditObject(BaseModel):
    run_id: str
    task: str | None  # None: a run asked by one of the plan's runs (ask_agent)
    parent_run_id: str | None
    ok: bool
    entries: int
    head: str
    broken_at: int | None
    reason: str


class PlanAuditObject(BaseModel):
    plan_id: str
    ok: bool  # every run's hash chain verifies
    head: str  # the plan-level chain: over the plan's events, then each run's head
    events: int
    runs: list[RunAuditObject]


@router.get("/v1/plans/{plan_id}/audit", response_model=PlanAuditObject)
async def plan_audit(plan_id: str, request: Request) -> PlanAuditObject:
    """Every run the plan had, its audit chain verified, and the head of the chain linking them."""
    a = await call(runtime(request).plans.audit, plan_id)
    return PlanAuditObject(plan_id=a.plan_id, ok=a.ok, head=a.head, events=a.events, runs=[
        RunAuditObject(run_id=r.run_id, task=r.task, parent_run_id=r.parent_run_id, ok=r.verdict.ok,
                       entries=r.verdict.entries, head=r.verdict.head, broken_at=r.verdict.broken_at,
                       reason=r.verdict.reason) for r in a.runs])


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
