"""The run journal: what each change of a run writes (its rows, its event, its audit entry), and the run read back.

Every change is queued on a writes.Batch, the one write path: a running loop commits its batch fenced by its
lease (if another worker took the run over, nothing is written and LeaseLost is raised instead of forking
history), the others apply theirs in their own transaction (writes.write_in). The state the loop holds
(RunState) is updated as changes are queued, so nothing is read back. Reads rebuild the run from the journal alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from mainspring.agents.spec import AgentSpec
from mainspring.agents.status import OPEN_CALLS, TERMINAL, InterruptStatus, RunStatus, StepStatus, ToolCallStatus
from mainspring.agents.tables import (AgentRow, ArtifactRow, InterruptRow, RunRow, StepRow, ThreadRow,
                                      ToolCallRow)
from mainspring.agents.writes import LeaseLost  # noqa: F401  (a loop that lost its lease catches it from here)
from mainspring.agents.writes import Batch, Sql, insert_sql, now, table_of, write_in
from mainspring.store.db import session
from mainspring.store.ids import new_id


class JournalError(ValueError):
    """A request the journal refuses (unknown id, wrong state); the API maps it to a 4xx."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


def get_run(s: Session, run_id: str) -> RunRow:
    run = s.get(RunRow, run_id)
    if run is None:
        raise JournalError(f"no run {run_id!r}", status=404)
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
        # compared as specs, not text: a version stored before a field was added is unchanged by the new default
        if latest is not None and AgentSpec.model_validate_json(latest.spec_json) == spec:
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
               api_key_id: str | None = None, run_id: str | None = None,
               output_schema: dict | None = None, model: str | None = None,
               parent_run_id: str | None = None) -> RunRow:
    """A queued run of agent `agent_id` in project `project_id`, created by key `api_key_id` (whose ledger and
    budgets its model calls use); its thread must be the project's own. `run_id` is for a caller that wrote the
    id down before creating the run (the plan scheduler), so a crash in between cannot make two runs.
    `output_schema` is the JSON Schema its final answer must meet, and `model` the model it calls, both over its
    agent's (a plan task's artifact schema; the model its complexity routes it to). `parent_run_id`: the run
    that asked for this one (ask_agent)."""
    with session(db) as s:
        spec = agent_spec(s, agent_id)
        if thread_id is None:
            thread_id = new_id("thread_")
            s.add(ThreadRow(id=thread_id, project_id=project_id))
            s.flush()  # no ORM relationship orders the inserts, so the thread goes first explicitly
        elif s.scalar(select(ThreadRow.id).where(ThreadRow.id == thread_id,
                                                 project_is(ThreadRow.project_id, project_id))) is None:
            raise JournalError(f"no thread {thread_id!r}", status=404)
        from mainspring.billing.prices import usd_to_micro

        limits = spec.limits
        run = RunRow(
            id=run_id or new_id("run_"), project_id=project_id, api_key_id=api_key_id, thread_id=thread_id,
            agent_id=agent_id, goal=goal, priority=priority,
            token_budget=token_budget if token_budget is not None else limits.token_budget,
            cost_budget_u=cost_budget_u if cost_budget_u is not None else (
                usd_to_micro(limits.cost_budget_usd) if limits.cost_budget_usd else None),
            attachments_json=json.dumps(attachments or {}),
            output_schema_json=json.dumps(output_schema) if output_schema is not None else None,
            model_override=model, parent_run_id=parent_run_id,
            status=RunStatus.QUEUED,
            cancel_requested=False, pause_requested=False, attempt=0, step_count=0, prompt_tokens=0,
            completion_tokens=0, cached_tokens=0, cost_u=0, created_at=now(), updated_at=now(),
        )
        s.add(run)
        batch = Batch(run.id)
        batch.event("run.created", goal=goal, agent_id=agent_id, thread_id=thread_id)
        batch.audit("run.created", {"goal": goal, "agent_id": agent_id, "spec": spec.model_dump()})
        write_in(s, batch)
        return run


# ---- reading a run back ------------------------------------------------------------------------------
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
                return [c for c in self.calls.get(st.id, []) if c.status in OPEN_CALLS]
        return []


