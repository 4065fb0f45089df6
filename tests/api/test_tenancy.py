"""Tenancy of the agent surface, as an attacker with a key of project A sees project B's resources.

Every agent route and action is tried on B's ids through A's key: each answers 404 (as for an id never used,
so existence is not confirmed), B's data never appears in anything A gets back (lists, SSE, audit exports), and
nothing of B's changes. A's agent of the same name as B's is A's own; B's runs keep B's instructions.
"""

from __future__ import annotations

import json
import time
from typing import Iterator

import httpx
import pytest

from .test_agent_routes import TERMINAL, agent_server, ok, pending_interrupt, wait_status

SECRET = "B-ONLY-7f3a"  # in B's goal, instructions and tool output: must never reach A


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict]:
    from mainspring.billing.keys import create_key
    from mainspring.store.db import session

    with agent_server(tmp_path_factory.mktemp("tenancy"), require_auth=True) as s:
        with session(s.app.state.agents.db) as db:
            a, b = create_key(db, "alpha"), create_key(db, "beta")
        A = httpx.Client(base_url=s.url, timeout=30, headers={"Authorization": f"Bearer {a.secret}"})
        B = httpx.Client(base_url=s.url, timeout=30, headers={"Authorization": f"Bearer {b.secret}"})
        spec = {"name": "helper", "model": "SmolLM2-135M-Instruct", "instructions": f"B's own rules {SECRET}",
                "tools": ["report"], "limits": {"max_tokens": 16}}
        agent = ok(B.post("/v1/agents", json=spec), 201)
        thread = ok(B.post("/v1/threads"), 201)
        done = ok(B.post("/v1/runs", json={"agent": "helper", "goal": f"report {SECRET}",
                                           "thread_id": thread["id"]}), 201)
        s.http.headers["Authorization"] = f"Bearer {b.secret}"
        done = wait_status(s, done["id"], TERMINAL)
        assert done["status"] == "succeeded", done
        ok(B.post("/v1/agents", json={**spec, "name": "gate", "tools": ["guarded"]}), 201)
        waiting = ok(B.post("/v1/runs", json={"agent": "gate", "goal": f"guarded {SECRET}"}), 201)
        interrupt = pending_interrupt(s, waiting["id"])
        upload = ok(B.post("/v1/files", files={"file": ("notes.txt", f"{SECRET}\n".encode())},
                           data={"purpose": "assistants"}))
        artifacts = ok(B.get(f"/v1/runs/{done['id']}/artifacts"))["data"]
        assert artifacts and SECRET in B.get(artifacts[0]["url"]).text
        yield {"A": A, "B": B, "server": s, "agent": agent, "thread": thread, "done": done, "waiting": waiting,
               "interrupt": interrupt, "file": upload, "artifact": artifacts[0]}
        A.close()
        B.close()


def not_found(r: httpx.Response) -> None:
    assert r.status_code == 404, (r.request.method, r.request.url, r.status_code, r.text)
    body = r.json()["error"]
    assert body["code"] == "not_found" and SECRET not in r.text


ROUTES = [  # (method, path template, json body): every route that names one of B's resources
    ("GET", "/v1/agents/{agent_id}", None),
    ("GET", "/v1/runs/{done}", None),
    ("GET", "/v1/runs/{done}/events", None),
    ("GET", "/v1/runs/{done}/events?stream=true", None),
    ("GET", "/v1/runs/{done}/steps", None),
    ("GET", "/v1/runs/{done}/artifacts", None),
    ("GET", "/v1/artifacts/{artifact}/content", None),
    ("GET", "/v1/runs/{done}/audit", None),
    ("GET", "/v1/runs/{done}/audit.jsonl", None),
    ("POST", "/v1/runs/{waiting}/cancel", {}),
    ("POST", "/v1/runs/{waiting}/pause", {}),
    ("POST", "/v1/runs/{waiting}/interrupt", {}),
    ("POST", "/v1/runs/{waiting}/resume", {}),
    ("POST", "/v1/runs/{waiting}/budget", {"token_budget": 10**9}),
    ("POST", "/v1/interrupts/{interrupt}/resolve", {"decision": "approve"}),
    ("POST", "/v1/runs", {"agent": "{agent_id}", "goal": "hijack"}),
    ("POST", "/v1/runs", {"agent": "gate", "goal": "hijack"}),
]


def fill(template, world: dict):
    ids = {"agent_id": world["agent"]["id"], "done": world["done"]["id"], "waiting": world["waiting"]["id"],
           "artifact": world["artifact"]["id"], "interrupt": world["interrupt"]["id"]}
    if isinstance(template, str):
        return template.format(**ids)
    if isinstance(template, dict):
        return {k: fill(v, world) for k, v in template.items()}
    return template


