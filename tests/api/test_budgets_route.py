"""GET /v1/budgets on a real server: a key sees its own budget and its project's, with spend from the ledger,
never another project's; an anonymous caller (keys optional) sees every budget."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from .test_agent_routes import agent_server


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict]:
    from mainspring.billing.budgets import set_budget
    from mainspring.billing.keys import create_key
    from mainspring.store.db import session
    from mainspring.store.tables import LedgerEntry

    with agent_server(tmp_path_factory.mktemp("budgets-route")) as s:
        econ = s.app.state.economics
        with session(econ.db) as db:
            a, b = create_key(db, "alpha"), create_key(db, "beta")
            set_budget(db, "key", a.key.id, "month", 5_000_000)
            set_budget(db, "project", b.key.project_id, "day", 1_000_000, soft_limit_u=800_000)
            db.add(LedgerEntry(request_id="spend-a", api_key_id=a.key.id, project_id=a.key.project_id,
                               model="SmolLM2-135M-Instruct", tier="standard", endpoint="/v1/chat/completions",
                               cost_total_u=1_250_000, price_sheet_version=econ.sheet.version))
        yield {"url": s.url, "a": a, "b": b}


def budgets(world: dict, who: str | None) -> list[dict]:
    headers = {"Authorization": f"Bearer {world[who].secret}"} if who else {}
    r = httpx.get(f"{world['url']}/v1/budgets", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_a_key_sees_its_own_budget_with_its_spend(world):
    (mine,) = budgets(world, "a")
    assert (mine["scope"], mine["scope_id"], mine["period"]) == ("key", world["a"].key.id, "month")
    assert (mine["hard_limit_u"], mine["spent_u"], mine["outstanding_u"], mine["remaining_u"]) == (
        5_000_000, 1_250_000, 0, 3_750_000)
    assert (mine["hard_limit_usd"], mine["spent_usd"], mine["remaining_usd"]) == ("5", "1.25", "3.75")


def test_a_project_budget_reaches_its_keys_only(world):
    (theirs,) = budgets(world, "b")
    assert (theirs["scope"], theirs["scope_id"], theirs["soft_limit_usd"]) == (
        "project", str(world["b"].key.project_id), "0.8")
    assert theirs["spent_u"] == 0


def test_anonymous_sees_every_budget(world):
    assert {b["scope"] for b in budgets(world, None)} == {"key", "project"}
