"""What people do to runs: approve / reject / edit a tool call, let approvals expire, pause, resume, cancel,
raise a budget. Server-held state only: a decision is applied to the journal, never taken from a client's copy."""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import select

from mainspring.agents import audit
from mainspring.agents.journal import JournalError, event, get_run, new_id, now
from mainspring.agents.tables import InterruptRow, RunRow, TERMINAL, ToolCallRow
from mainspring.store.db import session

DECISIONS = ("approve", "reject", "edit")


def open_interrupt(db: str, run_id: str, owner: str, call: ToolCallRow, kind: str, ttl_s: float | None,
                   expiry_decision: str) -> str:
    """Park the run until a human decides on `call` (kind: approval | in_flight)."""
    from mainspring.agents.journal import fenced

    with session(db) as s:
        run = fenced(s, run_id, owner)
        row = s.get(ToolCallRow, call.id)
        row.status = "waiting_approval"
        interrupt = InterruptRow(id=new_id("int"), run_id=run_id, tool_call_id=call.id, kind=kind, status="pending",
                                 expires_at=now() + timedelta(seconds=ttl_s) if ttl_s else None,
                                 expiry_decision=expiry_decision, created_at=now())
        s.add(interrupt)
        run.status, run.pause_reason = "waiting_approval", kind
        run.lease_owner, run.lease_expires_at = None, None
        event(s, run_id, "interrupt.created", interrupt_id=interrupt.id, kind=kind, call_id=call.id,
              name=call.name, arguments=row.arguments_json,
              expires_at=interrupt.expires_at.isoformat() if interrupt.expires_at else None)
        event(s, run_id, "run.status", status="waiting_approval", reason=kind)
        audit.append(s, run_id, "interrupt.created", {"interrupt_id": interrupt.id, "kind": kind, "call_id": call.id,
                                                      "name": call.name, "arguments": row.arguments_json})
        return interrupt.id


def resolve(db: str, interrupt_id: str, decision: str, *, actor: str, arguments: dict | None = None,
            comment: str | None = None) -> InterruptRow:
    """approve: run the call (in_flight: run it again); edit: run it with `arguments`; reject: never run it."""
    if decision not in DECISIONS:
        raise JournalError(f"decision must be one of {', '.join(DECISIONS)}", status=400)
    if decision == "edit" and not isinstance(arguments, dict):
        raise JournalError("an edit needs the new arguments as a JSON object", status=400)
    with session(db) as s:
        interrupt = s.get(InterruptRow, interrupt_id)
        if interrupt is None:
            raise JournalError(f"no interrupt {interrupt_id!r}", status=404)
        if interrupt.status != "pending":
            raise JournalError(f"interrupt {interrupt_id} is already {interrupt.status}")
        _apply(s, interrupt, decision, actor=actor, arguments=arguments, comment=comment)
        return interrupt


def _apply(s, interrupt: InterruptRow, decision: str, *, actor: str, arguments=None, comment=None) -> None:
    call = s.get(ToolCallRow, interrupt.tool_call_id)
    interrupt.status = {"approve": "approved", "reject": "rejected", "edit": "edited"}[decision]
    interrupt.actor, interrupt.comment, interrupt.resolved_at = actor, comment, now()
    if decision == "edit":
        interrupt.arguments_json = call.arguments_json = json.dumps(arguments)
    if decision == "reject":
        call.status, call.finished_at = "rejected", now()
        note = f"A human rejected this call{': ' + comment if comment else ''}. It was not run."
        call.result_json = json.dumps({"content": note, "is_error": True})
    else:
        call.status = "approved"
    run = s.get(RunRow, interrupt.run_id)
    still_waiting = s.scalars(select(InterruptRow).where(InterruptRow.run_id == run.id,
                                                         InterruptRow.status == "pending",
                                                         InterruptRow.id != interrupt.id)).first()
    if run.status == "waiting_approval" and still_waiting is None:
        run.status, run.pause_reason = "queued", None
        event(s, run.id, "run.status", status="queued", reason="interrupt resolved")
    event(s, run.id, "interrupt.resolved", interrupt_id=interrupt.id, decision=decision, actor=actor,
          arguments=call.arguments_json)
    audit.append(s, run.id, "interrupt.resolved", {"interrupt_id": interrupt.id, "decision": decision,
                                                    "actor": actor, "comment": comment,
                                                    "arguments": call.arguments_json})


def expire_due(db: str) -> int:
    """Resolve pending interrupts past their expiry with their configured default decision."""
    t = now()
    with session(db, readonly=True) as s:  # the worker asks every poll: only take the write lock when needed
        if s.scalars(select(InterruptRow.id).where(InterruptRow.status == "pending",
                                                   InterruptRow.expires_at.is_not(None),
                                                   InterruptRow.expires_at < t).limit(1)).first() is None:
            return 0
    with session(db) as s:
        due = s.scalars(select(InterruptRow).where(InterruptRow.status == "pending",
                                                   InterruptRow.expires_at.is_not(None),
                                                   InterruptRow.expires_at < t)).all()
        for interrupt in due:
            _apply(s, interrupt, interrupt.expiry_decision, actor="system:expiry",
                   comment="approval expired")
            interrupt.status = "expired"
        return len(due)


def request(db: str, run_id: str, action: str, actor: str = "user") -> RunRow:
    """cancel | pause | resume. A run that no worker holds changes at once; a running one at its next step
    (cancel and pause also interrupt the step in flight, through the worker)."""
    with session(db) as s:
        run = get_run(s, run_id)
        if run.status in TERMINAL:
            raise JournalError(f"run {run_id} already {run.status}")
        if action == "cancel":
            if run.status == "running":
                run.cancel_requested = True
            else:
                run.status, run.finished_at, run.stop_reason = "cancelled", now(), "cancelled"
                event(s, run_id, "run.finished", status="cancelled", stop_reason="cancelled", actor=actor)
        elif action == "pause":
            if run.status == "running":
                run.pause_requested = True
            elif run.status == "queued":
                run.status, run.pause_reason = "paused", "user"
                event(s, run_id, "run.status", status="paused", reason="user")
        elif action == "resume":
            if run.status != "paused":
                raise JournalError(f"run {run_id} is {run.status}, not paused")
            run.status, run.pause_reason, run.pause_requested = "queued", None, False
            event(s, run_id, "run.status", status="queued", reason="resumed")
        else:
            raise JournalError(f"unknown action {action!r}", status=400)
        audit.append(s, run_id, f"run.{action}", {"actor": actor})
        return run


def raise_budget(db: str, run_id: str, *, token_budget: int | None = None, cost_budget_u: int | None = None,
                 actor: str = "user") -> RunRow:
    """New limits; a run paused by its budget is queued again."""
    with session(db) as s:
        run = get_run(s, run_id)
        if token_budget is not None:
            run.token_budget = token_budget
        if cost_budget_u is not None:
            run.cost_budget_u = cost_budget_u
        event(s, run_id, "budget.changed", token_budget=run.token_budget, cost_budget_u=run.cost_budget_u)
        audit.append(s, run_id, "budget.changed", {"token_budget": run.token_budget,
                                                    "cost_budget_u": run.cost_budget_u, "actor": actor})
        if run.status == "paused" and run.pause_reason == "budget":
            run.status, run.pause_reason = "queued", None
            event(s, run_id, "run.status", status="queued", reason="budget raised")
        return run
