"""The run journal: every state change of a run, written (with its event and audit entry) in one transaction.

Writes by a worker are fenced by its lease: if another worker took the run over, the write fails with
LeaseLost instead of forking history. Reads rebuild the run from the journal alone. A running loop's own
per-step writes (steps, tool calls, its normal ending) are batched on a faster path: writes.py.
"""

from __future__ import annotations

import json
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from mainspring.agents import audit
from mainspring.agents.spec import AgentSpec
from mainspring.agents.tables import (AgentRow, EventRow, RunRow, StepRow, ThreadRow, ToolCallRow,
                                      TERMINAL)
from mainspring.store.db import session


class LeaseLost(Exception):
    """Another worker holds this run now; the caller must stop driving it."""


class JournalError(ValueError):
    """A request the journal refuses (unknown id, wrong state); the API maps it to a 4xx."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


def now() -> datetime:
    return datetime.now(timezone.utc)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@contextmanager
def tx(db: str | Session) -> Iterator[Session]:
    """A write transaction, or the caller's when given a Session (several journal writes, one commit)."""
    if isinstance(db, Session):
        yield db
    else:
        with session(db) as s:
            yield s


_EVENT = insert(EventRow.__table__)  # built once: building a statement per call costs more than running it


def event(s: Session, run_id: str, type_: str, **data: Any) -> None:
    # a Core insert: the ORM's unit of work costs more than the SQL itself
    s.execute(_EVENT, [{"run_id": run_id, "type": type_, "data_json": json.dumps(data, default=str),
                        "created_at": now()}])


def get_run(s: Session, run_id: str) -> RunRow:
    run = s.get(RunRow, run_id)
    if run is None:
        raise JournalError(f"no run {run_id!r}", status=404)
    return run


def fenced(s: Session, run_id: str, owner: str) -> RunRow:
    run = get_run(s, run_id)
    if run.lease_owner != owner or run.status != "running":
        raise LeaseLost(run_id)
    return run


# ---- agents, threads, runs ---------------------------------------------------------------------------
def project_is(column: Any, project_id: int | None) -> Any:
    """The SQL condition "belongs to project `project_id`" (None: the anonymous caller's rows, auth off)."""
    return column.is_(None) if project_id is None else column == project_id


def put_agent(db: str, spec: AgentSpec, project_id: int | None = None) -> AgentRow:
    """The agent's newest version in its project, adding one when the spec changed (runs keep the version they
    started on). Names are per project: another project's agent of the same name is another agent."""
    body = spec.model_dump_json()
    with session(db) as s:
        latest = s.scalars(select(AgentRow).where(AgentRow.name == spec.name,
                                                  project_is(AgentRow.project_id, project_id))
                           .order_by(AgentRow.version.desc()).limit(1)).first()
        if latest is not None and latest.spec_json == body:
            return latest
        version = latest.version + 1 if latest else 1
        suffix = "" if project_id is None else f"_p{project_id}"
        row = AgentRow(id=f"agent_{spec.name}_v{version}{suffix}", project_id=project_id, name=spec.name,
                       version=version, spec_json=body)
        s.add(row)
        return row


def agent_spec(s: Session, agent_id: str) -> AgentSpec:
    row = s.get(AgentRow, agent_id)
    if row is None:
        raise JournalError(f"no agent {agent_id!r}", status=404)
    return AgentSpec.model_validate_json(row.spec_json)


def create_run(db: str, agent_id: str, goal: str, *, thread_id: str | None = None, priority: int = 0,
               token_budget: int | None = None, cost_budget_u: int | None = None,
               attachments: dict[str, str] | None = None, project_id: int | None = None,
               api_key_id: str | None = None) -> RunRow:
    """A queued run of agent `agent_id` in project `project_id`, created by key `api_key_id` (whose ledger and
    budgets its model calls use); its thread must be the project's own."""
    with session(db) as s:
        spec = agent_spec(s, agent_id)
        if thread_id is None:
            thread_id = new_id("thread")
            s.add(ThreadRow(id=thread_id, project_id=project_id))
            s.flush()  # no ORM relationship orders the inserts, so the thread goes first explicitly
        elif s.scalar(select(ThreadRow.id).where(ThreadRow.id == thread_id,
                                                 project_is(ThreadRow.project_id, project_id))) is None:
            raise JournalError(f"no thread {thread_id!r}", status=404)
        from mainspring.billing.prices import usd_to_micro

        limits = spec.limits
        run = RunRow(
            id=new_id("run"), project_id=project_id, api_key_id=api_key_id, thread_id=thread_id,
            agent_id=agent_id, goal=goal, priority=priority,
            token_budget=token_budget if token_budget is not None else limits.token_budget,
            cost_budget_u=cost_budget_u if cost_budget_u is not None else (
                usd_to_micro(limits.cost_budget_usd) if limits.cost_budget_usd else None),
            attachments_json=json.dumps(attachments or {}), status="queued",
            cancel_requested=False, pause_requested=False, attempt=0, step_count=0, prompt_tokens=0,
            completion_tokens=0, cached_tokens=0, cost_u=0, created_at=now(), updated_at=now(),
        )
        s.add(run)
        s.flush()
        event(s, run.id, "run.created", goal=goal, agent_id=agent_id, thread_id=thread_id)
        audit.append(s, run.id, "run.created", {"goal": goal, "agent_id": agent_id, "spec": spec.model_dump()})
        return run


