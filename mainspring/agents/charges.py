"""A run's model calls on its API key's ledger, exactly like API calls: each call's worst case is reserved against
the budgets of the key that created the run (and its project) before the model runs, and settled to its cost
after (billing/metering.py: one ledger, one set of budgets). A refused reservation pauses the run, as its own
budget does; raising the key's budget and resuming continues it. A run without a key (auth off) is charged
like an anonymous API call: a ledger row without key, no budget.

Ledger rows: endpoint "agent.run", request_id = the step's id (a step re-run after a crash is billed once),
custom_id = the run's id; `cost_total_u` of a run's rows sums to its `cost_u`. A call that produced nothing
to bill (cancelled, failed, unpriced model) releases its hold and writes no row, as it adds nothing to cost_u.
The blocking functions here run on the worker's journal thread (LoopEnv.call).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from mainspring.agents.tables import RunRow
from mainspring.agents.writes import Batch
from mainspring.billing.budgets import BudgetExceeded, Reservation, usd
from mainspring.billing.metering import Meter
from mainspring.store.tables import ApiKey

ENDPOINT = "agent.run"
TIER = "standard"


class KeyBudgetExceeded(Exception):
    """The run's key (or its project) cannot cover the next model call: what the API answers with a 402."""

    def __init__(self, exc: BudgetExceeded):
        self.detail = {"scope": exc.scope, "scope_id": exc.scope_id, "period": exc.period,
                       "hard_limit_u": exc.hard_limit_u, "spent_u": exc.spent_u, "held_u": exc.outstanding_u,
                       "needed_u": exc.reserve_u}
        whose = "API key's" if exc.scope == "key" else "project's"
        super().__init__(f"the {whose} {exc.period} budget is exhausted ({usd(exc.hard_limit_u)}: spent "
                         f"{usd(exc.spent_u)}, {usd(exc.outstanding_u)} held by calls in flight, the next model "
                         f"call could cost up to {usd(exc.reserve_u)}); raise it and resume the run")


class KeyRevoked(Exception):
    """The key that created the run was revoked: the run may not spend under it any more (it fails)."""

    def __init__(self, key_id: str):
        super().__init__(f"the API key {key_id} that created this run was revoked; the run stops before its next "
                         "model call (start it again with a valid key)")


@dataclass(frozen=True)
class Charge:
    """One model call's hold, from before the call to its ledger row."""

    meter: Meter
    key: ApiKey | None
    run_id: str
    project_id: int | None
    step_id: str
    reservation: Reservation


def reserve(meter: Meter, run: RunRow, step_id: str, models: tuple[str | None, ...], input_tokens: int,
            max_tokens: int) -> Charge | None:
    """Hold the next call's worst case, priced as the first of `models` the sheet lists; None when none is (an
    unpriced model costs nothing and is not metered). Raises KeyBudgetExceeded, or KeyRevoked (priced or not)."""
    key = meter.key(run.api_key_id)
    if key is not None and key.revoked_at is not None:
        raise KeyRevoked(key.id)
    model = meter.priced(*models)
    if model is None:
        return None
    # a hold of its own per attempt: a released hold under the same id would be taken for a live one
    request_id = f"{step_id}:{secrets.token_hex(4)}"
    try:
        reservation = meter.reserve(key, request_id, model=model, tier=TIER, input_tokens=input_tokens,
                                    max_output_tokens=max_tokens)
    except BudgetExceeded as exc:
        raise KeyBudgetExceeded(exc) from None
    return Charge(meter, key, run.id, run.project_id if key is None else key.project_id, step_id, reservation)


def settle(charge: Charge, models: tuple[str | None, ...], completion) -> int | None:
    """The call's ledger row and settled hold; its cost in micro-USD, None when no model of `models` is priced."""
    model = charge.meter.priced(*models)
    if model is None:
        release(charge)
        return None
    return charge.meter.record(charge.key, charge.reservation, charge.step_id, completion.usage, endpoint=ENDPOINT,
                               model=model, tier=TIER, stream=False, status="ok",
                               finish_reason=completion.finish_reason, project_id=charge.project_id,
                               custom_id=charge.run_id)


def release(charge: Charge) -> None:
    charge.meter.release(charge.reservation)


def note_refusal(batch: Batch, exc: KeyBudgetExceeded) -> None:
    """Journal why the run pauses (the pause itself is journal.park_run's, reason "budget")."""
    batch.event("budget.exceeded", message=str(exc), **exc.detail)
    batch.audit("budget.exceeded", {"message": str(exc), **exc.detail})
