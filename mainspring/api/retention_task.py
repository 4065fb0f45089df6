"""The retention sweeper in the server: one bounded pass (mainspring/store/retention.py) at start, then one an
hour, on a background task of the server's event loop (the SQL and the file deletes in a worker thread).

Started and stopped with the batch runner (api/batch_runner.py), the server's other housekeeping loop, so it runs
exactly where batches do: once per API server process. A failed pass is logged and retried at the next tick; it
never stops the server. `mainspring projects sweep` runs the same passes by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from mainspring.store.retention import DEFAULT_LIMIT, sweep

log = logging.getLogger(__name__)

INTERVAL_S = 3600.0  # retention is in days: an hour late is well inside it, and a pass an hour is cheap


class RetentionTask:
    def __init__(self, db: Any, data_dir: Path, *, interval_s: float = INTERVAL_S, limit: int = DEFAULT_LIMIT) -> None:
        self.db, self.data_dir, self.interval_s, self.limit = db, data_dir, interval_s, limit
        self._task: asyncio.Task | None = None
        self.passes = 0  # passes finished (tests and diagnostics read it)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="retention-sweeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run_once(self) -> int:
        """One bounded pass; the rows it deleted."""
        results = await asyncio.to_thread(sweep, self.db, self.data_dir, limit=self.limit)
        self.passes += 1
        return sum(r.total for r in results)

    async def _loop(self) -> None:
        while True:
            try:
                deleted = await self.run_once()
                # a full pass means a backlog: the next one soon rather than in an hour
                delay = 1.0 if deleted >= self.limit else self.interval_s
            except Exception:
                log.exception("retention sweeper: the pass failed; trying again in %.0f s", self.interval_s)
                delay = self.interval_s
            await asyncio.sleep(delay)
