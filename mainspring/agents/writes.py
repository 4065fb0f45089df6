"""A running loop's own journal writes, batched: one short transaction per action instead of one per fact.

The loop queues what happened (a model step completed, a tool call finished) in a Batch and commits it with
the write that must precede its next action (a tool call started, the next step started): a step of one model
call and one tool call costs two transactions. The durability rule is unchanged: nothing is acted on before
the writes that tell of it are committed, and the loop awaits nothing but the commit while a batch holds
writes (so a crash or a cancel never finds facts that were acted on but not written).

Every commit is fenced once by the worker's lease (a worker that lost the run writes nothing; on Postgres the
run's row stays locked until the commit) and chains its audit entries from one read of the chain's head. The
state the loop holds (RunState) is updated as writes are queued, so nothing is read back. The SQL is Core
statements compiled once per dialect and run on the DBAPI cursor: SQLAlchemy's per-execution work (cache
keys, parameter and result processing) costs several times what SQLite itself does here.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, bindparam, insert, select, update
from sqlalchemy.engine import Dialect

from mainspring.agents import audit
from mainspring.agents.journal import LeaseLost, RunState, new_id, now
from mainspring.agents.tables import ArtifactRow, AuditRow, EventRow, RunRow, StepRow, ToolCallRow
from mainspring.store.db import get_engine


class Sql:
    """A Core statement compiled once per dialect, with its parameters bound in order for the DBAPI cursor."""

    def __init__(self, stmt: Any):
        self.stmt = stmt
        self._compiled: dict[tuple, tuple] = {}

    def _for(self, dialect: Dialect) -> tuple:
        key = (type(dialect), dialect.paramstyle)  # not the instance: every engine (each test's) has its own
        found = self._compiled.get(key)
        if found is None:
            c = self.stmt.compile(dialect=dialect)
            params = c.params  # every bind the SQL names, with the statement's own literals (LIMIT 1, + 1)
            names = tuple(c.positiontup) if dialect.positional else tuple(params)
            procs, fixed = {}, {}
            for name in names:
                bind = c.binds[name]
                proc = bind.type.dialect_impl(dialect).bind_processor(dialect)  # e.g. UTC datetimes as SQLite text
                if proc is not None:
                    procs[name] = proc
                if not bind.required:
                    fixed[name] = params[name]
            found = self._compiled[key] = (c.string, names, procs, fixed, dialect.positional)
        return found

    def bind(self, dialect: Dialect, values: dict) -> tuple[str, Any]:
        sql, names, procs, fixed, positional = self._for(dialect)
        args = []
        for name in names:
            value = values[name] if name in values else fixed[name]
            proc = procs.get(name)
            args.append(value if proc is None or value is None else proc(value))
        return sql, tuple(args) if positional else dict(zip(names, args))


def _insert(table: Table, *columns: str) -> Sql:
    # .inline(): no RETURNING of generated keys (Postgres would add one to every row of an executemany)
    return Sql(insert(table).values({c: bindparam(c) for c in columns}).inline())


_runs, _steps, _calls = RunRow.__table__, StepRow.__table__, ToolCallRow.__table__
FENCE = Sql(select(_runs.c.lease_owner, _runs.c.status).where(_runs.c.id == bindparam("p_run")).with_for_update())
AUDIT_HEAD = Sql(select(AuditRow.seq, AuditRow.hash).where(AuditRow.run_id == bindparam("p_run"))
                 .order_by(AuditRow.seq.desc()).limit(1))
EVENT = _insert(EventRow.__table__, "run_id", "type", "data_json", "created_at")
AUDIT = _insert(AuditRow.__table__, "run_id", "seq", "kind", "payload_json", "created_at", "prev_hash", "hash")
STEP_NEW = _insert(_steps, "id", "run_id", "seq", "kind", "status", "input_hash", "prompt_tokens",
                   "completion_tokens", "cached_tokens", "cost_u", "attempts", "started_at")
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
    {c: bindparam(c) for c in ("status", "result", "error", "stop_reason", "finished_at", "lease_owner",
                               "lease_expires_at")}))
CALL_NEW = _insert(_calls, "id", "run_id", "step_id", "ordinal", "name", "arguments_json", "idempotency_key",
                   "status", "attempts")
CALL_START = Sql(update(_calls).where(_calls.c.id == bindparam("p_id")).values(
    status="running", started_at=bindparam("started_at"), arguments_json=bindparam("arguments_json"),
    attempts=_calls.c.attempts + 1))
CALL_FINISH = Sql(update(_calls).where(_calls.c.id == bindparam("p_id")).values(
    status=bindparam("status"), finished_at=bindparam("finished_at"), result_json=bindparam("result_json")))
ARTIFACT = _insert(ArtifactRow.__table__, "id", "run_id", "name", "mime", "bytes", "sha256", "path", "created_at")


@dataclass
class Batch:
    """Writes of one run waiting for their transaction, in order: rows, then events, then audit entries."""
    run_id: str
    rows: list[tuple[Sql, Any, bool]] = field(default_factory=list)  # (statement, values or list of them, many)
    events: list[dict] = field(default_factory=list)
    audits: list[tuple[str, str]] = field(default_factory=list)  # (kind, canonical JSON payload)

    def __bool__(self) -> bool:
        return bool(self.rows or self.events or self.audits)

    def write(self, sql: Sql, values: dict) -> None:
        self.rows.append((sql, values, False))

    def write_many(self, sql: Sql, rows: list[dict]) -> None:
        self.rows.append((sql, rows, True))

    def event(self, type_: str, **data: Any) -> None:
        self.events.append({"run_id": self.run_id, "type": type_, "data_json": json.dumps(data, default=str),
                            "created_at": now()})

    def audit(self, kind: str, payload: Any) -> None:
        # serialised now: the entry records the state as queued, whatever happens to those objects later
        self.audits.append((kind, audit.canonical(payload)))


def _apply(cur: Any, dialect: Dialect, owner: str, batch: Batch) -> None:
    cur.execute(*FENCE.bind(dialect, {"p_run": batch.run_id}))
    lease = cur.fetchone()
    if lease is None or lease[0] != owner or lease[1] != "running":
        raise LeaseLost(batch.run_id)
    for sql, values, many in batch.rows:
        if many:
            cur.executemany(sql.bind(dialect, values[0])[0], [sql.bind(dialect, v)[1] for v in values])
        else:
            cur.execute(*sql.bind(dialect, values))
    if batch.events:
        cur.executemany(EVENT.bind(dialect, batch.events[0])[0], [EVENT.bind(dialect, e)[1] for e in batch.events])
    if batch.audits:
        cur.execute(*AUDIT_HEAD.bind(dialect, {"p_run": batch.run_id}))
        seq, prev = cur.fetchone() or (0, audit.GENESIS)
        entries = []
        for kind, body in batch.audits:
            entries.append(audit.link(batch.run_id, seq, prev, kind, body))
            seq, prev = entries[-1]["seq"], entries[-1]["hash"]
        cur.executemany(AUDIT.bind(dialect, entries[0])[0], [AUDIT.bind(dialect, e)[1] for e in entries])


def commit_group(db: str, owner: str, batches: list[Batch]) -> list[BaseException | None]:
    """Write several runs' batches in one transaction (group commit: one BEGIN/COMMIT, shared pages written
    once). Each batch is fenced and applied on its own: one that fails (LeaseLost, a refused row) is rolled
    back to its savepoint and gets its exception; the others commit. Returns each batch's outcome."""
    engine = get_engine(db)
    dialect = engine.dialect
    outcomes: list[BaseException | None] = [None] * len(batches)
    conn = engine.raw_connection()  # a pooled DBAPI connection: SQLAlchemy's Connection would double the cost
    try:
        cur = conn.cursor()
        if dialect.name == "sqlite":  # store/db.py leaves transaction control to us: take the write lock at once
            cur.execute("BEGIN IMMEDIATE")
        if len(batches) == 1:
            _apply(cur, dialect, owner, batches[0])  # alone: a failure rolls the whole transaction back below
        else:
            for i, batch in enumerate(batches):
                cur.execute("SAVEPOINT batch")
                try:
                    _apply(cur, dialect, owner, batch)
                except Exception as exc:
                    cur.execute("ROLLBACK TO SAVEPOINT batch")
                    outcomes[i] = exc
                cur.execute("RELEASE SAVEPOINT batch")
        cur.close()
        conn.commit()
    except BaseException as exc:  # nothing of the group is written
        conn.rollback()
        return [exc] * len(batches)
    finally:
        conn.close()  # back to the pool
    return outcomes


