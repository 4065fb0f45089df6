"""What people do to runs: approve / reject / edit a tool call, let approvals expire, pause, resume, cancel,
raise a budget. Server-held state only: a decision is applied to the journal, never taken from a client's copy."""

from __future__ import annotations

import json

from sqlalchemy import select

from mainspring.agents.journal import JournalError, get_run, now
from mainspring.agents.status import MODEL_STOPPED, TERMINAL, InterruptStatus, RunStatus, ToolCallStatus
from mainspring.agents.tables import InterruptRow, RunRow, ToolCallRow
from mainspring.agents.writes import Batch, write_in
from mainspring.store.db import session

DECISIONS = ("approve", "reject", "edit")


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
        if interrupt.status != InterruptStatus.PENDING:
            raise JournalError(f"interrupt {interrupt_id} is already {interrupt.status}")
        _apply(s, interrupt, decision, actor=actor, arguments=arguments, comment=comment)
        return interrupt


def _apply(s, interrupt: InterruptRow, decision: str, *, actor: str, arguments=None, comment=None) -> None:
    call = s.get(ToolCallRow, interrupt.tool_call_id)
    interrupt.status = {"approve": InterruptStatus.APPROVED, "reject": InterruptStatus.REJECTED,
                        "edit": InterruptStatus.EDITED}[decision]
    interrupt.actor, interrupt.comment, interrupt.resolved_at = actor, comment, now()
    if decision == "edit":
        interrupt.arguments_json = call.arguments_json = json.dumps(arguments)
    if decision == "reject":
        call.status, call.finished_at = ToolCallStatus.REJECTED, now()
        note = f"A human rejected this call{': ' + comment if comment else ''}. It was not run."
        call.result_json = json.dumps({"content": note, "is_error": True})
    else:
        call.status = ToolCallStatus.APPROVED
    run = s.get(RunRow, interrupt.run_id)
    still_waiting = s.scalars(select(InterruptRow).where(InterruptRow.run_id == run.id,
                                                         InterruptRow.status == InterruptStatus.PENDING,
                                                         InterruptRow.id != interrupt.id)).first()
    batch = Batch(run.id)
    if run.status == RunStatus.WAITING_APPROVAL and still_waiting is None:
        run.status, run.pause_reason = RunStatus.QUEUED, None
        batch.event("run.status", status=RunStatus.QUEUED, reason="interrupt resolved")
    batch.event("interrupt.resolved", interrupt_id=interrupt.id, decision=decision, actor=actor,
                arguments=call.arguments_json)
    batch.audit("interrupt.resolved", {"interrupt_id": interrupt.id, "decision": decision, "actor": actor,
                                       "comment": comment, "arguments": call.arguments_json})
    write_in(s, batch)


def expire_due(db: str) -> int:
    """Resolve pending interrupts past their expiry with their configured default decision."""
    t = now()
    with session(db, readonly=True) as s:  # the worker asks every poll: only take the write lock when needed
        if s.scalars(select(InterruptRow.id).where(InterruptRow.status == InterruptStatus.PENDING,
                                                   InterruptRow.expires_at.is_not(None),
                                                   InterruptRow.expires_at < t).limit(1)).first() is None:
            return 0
    with session(db) as s:
        due = s.scalars(select(InterruptRow).where(InterruptRow.status == InterruptStatus.PENDING,
                                                   InterruptRow.expires_at.is_not(None),
                                                   InterruptRow.expires_at < t)).all()
        for interrupt in due:
            _apply(s, interrupt, interrupt.expiry_decision, actor="system:expiry",
                   comment="approval expired")
            interrupt.status = InterruptStatus.EXPIRED
        return len(due)


def request(db: str, run_id: str, action: str, actor: str = "user") -> RunRow:
    """cancel | pause | resume. A run that no worker holds changes at once; a running one at its next step
    (cancel and pause also interrupt the step in flight, through the worker)."""
    with session(db) as s:
        run = get_run(s, run_id)
        if run.status in TERMINAL:
            raise JournalError(f"run {run_id} already {run.status}")
        batch = Batch(run_id)
        if action == "cancel":
            if run.status == RunStatus.RUNNING:
                run.cancel_requested = True
            else:
                run.status, run.finished_at, run.stop_reason = RunStatus.CANCELLED, now(), "cancelled"
                batch.event("run.finished", status=RunStatus.CANCELLED, stop_reason="cancelled", actor=actor)
        elif action == "pause":
            if run.status == RunStatus.RUNNING:
                run.pause_requested = True
            elif run.status == RunStatus.QUEUED:
                run.status, run.pause_reason = RunStatus.PAUSED, "user"
                batch.event("run.status", status=RunStatus.PAUSED, reason="user")
        elif action == "resume":
            if run.status != RunStatus.PAUSED:
                raise JournalError(f"run {run_id} is {run.status}, not paused")
            run.status, run.pause_reason, run.pause_requested = RunStatus.QUEUED, None, False
            batch.event("run.status", status=RunStatus.QUEUED, reason="resumed")
        else:
            raise JournalError(f"unknown action {action!r}", status=400)
        batch.audit(f"run.{action}", {"actor": actor})
        write_in(s, batch)
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
        batch = Batch(run_id)
        batch.event("budget.changed", token_budget=run.token_budget, cost_budget_u=run.cost_budget_u)
        batch.audit("budget.changed", {"token_budget": run.token_budget, "cost_budget_u": run.cost_budget_u,
                                       "actor": actor})
        if run.status == RunStatus.PAUSED and run.pause_reason == "budget":
            run.status, run.pause_reason = RunStatus.QUEUED, None
            batch.event("run.status", status=RunStatus.QUEUED, reason="budget raised")
        write_in(s, batch)
        return run


def requeue_model_stopped(db: str) -> list[str]:
    """Queue again every run parked because its model's engine stopped (a worker starting: its engine is new)."""
    with session(db) as s:
        runs = s.scalars(select(RunRow).where(RunRow.status == RunStatus.PAUSED,
                                              RunRow.pause_reason == MODEL_STOPPED)).all()
        for run in runs:
            run.status, run.pause_reason = RunStatus.QUEUED, None
            batch = Batch(run.id)
            batch.event("run.status", status=RunStatus.QUEUED, reason="a worker started")
            batch.audit("run.resume", {"actor": "worker", "reason": MODEL_STOPPED})
            write_in(s, batch)
        return [r.id for r in runs]
