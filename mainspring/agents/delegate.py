"""Agent-as-tool: `ask_agent(agent, question)` runs another agent of the caller's project as a child run and
returns its final answer, as the OpenAI Agents SDK's `agent.as_tool()` does.

The child is an ordinary durable run (its own journal, audit chain, budget and charges on the parent's API key),
with `parent_run_id` set. Its id comes from the asking call's idempotency key, so a call re-run after a crash
finds the child it started instead of starting another. A child may ask in turn, up to MAX_DEPTH levels:
deeper asking, or asking an agent already in its chain of parents (a ring that would only recurse), is refused.
While it waits, the asking run holds its worker slot (a parent's children need free slots: keep
`agent_max_runs` above the deepest fan-out).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Callable

from sqlalchemy import select

from mainspring.agents import control, journal
from mainspring.agents.journal import JournalError, project_is
from mainspring.agents.status import TERMINAL, RunStatus
from mainspring.agents.tables import AgentRow, RunRow
from mainspring.agents.tools.base import Tool, ToolContext, ToolError
from mainspring.agents.tools.decorator import function_tool
from mainspring.store.db import session

MAX_DEPTH = 3
POLL_S = (0.05, 0.5)


def _chain(s, run: RunRow) -> list[RunRow]:
    """The run and its parents, nearest first."""
    out = [run]
    while out[-1].parent_run_id is not None and len(out) <= MAX_DEPTH + 1:
        parent = s.get(RunRow, out[-1].parent_run_id)
        if parent is None:
            break
        out.append(parent)
    return out


def _start_child(db: str, ctx: ToolContext, agent: str, question: str) -> str:
    child_id = "run_" + hashlib.sha256(f"ask_agent/{ctx.idempotency_key}".encode()).hexdigest()[:32]
    with session(db, readonly=True) as s:
        if s.get(RunRow, child_id) is not None:
            return child_id  # re-run after a crash: the child this call started
        run = s.get(RunRow, ctx.run_id)
        assert run is not None
        chain = _chain(s, run)
        target = s.scalars(select(AgentRow).where(AgentRow.name == agent, project_is(AgentRow.project_id,
                                                                                     run.project_id))
                           .order_by(AgentRow.version.desc())).first()
        if target is None:
            raise ToolError(f"no agent {agent!r} in this project")
        if len(chain) > MAX_DEPTH:
            raise ToolError(f"ask_agent nests at most {MAX_DEPTH} levels deep")
        asking = set(s.scalars(select(AgentRow.name).where(AgentRow.id.in_({r.agent_id for r in chain}))))
        if agent in asking:
            raise ToolError(f"agent {agent!r} is already asking (it is this run or one of its parents): "
                            "asking it again would only go round")
    try:
        journal.create_run(db, target.id, question, project_id=run.project_id, api_key_id=run.api_key_id,
                           run_id=child_id, parent_run_id=run.id, priority=run.priority)
    except JournalError as exc:
        raise ToolError(str(exc))
    return child_id


def ask_agent_tool(db: str, notify: Callable[[], None] = lambda: None, timeout_s: float = 3600) -> Tool:
    async def ask_agent(agent: str, question: str, ctx: ToolContext) -> str:
        """Ask another agent of this project a question: it runs as a separate agent with its own tools, and its
        final answer comes back as this tool's result.

        Args:
            agent: the name of the agent to ask
            question: everything it needs to know, on its own (it does not see this conversation)
        """
        child_id = await asyncio.to_thread(_start_child, db, ctx, agent, question)
        notify()
        pause = POLL_S[0]
        while True:
            child = await asyncio.to_thread(_read, db, child_id)
            if child.status in TERMINAL:
                if child.status == RunStatus.SUCCEEDED:
                    return child.result or ""
                raise ToolError(f"agent {agent!r} did not answer: its run {child_id} {child.status}"
                                f"{': ' + child.error if child.error else ''}")
            if ctx.cancel.is_set():  # the asking run was cancelled: its question goes with it
                await asyncio.to_thread(_cancel, db, child_id)
                raise ToolError("cancelled while waiting for the answer")
            await asyncio.sleep(pause)
            pause = min(pause * 2, POLL_S[1])

    return function_tool(ask_agent, idempotent=True, timeout_s=timeout_s)


def _read(db: str, run_id: str) -> RunRow:
    with session(db, readonly=True) as s:
        run = s.get(RunRow, run_id)
        assert run is not None
        return run


def _cancel(db: str, run_id: str) -> None:
    try:
        control.request(db, run_id, "cancel", actor="ask_agent")
    except JournalError:  # it ended meanwhile
        pass
