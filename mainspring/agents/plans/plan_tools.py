"""The tools a plan task's agent coordinates with: send_message, wait_for_message and handoff.

They work only in a run that is a plan task's current run (waits.seat_of); anywhere else they answer an error
the model sees. wait_for_message blocks its call, polling the database, until the message is there or the wait
ends another way (waits.py lists how); every open wait is an edge of the wait-for graph the scheduler checks for
cycles (deadlocks.py), so agents waiting on each other are found and broken instead of hanging. `wake` tells the
local scheduler a wait opened, so a cycle is found at once rather than at its next poll.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from sqlalchemy import select

from mainspring.agents.journal import project_is
from mainspring.agents.plans import waits
from mainspring.agents.plans.spec import PlanError
from mainspring.agents.plans.tables import TASK_TERMINAL, PlanRow, PlanTaskRow
from mainspring.agents.tables import AgentRow
from mainspring.agents.tools.base import EndRun, Tool, ToolContext, ToolError, ToolResult
from mainspring.agents.tools.decorator import function_tool
from mainspring.store.base import utcnow as now
from mainspring.store.db import session

POLL_S = (0.05, 0.5)  # first and longest pause between two looks at the mailbox
MAX_WAIT_S = 24 * 3600.0  # the tool's own bound; the plan's message_timeout_s is usually far lower


def coordination_tools(db: str, wake: Callable[[], None] = lambda: None) -> list[Tool]:
    def seat(ctx: ToolContext) -> waits.Seat:
        found = waits.seat_of(db, ctx.run_id)
        if found is None:
            raise ToolError("this run is not a plan task's: messages and handoffs are between a plan's tasks")
        return found

    async def send_message(to: str, text: str, ctx: ToolContext) -> str:
        """Send a message to another task of this plan; its agent receives it with wait_for_message.

        Args:
            to: the task key of the receiving task (as in the plan, e.g. "review" or "draft[2]")
            text: the message
        """
        where = await asyncio.to_thread(seat, ctx)
        try:
            await asyncio.to_thread(waits.send, db, where, ctx.call_id, to, text)
        except PlanError as exc:
            raise ToolError(exc.message)
        return f"sent to task {to!r}"

    async def wait_for_message(sender: str, ctx: ToolContext, timeout_s: float | None = None) -> ToolResult:
        """Wait for the next message another task of this plan sends to this one, and return it.

        Args:
            sender: the task key of the task whose message to wait for
            timeout_s: the longest to wait, in seconds (at most the plan's message timeout)
        """
        where = await asyncio.to_thread(seat, ctx)
        limit = where.message_timeout_s if timeout_s is None else min(max(float(timeout_s), 0.0),
                                                                      where.message_timeout_s)
        try:
            got = await asyncio.to_thread(waits.take, db, where, ctx.call_id, sender)
            if got is not None:
                return _received(got)
            status = await asyncio.to_thread(waits.target_status, db, where, sender)
            if status in TASK_TERMINAL:
                raise ToolError(f"task {sender!r} is {status} and sent no message: none will come")
            wait = await asyncio.to_thread(waits.open_wait, db, where, ctx.call_id, ctx.run_id, sender, limit)
        except PlanError as exc:
            raise ToolError(exc.message)
        wake()
        pause = POLL_S[0]
        while True:
            got = await asyncio.to_thread(waits.take, db, where, ctx.call_id, sender)
            if got is not None:
                await asyncio.to_thread(waits.end_wait, db, wait.id, "received")
                return _received(got)
            current = await asyncio.to_thread(waits.wait, db, wait.id)
            if current.ended_at is None and ctx.cancel.is_set():
                await asyncio.to_thread(waits.end_wait, db, wait.id, "abandoned", "the run was stopped")
                raise ToolError("the run was stopped while waiting")
            if current.ended_at is None and now() > current.deadline_at:
                await asyncio.to_thread(waits.end_wait, db, wait.id, "timed_out",
                                        f"no message from task {sender!r} within {limit:g} s")
                current = await asyncio.to_thread(waits.wait, db, wait.id)
            if current.ended_at is not None and current.outcome != "received":
                raise ToolError(f"the wait for task {sender!r} ended ({current.outcome}): {current.detail}")
            await asyncio.sleep(pause)
            pause = min(pause * 2, POLL_S[1])

    async def handoff(agent: str, note: str, ctx: ToolContext) -> str:
        """Hand this task over to another agent: your run ends here, and that agent goes on with the task, reading
        this conversation and your note.

        Args:
            agent: the name of the agent to hand over to (an agent of this project)
            note: what the next agent should know or do
        """
        where = await asyncio.to_thread(seat, ctx)
        current = await asyncio.to_thread(_current_agent, db, where)
        if agent == current:
            raise ToolError(f"this task is already with agent {agent!r}")
        if not await asyncio.to_thread(_agent_exists, db, where.plan_id, agent):
            raise ToolError(f"no agent {agent!r} in this project")
        raise EndRun(f"handed over to agent {agent!r}",
                     json.dumps({"handoff": {"from": current, "to": agent, "note": note}}), "handoff")

    return [function_tool(send_message, idempotent=True, timeout_s=30),
            # the loop's own bound on the call: the wait ends itself well before (message_timeout_s)
            function_tool(wait_for_message, idempotent=True, timeout_s=MAX_WAIT_S),
            function_tool(handoff, idempotent=True, timeout_s=30)]


def _received(message: Any) -> ToolResult:
    return ToolResult(f"message from task {message.from_task!r}:\n{message.body}",
                      data={"from": message.from_task, "id": message.id})


def _current_agent(db: str, where: waits.Seat) -> str:
    from mainspring.agents.plans.store import load_spec

    with session(db, readonly=True) as s:
        plan = s.get(PlanRow, where.plan_id)
        task = s.scalars(select(PlanTaskRow).where(PlanTaskRow.plan_id == where.plan_id,
                                                   PlanTaskRow.key == where.task)).first()
        assert plan is not None and task is not None
        return task.agent_override or next(t.agent for t in load_spec(plan).tasks if t.id == task.spec_key)


def _agent_exists(db: str, plan_id: str, name: str) -> bool:
    with session(db, readonly=True) as s:
        project = s.scalar(select(PlanRow.project_id).where(PlanRow.id == plan_id))
        return s.scalar(select(AgentRow.id).where(AgentRow.name == name,
                                                  project_is(AgentRow.project_id, project)).limit(1)) is not None