def finish_run(db: str, run_id: str, owner: str, status: str, *, result: str | None = None,
               error: str | None = None, stop_reason: str | None = None) -> None:
    assert status in TERMINAL
    with tx(db) as s:
        run = fenced(s, run_id, owner)
        _finish(s, run, status, result=result, error=error, stop_reason=stop_reason)


def _finish(s: Session, run: RunRow, status: str, *, result=None, error=None, stop_reason=None) -> None:
    run.status, run.result, run.error, run.stop_reason = status, result, error, stop_reason
    run.finished_at, run.lease_owner, run.lease_expires_at = now(), None, None
    event(s, run.id, "run.finished", status=status, stop_reason=stop_reason, error=error, result=result)
    audit.append(s, run.id, "run.finished", {"status": status, "stop_reason": stop_reason, "error": error,
                                              "result": result, "cost_u": run.cost_u,
                                              "tokens": run.prompt_tokens + run.completion_tokens})


def park_run(db: str, run_id: str, owner: str, status: str, reason: str | None) -> None:
    """Stop driving a run that waits (approval) or is paused (budget, user); the lease is released."""
    with tx(db) as s:
        run = fenced(s, run_id, owner)
        run.status, run.pause_reason = status, reason
        run.lease_owner, run.lease_expires_at, run.pause_requested = None, None, False
        event(s, run_id, "run.status", status=status, reason=reason)
        audit.append(s, run_id, "run.parked", {"status": status, "reason": reason})


# ---- steps and tool calls ---------------------------------------------------------------------------
@dataclass
class RunState:
    run: RunRow
    spec: AgentSpec
    steps: list[StepRow] = field(default_factory=list)  # completed, in order
    calls: dict[str, list[ToolCallRow]] = field(default_factory=dict)  # step id -> its calls, in order
    open_step: StepRow | None = None  # a model step started but not completed (crash or retry)
    prompt_cache: Any = field(default=None, repr=False)  # context.py: the prompt's part that no step changes

    @property
    def next_seq(self) -> int:
        done = self.steps[-1].seq if self.steps else 0
        return max(done, self.open_step.seq if self.open_step else 0) + 1

    def open_calls(self) -> list[ToolCallRow]:
        """Calls of the newest model step that have not reached a final state."""
        for st in reversed(self.steps):
            if st.kind == "model":
                return [c for c in self.calls.get(st.id, [])
                        if c.status in ("pending", "approved", "running", "waiting_approval")]
        return []


def load_state(db: str, run_id: str) -> RunState:
    with session(db, readonly=True) as s:
        run = get_run(s, run_id)
        state = RunState(run=run, spec=agent_spec(s, run.agent_id))
        for st in s.scalars(select(StepRow).where(StepRow.run_id == run_id).order_by(StepRow.seq)):
            if st.status == "completed":
                state.steps.append(st)
            elif st.status == "started":
                state.open_step = st
        for call in s.scalars(select(ToolCallRow).where(ToolCallRow.run_id == run_id).order_by(ToolCallRow.ordinal)):
            state.calls.setdefault(call.step_id, []).append(call)
        return state


def record_compaction(db: str, run_id: str, owner: str, seq: int, summary: str, through_seq: int) -> StepRow:
    with tx(db) as s:
        fenced(s, run_id, owner)
        step = StepRow(id=new_id("step"), run_id=run_id, seq=seq, kind="compaction", status="completed",
                      output_json=json.dumps({"summary": summary, "through_seq": through_seq}), attempts=1,
                      started_at=now(), finished_at=now())
        s.add(step)
        event(s, run_id, "context.compacted", seq=seq, through_seq=through_seq, chars=len(summary))
        audit.append(s, run_id, "context.compacted", {"seq": seq, "through_seq": through_seq, "summary": summary})
        return step