def commit(db: str, owner: str, batch: Batch) -> None:
    """Write `batch` in one transaction if `owner` still holds the run, else raise LeaseLost and write nothing."""
    [outcome] = commit_group(db, owner, [batch])
    if outcome is not None:
        raise outcome


class Committer:
    """Group commit for one worker's loops. While a group is being written, batches that arrive wait and go
    together in the next one: with many runs, one transaction carries several of their steps. Each loop still
    awaits its own batch's outcome, so "committed before acted on" holds per run. Used from the event loop."""

    def __init__(self, db: str, owner: str, executor: Any):
        self.db, self.owner, self.executor = db, owner, executor
        self.waiting: list[tuple[Batch, asyncio.Future]] = []
        self.writing = False

    def submit(self, batch: Batch) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((batch, future))
        if not self.writing:
            self._next()
        return future

    def _next(self) -> None:
        group, self.waiting = self.waiting, []
        self.writing = bool(group)
        if not group:
            return
        try:
            job = asyncio.get_running_loop().run_in_executor(self.executor, commit_group, self.db, self.owner,
                                                             [b for b, _ in group])
        except RuntimeError as exc:  # the worker stopped: its executor takes nothing new
            self._resolve(group, [exc] * len(group))
            self.writing = False
            return
        job.add_done_callback(lambda done: self._written(group, done))

    def _written(self, group: list[tuple[Batch, asyncio.Future]], done: asyncio.Future) -> None:
        if done.cancelled() or done.exception() is not None:
            self._resolve(group, [done.exception() if not done.cancelled() else asyncio.CancelledError()] * len(group))
        else:
            self._resolve(group, done.result())
        self._next()

    @staticmethod
    def _resolve(group: list[tuple[Batch, asyncio.Future]], outcomes: list[BaseException | None]) -> None:
        for (_, future), outcome in zip(group, outcomes):
            if future.done():
                continue
            if outcome is None:
                future.set_result(None)
            else:
                future.set_exception(outcome)


