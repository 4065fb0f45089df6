"""BatchRunner: works through batches in the background of the API server.

Durable: the database is the truth. The runner looks for batches in validating / in_progress /
finalizing / cancelling every second (and at once when a route wakes it), so after a restart it picks
up every batch where it stood. Per-line progress is the batch's journal (batch_lines.Journal); a
line is billed under `ledger.batch_request_id(batch_id, custom_id)`, which the ledger keeps unique,
so a line that runs again after a crash is never billed twice.

Each line goes through the same route code as an HTTP call (`route_call.call_route`), with two things
swapped for batch work: the engine priority (BATCH_PRIORITY, after every interactive request) and the
economics (tier "batch", priced as the base model, billed to the key that created the batch, and
exempt from that key's per-minute limits: batch work fills idle capacity, it must not eat the rate
budget of the key's interactive calls). Up to MAX_IN_FLIGHT lines run at once so continuous batching
has work to batch, and lines are sorted so those with the same prompt start run together and share
the prefix cache.

A line the runner gives up on (cancel, shutdown) is aborted in the engine and not billed: it is
either redone later (shutdown) or absent from the output (cancel). A line answered 500 (a failed engine step
fails every request in the engine, however good) runs again, up to LINE_ATTEMPTS runs. A line answered 503
(the engine stopped: only a restart brings it back) is not the line's result: the batch stops where it
stands, as at shutdown, and is tried again every RETRY_S, so a restarted server finishes it instead of every
remaining line failing.

Every server process runs a runner; a batch is worked by the one that holds its lease ("batch:<id>" in the
leader leases, agents/plans/leader.py), renewed at every poll. The others pass it over until the lease
expires or its holder is gone (a dead process on this host frees it at once), then one takes it over and
resumes from the journal. The journal is a file under the data directory: processes that share the data
directory resume exactly; a runner on another machine redoes the lines it has no journal of (never billed
twice: the ledger keys each line).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import select, update
from sqlalchemy.engine import CursorResult

from mainspring.agents import leases
from mainspring.agents.plans import leader
from mainspring.api.batch_lines import (BatchInputError, Journal, Line, Plan, is_success, plan_batch,
                                        response_record, split_results, writer)
from mainspring.api.errors import APIError, error_body
from mainspring.api.retention_task import RetentionTask
from mainspring.api.route_call import call_route
from mainspring.api.routes.files import content_path, store_file
from mainspring.billing import budgets, ledger
from mainspring.billing.budgets import BudgetExceeded
from mainspring.billing.prices import PriceError
from mainspring.engine.outputs import Usage
from mainspring.store.db import session
from mainspring.store.tables import ApiKey, BatchRow, FileRow

log = logging.getLogger(__name__)

BATCH_PRIORITY = 10  # interactive requests run at 0 (fast: -1); lower runs first
MAX_IN_FLIGHT = 8
POLL_S = 1.0
LINE_ATTEMPTS = 3  # a line answered 500 is run again, up to this many runs in all, before it fails
RETRY_S = 30.0  # after an unexpected failure, a batch waits this long before the next try
LEASE_S = 30.0  # a runner's hold on a batch, renewed every poll: another runner takes over this long after a stall
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")


class _BatchEngine:
    """The app's engine, with every request at batch priority."""

    def __init__(self, engine: Any, priority: int) -> None:
        self._engine, self._priority = engine, priority

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def stream(self, prompt: Any, params: Any = None, request_id: str | None = None, priority: int = 0,
               cache_salt: str | None = None):
        return self._engine.stream(prompt, params, request_id, self._priority, cache_salt)


class _LineEconomics:
    """What `hooks.before_call` / `after_call` reach for one batch line: the app's price sheet and
    database, but the line's request id, tier "batch", the base model, and no per-minute limits."""

    def __init__(self, econ: Any, model: str, batch_id: str, custom_id: str) -> None:
        self.econ, self.model, self.batch_id, self.custom_id = econ, model, batch_id, custom_id
        self.request_id = ledger.batch_request_id(batch_id, custom_id)
        self.sheet = econ.sheet

    def admit(self, key: ApiKey | None, _request_id: str, _model: str, _tier: str, prompt_tokens: int,
              max_output_tokens: int) -> budgets.Reservation:
        try:  # the app's Meter: the hold stays alive however long the line waits behind other work
            return self.econ.meter.reserve(key, self.request_id, model=self.model, tier="batch",
                                           input_tokens=prompt_tokens, max_output_tokens=max_output_tokens)
        except BudgetExceeded as exc:
            raise APIError(402, str(exc), code="budget_exceeded") from None
        except PriceError as exc:
            raise APIError(500, f"{exc}; add a batch tier to the price sheet (MAINSPRING_PRICES_FILE)",
                           code="model_not_priced") from None

    def record(self, key: ApiKey | None, reservation: budgets.Reservation, _request_id: str, endpoint: str,
               _model: str, _tier: str, _stream: bool, usage: Usage, status: str, finish_reason: str | None) -> int:
        meter = self.econ.meter
        if status == "cancelled":  # given up by the runner: redone later or left out, never billed
            meter.release(reservation)
            return 0
        return meter.record(key, reservation, self.request_id, usage, endpoint=endpoint, model=self.model,
                            tier="batch", stream=False, status=status, finish_reason=finish_reason,
                            custom_id=self.custom_id, batch_id=self.batch_id)


