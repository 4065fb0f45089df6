"""GET /v1/usage: the ledger's usage report (billing/reports.py) over HTTP, as JSON or CSV.

A caller with a key sees its own project's rows only; an anonymous caller (possible only where keys
are not required) sees everything, as the operator at the console would (`mainspring usage`).
"""

from __future__ import annotations

import asyncio
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from mainspring.api.errors import bad_request
from mainspring.billing import reports
from mainspring.billing.prices import MICRO
from mainspring.store.db import session

router = APIRouter()

GroupBy = Literal["key", "project", "model", "tier", "day"]


def parse_time(value: str | None, param: str) -> datetime | None:
    """'2025-06-01' (UTC midnight) or an ISO 8601 date-time; one without a zone is taken as UTC."""
    if value is None or value == "":
        return None
    try:
        t = datetime.combine(date.fromisoformat(value), datetime.min.time()) if len(value) == 10 \
            else datetime.fromisoformat(value)
        return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    except (ValueError, OverflowError):  # OverflowError: a zone offset pushes year 9999 (or 1) past the range
        raise bad_request(f"{param} {value!r} is not a date (2025-06-01) or an ISO 8601 date-time "
                          "(2025-06-01T12:00:00Z) within years 1-9999", param=param) from None


def usd(u: int) -> str:
    """Micro-USD as an exact decimal string of USD, as the CSV writes it."""
    return f"{Decimal(u) / MICRO:f}"


def row_json(r: reports.UsageRow) -> dict[str, Any]:
    # money as integer micro-USD and exact decimal strings: a client never has to trust a float
    return {"group": r.group, "requests": r.requests, "input_total": r.input_total,
            "input_uncached": r.input_uncached, "cache_read": r.cache_read, "cache_write": r.cache_write,
            "output": r.output, "reasoning": r.reasoning, "cache_hit_rate": round(r.cache_hit_rate, 4),
            "cost_u": r.cost_u, "cost_usd": usd(r.cost_u), "savings_u": r.savings_u,
            "savings_usd": usd(r.savings_u)}


@router.get("/v1/usage")
async def get_usage(request: Request, by: GroupBy = "key", since: str | None = None, until: str | None = None,
                    format: Literal["json", "csv"] = Query("json")) -> Any:
    start, end = parse_time(since, "since"), parse_time(until, "until")
    if start is not None and end is not None and end < start:
        raise bad_request("until is before since", param="until")
    key = request.state.principal
    project_id = key.project_id if key is not None else None
    econ = request.app.state.economics

    def report() -> list[reports.UsageRow]:
        with session(econ.db, readonly=True) as s:
            return reports.usage_report(s, by, start, end, sheets={econ.sheet.version: econ.sheet},
                                        project_id=project_id)

    rows = await asyncio.to_thread(report)
    if format == "csv":
        return Response(reports.to_csv(rows, by), media_type="text/csv; charset=utf-8",
                        headers={"Content-Disposition": f'attachment; filename="usage-by-{by}.csv"'})
    return {"object": "usage_report", "by": by, "since": start.isoformat() if start else None,
            "until": end.isoformat() if end else None, "project_id": project_id,
            "data": [row_json(r) for r in rows]}
