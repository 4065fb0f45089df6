"""Handoffs: an agent transfers its plan task, with the conversation so far, to another agent.

The handoff tool (plan_tools.py) ends the run with stop_reason "handoff" and {"handoff": {from, to, note}} as its
result. The scheduler's reconcile then hands the task over (`store.hand_off`: the task stays in flight, now
with `agent_override` and a fresh run id, and a task.handed_off event naming the previous run) and creates the
next run, whose goal is the task's own followed by the previous runs' conversation and the note (`context`,
rebuilt from the journal and that event, so a run recreated after a crash gets the same goal).

A task handed over more than its plan's max_handoffs times is a livelock (agents passing it back and forth):
recorded by deadlocks.livelock, and the task fails without a retry.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from mainspring.agents import journal
from mainspring.agents.context import build_prompt
from mainspring.agents.plans.tables import PlanEventRow, PlanTaskRow
from mainspring.store.db import session

TRANSCRIPT_CHARS = 24_000  # the tail of the conversation the next agent reads


def request_of(result: str | None) -> dict[str, Any] | None:
    """The {from, to, note} a handoff run ended with, or None."""
    try:
        body = json.loads(result or "")
    except json.JSONDecodeError:
        return None
    hand = body.get("handoff") if isinstance(body, dict) else None
    return hand if isinstance(hand, dict) and isinstance(hand.get("to"), str) else None


def chain(db: str, task: PlanTaskRow, first_agent: str) -> list[str]:
    """The agents the task went through, from its first: ["writer", "editor", "writer", ...]."""
    with session(db, readonly=True) as s:
        bodies = s.scalars(select(PlanEventRow.data_json).where(PlanEventRow.plan_id == task.plan_id,
                                                                PlanEventRow.task_key == task.key,
                                                                PlanEventRow.type == "task.handed_off")
                           .order_by(PlanEventRow.seq))
        hands = [json.loads(b) for b in bodies]
    return [first_agent, *(h["to"] for h in hands if h.get("attempt") == task.attempt)]


def transcript(db: str, run_id: str) -> str:
    """A run's conversation as plain text (the model's view of it, from the journal), its tail if long."""
    state = journal.load_state(db, run_id)
    lines = []
    for m in build_prompt(state).messages:
        if m.get("role") == "system":
            continue
        text = m.get("content") or ""
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            text += f"\n[calls {fn.get('name')}({fn.get('arguments')})]"
        lines.append(f"{m.get('role')}: {text}".strip())
    body = "\n\n".join(lines)
    return body if len(body) <= TRANSCRIPT_CHARS else "…" + body[-TRANSCRIPT_CHARS:]


def context(db: str, task: PlanTaskRow) -> str:
    """What the task's current run reads after its goal: each earlier agent's conversation and note, oldest
    first ("" for a task never handed over)."""
    if not task.handoffs:
        return ""
    with session(db, readonly=True) as s:
        bodies = list(s.scalars(select(PlanEventRow.data_json).where(
            PlanEventRow.plan_id == task.plan_id, PlanEventRow.task_key == task.key,
            PlanEventRow.type == "task.handed_off").order_by(PlanEventRow.seq)))
    parts = []
    for body in bodies:
        hand = json.loads(body)
        if hand.get("attempt") != task.attempt:
            continue  # a retry starts the task over, from its first agent
        parts.append(f'<handoff from="{hand["from"]}" to="{hand["to"]}" run="{hand["previous_run_id"]}">\n'
                     f'{transcript(db, hand["previous_run_id"])}\n\nNote from {hand["from"]}: {hand["note"]}\n'
                     f'</handoff>')
    if not parts:
        return ""
    return ("This task was handed over to you. What happened before, and what you were told:\n\n"
            + "\n\n".join(parts))
