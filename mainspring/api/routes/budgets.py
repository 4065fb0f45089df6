"""GET /v1/budgets: the budgets that apply to the caller, with what is spent, held and left in the period.

A caller with a key sees its key's budget and its project's (the two `Economics.admit` checks); an anonymous
caller (possible only where keys are not required) sees every budget, as /v1/usage shows it every project's
spend. Money is integer micro-USD plus an exact decimal string of USD, never a float.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from mainspring.api.routes.usage import usd  # exact decimal USD, as the usage report writes it
from mainspring.billing import budgets
from mainspring.store.db import session

router = APIRouter()


def budget_json(b: budgets.BudgetStatus) -> dict[str, Any]:
    return {"object": "budget", "id": b.budget_id, "scope": b.scope, "scope_id": b.scope_id, "period": b.period,
            "hard_limit_u": b.hard_limit_u, "hard_limit_usd": usd(b.hard_limit_u),
            "soft_limit_u": b.soft_limit_u,
            "soft_limit_usd": None if b.soft_limit_u is None else usd(b.soft_limit_u),
            "spent_u": b.spent_u, "spent_usd": usd(b.spent_u),
            "outstanding_u": b.outstanding_u, "outstanding_usd": usd(b.outstanding_u),
            "remaining_u": b.remaining_u, "remaining_usd": usd(b.remaining_u)}


@router.get("/v1/budgets")
async def list_budgets(request: Request) -> dict:
    key = request.state.principal
    econ = request.app.state.economics

    def read() -> list[budgets.BudgetStatus]:
        with session(econ.db, readonly=True) as s:
            if key is None:
                return budgets.status(s)
            mine = budgets.status(s, "key", key.id)
            return mine + (budgets.status(s, "project", key.project_id) if key.project_id is not None else [])

    return {"object": "list", "data": [budget_json(b) for b in await asyncio.to_thread(read)]}
