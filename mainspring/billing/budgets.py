"""Budgets enforced before the call: reserve the worst case, run, settle to the actual cost.

Admission rejects when `spent + open reservations + this reservation > hard limit`, so concurrent
requests cannot together overspend: the check and the insert of the reservation happen in one
transaction that is serialised per budget (BEGIN IMMEDIATE on SQLite, which `store.session()` uses
for writes; SELECT ... FOR UPDATE on the budget rows on Postgres). Expired reservations (a
crashed worker that never settled) stop counting after their TTL. Requests that can outlive a TTL
reserve through `metering.Meter`, which keeps their holds alive while they run and releases an
earlier process's holds at server start (billing/holds.py).

Call pattern (see also the report in the API issue):
    with session() as s: res = reserve(s, rid, key, sheet=..., model=..., tier=...,
                                       input_tokens=..., max_output_tokens=...)
    ... run the request ...
    with session() as s: ledger.record(s, rid, key, usage, cost, status); settle(s, res, cost.total_u)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from sqlalchemy import Select, func, select, update
from sqlalchemy.orm import Session

from mainspring.billing import ledger
from mainspring.billing.prices import MICRO, PriceSheet, micro_usd, rates_for
from mainspring.store.tables import ApiKey, Budget
from mainspring.store.tables import Reservation as ReservationRow

SCOPES = ("key", "project")
PERIODS = ("day", "month", "total")
DEFAULT_TTL_S = 900  # longer than any single request we serve; a lost settle frees the money after this
WARN_AT = (Decimal("0.5"), Decimal("0.8"), Decimal("1.0"))


def usd(u: int) -> str:
    """Micro-USD for people: "$5.00", or every digit when there are fractions of a cent ("$0.000123")."""
    d = Decimal(u) / MICRO
    return f"${d:.2f}" if u % 10_000 == 0 else f"${d:f}"


class BudgetError(ValueError):
    pass


class BudgetExceeded(Exception):
    """The request could cost more than the budget has left (HTTP 402)."""

    http_status = 402

    def __init__(self, budget: Budget, spent_u: int, outstanding_u: int, reserve_u: int):
        self.budget_id, self.scope, self.scope_id, self.period = budget.id, budget.scope, budget.scope_id, budget.period
        self.hard_limit_u, self.spent_u, self.outstanding_u, self.reserve_u = (
            budget.hard_limit_u, spent_u, outstanding_u, reserve_u)
        super().__init__(
            f"budget exceeded: {budget.scope} {budget.scope_id} has a {budget.period} limit of "
            f"{usd(budget.hard_limit_u)}; spent {usd(spent_u)}, {usd(outstanding_u)} held by requests in flight, "
            f"and this call could cost up to {usd(reserve_u)}")


@dataclass(frozen=True)
class Reservation:
    request_id: str
    reserved_u: int
    budget_ids: tuple[int, ...]
    expires_at: datetime
    warnings: tuple[str, ...] = ()  # soft-limit crossings (50/80/100%) this request would cause


def period_start(period: str, now: datetime) -> datetime | None:
    """Start of the budget period containing `now`; periods follow UTC calendar days and months."""
    now = now.astimezone(timezone.utc)
    if period == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "month":
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return None


def set_budget(session: Session, scope: str, scope_id: str | int, period: str, hard_limit_u: int,
               soft_limit_u: int | None = None) -> Budget:
    """Create or change the budget of a key (scope_id = key id) or project (scope_id = project id)."""
    if scope not in SCOPES:
        raise BudgetError(f"budget scope {scope!r} is not one of {', '.join(SCOPES)}")
    if period not in PERIODS:
        raise BudgetError(f"budget period {period!r} is not one of {', '.join(PERIODS)}")
    if hard_limit_u < 0 or (soft_limit_u is not None and soft_limit_u < 0):
        raise BudgetError("a budget limit cannot be negative")
    b = session.scalar(select(Budget).where(Budget.scope == scope, Budget.scope_id == str(scope_id),
                                            Budget.period == period))
    if b is None:
        b = Budget(scope=scope, scope_id=str(scope_id), period=period, hard_limit_u=hard_limit_u)
        session.add(b)
    b.hard_limit_u, b.soft_limit_u = hard_limit_u, soft_limit_u
    session.flush()
    return b


def budgets_for(session: Session, key: ApiKey, lock: bool = False) -> list[Budget]:
    q = select(Budget).where(
        ((Budget.scope == "key") & (Budget.scope_id == key.id))
        | ((Budget.scope == "project") & (Budget.scope_id == str(key.project_id)))
    ).order_by(Budget.id)  # one lock order everywhere, so two requests cannot deadlock on Postgres
    return list(session.scalars(q.with_for_update() if lock else q))


def _outstanding_query(budget_id: int, now: datetime) -> Select:
    return select(func.coalesce(func.sum(ReservationRow.reserved_u), 0)).where(
        ReservationRow.budget_id == budget_id, ReservationRow.settled.is_(False), ReservationRow.expires_at > now)


def _spent_query(budget: Budget, now: datetime) -> Select:
    return ledger.spend_query(budget.scope, budget.scope_id, period_start(budget.period, now))  # type: ignore[arg-type]


def outstanding_u(session: Session, budget_id: int, now: datetime) -> int:
    return int(session.scalar(_outstanding_query(budget_id, now)) or 0)


def spent_u(session: Session, budget: Budget, now: datetime) -> int:
    return int(session.scalar(_spent_query(budget, now)) or 0)


def spent_and_outstanding_u(session: Session, budget: Budget, now: datetime) -> tuple[int, int]:
    """What `budget` has spent and what requests in flight hold, read in ONE statement. Settling moves money from
    held to spent in one transaction; on Postgres (READ COMMITTED) each statement sees its own snapshot, so two
    separate reads can fall either side of a settle's commit and count its money neither as held nor as spent,
    which let concurrent admissions overspend. The budget-row lock `hold` takes does not stop settles."""
    row = session.execute(select(_spent_query(budget, now).scalar_subquery(),
                                 _outstanding_query(budget.id, now).scalar_subquery())).one()
    return int(row[0] or 0), int(row[1] or 0)


def worst_case_u(sheet: PriceSheet, model: str, tier: str, input_tokens: int, max_output_tokens: int | None) -> int:
    """The most a call can cost: every input token at the dearer of the uncached and cache-write
    prices (nothing assumed cached), plus `max_output_tokens` at output price. None means the
    model's cap; an explicit value is not capped, since it may sum several choices (n > 1)."""
    out = sheet.model(model).max_output_tokens if max_output_tokens is None else max_output_tokens
    if input_tokens < 0 or out < 0:
        raise BudgetError("token counts for a reservation must be >= 0")
    r = rates_for(sheet, model, tier, input_tokens)
    return micro_usd(input_tokens, max(r.input, r.cache_write)) + micro_usd(out, r.output)


