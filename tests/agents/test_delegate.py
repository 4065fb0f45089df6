"""Agent-as-tool (ask_agent): a child run of another agent answers the asking run; the child is an ordinary
durable run with its parent recorded, and asking round in a ring is refused. Scripted models (TEST-ONLY)."""

from __future__ import annotations

import json

from sqlalchemy import select

from mainspring.agents.tables import RunRow
from mainspring.store.db import session
from tests.agents.conftest import drive, make_runtime, wait_status
from tests.agents.plans.test_coordination import Scripted, agent


def test_an_agent_asks_another_and_gets_its_answer(tmp_path, db_url):
    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    rt.put_agent(agent("boss", "ask helper: how many legs has a spider"))
    rt.put_agent(agent("helper"))

    async def body():
        run = rt.start_run("boss", "find out")
        return await wait_status(rt, run.id, {"succeeded", "failed"})

    run = drive(rt, body)
    assert run.status == "succeeded", run.error
    answer = json.loads(json.loads(run.result)["last"])
    assert answer["by"] == "helper"
    assert model.goals["helper"] == ["how many legs has a spider"]
    with session(db_url, readonly=True) as s:
        child = s.scalars(select(RunRow).where(RunRow.parent_run_id == run.id)).one()
    assert child.status == "succeeded" and child.project_id == run.project_id


def test_asking_round_in_a_ring_is_refused(tmp_path, db_url):
    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    rt.put_agent(agent("ping", "ask pong: your turn"))
    rt.put_agent(agent("pong", "ask ping: no, yours"))

    async def body():
        run = rt.start_run("ping", "start")
        return await wait_status(rt, run.id, {"succeeded", "failed"})

    run = drive(rt, body)
    assert run.status == "succeeded"
    # pong's ask of ping was refused; pong answered with the refusal, which came back to ping
    assert "already asking" in json.loads(run.result)["last"]
    with session(db_url, readonly=True) as s:
        assert len(s.scalars(select(RunRow)).all()) == 2  # ping and one pong: no third run


def test_ask_agent_names_an_unknown_agent(tmp_path, db_url):
    model = Scripted()
    rt = make_runtime(tmp_path, db_url, model, {})
    rt.put_agent(agent("boss", "ask nobody: hello"))

    async def body():
        run = rt.start_run("boss", "x")
        return await wait_status(rt, run.id, {"succeeded", "failed"})

    run = drive(rt, body)
    assert "no agent 'nobody' in this project" in json.loads(run.result)["last"]
