"""The journal's one write path: every change of a run reaches the database as a Batch of rows, events and audit
entries, in one short transaction.

A running loop queues what happened (a model step completed, a tool call finished) and commits it with the write
that must precede its next action (a tool call started, the next step started): a step of one model call and one
tool call costs two transactions. Such a commit is fenced by the worker's lease (a worker that lost the run
writes nothing; on Postgres the run's row stays locked until the commit). Callers outside a loop (creating,
claiming, resolving, cancelling) apply their batch inside their own ORM transaction (`write_in`). Either way the
audit entries are chained from one read of the chain's head, and what is queued is in the database before it is
acted on (the loop awaits nothing but the commit while a batch holds writes, so a crash or a cancel never finds
facts that were acted on but not written). journal.py says what each change writes.

The SQL is Core statements compiled once per dialect and run on the DBAPI cursor, from the compiled statement's
public attributes (string, positiontup, binds, params) and the types' bind processors: a SQLAlchemy Connection
costs 5x per statement (about 80 µs against 16 µs on SQLite) and 6x per transaction, several times what SQLite
itself does here.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

from sqlalchemy import Table, bindparam, insert, select
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from mainspring.agents import audit
from mainspring.agents.status import RunStatus
from mainspring.agents.tables import AuditRow, EventRow, RunRow
from mainspring.store.db import get_engine, is_busy_error


class LeaseLost(Exception):
    """Another worker holds this run now; the caller must stop driving it."""


def now() -> datetime:
    return datetime.now(timezone.utc)


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
            names = tuple(c.positiontup or ()) if dialect.positional else tuple(params)
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


def insert_sql(table: Table, *columns: str) -> Sql:
    # .inline(): no RETURNING of generated keys (Postgres would add one to every row of an executemany)
    return Sql(insert(table).values({c: bindparam(c) for c in columns}).inline())


def table_of(row: type[Any]) -> Table:
    return cast(Table, row.__table__)  # the ORM types it as any FromClause


_runs = table_of(RunRow)
FENCE = Sql(select(_runs.c.lease_owner, _runs.c.status).where(_runs.c.id == bindparam("p_run")).with_for_update())
AUDIT_HEAD = Sql(select(AuditRow.seq, AuditRow.hash).where(AuditRow.run_id == bindparam("p_run"))
                 .order_by(AuditRow.seq.desc()).limit(1))
EVENT = insert_sql(table_of(EventRow), "run_id", "type", "data_json", "created_at")
AUDIT = insert_sql(table_of(AuditRow), "run_id", "seq", "kind", "payload_json", "created_at", "prev_hash", "hash")


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
        """An entry of the run's event stream (what SSE followers see)."""
        self.events.append({"run_id": self.run_id, "type": type_, "data_json": json.dumps(data, default=str),
                            "created_at": now()})

    def audit(self, kind: str, payload: Any) -> None:
        """An entry of the run's hash-chained audit trail (audit.py)."""
        # serialised now: the entry records the state as queued, whatever happens to those objects later
        self.audits.append((kind, audit.canonical(payload)))


def _fence(cur: Any, dialect: Dialect, run_id: str, owner: str) -> None:
    cur.execute(*FENCE.bind(dialect, {"p_run": run_id}))
    lease = cur.fetchone()
    if lease is None or lease[0] != owner or lease[1] != RunStatus.RUNNING:
        raise LeaseLost(run_id)


def _apply(cur: Any, dialect: Dialect, batch: Batch, owner: str | None) -> None:
    if owner is not None:
        _fence(cur, dialect, batch.run_id, owner)
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


def write_in(s: Session, batch: Batch) -> None:
    """Apply `batch` in the caller's ORM transaction (not fenced: for changes that need no lease)."""
    s.flush()  # the ORM's pending rows first: the batch's events and audit entries refer to them
    conn = s.connection()
    cur = conn.connection.cursor()
    try:
        _apply(cur, conn.dialect, batch, None)
    finally:
        cur.close()


TRANSIENT_RETRIES = 3  # a batch that lost a deadlock (or waited out a lock) is written again, in a new transaction


def commit_group(db: str, owner: str, batches: list[Batch]) -> list[BaseException | None]:
    """Write several runs' batches in one transaction (group commit: one BEGIN/COMMIT, shared pages written
    once). Each batch is fenced and applied on its own: one that fails (LeaseLost, a refused row) is rolled
    back to its savepoint and gets its exception; the others commit. Returns each batch's outcome.

    Run rows are locked in run-id order, as the heartbeat locks them (leases.heartbeat): a group that fenced
    its runs in arrival order deadlocked with a heartbeat over the same runs on Postgres, and the loser's runs
    failed. A batch that still loses to the database's own contention (deadlock, lock timeout, busy) is
    retried in a fresh transaction after this one ends, a few times, before it fails."""
    outcomes: list[BaseException | None] = [None] * len(batches)
    todo = sorted(range(len(batches)), key=lambda i: batches[i].run_id)  # stable: a run's batches keep order
    for attempt in range(TRANSIENT_RETRIES + 1):
        results = _commit_once(db, owner, [batches[i] for i in todo])
        for i, outcome in zip(todo, results):
            outcomes[i] = outcome
        todo = [i for i, outcome in zip(todo, results) if outcome is not None and is_busy_error(outcome)]
        if not todo:
            break
        time.sleep(0.01 * 2**attempt)
    return outcomes


def _commit_once(db: str, owner: str, batches: list[Batch]) -> list[BaseException | None]:
    engine = get_engine(db)
    dialect = engine.dialect
    outcomes: list[BaseException | None] = [None] * len(batches)
    conn = engine.raw_connection()  # a pooled DBAPI connection: SQLAlchemy's Connection would double the cost
    try:
        cur = conn.cursor()
        if dialect.name == "sqlite":  # store/db.py leaves transaction control to us: take the write lock at once
            cur.execute("BEGIN IMMEDIATE")
        if len(batches) == 1:
            _apply(cur, dialect, batches[0], owner)  # alone: a failure rolls the whole transaction back below
        else:
            for i, batch in enumerate(batches):
                cur.execute("SAVEPOINT batch")
                try:
                    _apply(cur, dialect, batch, owner)
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


