"""Local-only refusals of the agent routes (api/project_policy.py): a local-only project may not create a run, a
plan or a schedule (of either) that names an upstream model, nor resume a run that would go to one.

These are the early, explicit 403s a client sees at the call it made. The agent runtime's model resolver
(api/agent_models.AppModels) checks the same policy again on every step, so a run that was queued or running
when its project went local-only fails at its next model call instead of sending anything upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fastapi import Request

from mainspring.agents.journal import JournalError, agent_spec
from mainspring.agents.plans.spec import PlanSpec
from mainspring.agents.runtime import AgentRuntime
from mainspring.agents.spec import AgentSpec
from mainspring.api import upstream
from mainspring.api.project_policy import local_only_error, read_policy, refuse_if_local_only
from mainspring.store.db import session


async def refuse_upstream_model(request: Request, model: str | None, param: str | None) -> None:
    """403 when `model` is an upstream's and the caller's project is local-only (no database read otherwise)."""
    if model and upstream.serves(request, model):
        await refuse_if_local_only(request, model, param)


def _agent_model(rt: AgentRuntime, name_or_id: str) -> str | None:
    try:
        row = rt.agent(name_or_id)
    except JournalError:  # an unknown agent: the runtime's own 404 says so when the run is made
        return None
    return AgentSpec.model_validate_json(row.spec_json).model


async def refuse_upstream_agents(request: Request, rt: AgentRuntime, agents: Sequence[str],
                                 param: str | None = None) -> None:
    """403 when the caller's project is local-only and one of `agents` (names or ids, as `rt` sees them) runs on
    an upstream model."""
    models = {await asyncio.to_thread(_agent_model, rt, name) for name in agents}
    for model in sorted(m for m in models if m):
        await refuse_upstream_model(request, model, param)


async def refuse_upstream_plan(request: Request, rt: AgentRuntime, plan: PlanSpec,
                               param: str | None = None) -> None:
    """403 when the caller's project is local-only and `plan` routes tasks to an upstream model (its
    `simple_model`, or a task's agent); `param` names the field, else `simple_model` or `tasks`."""
    await refuse_upstream_model(request, plan.simple_model, param or "simple_model")
    await refuse_upstream_agents(request, rt, sorted({t.agent for t in plan.tasks}), param or "tasks")


def _run_model(rt: AgentRuntime, run_id: str) -> tuple[str | None, int | None]:
    """The model a run's next step would use (its own override, else its pinned agent version's), and its
    project."""
    try:
        run = rt.run(run_id)
        if run.model_override is not None:
            return run.model_override, run.project_id
        with session(rt.db, readonly=True) as s:
            return agent_spec(s, run.agent_id).model, run.project_id
    except JournalError:  # not the caller's, or no such run: the action's own error says so
        return None, None


async def refuse_resuming_upstream_run(request: Request, rt: AgentRuntime, run_id: str) -> None:
    """403 on resuming a run of a local-only project whose model is an upstream's. The run's project decides
    (an operator may act on any project's run), read now: the policy may have changed since the run began."""
    model, project_id = await asyncio.to_thread(_run_model, rt, run_id)
    if model is None or not upstream.serves(request, model):
        return
    policy = await asyncio.to_thread(read_policy, request.app.state.economics.db, project_id)
    if policy.local_only:
        raise local_only_error(model, None)
