"""/v1/diagnostics/deadlocks and /v1/diagnostics/waits on a real server, and `mainspring deadlocks …` against it:
a constructed 3-agent wait-for cycle (scripted models, TEST-ONLY: tests/agents/plans/test_coordination.py) is
reported with its cycle spelled out, resolved by a person, and bad requests are 4xx with an error body; then the
plan's audit (/v1/plans/{id}/audit) over the runs it had."""

from __future__ import annotations

import time

import typer
from typer.testing import CliRunner

from mainspring.agents.plans.deadlocks_cli import deadlocks_app
from tests.agents.plans.test_coordination import Scripted
from tests.api.test_agent_routes import agent_server, ok

cli = typer.Typer()
cli.add_typer(deadlocks_app, name="deadlocks")


def until(fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def test_a_deadlock_through_http_and_the_cli(tmp_path, monkeypatch):
    model = Scripted()
    with agent_server(tmp_path, models=lambda name, project=None: model, tools={}) as s:
        for name, waits_on in (("ag_a", "b"), ("ag_b", "c"), ("ag_c", "a")):
            ok(s.http.post("/v1/agents", json={"name": name, "model": "scripted",
                                               "instructions": f"agent={name}|wait {waits_on}",
                                               "tools": ["wait_for_message", "send_message"]}), 201)
        plan = ok(s.http.post("/v1/plans", json={
            "goal": "g", "deadlock_policy": "ask_human",
            "tasks": [{"id": k, "agent": f"ag_{k}", "prompt": f"do {k}", "output_schema": {"type": "object"}}
                      for k in "abc"]}))
        found = until(lambda: ok(s.http.get("/v1/diagnostics/deadlocks", params={"plan_id": plan["id"]}))["data"])
        (dl,) = found
        assert (dl["kind"], dl["status"], dl["text"]) == ("deadlock", "open", "a → b → c → a")
        assert dl["cycle"] == ["a", "b", "c", "a"]
        waits = ok(s.http.get("/v1/diagnostics/waits", params={"plan_id": plan["id"]}))["data"]
        assert sorted((w["waiter"], w["target"]) for w in waits) == [("a", "b"), ("b", "c"), ("c", "a")]
        events = ok(s.http.get(f"/v1/plans/{plan['id']}/events"))["data"]
        assert any(e["type"] == "deadlock.detected" for e in events)

        # bad requests: 4xx with an OpenAI-style error body, nothing changed
        r = s.http.post(f"/v1/diagnostics/deadlocks/{dl['id']}/resolve", json={"action": "fail", "task": "zz"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "task"
        r = s.http.post(f"/v1/diagnostics/deadlocks/{dl['id']}/resolve", json={"action": "explode", "task": "a"})
        assert r.status_code == 400 and "error" in r.json()
        assert s.http.get("/v1/diagnostics/deadlocks/dl_nope").status_code == 404
        assert s.http.get("/v1/diagnostics/deadlocks", params={"plan_id": "plan_nope"}).status_code == 404

        port = s.url.rsplit(":", 1)[1]
        monkeypatch.setenv("MAINSPRING_HOST", "127.0.0.1")
        monkeypatch.setenv("MAINSPRING_PORT", port)
        listed = CliRunner().invoke(cli, ["deadlocks", "list", "--open"])
        assert listed.exit_code == 0 and "a → b → c → a" in listed.stdout, listed.stdout
        both = CliRunner().invoke(cli, ["deadlocks", "resolve", dl["id"], "--fail", "a", "--release", "b"])
        assert both.exit_code == 2 and "exactly one" in both.stderr
        done = CliRunner().invoke(cli, ["deadlocks", "resolve", dl["id"], "--release", "c"])
        assert done.exit_code == 0 and "resolved" in done.stdout, done.stdout + done.stderr

        again = s.http.post(f"/v1/diagnostics/deadlocks/{dl['id']}/resolve", json={"action": "fail", "task": "a"})
        assert again.status_code == 409
        final = until(lambda: (p := ok(s.http.get(f"/v1/plans/{plan['id']}")))["status"] in ("succeeded", "failed")
                      and p)
        assert final["status"] == "succeeded"
        assert ok(s.http.get("/v1/diagnostics/waits"))["data"] == []
        trail = ok(s.http.get(f"/v1/plans/{plan['id']}/audit"))  # the plan-level audit of the same plan
        assert trail["ok"] and sorted(r["task"] for r in trail["runs"]) == ["a", "b", "c"]
        assert all(r["ok"] and r["entries"] > 0 for r in trail["runs"]) and len(trail["head"]) == 64
        assert s.http.get("/v1/plans/plan_nope/audit").status_code == 404
