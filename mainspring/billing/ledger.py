"""The ledger: one append-only row per priced request, in integer micro-USD.

Rows are never updated or deleted (the database refuses it with triggers); a correction is a
reversing row with negated counts and costs, so every sum over the ledger stays right. A request
is billed at most once: `request_id` is UNIQUE and `record` returns the existing row on a repeat
(a retried handler, a re-polled batch). Batch lines use `batch_request_id(batch_id, custom_id)`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from sqlalchemy import Select, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mainspring.billing.prices import Cost, PriceSheet
from mainspring.billing.usage import UsageRecord
from mainspring.store.tables import ApiKey, LedgerEntry, PriceSheetRow

STATUSES = ("ok", "error", "cancelled", "truncated", "stream_interrupted")
Scope = Literal["key", "project"]


class LedgerError(ValueError):
    pass


def batch_request_id(batch_id: str, custom_id: str) -> str:
    """The request_id of one batch output line: re-polling or re-running a batch cannot bill it twice."""
    return f"{batch_id}:{custom_id}"


def register_price_sheet(session: Session, sheet: PriceSheet) -> PriceSheetRow:
    """Store `sheet` under its version (once). A different body under a known version is refused:
    history is never rewritten, a new price is a new version."""
    row = session.get(PriceSheetRow, sheet.version)
    body = sheet.body_json()
    if row is None:
        # processes starting together on one Postgres (API servers, `mainspring worker`) each find no row and
        # insert it: the savepoint lets the loser read the winner's row instead of dying at start-up
        try:
            with session.begin_nested():
                row = PriceSheetRow(version=sheet.version, body_json=body)
                session.add(row)
        except IntegrityError:
            row = session.get(PriceSheetRow, sheet.version, populate_existing=True)
            if row is None:
                raise
    if row.body_json != body:
        raise LedgerError(f"price sheet version {sheet.version!r} is already stored with other prices; "
                          "give the changed sheet a new version")
    return row


def record(
    session: Session,
    request_id: str,
    key: ApiKey | None,
    usage: UsageRecord,
    cost: Cost,
    status: str = "ok",
    *,
    endpoint: str = "/v1/chat/completions",
    project_id: int | None = None,
    custom_id: str | None = None,
    idempotency_key: str | None = None,
) -> LedgerEntry:
    """Append the row for `request_id`, or return the row already there (idempotent)."""
    if status not in STATUSES:
        raise LedgerError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    if (usage.model, usage.tier) != (cost.model, cost.tier):
        raise LedgerError(f"cost is for {cost.model}/{cost.tier} but usage is for {usage.model}/{usage.tier}")
    existing = _by_request_id(session, request_id)
    if existing is not None:
        return existing
    entry = LedgerEntry(
        request_id=request_id, idempotency_key=idempotency_key,
        api_key_id=key.id if key is not None else None,
        project_id=key.project_id if key is not None else project_id,
        model=usage.model, tier=usage.tier, endpoint=endpoint, stream=usage.stream,
        batch_id=usage.batch_id, custom_id=custom_id,
        tokens_input_uncached=usage.input_uncached, tokens_cache_read=usage.cache_read,
        tokens_cache_write=usage.cache_write, tokens_output=usage.output_total, tokens_reasoning=usage.reasoning,
        cost_input_u=cost.input_u, cost_cache_read_u=cost.cache_read_u, cost_cache_write_u=cost.cache_write_u,
        cost_output_u=cost.output_u, cost_total_u=cost.total_u,
        price_sheet_version=cost.price_sheet_version, status=status, finish_reason=usage.finish_reason,
    )
    return _insert_or_existing(session, entry)


def reverse(session: Session, entry_id: int, reason: str) -> LedgerEntry:
    """Cancel an entry with a reversing row (negated tokens and costs). Reversing twice returns
    the first reversal; a reversal itself cannot be reversed (record the charge again instead)."""
    orig = session.get(LedgerEntry, entry_id)
    if orig is None:
        raise LedgerError(f"no ledger entry {entry_id}")
    if orig.reverses_entry_id is not None:
        raise LedgerError(f"ledger entry {entry_id} is itself a reversal")
    if not reason.strip():
        raise LedgerError("a reversal needs a reason")
    existing = session.scalar(select(LedgerEntry).where(LedgerEntry.reverses_entry_id == entry_id))
    if existing is not None:
        return existing
    neg = {c: -getattr(orig, c) for c in (
        "tokens_input_uncached", "tokens_cache_read", "tokens_cache_write", "tokens_output", "tokens_reasoning",
        "cost_input_u", "cost_cache_read_u", "cost_cache_write_u", "cost_output_u", "cost_total_u")}
    entry = LedgerEntry(
        request_id=f"{orig.request_id}:reversal", api_key_id=orig.api_key_id, project_id=orig.project_id,
        model=orig.model, tier=orig.tier, endpoint=orig.endpoint, stream=orig.stream, batch_id=orig.batch_id,
        custom_id=orig.custom_id, price_sheet_version=orig.price_sheet_version, status=orig.status,
        reverses_entry_id=orig.id, reason=reason, **neg,
    )
    return _insert_or_existing(session, entry)


def spend(session: Session, scope: Scope, scope_id: str | int, since: datetime | None = None) -> int:
    """Net micro-USD billed to a key or project (reversals included), from `since` on."""
    return int(session.scalar(spend_query(scope, scope_id, since)) or 0)


def spend_query(scope: Scope, scope_id: str | int, since: datetime | None = None) -> Select:
    """The SELECT behind `spend`, for callers that must read it in the same statement as something else."""
    col = {"key": LedgerEntry.api_key_id, "project": LedgerEntry.project_id}.get(scope)
    if col is None:
        raise LedgerError(f"scope {scope!r} is not 'key' or 'project'")
    q = select(func.coalesce(func.sum(LedgerEntry.cost_total_u), 0)).where(
        col == (int(scope_id) if scope == "project" else str(scope_id)))
    if since is not None:
        q = q.where(LedgerEntry.ts >= since)
    return q


def entries(session: Session, request_id: str | None = None, batch_id: str | None = None) -> list[LedgerEntry]:
    q = select(LedgerEntry).order_by(LedgerEntry.id)
    if request_id is not None:
        q = q.where(LedgerEntry.request_id == request_id)
    if batch_id is not None:
        q = q.where(LedgerEntry.batch_id == batch_id)
    return list(session.scalars(q))


def _by_request_id(session: Session, request_id: str) -> LedgerEntry | None:
    return session.scalar(select(LedgerEntry).where(LedgerEntry.request_id == request_id))


def _insert_or_existing(session: Session, entry: LedgerEntry) -> LedgerEntry:
    # The savepoint covers a concurrent insert of the same request_id (possible on Postgres, where
    # the check above does not lock): the loser gets the winner's row instead of an error.
    try:
        with session.begin_nested():
            session.add(entry)
    except IntegrityError:
        existing = _by_request_id(session, entry.request_id)
        if existing is None:
            raise
        return existing
    return entry