def load_state(db: str, run_id: str) -> RunState:
    with session(db, readonly=True) as s:
        run = get_run(s, run_id)
        spec = agent_spec(s, run.agent_id)
        if run.output_schema_json is not None:  # the run's own schema (a plan task's) over its agent's
            spec = spec.model_copy(update={"output_schema": json.loads(run.output_schema_json)})
        if run.model_override is not None:  # the run's own model (a plan task routed by complexity)
            spec = spec.model_copy(update={"model": run.model_override})
        state = RunState(run=run, spec=spec)
        for st in s.scalars(select(StepRow).where(StepRow.run_id == run_id).order_by(StepRow.seq)):
            if st.status == StepStatus.COMPLETED:
                state.steps.append(st)
            elif st.status == StepStatus.STARTED:
                state.open_step = st
        for call in s.scalars(select(ToolCallRow).where(ToolCallRow.run_id == run_id).order_by(ToolCallRow.ordinal)):
            state.calls.setdefault(call.step_id, []).append(call)
        return state


# ---- what a loop queues; each also applies itself to the loop's RunState ------------------------------------
_runs, _steps, _calls = table_of(RunRow), table_of(StepRow), table_of(ToolCallRow)
_STEP_COLUMNS = ("id", "run_id", "seq", "kind", "status", "input_hash", "output_json", "prompt_tokens",
                 "completion_tokens", "cached_tokens", "cost_u", "attempts", "started_at", "finished_at")
STEP_NEW = insert_sql(_steps, *_STEP_COLUMNS)
STEP_RETRY = Sql(update(_steps).where(_steps.c.id == bindparam("p_id"))
                 .values(attempts=bindparam("attempts"), input_hash=bindparam("input_hash")))
STEP_DONE = Sql(update(_steps).where(_steps.c.id == bindparam("p_id")).values(
    {c: bindparam(c) for c in ("status", "finished_at", "output_json", "prompt_tokens", "completion_tokens",
                               "cached_tokens", "cost_u")}))
RUN_USAGE = Sql(update(_runs).where(_runs.c.id == bindparam("p_run")).values(  # increments: the row is the truth
    step_count=_runs.c.step_count + 1, prompt_tokens=_runs.c.prompt_tokens + bindparam("d_prompt"),
    completion_tokens=_runs.c.completion_tokens + bindparam("d_completion"),
    cached_tokens=_runs.c.cached_tokens + bindparam("d_cached"), cost_u=_runs.c.cost_u + bindparam("d_cost"),
    updated_at=bindparam("updated_at")))
RUN_FINISH = Sql(update(_runs).where(_runs.c.id == bindparam("p_run")).values(
    {c: bindparam(c) for c in ("status", "result", "error", "stop_reason", "finished_at")}
    | {"lease_owner": None, "lease_expires_at": None}))
RUN_PARK = Sql(update(_runs).where(_runs.c.id == bindparam("p_run")).values(  # the lease is released
    status=bindparam("status"), pause_reason=bindparam("pause_reason"), lease_owner=None, lease_expires_at=None))
RUN_PAUSE_TAKEN = Sql(update(_runs).where(_runs.c.id == bindparam("p_run")).values(pause_requested=False))
CALL_NEW = insert_sql(_calls, "id", "run_id", "step_id", "ordinal", "name", "arguments_json", "idempotency_key",
                      "status", "attempts")
CALL_START = Sql(update(_calls).where(_calls.c.id == bindparam("p_id")).values(
    status=ToolCallStatus.RUNNING.value, started_at=bindparam("started_at"),
    arguments_json=bindparam("arguments_json"), attempts=_calls.c.attempts + 1))
CALL_FINISH = Sql(update(_calls).where(_calls.c.id == bindparam("p_id")).values(
    status=bindparam("status"), finished_at=bindparam("finished_at"), result_json=bindparam("result_json")))
CALL_WAIT = Sql(update(_calls).where(_calls.c.id == bindparam("p_id"))
                .values(status=ToolCallStatus.WAITING_APPROVAL.value))
INTERRUPT_NEW = insert_sql(table_of(InterruptRow), "id", "run_id", "tool_call_id", "kind", "status", "expires_at",
                           "expiry_decision", "created_at")
ARTIFACT = insert_sql(table_of(ArtifactRow), "id", "run_id", "name", "mime", "bytes", "sha256", "path",
                      "created_at")


def _new_step(batch: Batch, step: StepRow) -> None:
    batch.write(STEP_NEW, {c: getattr(step, c) for c in _STEP_COLUMNS})


