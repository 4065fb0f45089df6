"""Usage reports from the ledger: tokens and dollars by key, project, model, tier or day, with the
cache hit rate and what the cache saved.

hit rate = cache_read / input_total (token-weighted, as in the design note);
savings  = what the cache-read tokens would have cost at the uncached input price, minus what they
           cost. The uncached price comes from the sheet version each row was priced with (stored in
           `price_sheets`), so a later price change does not rewrite past savings. Context-length
           multipliers are not applied to savings (rows are summed before pricing).
Reversal rows are negative, so every figure is net.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TextIO

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from mainspring.billing.prices import MICRO, PriceError, PriceSheet, micro_usd, parse_price_sheet
from mainspring.store.tables import LedgerEntry, PriceSheetRow, Project

GROUPS = ("key", "project", "model", "tier", "day")


class ReportError(ValueError):
    pass


@dataclass
class UsageRow:
    group: str
    requests: int = 0
    input_uncached: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0
    reasoning: int = 0
    cost_u: int = 0
    savings_u: int = 0

    @property
    def input_total(self) -> int:
        return self.input_uncached + self.cache_read + self.cache_write

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_read / self.input_total if self.input_total > 0 else 0.0


def stored_sheets(session: Session) -> dict[str, PriceSheet]:
    """Every price sheet version ever registered, parsed."""
    out = {}
    for row in session.scalars(select(PriceSheetRow)):
        try:
            out[row.version] = parse_price_sheet(json.loads(row.body_json), f"stored sheet {row.version}")
        except (PriceError, ValueError):
            continue  # an unreadable old sheet only costs its savings figure, not the report
    return out


def _group_column(by: str):
    if by == "key":
        return func.coalesce(LedgerEntry.api_key_id, "(none)")
    if by == "project":
        return func.coalesce(Project.name, "(none)")
    if by == "model":
        return LedgerEntry.model
    if by == "tier":
        return LedgerEntry.tier
    if by == "day":
        return func.date(LedgerEntry.ts)  # SQLite: 'YYYY-MM-DD'; Postgres: a date (made str below)
    raise ReportError(f"cannot group usage by {by!r}; choose one of {', '.join(GROUPS)}")


def usage_report(session: Session, by: str = "key", since: datetime | None = None, until: datetime | None = None,
                 sheets: dict[str, PriceSheet] | None = None, project_id: int | None = None) -> list[UsageRow]:
    """Net usage per group, sorted by cost (highest first). `sheets` adds versions not stored in the database;
    `project_id` keeps only that project's rows."""
    grp = _group_column(by).label("grp")
    is_rev = LedgerEntry.reverses_entry_id.is_not(None)
    q = (
        select(
            grp, LedgerEntry.model, LedgerEntry.tier, LedgerEntry.price_sheet_version,
            func.sum(case((is_rev, -1), else_=1)),
            *[func.sum(c) for c in (LedgerEntry.tokens_input_uncached, LedgerEntry.tokens_cache_read,
                                    LedgerEntry.tokens_cache_write, LedgerEntry.tokens_output,
                                    LedgerEntry.tokens_reasoning, LedgerEntry.cost_total_u,
                                    LedgerEntry.cost_cache_read_u)],
        )
        .select_from(LedgerEntry)
        .outerjoin(Project, Project.id == LedgerEntry.project_id)
        .group_by(grp, LedgerEntry.model, LedgerEntry.tier, LedgerEntry.price_sheet_version)
    )
    if since is not None:
        q = q.where(LedgerEntry.ts >= since)
    if until is not None:
        q = q.where(LedgerEntry.ts < until)
    if project_id is not None:
        q = q.where(LedgerEntry.project_id == project_id)
    known = {**stored_sheets(session), **(sheets or {})}
    rows: dict[str, UsageRow] = {}
    for g, model, tier, version, n, unc, read, write, out, reas, cost, read_cost in session.execute(q):
        r = rows.setdefault(str(g), UsageRow(str(g)))
        r.requests += int(n)
        r.input_uncached += int(unc)
        r.cache_read += int(read)
        r.cache_write += int(write)
        r.output += int(out)
        r.reasoning += int(reas)
        r.cost_u += int(cost)
        sheet = known.get(version)
        if sheet is not None and read:
            try:
                r.savings_u += micro_usd(int(read), sheet.rates(model, tier).input) - int(read_cost)
            except PriceError:
                pass  # model or tier not in that sheet: no savings figure for these rows
    return sorted(rows.values(), key=lambda r: (-r.cost_u, r.group))


CSV_COLUMNS = ["group", "requests", "input_total", "input_uncached", "cache_read", "cache_write", "output",
               "reasoning", "cache_hit_rate", "cost_usd", "savings_usd"]


def _usd(u: int) -> str:
    return f"{Decimal(u) / MICRO:f}"


def write_csv(rows: list[UsageRow], out: TextIO | Path | str, by: str = "group") -> None:
    """CSV with exact decimal dollars (no float rounding); the first column is named after `by`."""
    if isinstance(out, (str, Path)):
        with open(out, "w", newline="", encoding="utf-8") as f:
            write_csv(rows, f, by)
        return
    w = csv.writer(out)
    w.writerow([by, *CSV_COLUMNS[1:]])
    for r in rows:
        w.writerow([r.group, r.requests, r.input_total, r.input_uncached, r.cache_read, r.cache_write, r.output,
                    r.reasoning, f"{r.cache_hit_rate:.4f}", _usd(r.cost_u), _usd(r.savings_u)])


def to_csv(rows: list[UsageRow], by: str = "group") -> str:
    buf = io.StringIO()
    write_csv(rows, buf, by)
    return buf.getvalue()