# ---- what a loop queues; each also applies itself to the loop's RunState ------------------------------------
def begin_step(batch: Batch, state: RunState, seq: int, kind: str, input_hash: str) -> StepRow:
    """Journaled before the model is called; a step started before a crash is reused (one more attempt)."""
    step = state.open_step
    if step is not None and step.seq == seq:
        step.attempts, step.input_hash = step.attempts + 1, input_hash
        batch.write(STEP_RETRY, {"p_id": step.id, "attempts": step.attempts, "input_hash": input_hash})
    else:
        step = StepRow(id=new_id("step"), run_id=batch.run_id, seq=seq, kind=kind, status="started",
                       input_hash=input_hash, prompt_tokens=0, completion_tokens=0, cached_tokens=0, cost_u=0,
                       attempts=1, started_at=now())
        batch.write(STEP_NEW, {c: getattr(step, c) for c in ("id", "run_id", "seq", "kind", "status", "input_hash",
                                                            "prompt_tokens", "completion_tokens", "cached_tokens",
                                                            "cost_u", "attempts", "started_at")})
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
                                 idempotency_key=f"{run_id}/{step.seq}/{ordinal}", status="pending", attempts=0))
    step.status, step.finished_at, step.output_json = "completed", now(), json.dumps(message)
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


def start_call(batch: Batch, call: ToolCallRow, arguments_json: str) -> None:
    """'About to run': must be committed before any side effect of the call."""
    call.status, call.started_at, call.arguments_json = "running", now(), arguments_json
    call.attempts = (call.attempts or 0) + 1
    batch.write(CALL_START, {"p_id": call.id, "started_at": call.started_at, "arguments_json": arguments_json})
    batch.event("tool.started", call_id=call.id, name=call.name, arguments=arguments_json, attempt=call.attempts)


def finish_call(batch: Batch, call: ToolCallRow, status: str, result: dict,
                artifacts: list[dict] | None = None) -> None:
    call.status, call.finished_at, call.result_json = status, now(), json.dumps(result, default=str)
    batch.write(CALL_FINISH, {"p_id": call.id, "status": status, "finished_at": call.finished_at,
                              "result_json": call.result_json})
    for a in artifacts or []:
        batch.write(ARTIFACT, {"id": new_id("art"), "run_id": batch.run_id, **a, "created_at": now()})
    batch.event("tool.finished", call_id=call.id, name=call.name, status=status,
                content=result.get("content", "")[:2000], artifacts=artifacts or [])
    batch.audit("tool.call", {"call_id": call.id, "name": call.name, "arguments": call.arguments_json,
                              "status": status, "result": result, "idempotency_key": call.idempotency_key,
                              "attempts": call.attempts})


def finish_run(batch: Batch, state: RunState, status: str, *, result: str | None = None,
               error: str | None = None, stop_reason: str | None = None) -> None:
    """The loop's own ending (journal.finish_run is the one for callers without a RunState)."""
    run = state.run
    run.status, run.result, run.error, run.stop_reason = status, result, error, stop_reason
    run.finished_at, run.lease_owner, run.lease_expires_at = now(), None, None
    batch.write(RUN_FINISH, {"p_run": run.id, "status": status, "result": result, "error": error,
                             "stop_reason": stop_reason, "finished_at": run.finished_at, "lease_owner": None,
                             "lease_expires_at": None})
    batch.event("run.finished", status=status, stop_reason=stop_reason, error=error, result=result)
    batch.audit("run.finished", {"status": status, "stop_reason": stop_reason, "error": error, "result": result,
                                 "cost_u": run.cost_u, "tokens": run.prompt_tokens + run.completion_tokens})