@pytest.mark.parametrize("method,path,body", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_another_projects_resource_is_not_found(world, method, path, body):
    before = ok(world["B"].get(f"/v1/runs/{world['waiting']['id']}"))
    not_found(world["A"].request(method, fill(path, world), json=fill(body, world)))
    after = ok(world["B"].get(f"/v1/runs/{world['waiting']['id']}"))
    assert (after["status"], after["budget"], after["cancel_requested"], after["pause_requested"]) == (
        before["status"], before["budget"], before["cancel_requested"], before["pause_requested"])
    assert after["pending_interrupts"] == [world["interrupt"]["id"]]


def test_lists_show_only_the_callers_project(world):
    """A's lists hold none of B's resources (A's own, made by other tests of this module, may be there: the
    module shares one server, and the tests run in any order)."""
    A, B = world["A"], world["B"]
    theirs = {x["id"] for path in ("/v1/agents", "/v1/runs", "/v1/interrupts?status=all")
              for x in ok(B.get(path))["data"]}
    assert {world["agent"]["id"], world["done"]["id"], world["waiting"]["id"], world["interrupt"]["id"]} <= theirs
    for path in ("/v1/agents", "/v1/runs", "/v1/interrupts?status=all",
                 f"/v1/interrupts?run_id={world['waiting']['id']}", "/v1/runs?status=waiting_approval"):
        r = A.get(path)
        assert r.status_code == 200 and SECRET not in r.text, (path, r.text)
        assert not {x["id"] for x in ok(r)["data"]} & theirs, (path, r.text)
    assert not ok(A.get(f"/v1/interrupts?run_id={world['waiting']['id']}"))["data"]
    assert {a["name"] for a in ok(B.get("/v1/agents"))["data"]} == {"helper", "gate"}
    assert {world["done"]["id"], world["waiting"]["id"]} <= {r["id"] for r in ok(B.get("/v1/runs"))["data"]}
    assert [i["id"] for i in ok(B.get("/v1/interrupts"))["data"]] == [world["interrupt"]["id"]]


def test_a_thread_or_an_uploaded_file_of_another_project_cannot_be_used(world):
    A = world["A"]
    ok(A.post("/v1/agents", json={"name": "mine", "tools": ["echo"], "model": "SmolLM2-135M-Instruct"}), 201)
    not_found(A.post("/v1/runs", json={"agent": "mine", "goal": "x", "thread_id": world["thread"]["id"]}))
    not_found(A.post("/v1/runs", json={"agent": "mine", "goal": "x", "attachments": {"docs": [world["file"]["id"]]}}))
    not_found(A.post("/v1/runs", json={"agent": "mine", "goal": "x", "attachments": {"db": world["file"]["id"]}}))


def test_agent_names_are_per_project(world):
    """A creating "helper" makes A's own agent; B's name still means B's agent, with B's instructions."""
    A, B = world["A"], world["B"]
    mine = ok(A.post("/v1/agents", json={"name": "helper", "instructions": "A's rules", "tools": ["echo"],
                                         "model": "SmolLM2-135M-Instruct", "limits": {"max_tokens": 16}}), 201)
    assert mine["version"] == 1 and mine["id"] != world["agent"]["id"]
    assert ok(A.get("/v1/agents/helper"))["spec"]["instructions"] == "A's rules"
    theirs = ok(B.get("/v1/agents/helper"))
    assert theirs["id"] == world["agent"]["id"] and SECRET in theirs["spec"]["instructions"]
    run = ok(B.post("/v1/runs", json={"agent": "helper", "goal": "again"}), 201)
    assert run["agent_id"] == world["agent"]["id"]
    a_run = ok(A.post("/v1/runs", json={"agent": "helper", "goal": "mine"}), 201)
    assert a_run["agent_id"] == mine["id"]


def test_a_stream_of_ones_own_run_carries_only_its_own_events(world):
    """SSE, the route most likely to leak across runs: A's stream of A's run has A's events only."""
    A = world["A"]
    ok(A.post("/v1/agents", json={"name": "streamer", "tools": ["echo"], "model": "SmolLM2-135M-Instruct"}), 201)
    run = ok(A.post("/v1/runs", json={"agent": "streamer", "goal": "stream me"}), 201)
    deadline = time.monotonic() + 20
    with A.stream("GET", f"/v1/runs/{run['id']}/events", params={"stream": "true"}) as r:
        assert r.status_code == 200
        frames = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")
                  and time.monotonic() < deadline]
    assert frames and {f["run_id"] for f in frames} == {run["id"]}
    assert frames[-1]["type"] == "run.finished" and SECRET not in json.dumps(frames)
