"""A worker: claims runnable runs, drives each as an asyncio task, keeps their leases alive, relays cancel and
pause to the loops, and lets expired approvals take their default. One per server process; several processes
(or machines, on Postgres) can run workers against the same database."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping

from mainspring.agents import control, leases, writes
from mainspring.agents.loop import LoopEnv, ModelResolver, RunLoop
from mainspring.agents.polling import IdlePace
from mainspring.agents.tools.base import Tool
from mainspring.models import Usage

log = logging.getLogger("mainspring.agents")


class ListPrice:
    """(model, usage) -> list-price micro-USD from the price sheet; models it does not list cost 0."""

    def __init__(self, sheet: Any) -> None:
        self.sheet = sheet  # billing.prices.PriceSheet: the worker's Meter prices the ledger rows with the same

    def __call__(self, model: str, usage: Usage) -> int:
        from mainspring.billing.prices import PriceError, price
        from mainspring.billing.usage import from_engine

        try:
            return price(from_engine(usage, model), self.sheet).total_u
        except PriceError:
            return 0


def list_price(prices_file: str | None = None) -> ListPrice:
    from mainspring.billing.prices import load_price_sheet

    return ListPrice(load_price_sheet(prices_file or None))


class Worker:
    def __init__(self, db_url: str, *, models: ModelResolver,
                 tools: Mapping[str, Tool], data_dir: Path,
                 capacity: int = 64, lease_s: float = 30.0, poll_s: float = 0.2, sandbox: Any = None,
                 price: Callable[[str, Usage], int] | None = None, sleep: Callable[[float], Any] = asyncio.sleep,
                 meter: Any = None):
        """`meter` (billing.metering.Meter) charges the runs' model calls to their keys' ledger and budgets; by
        default one on `price`'s sheet when `price` is a ListPrice (a bare callable: calls are not charged)."""
        from mainspring.billing.metering import Meter

        self.owner = leases.new_owner()
        price = price or list_price()
        if meter is None and isinstance(price, ListPrice):
            meter = Meter(db_url, price.sheet)
        self.env = LoopEnv(db=db_url, owner=self.owner, models=models, tools=tools, data_dir=data_dir,
                           price=price, sandbox=sandbox, sleep=sleep, meter=meter)
        self.capacity, self.lease_s, self.poll_s = capacity, lease_s, poll_s
        self.loops: dict[str, tuple[RunLoop, asyncio.Task]] = {}
        self._wake = asyncio.Event()
        self._main: asyncio.Task | None = None
        self._last_beat = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_run_done: Callable[[], Any] = lambda: None  # a driven run stopped (the plan scheduler's wake-up)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        # SQLite has one writer at a time: journal calls from several threads of this process would only queue
        # on its lock, and a writer that finds it taken sleeps in steps of milliseconds (busy_timeout) although
        # the holder needs a fraction of one. One thread takes them in turn instead. Other databases write
        # rows in parallel: a few threads.
        from sqlalchemy.engine import make_url

        sqlite = make_url(self.env.db).get_backend_name() == "sqlite"
        self.env.executor = ThreadPoolExecutor(1 if sqlite else 4, thread_name_prefix="agent-journal")
        self.env.committer = writes.Committer(self.env.db, self.owner, self.env.executor)
        try:
            requeued = await asyncio.to_thread(control.requeue_model_stopped, self.env.db)
        except Exception:  # a database hiccup must not keep the worker from starting; a resume queues them too
            log.exception("could not queue again the runs parked when their model's engine stopped")
            requeued = []
        if requeued:
            log.info("queued again %d run(s) parked when their model's engine stopped", len(requeued))
        self._main = asyncio.create_task(self._run(), name="agent-worker")

    def soon(self, fn, *args) -> None:
        """Run `fn` on the worker's event loop: callers may be request threads."""
        if self._loop is None or self._loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    def notify(self) -> None:
        """Something became runnable (a new run, a resolved interrupt): look now rather than at the next poll."""
        self.soon(self._wake.set)

    async def stop(self) -> None:
        """Stop driving runs; their journals stay as they are and the next worker picks them up."""
        if self._main:
            self._main.cancel()
        for loop, task in list(self.loops.values()):
            loop.stop = "shutdown"
            task.cancel()
        await asyncio.gather(*(t for _, t in self.loops.values()), self._main or asyncio.sleep(0),
                             return_exceptions=True)
        self.loops.clear()
        if self.env.executor is not None:
            self.env.executor.shutdown(wait=False)  # a commit still running finishes; nothing new is taken
            self.env.executor = self.env.committer = None

    def interrupt(self, run_id: str, order: str, cut: bool = True) -> None:
        """Stop a run this worker drives (order: cancel | pause): at once, cutting the step in flight, or
        (cut=False) at its next step boundary."""
        self.soon(self._interrupt, run_id, order, cut)

    def _interrupt(self, run_id: str, order: str, cut: bool) -> None:
        entry = self.loops.get(run_id)
        if entry is None:
            return
        loop, task = entry
        if not cut:
            loop.pause_at_boundary = True
            return
        loop.stop = order
        task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        pace = IdlePace(self.poll_s)
        while True:
            found = True
            try:
                found = await self._tick(loop.time())
            except asyncio.CancelledError:
                raise
            except Exception:  # a database hiccup must not kill the worker
                log.exception("agent worker tick failed")
            self._wake.clear()
            # not asyncio.wait_for: on Python 3.11 it returns normally when the wake-up and stop()'s cancel land in
            # the same turn of the loop (CPython gh-86296), and this loop then ran on with stop() waiting for it
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pace.after(found)):
                    await self._wake.wait()

    async def _tick(self, t: float) -> bool:
        """One look: heartbeats, expired interrupts, runs to claim; whether there was work (runs driven, found or
        expired)."""
        for run_id in [r for r, (_, task) in self.loops.items() if task.done()]:
            del self.loops[run_id]
        if self.loops and t - self._last_beat >= min(self.lease_s / 3, 1.0):
            self._last_beat = t
            orders = await self.env.call(leases.heartbeat, self.env.db, self.owner, list(self.loops), self.lease_s)
            for run_id, order in orders.items():  # flags set by another process; pauses wait for the boundary
                self._interrupt(run_id, order, cut=order != "pause")
        expired = await self.env.call(control.expire_due, self.env.db)
        claimed = await self.env.call(leases.claim, self.env.db, self.owner, self.capacity - len(self.loops),
                                      self.lease_s)
        for run_id, recovered in claimed:
            if recovered:
                log.info("run %s: recovered after its worker died", run_id)
            run_loop = RunLoop(self.env, run_id)
            task = asyncio.create_task(run_loop.drive(), name=f"run-{run_id}")
            task.add_done_callback(lambda _: self.on_run_done())
            self.loops[run_id] = (run_loop, task)
        return bool(self.loops) or expired > 0

    async def wait_idle(self, timeout: float = 60.0) -> None:
        """Until no run is being driven (tests, shutdown)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.loops:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"runs still active: {sorted(self.loops)}")
            await asyncio.gather(*(t for _, t in list(self.loops.values())), return_exceptions=True)
            await asyncio.sleep(0)
            for run_id in [r for r, (_, task) in self.loops.items() if task.done()]:
                del self.loops[run_id]
