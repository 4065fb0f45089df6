"""The agent runtime's commands over HTTP: agents, threads, runs, and what people do to runs (cancel, pause,
interrupt, resume, raise a budget, approve / reject / edit a tool call).

Every route goes through `request.app.state.agents` (an AgentRuntime). What a run has produced (events, steps,
artifacts, audit) is read by the routes in runs.py. Money is integer micro-USD plus an exact decimal string of
USD, never a float.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, Callable, Literal, TypeVar

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from mainspring.agents.journal import JournalError
from mainspring.agents.runtime import AgentRuntime
from mainspring.agents.spec import AgentSpec
from mainspring.agents.status import InterruptStatus, RunStatus
from mainspring.agents.tables import AgentRow, InterruptRow, RunRow
from mainspring.api.errors import APIError
from mainspring.api.routes.agent_policy import refuse_resuming_upstream_run, refuse_upstream_agents
from mainspring.billing.prices import MICRO, usd_to_micro

router = APIRouter()
T = TypeVar("T")

MAX_INT = 2**62  # keeps every integer a client sends inside SQLite's 64-bit columns
MAX_DURATION_S = 10 * 365 * 24 * 3600
_CODES = {400: "invalid_value", 404: "not_found", 409: "invalid_state"}


# ---- calling the runtime ---------------------------------------------------------------------------------
def runtime(request: Request) -> AgentRuntime:
    """The runtime as the caller's project sees it: every route reaches the agents only through this view."""
    key = getattr(request.state, "principal", None)
    rt = request.app.state.agents
    return rt.scoped(key.project_id, key.id) if key is not None else rt.scoped(None)


def api_error(exc: JournalError) -> APIError:
    return APIError(exc.status, str(exc), code=_CODES.get(exc.status))


