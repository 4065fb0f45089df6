"""Wakes the followers of runs' event streams when their run has new events, with one poller per process.

Events are rows in the database, written by this process's worker or by another process's. Instead of every SSE
follower querying its run every 0.2 s (50 idle followers cost 0.7 cores), the bus asks one cheap question for
all of them — the newest event id — and, only when it grew, which runs the new events belong to; it then wakes
those runs' followers, which read their events once. The poller runs only while someone follows.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from sqlalchemy import func, select

from mainspring.agents.tables import EventRow
from mainspring.store.db import session


class EventBus:
    def __init__(self, db: str, poll_s: float = 0.2):
        self.db, self.poll_s = db, poll_s
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._last_id: int | None = None
        self._poller: asyncio.Task | None = None

    @property
    def horizon(self) -> int | None:
        """Take it before reading a run's events; pass it to `wait` after."""
        return self._last_id

    async def wait(self, run_id: str, horizon: int | None, timeout: float) -> bool:
        """Until run `run_id` may have events newer than those read after taking `horizon` (True), or `timeout`
        (False). A poll that happened in between may have seen them already: then this returns at once."""
        if horizon != self._last_id:
            return True
        woken = asyncio.Event()
        self._waiters[run_id].add(woken)
        if self._poller is None or self._poller.done() or self._poller.get_loop() is not asyncio.get_running_loop():
            self._poller = asyncio.create_task(self._poll(), name="event-bus")
        try:
            async with asyncio.timeout(timeout):
                await woken.wait()
            return True
        except TimeoutError:
            return False
        finally:
            waiting = self._waiters.get(run_id)
            if waiting is not None:
                waiting.discard(woken)
                if not waiting:
                    del self._waiters[run_id]

    def wake(self, run_id: str) -> None:
        for woken in self._waiters.get(run_id, ()):
            woken.set()

    async def _poll(self) -> None:
        while self._waiters:
            first = self._last_id is None
            newest, runs = await asyncio.to_thread(self._new_runs)
            for run_id in list(self._waiters) if first else runs:  # first poll: no horizon yet, wake them all
                self.wake(run_id)
            self._last_id = newest
            await asyncio.sleep(self.poll_s)

    def _new_runs(self) -> tuple[int, set[str]]:
        """The newest event id, and the runs with events after the one seen last."""
        with session(self.db, readonly=True) as s:
            newest = s.scalar(select(func.max(EventRow.id))) or 0
            if self._last_id is None or newest <= self._last_id:
                return newest, set()
            runs = s.scalars(select(EventRow.run_id).where(EventRow.id > self._last_id).distinct())
            return newest, set(runs)