class _Unavailable(Exception):
    """A line was answered 503: this server cannot serve lines now."""


def _message(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("message")) if isinstance(error, dict) else str(body)[:200]


@dataclass
class _Job:
    batch_id: str
    task: asyncio.Task | None = None
    scheduler: asyncio.Task | None = None
    expired: bool = False

    def cancel(self) -> None:
        if self.scheduler is not None and not self.scheduler.done():
            self.scheduler.cancel()


@dataclass
class _Run:
    """What the lines of one batch share while it runs."""

    row: BatchRow
    journal: Journal
    key: ApiKey | None
    key_revoked: bool


class BatchRunner:
    def __init__(self, app: Any, *, max_in_flight: int = MAX_IN_FLIGHT, priority: int = BATCH_PRIORITY,
                 poll_s: float = POLL_S) -> None:
        self.app, self.priority, self.poll_s = app, priority, poll_s
        self.db = app.state.economics.db
        self.retention: RetentionTask | None = None
        self.settings = app.state.settings
        self._slots = asyncio.Semaphore(max_in_flight)  # shared by all batches: one engine
        self._wake = asyncio.Event()
        self._jobs: dict[str, _Job] = {}
        self._retry_at: dict[str, float] = {}
        self._main: asyncio.Task | None = None
        self.owner = leases.new_owner()  # whose lease on a batch (host:pid:nonce)

    async def start(self) -> None:
        self._main = asyncio.create_task(self._loop(), name="batch-runner")
        # the projects' retention (api/retention_task.py) shares this housekeeping start and stop
        self.retention = RetentionTask(self.db, self.app.state.settings.data_dir)
        self.retention.start()

    async def stop(self) -> None:
        """Stops every batch where it stands (in-flight lines aborted, unbilled); they resume on the next start."""
        if self.retention is not None:
            await self.retention.stop()
        tasks = [t for t in [self._main, *(j.task for j in self._jobs.values())] if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=15)

    def notify(self) -> None:
        """Look at the batches now (one was created or cancelled)."""
        self._wake.set()

    # ---- finding work -----------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                for batch_id, status in await asyncio.to_thread(self._active):
                    job = self._jobs.get(batch_id)
                    if job is not None:
                        if not await asyncio.to_thread(self._hold, batch_id):
                            log.warning("batch %s: lost the lease to another runner; stopping here", batch_id)
                            if job.task is not None:
                                job.task.cancel()  # as at shutdown: lines in flight aborted, unbilled
                        elif status == "cancelling":
                            job.cancel()
                    elif status == "cancelling" or self._retry_at.get(batch_id, 0.0) <= time.monotonic():
                        term = await asyncio.to_thread(self._hold, batch_id)
                        if term is None:
                            continue  # another runner works it
                        log.info("batch %s: working it (runner %s, lease term %d)", batch_id, self.owner, term)
                        job = self._jobs[batch_id] = _Job(batch_id)
                        job.task = asyncio.create_task(self._run_batch(job), name=f"batch-{batch_id}")
            except Exception:
                log.exception("batch runner: cannot read the batches")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):  # not wait_for: see agents/worker.py's _run
                    await self._wake.wait()

    def _active(self) -> list[tuple[str, str]]:
        with session(self.db, readonly=True) as s:
            q = select(BatchRow.id, BatchRow.status).where(BatchRow.status.in_(ACTIVE)).order_by(BatchRow.created_at)
            return [(i, st) for i, st in s.execute(q)]

    # ---- one batch --------------------------------------------------------------------------------------
    async def _run_batch(self, job: _Job) -> None:
        journal: Journal | None = None
        try:
            row = await asyncio.to_thread(self._load, job.batch_id)
            if row is None or row.status not in ACTIVE:
                return
            try:
                input_row = await asyncio.to_thread(self._file, row.input_file_id)
                plan = await asyncio.to_thread(plan_batch, content_path(self.settings, input_row), row.endpoint)
            except BatchInputError as e:
                await asyncio.to_thread(self._fail, row.id, e)
                return
            journal = Journal(self.settings.data_dir / "batches" / f"{row.id}.progress.jsonl")
            done = await asyncio.to_thread(journal.load)
            row = await asyncio.to_thread(self._begin, row.id, plan, done)
            if row.status == "in_progress":
                key, revoked = await asyncio.to_thread(self._key, row.api_key_id)
                run = _Run(row, journal, key, revoked)
                pending = sorted((ln for ln in plan.lines if ln.no not in done), key=lambda ln: (ln.prefix_key, ln.no))
                job.scheduler = asyncio.create_task(self._schedule(job, run, pending))
                try:
                    await job.scheduler
                except asyncio.CancelledError:
                    if asyncio.current_task().cancelling():  # type: ignore[union-attr]  # shutdown, not a cancel
                        raise
            await self._finalize(job, row, plan, journal)
            self._retry_at.pop(job.batch_id, None)
        except asyncio.CancelledError:
            raise
        except _Unavailable as e:
            log.warning("batch %s: paused where it stands, the server cannot serve its lines (%s); retrying in "
                        "%.0f s", job.batch_id, e, RETRY_S)
            self._retry_at[job.batch_id] = time.monotonic() + RETRY_S
        except Exception:
            log.exception("batch %s: failed; retrying in %.0f s", job.batch_id, RETRY_S)
            self._retry_at[job.batch_id] = time.monotonic() + RETRY_S
        finally:
            if journal is not None:
                journal.close()
            self._jobs.pop(job.batch_id, None)
            with contextlib.suppress(Exception):  # unreleased, the lease still expires
                await asyncio.shield(asyncio.to_thread(leader.release, self.db, _lease(job.batch_id), self.owner))

    async def _schedule(self, job: _Job, run: _Run, pending: list[Line]) -> None:
        """Starts lines while slots are free; returns when all are done. Cancelled: aborts those in flight."""
        in_flight: set[asyncio.Task] = set()

        def finished(t: asyncio.Task) -> None:
            in_flight.discard(t)
            self._slots.release()

        try:
            for line in pending:
                if run.row.expires_at is not None and datetime.now(timezone.utc) >= run.row.expires_at:
                    job.expired = True  # the 24 h window is over: what is done is the result
                    break
                await self._slots.acquire()
                t = asyncio.create_task(self._run_line(run, line))
                in_flight.add(t)
                t.add_done_callback(finished)
            if in_flight:
                await asyncio.gather(*in_flight)
        finally:
            for t in list(in_flight):
                t.cancel()
            if in_flight:
                await asyncio.gather(*in_flight, return_exceptions=True)

    async def _run_line(self, run: _Run, line: Line) -> None:
        if run.key_revoked:
            status, body = 401, error_body(APIError(401, "the API key that created this batch has been revoked",
                                                    code="invalid_api_key"), False)
        else:  # a batch answers with whole bodies: a line asking to stream gets the non-streamed response
            for attempt in range(LINE_ATTEMPTS):
                status, body = await call_route(self._line_app(run, line), run.row.endpoint,
                                                {**line.body, "stream": False}, run.key)
                if status == 503:  # not journaled: the line runs again when the server can serve it
                    raise _Unavailable(_message(body))
                if status != 500:  # a 500 (a failed engine step fails every line in it) is worth another try
                    break
                log.warning("batch %s line %s: a 500 on attempt %d of %d: %s", run.row.id, line.custom_id,
                            attempt + 1, LINE_ATTEMPTS, _message(body))
        record = response_record(line, status, body)
        run.journal.append(record)  # no await between the result and the journal: a cancel cannot split them
        await asyncio.to_thread(self._count, run.row.id, is_success(record))

    def _line_app(self, run: _Run, line: Line) -> SimpleNamespace:
        """The app as the line's route call sees it: the real app state, with batch engine priority and
        batch economics, and no upstream providers (batches run on the local engine)."""
        state = SimpleNamespace(**vars(self.app.state).get("_state", {}))
        engine = self.app.state.engine
        state.engine = _BatchEngine(engine, self.priority)
        state.economics = _LineEconomics(self.app.state.economics, engine.engine.name, run.row.id, line.custom_id)
        state.upstreams = None
        return SimpleNamespace(state=state)

    async def _finalize(self, job: _Job, row: BatchRow, plan: Plan, journal: Journal) -> None:
        done = await asyncio.to_thread(journal.load)
        status = (await asyncio.to_thread(self._load, row.id)).status
        final = "cancelled" if status == "cancelling" else "expired" if job.expired else "completed"
        if final == "completed" and not await asyncio.to_thread(
                self._move, row.id, ("in_progress",), "finalizing", finalizing_at=datetime.now(timezone.utc)):
            status = (await asyncio.to_thread(self._load, row.id)).status
            if status == "cancelling":
                final = "cancelled"
            elif status != "finalizing":  # resumed in finalizing, or moved on elsewhere
                return
        ok, failed = split_results(plan, done)
        ids = {}
        for kind, records in (("output", ok), ("error", failed)):
            if records:  # deterministic ids: finalizing again after a crash reuses the same file
                file_id = "file-" + hashlib.sha256(f"{row.id}:{kind}".encode()).hexdigest()[:24]
                await asyncio.to_thread(store_file, self.db, self.settings, file_id, purpose="batch_output",
                                        filename=f"{row.id}_{kind}.jsonl", write=writer(records),
                                        api_key_id=row.api_key_id)
                ids[kind] = file_id
        await asyncio.to_thread(self._close, row.id, final, ids, plan.total, len(ok), len(failed))
        await asyncio.to_thread(journal.remove)

    # ---- database steps (worker threads) ------------------------------------------------------------------
    def _hold(self, batch_id: str) -> int | None:
        return leader.hold(self.db, _lease(batch_id), self.owner, LEASE_S)

    def _load(self, batch_id: str) -> BatchRow:
        with session(self.db, readonly=True) as s:
            row = s.get(BatchRow, batch_id)
        if row is None:
            raise LookupError(f"batch {batch_id} is no longer in the database")
        return row

    def _file(self, file_id: str) -> FileRow:
        with session(self.db, readonly=True) as s:
            row = s.get(FileRow, file_id)
        if row is None:
            raise BatchInputError("file_not_found", f"the input file {file_id} no longer exists")
        return row

    def _key(self, key_id: str | None) -> tuple[ApiKey | None, bool]:
        if key_id is None:
            return None, False
        with session(self.db, readonly=True) as s:
            key = s.get(ApiKey, key_id)
        return key, key is None or key.revoked_at is not None

    def _move(self, batch_id: str, from_: tuple[str, ...], to: str, **values: Any) -> bool:
        """status from_ -> to (conditional: a cancel that came in between is never overwritten)."""
        with session(self.db) as s:
            # an UPDATE returns a CursorResult (with rowcount); Session.execute is typed as the general Result
            res = cast(CursorResult, s.execute(update(BatchRow).where(BatchRow.id == batch_id,
                                                                      BatchRow.status.in_(from_))
                                               .values(status=to, **values)))
            return res.rowcount == 1

    def _begin(self, batch_id: str, plan: Plan, done: dict[int, dict]) -> BatchRow:
        """validating -> in_progress, and the counts as the journal has them (a resume starts from there)."""
        completed = sum(1 for r in done.values() if is_success(r))
        with session(self.db) as s:
            row = s.get(BatchRow, batch_id)
            if row is None:
                raise LookupError(f"batch {batch_id} is no longer in the database")
            if row.status == "validating":
                row.status, row.in_progress_at = "in_progress", datetime.now(timezone.utc)
            row.request_counts_total = plan.total
            row.request_counts_completed = completed
            row.request_counts_failed = len(plan.invalid) + len(done) - completed
        return row

    def _count(self, batch_id: str, success: bool) -> None:
        col = BatchRow.request_counts_completed if success else BatchRow.request_counts_failed
        with session(self.db) as s:
            s.execute(update(BatchRow).where(BatchRow.id == batch_id).values({col: col + 1}))

    def _fail(self, batch_id: str, e: BatchInputError) -> None:
        errors = {"object": "list", "data": [{"code": e.code, "message": e.message, "param": None, "line": None}]}
        self._move(batch_id, ("validating", "in_progress", "cancelling"), "failed",
                   failed_at=datetime.now(timezone.utc), errors_json=json.dumps(errors))

    def _close(self, batch_id: str, final: str, ids: dict[str, str], total: int, completed: int, failed: int) -> None:
        self._move(batch_id, ("in_progress", "finalizing", "cancelling"), final,
                   output_file_id=ids.get("output"), error_file_id=ids.get("error"), request_counts_total=total,
                   request_counts_completed=completed, request_counts_failed=failed,
                   **{f"{final}_at": datetime.now(timezone.utc)})


def _lease(batch_id: str) -> str:
    return f"batch:{batch_id}"
