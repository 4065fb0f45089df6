"""One model call on the ledger: reserve its worst case against the caller's key and project budgets, run it,
then write its ledger row and settle the hold in one transaction. The API's calls (api/economics.py) and an
agent run's model calls (agents/charges.py) both go through a Meter, so there is one ledger and one set of
budgets whoever makes the call. Holds it takes are kept alive while their request runs (billing/holds.py).
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy.engine import Engine

from mainspring.billing import budgets, holds, ledger
from mainspring.billing.budgets import Reservation
from mainspring.billing.prices import PriceError, PriceSheet, price
from mainspring.billing.usage import from_engine
from mainspring.engine.outputs import Usage
from mainspring.store.db import session
from mainspring.store.tables import ApiKey


class Meter:
    def __init__(self, db: Engine | str, sheet: PriceSheet, *, ttl_s: float = holds.HOLD_TTL_S) -> None:
        self.db, self.sheet, self.ttl_s = db, sheet, ttl_s
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
               project_id: int | None = None, custom_id: str | None = None) -> int:
        """The ledger row for what the call used and the settled hold, in one transaction; returns the row's cost
        in micro-USD (the row already there when `request_id` was recorded before: a request is billed once)."""
        try:
            rec = from_engine(usage, model, tier, stream=stream, finish_reason=finish_reason)
            cost = price(rec, self.sheet)
            with session(self.db) as s:
                entry = ledger.record(s, request_id, key, rec, cost, status, endpoint=endpoint,
                                      project_id=project_id, custom_id=custom_id)
                budgets.settle(s, reservation, entry.cost_total_u)
                return entry.cost_total_u
        finally:
            holds.forget(reservation.request_id)  # settled, or left to expire if the write failed

    def release(self, reservation: Reservation) -> None:
        """Drop the hold of a call that produced nothing to bill (refused, cancelled, failed)."""
        holds.forget(reservation.request_id)
        with session(self.db) as s:
            budgets.release(s, reservation)

    def release_stale(self) -> holds.Released:
        """Once per server start: free the holds an earlier process left (see billing/holds.py)."""
        return holds.release_stale(self.db, self.started)
