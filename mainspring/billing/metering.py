"""One model call on the ledger: reserve its worst case against the caller's key and project budgets, run it,
then write its ledger row and settle the hold in one transaction. The API's calls (api/economics.py) and an
agent run's model calls (agents/charges.py) both go through a Meter, so there is one ledger and one set of
budgets whoever makes the call. Holds it takes are kept alive while their request runs (billing/holds.py).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Callable

from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from mainspring.billing import budgets, holds, ledger
from mainspring.billing.budgets import Reservation
from mainspring.billing.prices import PriceError, PriceSheet, price
from mainspring.billing.usage import from_engine
from mainspring.engine.outputs import Usage
from mainspring.store.db import is_busy_error, session
from mainspring.store.tables import ApiKey


log = logging.getLogger(__name__)
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 10.0


class Meter:
    def __init__(self, db: Engine | str, sheet: PriceSheet, *, ttl_s: float = holds.HOLD_TTL_S) -> None:
        self.db, self.sheet, self.ttl_s = db, sheet, ttl_s
        self._pending: list[tuple[Callable[[], int], str, str]] = []  # ledger writes a busy database refused
        self._lock = threading.Lock()
        self._retrier: threading.Thread | None = None
        self.started = datetime.now(timezone.utc)  # holds created before this belong to an earlier process
        with session(db) as s:
            ledger.register_price_sheet(s, sheet)  # ledger rows name the sheet version they were priced with

    def priced(self, *models: str | None) -> str | None:
        """The first of `models` the price sheet lists (None: none is priced, the call costs nothing)."""
        for m in models:
            if m:
                try:
                    self.sheet.model(m)
                    return m
                except PriceError:
                    continue
        return None

    def key(self, key_id: str | None) -> ApiKey | None:
        """The key a charge goes to, revoked or not (money spent under it is still its own)."""
        if key_id is None:
            return None
        with session(self.db, readonly=True) as s:
            return s.get(ApiKey, key_id)

    def reserve(self, key: ApiKey | None, request_id: str, *, model: str, tier: str, input_tokens: int,
                max_output_tokens: int | None, now: datetime | None = None) -> Reservation:
        """Hold the call's worst case; raises BudgetExceeded (402) or UnknownModel/UnknownTier (PriceError)."""
        holds.keep_alive(self.db, now, self.ttl_s)  # our running holds count, however old they are
        with session(self.db) as s:
            reservation = budgets.reserve(s, request_id, key, sheet=self.sheet, model=model, tier=tier,
                                          input_tokens=input_tokens, max_output_tokens=max_output_tokens,
                                          ttl_s=self.ttl_s, now=now)
        holds.track(self.db, reservation)
        return reservation

    def record(self, key: ApiKey | None, reservation: Reservation, request_id: str, usage: Usage, *,
               endpoint: str, model: str, tier: str, stream: bool, status: str, finish_reason: str | None,
               project_id: int | None = None, custom_id: str | None = None, batch_id: str | None = None) -> int:
        """The ledger row for what the call used and the settled hold, in one transaction; returns the row's cost
        in micro-USD (the row already there when `request_id` was recorded before: a request is billed once)."""
        rec = from_engine(usage, model, tier, stream=stream, finish_reason=finish_reason, batch_id=batch_id)
        cost = price(rec, self.sheet)

        def write() -> int:
            with session(self.db) as s:
                entry = ledger.record(s, request_id, key, rec, cost, status, endpoint=endpoint,
                                      project_id=project_id, custom_id=custom_id)
                budgets.settle(s, reservation, entry.cost_total_u)
                return entry.cost_total_u

        try:
            cost_u = write()
        except OperationalError as exc:
            if not is_busy_error(exc):
                holds.forget(reservation.request_id)  # left to expire
                raise
            # the call has been served: its row must not be lost to another process's long write lock; the
            # hold stays alive (counted against the budget) until the retry settles it
            self._later(write, reservation.request_id, request_id)
            return cost.total_u
        holds.forget(reservation.request_id)
        return cost_u

    def _later(self, write: Callable[[], int], hold_id: str, request_id: str) -> None:
        """Retry `write` in the background until the database takes it (ledger.record is idempotent per
        request id, so a retry after a write that did land is harmless)."""
        with self._lock:
            self._pending.append((write, hold_id, request_id))
            if self._retrier is None or not self._retrier.is_alive():
                self._retrier = threading.Thread(target=self._retry, name="ledger-retry", daemon=True)
                self._retrier.start()
        log.warning("ledger: the database is busy; the row of %s is written when it frees", request_id)

    def _retry(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            with self._lock:
                if not self._pending:
                    self._retrier = None
                    return
                write, hold_id, request_id = self._pending[0]
            try:
                write()
            except OperationalError as exc:
                if not is_busy_error(exc):
                    log.exception("ledger: dropping the row of %s", request_id)
                else:
                    time.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
                    continue
            holds.forget(hold_id)
            with self._lock:
                self._pending.pop(0)
            delay = RETRY_FIRST_S

    def pending(self) -> list[str]:
        """Request ids whose ledger rows wait for a busy database."""
        with self._lock:
            return [request_id for _, _, request_id in self._pending]

    def release(self, reservation: Reservation) -> None:
        """Drop the hold of a call that produced nothing to bill (refused, cancelled, failed)."""
        holds.forget(reservation.request_id)
        with session(self.db) as s:
            budgets.release(s, reservation)

    def release_stale(self) -> holds.Released:
        """Once per server start: free the holds an earlier process left (see billing/holds.py)."""
        return holds.release_stale(self.db, self.started)