def hold(session: Session, request_id: str, key: ApiKey | None, amount_u: int, *,
         ttl_s: float = DEFAULT_TTL_S, now: datetime | None = None) -> Reservation:
    """Reserve `amount_u` against every budget of the key and its project, or raise BudgetExceeded.
    Repeating a request_id returns the reservation already held."""
    now = now or datetime.now(timezone.utc)
    expires = now + timedelta(seconds=ttl_s)
    if key is None:
        return Reservation(request_id, amount_u, (), expires)
    budgets = budgets_for(session, key, lock=True)
    held = list(session.scalars(select(ReservationRow).where(ReservationRow.request_id == request_id)))
    if held:
        return Reservation(request_id, held[0].reserved_u, tuple(r.budget_id for r in held), held[0].expires_at)
    warnings: list[str] = []
    for b in budgets:
        spent, pending = spent_and_outstanding_u(session, b, now)
        if spent + pending + amount_u > b.hard_limit_u:
            raise BudgetExceeded(b, spent, pending, amount_u)
        warnings += _crossed(b, spent + pending, spent + pending + amount_u)
    for b in budgets:
        session.add(ReservationRow(request_id=request_id, budget_id=b.id, reserved_u=amount_u, expires_at=expires))
    session.flush()
    return Reservation(request_id, amount_u, tuple(b.id for b in budgets), expires, tuple(warnings))


def reserve(session: Session, request_id: str, key: ApiKey | None, *, sheet: PriceSheet, model: str,
            tier: str = "standard", input_tokens: int, max_output_tokens: int | None = None,
            ttl_s: float = DEFAULT_TTL_S, now: datetime | None = None) -> Reservation:
    """Reserve the worst-case cost of one call (see `worst_case_u`). Raises UnknownModel/UnknownTier
    for an unpriced model, BudgetExceeded when a budget cannot cover it."""
    amount = worst_case_u(sheet, model, tier, input_tokens, max_output_tokens)
    return hold(session, request_id, key, amount, ttl_s=ttl_s, now=now)


def settle(session: Session, reservation: Reservation, actual_cost_u: int) -> None:
    """Release the hold; the actual cost is in the ledger now (record it in the same transaction,
    so there is no moment where the money is counted twice or not at all). Idempotent."""
    if not reservation.budget_ids:
        return
    session.execute(
        update(ReservationRow)
        .where(ReservationRow.request_id == reservation.request_id, ReservationRow.settled.is_(False))
        .values(settled=True, settled_u=actual_cost_u)
    )


def release(session: Session, reservation: Reservation) -> None:
    """Drop a hold for a request that never ran (nothing to bill)."""
    settle(session, reservation, 0)


@dataclass(frozen=True)
class BudgetStatus:
    budget_id: int
    scope: str
    scope_id: str
    period: str
    hard_limit_u: int
    soft_limit_u: int | None
    spent_u: int
    outstanding_u: int

    @property
    def remaining_u(self) -> int:
        return self.hard_limit_u - self.spent_u - self.outstanding_u


def status(session: Session, scope: str | None = None, scope_id: str | int | None = None,
           now: datetime | None = None) -> list[BudgetStatus]:
    now = now or datetime.now(timezone.utc)
    q = select(Budget).order_by(Budget.id)
    if scope is not None:
        q = q.where(Budget.scope == scope)
    if scope_id is not None:
        q = q.where(Budget.scope_id == str(scope_id))
    return [BudgetStatus(b.id, b.scope, b.scope_id, b.period, b.hard_limit_u, b.soft_limit_u,
                         *spent_and_outstanding_u(session, b, now)) for b in session.scalars(q)]


def _crossed(b: Budget, before_u: int, after_u: int) -> list[str]:
    base = b.soft_limit_u or b.hard_limit_u
    if base <= 0:
        return []
    return [f"{b.scope} {b.scope_id} {b.period} budget at {int(t * 100)}% of {usd(base)}"
            for t in WARN_AT if before_u < base * t <= after_u]