async def read(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A runtime read: blocking SQL, so off the event loop; a JournalError becomes its HTTP error."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except JournalError as exc:
        raise api_error(exc) from None




def actor(request: Request, claimed: str | None = None) -> str:
    """Who acts, as the journal records it: the API key when there is one (a client's claim alone is not
    trusted), with the name the client gives."""
    key = getattr(request.state, "principal", None)
    if key is None:
        return claimed or "anonymous"
    return f"{claimed} (key:{key.id})" if claimed else f"key:{key.id}"


def usd(u: int | None) -> str | None:
    return None if u is None else f"{Decimal(u) / MICRO:f}"


def cost_field() -> Any:
    return Field(None, pattern=r"^\d{1,9}(\.\d{1,6})?$", description='USD as a decimal string, e.g. "0.50"')


def cost_u(value: str | None, param: str) -> int | None:
    if value is None:
        return None
    try:
        return usd_to_micro(value)
    except ValueError as exc:
        raise APIError(400, f"invalid value for '{param}': {exc}", param=param, code="invalid_value") from None


def ts(t: datetime | None) -> int | None:
    return None if t is None else int(t.timestamp())


# ---- response objects ------------------------------------------------------------------------------------
class AgentObject(BaseModel):
    id: str
    object: Literal["agent"] = "agent"
    name: str
    version: int
    spec: AgentSpec
    created_at: int | None


def agent_object(row: AgentRow) -> AgentObject:
    return AgentObject(id=row.id, name=row.name, version=row.version,
                       spec=AgentSpec.model_validate_json(row.spec_json), created_at=ts(row.created_at))


class RunUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    total_tokens: int


class RunBudget(BaseModel):
    token_budget: int | None
    cost_budget_u: int | None
    cost_budget_usd: str | None


class RunObject(BaseModel):
    id: str
    object: Literal["agent.run"] = "agent.run"
    agent_id: str
    thread_id: str
    goal: str
    status: str
    pause_reason: str | None
    stop_reason: str | None
    result: str | None
    error: str | None
    priority: int
    step_count: int
    attempt: int
    usage: RunUsage
    cost_u: int
    cost_usd: str
    budget: RunBudget
    cancel_requested: bool
    pause_requested: bool
    pending_interrupts: list[str]
    created_at: int | None
    started_at: int | None
    finished_at: int | None
    updated_at: int | None


def run_object(run: RunRow, pending: list[str]) -> RunObject:
    return RunObject(
        id=run.id, agent_id=run.agent_id, thread_id=run.thread_id, goal=run.goal, status=run.status,
        pause_reason=run.pause_reason, stop_reason=run.stop_reason, result=run.result, error=run.error,
        priority=run.priority, step_count=run.step_count, attempt=run.attempt,
        usage=RunUsage(prompt_tokens=run.prompt_tokens, completion_tokens=run.completion_tokens,
                       cached_tokens=run.cached_tokens, total_tokens=run.prompt_tokens + run.completion_tokens),
        cost_u=run.cost_u, cost_usd=usd(run.cost_u),
        budget=RunBudget(token_budget=run.token_budget, cost_budget_u=run.cost_budget_u,
                         cost_budget_usd=usd(run.cost_budget_u)),
        cancel_requested=bool(run.cancel_requested), pause_requested=bool(run.pause_requested),
        pending_interrupts=pending, created_at=ts(run.created_at), started_at=ts(run.started_at),
        finished_at=ts(run.finished_at), updated_at=ts(run.updated_at))


async def run_response(request: Request, run: RunRow) -> RunObject:
    pending = await read(runtime(request).interrupts, run.id, InterruptStatus.PENDING)
    return run_object(run, [i.id for i in pending])


class ToolCallRef(BaseModel):
    id: str | None
    name: str | None
    arguments: str | None  # JSON text, as the model wrote it (or as a human edited it)


class InterruptObject(BaseModel):
    id: str
    object: Literal["agent.interrupt"] = "agent.interrupt"
    run_id: str
    kind: str  # approval | in_flight
    status: str  # pending | approved | rejected | edited | expired
    tool_call: ToolCallRef
    actor: str | None
    comment: str | None
    expiry_decision: str
    expires_at: int | None
    created_at: int | None
    resolved_at: int | None


async def interrupt_objects(request: Request, rows: list[InterruptRow]) -> list[InterruptObject]:
    # the interrupt row names its tool call only by id: name and arguments come from the run's journal
    calls: dict[str, dict] = {}
    for run_id in dict.fromkeys(r.run_id for r in rows):
        for step in await read(runtime(request).steps, run_id):
            calls.update({c["id"]: c for c in step["tool_calls"]})
    out = []
    for r in rows:
        call = calls.get(r.tool_call_id or "", {})
        out.append(InterruptObject(
            id=r.id, run_id=r.run_id, kind=r.kind, status=r.status,
            tool_call=ToolCallRef(id=r.tool_call_id, name=call.get("name"), arguments=call.get("arguments")),
            actor=r.actor, comment=r.comment, expiry_decision=r.expiry_decision, expires_at=ts(r.expires_at),
            created_at=ts(r.created_at), resolved_at=ts(r.resolved_at)))
    return out


def page(data: Sequence[BaseModel]) -> dict:
    return {"object": "list", "data": [d.model_dump() for d in data]}


# ---- agents and threads ----------------------------------------------------------------------------------
@router.post("/v1/agents", status_code=201, response_model=AgentObject,
             responses={200: {"model": AgentObject, "description": "the spec equals the newest version's"}})
async def put_agent(spec: AgentSpec, request: Request):
    """A new version of the agent `spec.name` when the spec changed (201), else its newest version (200).
    Runs keep the version they started on."""
    for name in ("max_wall_s", "approval_ttl_s"):
        # WORKAROUND until AgentLimits bounds them: a deadline past year 9999 breaks the worker's claim of every run
        if (getattr(spec.limits, name) or 0) > MAX_DURATION_S:
            raise APIError(400, f"invalid value for 'limits.{name}': at most {MAX_DURATION_S} seconds (10 years)",
                           param=f"limits.{name}", code="invalid_value")
    rt = runtime(request)
    before = {a.id for a in await read(rt.agents)}
    row = await read(rt.put_agent, spec)
    body = agent_object(row)
    return body if row.id not in before else JSONResponse(body.model_dump(mode="json"), status_code=200)


@router.get("/v1/agents")
async def list_agents(request: Request) -> dict:
    return page([agent_object(a) for a in await read(runtime(request).agents)])


@router.get("/v1/agents/{name_or_id}")
async def get_agent(name_or_id: str, request: Request) -> AgentObject:
    """By id (one version) or by name (its newest version)."""
    return agent_object(await read(runtime(request).agent, name_or_id))


class CreateThread(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, str] | None = Field(None, max_length=16)


class ThreadObject(BaseModel):
    id: str
    object: Literal["thread"] = "thread"
    created_at: int | None


@router.post("/v1/threads", status_code=201)
async def create_thread(request: Request, body: CreateThread | None = None) -> ThreadObject:
    """A thread groups runs; create one and pass its id to several runs."""
    row = await read(runtime(request).create_thread, body.metadata if body else None)
    return ThreadObject(id=row.id, created_at=ts(row.created_at))


# ---- runs ------------------------------------------------------------------------------------------------
class Attachments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    docs: str | list[str] | None = Field(
        None, description="what the search tool reads: ids of files this project uploaded (/v1/files), or a "
        "folder on the server under MAINSPRING_AGENT_ATTACH_ROOTS")
    db: str | None = Field(None, description="the database the sql tool queries: the id of a file this project "
                           "uploaded, or a SQLite/DuckDB file on the server under MAINSPRING_AGENT_ATTACH_ROOTS")


class CreateRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent: str = Field(..., min_length=1, description="agent name (its newest version) or agent id")
    goal: str = Field(..., min_length=1)
    thread_id: str | None = None
    priority: int = Field(0, ge=-1000, le=1000, description="higher runs first")
    token_budget: int | None = Field(None, ge=1, le=MAX_INT, description="overrides the agent's limit")
    cost_budget_usd: str | None = cost_field()
    attachments: Attachments | None = None


@router.post("/v1/runs", status_code=201)
async def create_run(body: CreateRun, request: Request) -> RunObject:
    attachments = {k: v for k, v in (body.attachments.model_dump() if body.attachments else {}).items() if v}
    await refuse_upstream_agents(request, runtime(request), [body.agent], param="agent")  # agent_policy.py
    run = await read(runtime(request).start_run, body.agent, body.goal, thread_id=body.thread_id,
                  priority=body.priority, token_budget=body.token_budget,
                  cost_budget_u=cost_u(body.cost_budget_usd, "cost_budget_usd"), attachments=attachments)
    return run_object(run, [])


@router.get("/v1/runs")
async def list_runs(request: Request, status: RunStatus | None = None,
                    limit: int = Query(50, ge=1, le=500)) -> dict:
    """Newest first."""
    rt = runtime(request)
    runs = await read(rt.runs, status, limit)
    pending: dict[str, list[str]] = {}
    for i in await read(rt.interrupts, None, InterruptStatus.PENDING):
        pending.setdefault(i.run_id, []).append(i.id)
    return page([run_object(r, pending.get(r.id, [])) for r in runs])


@router.get("/v1/runs/{run_id}")
async def get_run(run_id: str, request: Request) -> RunObject:
    return await run_response(request, await read(runtime(request).run, run_id))


# ---- people acting on runs -------------------------------------------------------------------------------
class Act(BaseModel):
    model_config = ConfigDict(extra="forbid")
    actor: str | None = Field(None, max_length=128, description="a name for the audit trail")


async def _act(request: Request, run_id: str, action: str, body: Act | None) -> RunObject:
    run = await read(runtime(request).act, run_id, action, actor(request, body.actor if body else None))
    return await run_response(request, run)


@router.post("/v1/runs/{run_id}/cancel")
async def cancel_run(run_id: str, request: Request, body: Act | None = None) -> RunObject:
    """Ends the run (cancelled); a step in flight is cut, a tool call in flight is recorded as cancelled."""
    return await _act(request, run_id, "cancel", body)


@router.post("/v1/runs/{run_id}/pause")
async def pause_run(run_id: str, request: Request, body: Act | None = None) -> RunObject:
    """Parks the run (paused, reason user) once the step in flight has finished; /resume continues it."""
    return await _act(request, run_id, "pause", body)


@router.post("/v1/runs/{run_id}/interrupt")
async def interrupt_run(run_id: str, request: Request, body: Act | None = None) -> RunObject:
    """Stops the run now, cutting the step in flight (it runs again on /resume, or a human decides if it
    was a non-idempotent tool call)."""
    return await _act(request, run_id, "interrupt", body)


@router.post("/v1/runs/{run_id}/resume")
async def resume_run(run_id: str, request: Request, body: Act | None = None) -> RunObject:
    await refuse_resuming_upstream_run(request, runtime(request), run_id)  # the project may have gone local-only
    return await _act(request, run_id, "resume", body)


class BudgetChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token_budget: int | None = Field(None, ge=1, le=MAX_INT)
    cost_budget_usd: str | None = cost_field()
    actor: str | None = Field(None, max_length=128)


@router.post("/v1/runs/{run_id}/budget")
async def change_budget(run_id: str, body: BudgetChange, request: Request) -> RunObject:
    """New limits for the run; a run paused by its budget is queued again."""
    if body.token_budget is None and body.cost_budget_usd is None:
        raise APIError(400, "give token_budget, cost_budget_usd or both", param="token_budget",
                       code="missing_required_parameter")
    run = await read(runtime(request).raise_budget, run_id, token_budget=body.token_budget,
                  cost_budget_u=cost_u(body.cost_budget_usd, "cost_budget_usd"), actor=actor(request, body.actor))
    return await run_response(request, run)


# ---- interrupts ------------------------------------------------------------------------------------------
InterruptFilter = Literal["pending", "approved", "rejected", "edited", "expired", "all"]  # InterruptStatus or all


@router.get("/v1/interrupts")
async def list_interrupts(request: Request, run_id: str | None = None,
                          status: InterruptFilter = "pending") -> dict:
    rows = await read(runtime(request).interrupts, run_id, None if status == "all" else status)
    return page(await interrupt_objects(request, rows))


class Resolve(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "reject", "edit"]
    arguments: dict[str, Any] | None = Field(None, description="edit: the arguments the call runs with instead")
    comment: str | None = Field(None, max_length=4000, description="reject: shown to the model")
    actor: str | None = Field(None, max_length=128)


@router.post("/v1/interrupts/{interrupt_id}/resolve")
async def resolve_interrupt(interrupt_id: str, body: Resolve, request: Request) -> InterruptObject:
    if body.decision == "edit" and body.arguments is None:
        raise APIError(400, "an edit needs `arguments`: the JSON object the call runs with", param="arguments",
                       code="missing_required_parameter")
    if body.decision != "edit" and body.arguments is not None:
        raise APIError(400, "`arguments` go with decision \"edit\"", param="arguments", code="invalid_value")
    row = await read(runtime(request).resolve, interrupt_id, body.decision, actor=actor(request, body.actor),
                  arguments=body.arguments, comment=body.comment)
    return (await interrupt_objects(request, [row]))[0]
