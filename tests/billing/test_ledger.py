"""billing/ledger: append-only rows in micro-USD, idempotent per request_id, reversals."""

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DatabaseError

from mainspring.billing import ledger
from mainspring.billing.keys import create_key
from mainspring.billing.prices import parse_price_sheet, price
from mainspring.billing.usage import UsageRecord
from mainspring.store.db import session
from mainspring.store.tables import LedgerEntry, PriceSheetRow

SMOL = "SmolLM2-135M-Instruct"


def _bill(s, sheet, rid, key, n_in=1000, cached=0, n_out=100, **kw):
    rec = UsageRecord(model=SMOL, input_total=n_in, cache_read=cached, output_total=n_out,
                      batch_id=kw.pop("batch_id", None))
    return ledger.record(s, rid, key, rec, price(rec, sheet), **kw)


def test_record_is_idempotent_per_request_id(db, sheet):
    with session(db) as s:
        key = create_key(s, "acme").key
        first = _bill(s, sheet, "req-1", key)
    with session(db) as s:  # a retried handler records the same request again, maybe with other numbers
        again = _bill(s, sheet, "req-1", key, n_in=5, n_out=5)
    assert again.id == first.id and again.cost_total_u == first.cost_total_u
    with session(db, readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 1
        row = s.scalar(select(LedgerEntry))
    assert (row.api_key_id, row.project_id, row.model, row.tier) == (key.id, key.project_id, SMOL, "standard")
    assert (row.tokens_input_uncached, row.tokens_output) == (1000, 100)
    assert (row.cost_input_u, row.cost_output_u, row.cost_total_u) == (100, 40, 140)
    assert row.price_sheet_version == sheet.version and row.status == "ok"


def test_a_racing_duplicate_insert_returns_the_winner(db, sheet, monkeypatch):
    # On Postgres two handlers can both miss the pre-check; the UNIQUE index decides, in a savepoint.
    with session(db) as s:
        key = create_key(s, "acme").key
        first = _bill(s, sheet, "req-1", key)
    real, calls = ledger._by_request_id, []

    def miss_once(s, rid):
        calls.append(rid)
        return None if len(calls) == 1 else real(s, rid)

    monkeypatch.setattr(ledger, "_by_request_id", miss_once)
    with session(db) as s:
        assert _bill(s, sheet, "req-1", key).id == first.id
        _bill(s, sheet, "req-2", key)  # the session is still usable after the rolled-back savepoint
    assert len(calls) == 3


def test_batch_lines_bill_once_however_often_polled(db, sheet):
    with session(db) as s:
        key = create_key(s, "acme").key
        for _ in range(3):
            for cid in ("a", "b"):
                _bill(s, sheet, ledger.batch_request_id("batch_1", cid), key, batch_id="batch_1", custom_id=cid,
                      endpoint="/v1/chat/completions")
        assert len(ledger.entries(s, batch_id="batch_1")) == 2


def test_reversal_adds_a_negating_row(db, sheet):
    with session(db) as s:
        key = create_key(s, "acme").key
        entry = _bill(s, sheet, "req-1", key, cached=600)
        _bill(s, sheet, "req-2", key)
    with session(db) as s:
        rev = ledger.reverse(s, entry.id, "refund: wrong model")
        assert ledger.reverse(s, entry.id, "again").id == rev.id  # reversing twice is a no-op
        with pytest.raises(ledger.LedgerError, match="itself a reversal"):
            ledger.reverse(s, rev.id, "undo")
        with pytest.raises(ledger.LedgerError, match="no ledger entry"):
            ledger.reverse(s, 999, "x")
    assert rev.reverses_entry_id == entry.id and rev.request_id == "req-1:reversal"
    assert rev.cost_total_u == -entry.cost_total_u and rev.tokens_cache_read == -600
    with session(db, readonly=True) as s:
        rows = ledger.entries(s)
        assert len(rows) == 3  # nothing was changed, one row was added
        assert [r.cost_total_u for r in rows if r.request_id == "req-1"] == [entry.cost_total_u]
        assert ledger.spend(s, "key", key.id) == rows[1].cost_total_u  # req-1 nets to zero


def test_database_refuses_updates_and_deletes(db, sheet):
    with session(db) as s:
        _bill(s, sheet, "req-1", create_key(s, "acme").key)
    for stmt in ("UPDATE ledger_entries SET cost_total_u = 0", "DELETE FROM ledger_entries"):
        with pytest.raises(DatabaseError, match="append-only"):
            with session(db) as s:
                s.execute(text(stmt))
    with pytest.raises(DatabaseError, match="append-only"):  # the ORM path too
        with session(db) as s:
            s.scalar(select(LedgerEntry)).cost_total_u = 0


def test_spend_by_scope_and_since(db, sheet):
    with session(db) as s:
        k1, k2 = create_key(s, "acme").key, create_key(s, "acme").key
        other = create_key(s, "beta").key
        costs = [_bill(s, sheet, f"r{i}", k).cost_total_u for i, k in enumerate([k1, k1, k2, other])]
        assert ledger.spend(s, "key", k1.id) == costs[0] + costs[1]
        assert ledger.spend(s, "project", k1.project_id) == sum(costs[:3])
        assert ledger.spend(s, "project", str(other.project_id)) == costs[3]
        tomorrow = datetime.now(timezone.utc) + timedelta(days=1)
        assert ledger.spend(s, "key", k1.id, since=tomorrow) == 0
        # reconciliation: the per-key sums add up to the whole ledger
        total = s.scalar(select(func.sum(LedgerEntry.cost_total_u)))
        assert sum(ledger.spend(s, "key", k.id) for k in (k1, k2, other)) == total
        with pytest.raises(ledger.LedgerError):
            ledger.spend(s, "model", SMOL)


def test_statuses_and_mismatched_costs(db, sheet):
    with session(db) as s:
        key = create_key(s, "acme").key
        row = _bill(s, sheet, "r-int", key, status="stream_interrupted")
        assert row.status == "stream_interrupted"
        with pytest.raises(ledger.LedgerError, match="status"):
            _bill(s, sheet, "r-bad", key, status="weird")
        rec = UsageRecord(model=SMOL, input_total=1)
        with pytest.raises(ledger.LedgerError, match="cost is for"):
            ledger.record(s, "r-x", key, rec.with_(tier="fast"), price(rec, sheet))
        # no key (auth off): a project id can still be given
        assert ledger.record(s, "anon", None, rec, price(rec, sheet)).api_key_id is None


def test_price_sheet_versions_are_never_rewritten(db, sheet):
    with session(db) as s:
        ledger.register_price_sheet(s, sheet)
        ledger.register_price_sheet(s, sheet)  # same body: fine
        changed = parse_price_sheet({**sheet.model_dump(mode="json", by_alias=True),
                                     "models": {SMOL: {**sheet.models[SMOL].model_dump(mode="json"),
                                                       "source": "edited"}}})
        with pytest.raises(ledger.LedgerError, match="new version"):
            ledger.register_price_sheet(s, changed)
        ledger.register_price_sheet(s, changed.model_copy(update={"version": "2025-07-01.1"}))
    with session(db, readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(PriceSheetRow)) == 2


def test_a_process_that_loses_the_race_to_register_a_sheet_reads_the_winners_row(db, sheet, monkeypatch):
    """Two processes start together on one database: both look, find no row, and insert. The one whose insert
    comes second gets the stored row, not an IntegrityError that kills it at start-up."""
    with session(db) as s:  # the winner, committed
        ledger.register_price_sheet(s, sheet)
    real_get = ledger.Session.get
    looks = []

    def get_before_the_winner_committed(self, entity, ident, **kw):
        looks.append(kw)
        return None if len(looks) == 1 else real_get(self, entity, ident, **kw)

    monkeypatch.setattr(ledger.Session, "get", get_before_the_winner_committed)
    with session(db) as s:
        row = ledger.register_price_sheet(s, sheet)
        assert row.version == sheet.version and row.body_json == sheet.body_json()
        _bill(s, sheet, "after-the-race", create_key(s, "acme").key)  # the session is still usable
    monkeypatch.undo()
    with session(db, readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(PriceSheetRow)) == 1
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 1
