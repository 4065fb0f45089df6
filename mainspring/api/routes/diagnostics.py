"""Diagnostics of plans over HTTP: deadlocks and livelocks between tasks, and the live wait-for graph.

    GET  /v1/diagnostics/deadlocks               the caller's deadlocks and livelocks, newest first
                                                 (?plan_id=, ?status=open|resolved)
    GET  /v1/diagnostics/deadlocks/{id}          one, with its cycle spelled out
    POST /v1/diagnostics/deadlocks/{id}/resolve  a person's decision on an open one (deadlock_policy ask_human):
                                                 {"action": "fail" | "release", "task": "<a member's key>"}
    GET  /v1/diagnostics/waits                   the open waits: which task waits for which (?plan_id=)

Detection and resolution themselves are the plan scheduler's (agents/plans/deadlocks.py); every route goes through
`runtime(request).plans`, so a caller sees its own project's plans only.
"""

from __future__ import annotations

import json
from typing import Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from mainspring.agents.plans.deadlocks import spell
from mainspring.agents.plans.tables import DeadlockRow, PlanWaitRow
from mainspring.api.routes.agents import actor, page, runtime, ts
from mainspring.api.routes.plans import call

router = APIRouter()


class DeadlockObject(BaseModel):
    id: str
    object: Literal["plan.deadlock"] = "plan.deadlock"
    plan_id: str
    kind: str  # deadlock (a wait-for cycle) | livelock (a task handed back and forth past max_handoffs)
    cycle: list[str]  # task keys round the cycle (the first repeated last); a livelock: the agents in turn
    text: str  # the cycle spelled out: "a → b → c → a"
    policy: str
    status: str  # open (a person decides) | resolved
    victim: str | None
    resolution: str | None
    detected_at: int | None
    resolved_at: int | None


class WaitObject(BaseModel):
    object: Literal["plan.wait"] = "plan.wait"
    plan_id: str
    waiter: str
    target: str
    run_id: str
    since: int | None
    deadline_at: int | None


class ResolveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["fail", "release"] = Field(..., description="fail the task (no retry), or release it: its "
                                                               "wait ends with an error its agent sees")
    task: str = Field(..., min_length=1, max_length=96, description="a member of the cycle")
    actor: str | None = Field(None, max_length=200)


def deadlock_object(row: DeadlockRow) -> DeadlockObject:
    cycle = json.loads(row.cycle_json)
    return DeadlockObject(id=row.id, plan_id=row.plan_id, kind=row.kind, cycle=cycle, text=spell(cycle),
                          policy=row.policy, status=row.status, victim=row.victim, resolution=row.resolution,
                          detected_at=ts(row.detected_at), resolved_at=ts(row.resolved_at))


def wait_object(row: PlanWaitRow) -> WaitObject:
    return WaitObject(plan_id=row.plan_id, waiter=row.waiter, target=row.target, run_id=row.run_id,
                      since=ts(row.since), deadline_at=ts(row.deadline_at))


@router.get("/v1/diagnostics/deadlocks")
async def list_deadlocks(request: Request, plan_id: str | None = Query(None, max_length=64),
                         status: Literal["open", "resolved"] | None = None,
                         limit: int = Query(100, ge=1, le=1000)) -> dict:
    rows = await call(runtime(request).plans.deadlocks, plan_id, status, limit)
    return page([deadlock_object(r) for r in rows])


@router.get("/v1/diagnostics/deadlocks/{deadlock_id}", response_model=DeadlockObject)
async def get_deadlock(request: Request, deadlock_id: str) -> DeadlockObject:
    return deadlock_object(await call(runtime(request).plans.deadlock, deadlock_id))


@router.post("/v1/diagnostics/deadlocks/{deadlock_id}/resolve", response_model=DeadlockObject)
async def resolve_deadlock(request: Request, deadlock_id: str, body: ResolveRequest) -> DeadlockObject:
    row = await call(runtime(request).plans.resolve_deadlock, deadlock_id, body.action, body.task,
                     actor(request, body.actor))
    return deadlock_object(row)


@router.get("/v1/diagnostics/waits")
async def list_waits(request: Request, plan_id: str | None = Query(None, max_length=64)) -> dict:
    rows = await call(runtime(request).plans.waits, plan_id)
    return page([wait_object(r) for r in rows])