def begin_step(batch: Batch, state: RunState, seq: int, kind: str, input_hash: str) -> StepRow:
    """Journaled before the model is called; a step started before a crash is reused (one more attempt)."""
    step = state.open_step
    if step is not None and step.seq == seq:
        step.attempts, step.input_hash = step.attempts + 1, input_hash
        batch.write(STEP_RETRY, {"p_id": step.id, "attempts": step.attempts, "input_hash": input_hash})
    else:
        step = StepRow(id=new_id("step_"), run_id=batch.run_id, seq=seq, kind=kind, status=StepStatus.STARTED,
                       input_hash=input_hash, output_json=None, prompt_tokens=0, completion_tokens=0,
                       cached_tokens=0, cost_u=0, attempts=1, started_at=now(), finished_at=None)
        _new_step(batch, step)
    state.open_step = step
    batch.event("step.started", step_id=step.id, seq=seq, kind=kind, attempt=step.attempts)
    return step


def complete_model_step(batch: Batch, state: RunState, step: StepRow, message: dict, usage: Any, cost_u: int,
                        known_tools: set[str]) -> list[ToolCallRow]:
    """The model's answer and the tool calls it asks for (pending), with usage and cost."""
    run, run_id = state.run, batch.run_id
    calls = []
    for ordinal, tc in enumerate(message.get("tool_calls") or []):
        call_id = f"{step.id}.{ordinal}"
        tc["id"] = call_id  # our ids: unique, and stable across replays of the journal
        calls.append(ToolCallRow(id=call_id, run_id=run_id, step_id=step.id, ordinal=ordinal,
                                 name=tc["function"]["name"], arguments_json=tc["function"]["arguments"],
                                 idempotency_key=f"{run_id}/{step.seq}/{ordinal}", status=ToolCallStatus.PENDING,
                                 attempts=0))
    step.status, step.finished_at, step.output_json = StepStatus.COMPLETED, now(), json.dumps(message)
    step.prompt_tokens, step.completion_tokens = usage.prompt_tokens, usage.completion_tokens
    step.cached_tokens, step.cost_u = usage.cached_tokens, cost_u
    batch.write(STEP_DONE, {"p_id": step.id, "status": step.status, "finished_at": step.finished_at,
                            "output_json": step.output_json, "prompt_tokens": step.prompt_tokens,
                            "completion_tokens": step.completion_tokens, "cached_tokens": step.cached_tokens,
                            "cost_u": cost_u})
    run.step_count += 1
    run.prompt_tokens += usage.prompt_tokens
    run.completion_tokens += usage.completion_tokens
    run.cached_tokens += usage.cached_tokens
    run.cost_u += cost_u
    run.updated_at = step.finished_at
    batch.write(RUN_USAGE, {"p_run": run_id, "d_prompt": usage.prompt_tokens, "d_completion": usage.completion_tokens,
                            "d_cached": usage.cached_tokens, "d_cost": cost_u, "updated_at": run.updated_at})
    if calls:
        batch.write_many(CALL_NEW, [{c: getattr(call, c) for c in ("id", "run_id", "step_id", "ordinal", "name",
                                                                   "arguments_json", "idempotency_key", "status",
                                                                   "attempts")} for call in calls])
    batch.event("step.completed", step_id=step.id, seq=step.seq, content=message.get("content"),
                tool_calls=[{"id": c.id, "name": c.name, "arguments": c.arguments_json} for c in calls],
                usage={"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                       "cached_tokens": usage.cached_tokens}, cost_u=cost_u)
    batch.audit("model.step", {
        "seq": step.seq, "input_hash": step.input_hash, "output": message, "cost_u": cost_u,
        "usage": {"prompt": usage.prompt_tokens, "completion": usage.completion_tokens, "cached": usage.cached_tokens},
        "unknown_tools": sorted({c.name for c in calls} - known_tools)})
    state.steps.append(step)
    state.calls[step.id] = calls
    state.open_step = None
    return calls


def record_compaction(batch: Batch, seq: int, summary: str, through_seq: int) -> StepRow:
    """A completed step holding the summary of steps 1..through_seq, which the prompt shows instead of them."""
    step = StepRow(id=new_id("step_"), run_id=batch.run_id, seq=seq, kind="compaction",
                   status=StepStatus.COMPLETED, input_hash=None,
                   output_json=json.dumps({"summary": summary, "through_seq": through_seq}), prompt_tokens=0,
                   completion_tokens=0, cached_tokens=0, cost_u=0, attempts=1, started_at=now(), finished_at=now())
    _new_step(batch, step)
    batch.event("context.compacted", seq=seq, through_seq=through_seq, chars=len(summary))
    batch.audit("context.compacted", {"seq": seq, "through_seq": through_seq, "summary": summary})
    return step


def start_call(batch: Batch, call: ToolCallRow, arguments_json: str) -> None:
    """'About to run': must be committed before any side effect of the call."""
    call.status, call.started_at, call.arguments_json = ToolCallStatus.RUNNING, now(), arguments_json
    call.attempts = (call.attempts or 0) + 1
    batch.write(CALL_START, {"p_id": call.id, "started_at": call.started_at, "arguments_json": arguments_json})
    batch.event("tool.started", call_id=call.id, name=call.name, arguments=arguments_json, attempt=call.attempts)


def finish_call(batch: Batch, call: ToolCallRow, status: ToolCallStatus, result: dict,
                artifacts: list[dict] | None = None) -> None:
    call.status, call.finished_at, call.result_json = status, now(), json.dumps(result, default=str)
    batch.write(CALL_FINISH, {"p_id": call.id, "status": status, "finished_at": call.finished_at,
                              "result_json": call.result_json})
    for a in artifacts or []:
        batch.write(ARTIFACT, {"id": new_id("art_"), "run_id": batch.run_id, **a, "created_at": now()})
    batch.event("tool.finished", call_id=call.id, name=call.name, status=status,
                content=result.get("content", "")[:2000], artifacts=artifacts or [])
    batch.audit("tool.call", {"call_id": call.id, "name": call.name, "arguments": call.arguments_json,
                              "status": status, "result": result, "idempotency_key": call.idempotency_key,
                              "attempts": call.attempts})


def open_interrupt(batch: Batch, call: ToolCallRow, kind: str, ttl_s: float | None, expiry_decision: str) -> str:
    """Park the run until a human decides on `call` (kind: approval | in_flight); the lease is released."""
    call.status = ToolCallStatus.WAITING_APPROVAL
    batch.write(CALL_WAIT, {"p_id": call.id})
    interrupt_id, expires = new_id("int_"), now() + timedelta(seconds=ttl_s) if ttl_s else None
    batch.write(INTERRUPT_NEW, {"id": interrupt_id, "run_id": batch.run_id, "tool_call_id": call.id, "kind": kind,
                                "status": InterruptStatus.PENDING, "expires_at": expires,
                                "expiry_decision": expiry_decision, "created_at": now()})
    batch.write(RUN_PARK, {"p_run": batch.run_id, "status": RunStatus.WAITING_APPROVAL, "pause_reason": kind})
    batch.event("interrupt.created", interrupt_id=interrupt_id, kind=kind, call_id=call.id, name=call.name,
                arguments=call.arguments_json, expires_at=expires.isoformat() if expires else None)
    batch.event("run.status", status=RunStatus.WAITING_APPROVAL, reason=kind)
    batch.audit("interrupt.created", {"interrupt_id": interrupt_id, "kind": kind, "call_id": call.id,
                                      "name": call.name, "arguments": call.arguments_json})
    return interrupt_id


def park_run(batch: Batch, reason: str) -> None:
    """Stop driving a paused run (reason: budget | user); the lease is released and the pause request taken."""
    batch.write(RUN_PARK, {"p_run": batch.run_id, "status": RunStatus.PAUSED, "pause_reason": reason})
    batch.write(RUN_PAUSE_TAKEN, {"p_run": batch.run_id})
    batch.event("run.status", status=RunStatus.PAUSED, reason=reason)
    batch.audit("run.parked", {"status": RunStatus.PAUSED, "reason": reason})


def finish_run(batch: Batch, run: RunRow, status: RunStatus, *, result: str | None = None,
               error: str | None = None, stop_reason: str | None = None) -> None:
    """The run's ending (the lease is released); `run` holds its counters, for the audit entry."""
    assert status in TERMINAL
    run.status, run.result, run.error, run.stop_reason = status, result, error, stop_reason
    run.finished_at, run.lease_owner, run.lease_expires_at = now(), None, None
    batch.write(RUN_FINISH, {"p_run": run.id, "status": status, "result": result, "error": error,
                             "stop_reason": stop_reason, "finished_at": run.finished_at})
    batch.event("run.finished", status=status, stop_reason=stop_reason, error=error, result=result)
    batch.audit("run.finished", {"status": status, "stop_reason": stop_reason, "error": error, "result": result,
                                 "cost_u": run.cost_u, "tokens": run.prompt_tokens + run.completion_tokens})
