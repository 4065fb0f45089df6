"""What every API call costs: who is calling (key), may they (rate limits, budget), what it cost
(price sheet → ledger). One instance per app; the database calls run on worker threads. The budget and ledger
work is a `Meter`'s (billing/metering.py), shared with agent runs, so every model call lands on one ledger."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mainspring.api.errors import APIError
from mainspring.api.ratelimit import RateLimitedCall, RateLimiter, RateLimited
from mainspring.billing.budgets import BudgetExceeded, Reservation
from mainspring.billing.keys import effective_limits, verify_key
from mainspring.billing.metering import Meter
from mainspring.billing.prices import PriceError, load_price_sheet
from mainspring.config import Settings
from mainspring.engine.outputs import Usage
from mainspring.store.db import init_db, session
from mainspring.store.tables import ApiKey

log = logging.getLogger(__name__)
KEY_PREFIX = "ms-"


@dataclass
class Admission:
    """Handed from before_call to after_call."""

    reservation: Reservation
    call: RateLimitedCall  # the rate limiter's entry, settled to the real token count


class Economics:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = init_db(settings.resolved_database_url())
        self.sheet = load_price_sheet(settings.prices_file or None)
        self.meter = Meter(self.db, self.sheet)
        # server start: the holds of requests an earlier process died serving no longer block their budgets
        self.meter.release_stale()
        self.limiter = RateLimiter()

    # -- who ------------------------------------------------------------------------------
    def authenticate(self, secret: str | None) -> ApiKey | None:
        """The caller's key; anonymous (None) is allowed unless MAINSPRING_REQUIRE_AUTH is set.
        A secret that looks like one of our keys must verify, so a revoked key never slips
        through as anonymous."""
        key = None
        if secret:
            with session(self.db, readonly=True) as s:
                key = verify_key(s, secret)
        if key is None and (self.settings.require_auth or (secret or "").startswith(KEY_PREFIX)):
            raise APIError(401, "invalid or revoked API key; create one with `mainspring keys create --project P`"
                           if secret else "an API key is required: send `Authorization: Bearer <key>`",
                           code="invalid_api_key")
        return key

    # -- may they -------------------------------------------------------------------------
    def admit(self, key: ApiKey | None, request_id: str, model: str, tier: str, prompt_tokens: int,
              max_output_tokens: int) -> Admission:
        rpm, tpm = effective_limits(key, self.settings.rpm_limit, self.settings.tpm_limit)
        try:
            call = self.limiter.admit(key.id if key else "anonymous", rpm, tpm, prompt_tokens + max_output_tokens)
        except RateLimited as exc:
            raise APIError(429, str(exc), code="rate_limit_exceeded", headers={"Retry-After": exc.retry_after})
        try:
            reservation = self.meter.reserve(key, request_id, model=model, tier=tier, input_tokens=prompt_tokens,
                                             max_output_tokens=max_output_tokens)
        except BudgetExceeded as exc:
            self.limiter.settle(call, 0)
            raise APIError(402, str(exc), code="budget_exceeded")
        except PriceError as exc:
            self.limiter.settle(call, 0)
            raise APIError(500, f"{exc}; add the model to the price sheet (MAINSPRING_PRICES_FILE)",
                           code="model_not_priced")
        for warning in reservation.warnings:
            log.warning("budget: %s", warning)
        return Admission(reservation, call)

    # -- what it cost ---------------------------------------------------------------------
    def record(self, key: ApiKey | None, admission: Admission, request_id: str, endpoint: str, model: str,
               tier: str, stream: bool, usage: Usage, status: str, finish_reason: str | None) -> int:
        """Ledger row + settled reservation in one transaction; returns the cost in micro-USD."""
        cost_u = self.meter.record(key, admission.reservation, request_id, usage, endpoint=endpoint, model=model,
                                   tier=tier, stream=stream, status=status, finish_reason=finish_reason)
        self.limiter.settle(admission.call, usage.prompt_tokens + usage.completion_tokens)
        return cost_u
