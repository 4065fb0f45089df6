"""Agent spend on the API key's ledger: every model call of a run is reserved against the key's and project's
budgets and settled into the one ledger (/v1/usage shows it per key); a budget that cannot cover the next call
pauses the run with reason "budget", and raising it and resuming continues the run."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import pytest
from sqlalchemy import select

from mainspring.agents import control, journal
from mainspring.agents.tables import AuditRow, EventRow, RunRow, StepRow
from mainspring.agents.tools.base import ToolResult
from mainspring.billing import budgets, ledger
from mainspring.billing.keys import create_key
from mainspring.store.db import session
from mainspring.store.tables import LedgerEntry
from mainspring.store.tables import Reservation as ReservationRow

from .conftest import CountTool, PolicyModel, drive, make_runtime, spec

SMOL = "SmolLM2-135M-Instruct"  # what the scripted model says it is: priced by the built-in sheet


def priced_policy(**kw) -> PolicyModel:
    model = PolicyModel(**kw)
    model.model = SMOL
    return model


@dataclass
class ExhaustTool:
    """TEST-ONLY: sets the key's budget to exactly what it has spent, so the run's next model call is refused."""
    db: str
    key_id: str
    name: str = "exhaust"
    description: str = "spend the rest of the budget"
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    idempotent: bool = True
    requires_approval: bool = False
    timeout_s: float = 30
    retries: int = 0

    async def call(self, args: dict, ctx) -> ToolResult:
        def exhaust() -> int:
            with session(self.db) as s:
                spent = ledger.spend(s, "key", self.key_id)
                budgets.set_budget(s, "key", self.key_id, "total", spent)
                return spent
        return ToolResult(f"count=1 spent={await asyncio.to_thread(exhaust)}")


def new_key(db: str, project: str = "acme"):
    with session(db) as s:
        return create_key(s, project).key


def set_budget(db: str, scope: str, scope_id, limit_u: int) -> None:
    with session(db) as s:
        budgets.set_budget(s, scope, scope_id, "total", limit_u)


def start(runtime, db: str, agent_spec, key=None) -> str:
    agent = journal.put_agent(db, agent_spec, project_id=key.project_id if key else None)
    run = journal.create_run(db, agent.id, "count", project_id=key.project_id if key else None,
                             api_key_id=key.id if key else None)
    runtime.worker.notify()
    return run.id


async def until(db: str, run_id: str, statuses: set[str], timeout: float = 30.0) -> RunRow:
    deadline = time.monotonic() + timeout
    while True:
        with session(db, readonly=True) as s:
            run = s.get(RunRow, run_id)
        if run.status in statuses:
            return run
        assert time.monotonic() < deadline, f"run {run_id} is {run.status}, not {statuses}: {run.error}"
        await asyncio.sleep(0.05)


def charged(db: str, run_id: str) -> tuple[list[LedgerEntry], list[str], list[ReservationRow]]:
    """The run's ledger rows, its model steps' ids, and every reservation in the database."""
    with session(db, readonly=True) as s:
        rows = list(s.scalars(select(LedgerEntry).where(LedgerEntry.custom_id == run_id).order_by(LedgerEntry.id)))
        steps = list(s.scalars(select(StepRow.id).where(StepRow.run_id == run_id, StepRow.kind == "model")
                               .order_by(StepRow.seq)))
        return rows, steps, list(s.scalars(select(ReservationRow)))


def events(db: str, run_id: str, type_: str) -> list[EventRow]:
    with session(db, readonly=True) as s:
        return list(s.scalars(select(EventRow).where(EventRow.run_id == run_id, EventRow.type == type_)))


def test_each_model_call_lands_on_the_keys_ledger(tmp_path, db_url):
    key = new_key(db_url)
    set_budget(db_url, "key", key.id, 1_000_000)
    runtime = make_runtime(tmp_path, db_url, priced_policy(calls=2), {"count": CountTool(tmp_path / "count")})

    async def body():
        run_id = start(runtime, db_url, spec(), key)
        return await until(db_url, run_id, {"succeeded", "failed"})

    run = drive(runtime, body)
    assert run.status == "succeeded" and run.cost_u > 0
    rows, steps, holds = charged(db_url, run.id)
    assert [r.request_id for r in rows] == steps and len(steps) == 3  # one row per model call, by step id
    assert {(r.api_key_id, r.project_id, r.endpoint, r.model, r.status) for r in rows} == {
        (key.id, key.project_id, "agent.run", SMOL, "ok")}
    assert sum(r.cost_total_u for r in rows) == run.cost_u  # the run's price is what the key was charged
    with session(db_url, readonly=True) as s:
        assert ledger.spend(s, "key", key.id) == run.cost_u
    assert holds and all(h.settled for h in holds)  # every hold settled to its call's cost
    assert sorted(h.settled_u for h in holds) == sorted(r.cost_total_u for r in rows)


def test_an_anonymous_run_is_charged_like_an_anonymous_call(tmp_path, db_url):
    runtime = make_runtime(tmp_path, db_url, priced_policy(calls=1), {"count": CountTool(tmp_path / "count")})

    async def body():
        return await until(db_url, start(runtime, db_url, spec()), {"succeeded", "failed"})

    run = drive(runtime, body)
    rows, steps, holds = charged(db_url, run.id)
    assert run.status == "succeeded" and [r.request_id for r in rows] == steps
    assert {(r.api_key_id, r.project_id) for r in rows} == {(None, None)} and holds == []  # no budget to hold
    assert sum(r.cost_total_u for r in rows) == run.cost_u > 0


@pytest.mark.parametrize("scope", ["key", "project"])
def test_an_exhausted_budget_pauses_the_run_until_raised_and_resumed(tmp_path, db_url, scope):
    key = new_key(db_url)
    scope_id = key.id if scope == "key" else key.project_id
    set_budget(db_url, scope, scope_id, 0)  # nothing left: not even the first call fits
    runtime = make_runtime(tmp_path, db_url, priced_policy(calls=1), {"count": CountTool(tmp_path / "count")})

    async def body():
        run_id = start(runtime, db_url, spec(), key)
        paused = await until(db_url, run_id, {"paused", "succeeded", "failed"})
        set_budget(db_url, scope, scope_id, 1_000_000)
        control.request(db_url, run_id, "resume")
        runtime.worker.notify()
        return paused, await until(db_url, run_id, {"succeeded", "failed", "paused"} - {paused.status})

    paused, done = drive(runtime, body)
    assert (paused.status, paused.pause_reason) == ("paused", "budget")
    [refused] = events(db_url, done.id, "budget.exceeded")
    whose = "API key's" if scope == "key" else "project's"
    assert f"the {whose} total budget is exhausted" in refused.data_json and f'"scope": "{scope}"' in refused.data_json
    with session(db_url, readonly=True) as s:
        assert s.scalars(select(AuditRow.kind).where(AuditRow.run_id == done.id,
                                                     AuditRow.kind == "budget.exceeded")).all() == ["budget.exceeded"]
    assert done.status == "succeeded"
    rows, steps, holds = charged(db_url, done.id)
    assert [r.request_id for r in rows] == steps and sum(r.cost_total_u for r in rows) == done.cost_u
    assert all(h.settled for h in holds)


def test_a_budget_spent_mid_run_pauses_before_the_next_call(tmp_path, db_url):
    key = new_key(db_url)
    set_budget(db_url, "key", key.id, 1_000_000)
    runtime = make_runtime(tmp_path, db_url, priced_policy(tool="exhaust", calls=1),
                           {"exhaust": ExhaustTool(db_url, key.id)})

    async def body():
        run_id = start(runtime, db_url, spec(tools=("exhaust",)), key)
        paused = await until(db_url, run_id, {"paused", "succeeded", "failed"})
        rows_paused = charged(db_url, run_id)[0]
        set_budget(db_url, "key", key.id, 1_000_000)
        control.request(db_url, run_id, "resume")
        runtime.worker.notify()
        return paused, rows_paused, await until(db_url, run_id, {"succeeded", "failed"})

    paused, rows_paused, done = drive(runtime, body)
    assert (paused.status, paused.pause_reason) == ("paused", "budget")
    assert len(rows_paused) == 1 and paused.cost_u == rows_paused[0].cost_total_u  # the first call was charged
    assert done.status == "succeeded"
    rows, steps, holds = charged(db_url, done.id)
    assert len(rows) == 2 and [r.request_id for r in rows] == steps
    assert sum(r.cost_total_u for r in rows) == done.cost_u and all(h.settled for h in holds)


# ---- over HTTP: a run created with a key, its spend in that key's /v1/usage --------------------------------
@pytest.fixture(scope="module")
def async_engine(embedded):
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine

    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=64)))
    yield engine
    engine.close()


@pytest.mark.slow
def test_a_keys_run_shows_in_its_usage_report(tmp_path, async_engine, database_url):
    from mainspring.api.app import create_app
    from mainspring.config import Settings
    from tests.servers import serve

    settings = Settings(database_url=database_url, data_dir=tmp_path)
    model = priced_policy(calls=1)
    app = create_app(settings, engine=async_engine, agent_models=lambda name, project=None: model,
                     agent_tools={"count": CountTool(tmp_path / "count")})
    with session(app.state.economics.db) as s:
        created = create_key(s, "alpha")
    auth = {"Authorization": f"Bearer {created.secret}"}
    with serve(app, async_engine) as srv:
        api = httpx.Client(base_url=srv.openai_url, headers=auth, timeout=30)
        api.post("/agents", json={"name": "counter", "model": "policy", "tools": ["count"]}).raise_for_status()
        run_id = api.post("/runs", json={"agent": "counter", "goal": "count"}).json()["id"]
        deadline = time.monotonic() + 60
        while (run := api.get(f"/runs/{run_id}").json())["status"] not in ("succeeded", "failed", "paused"):
            assert time.monotonic() < deadline, run
            time.sleep(0.05)
        usage = api.get("/usage", params={"by": "key"}).json()
    assert run["status"] == "succeeded"
    with session(app.state.economics.db, readonly=True) as s:
        cost_u = s.get(RunRow, run_id).cost_u
    [row] = [r for r in usage["data"] if r["group"] == created.key.id]
    assert row["requests"] == 2 and row["cost_u"] == cost_u > 0


@dataclass
class RevokeTool:
    """TEST-ONLY: revokes the key the run spends under, as an operator would mid-run."""
    db: str
    key_id: str
    name: str = "revoke"
    description: str = "revoke the run's key"
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    idempotent: bool = True
    requires_approval: bool = False
    timeout_s: float = 30
    retries: int = 0

    async def call(self, args: dict, ctx) -> ToolResult:
        from mainspring.billing.keys import revoke_key

        def revoke() -> None:
            with session(self.db) as s:
                revoke_key(s, self.key_id)
        await asyncio.to_thread(revoke)
        return ToolResult("count=1 revoked")


def test_a_revoked_key_stops_its_runs_before_their_next_model_call(tmp_path, db_url):
    key = new_key(db_url)
    model = priced_policy(tool="revoke", calls=2)
    runtime = make_runtime(tmp_path, db_url, model, {"revoke": RevokeTool(db_url, key.id)})

    async def body():
        return await until(db_url, start(runtime, db_url, spec(tools=("revoke",)), key), {"succeeded", "failed"})

    run = drive(runtime, body)
    assert (run.status, run.stop_reason) == ("failed", "key_revoked") and key.id in run.error
    rows, steps, holds = charged(db_url, run.id)
    assert len(model.seen) == 1 and len(rows) == 1  # the call before the revocation is billed, none after
    assert all(h.settled for h in holds)
