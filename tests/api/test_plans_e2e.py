"""Plans through the HTTP API: a 3-stage plan with the real embedded model (typed artifacts, passed whole and
checked by hash), its resumable event stream, and the errors bad plans get."""

import json

import httpx
import pytest

SHORT = {"type": "string", "maxLength": 40}
FACTS = {"type": "object", "properties": {"facts": {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 2}},
         "required": ["facts"], "additionalProperties": False}
TITLE = {"type": "object", "properties": {"title": SHORT}, "required": ["title"], "additionalProperties": False}


def api(server) -> httpx.Client:
    return httpx.Client(base_url=server.openai_url, timeout=300)


def agent(client: httpx.Client, name: str) -> None:
    r = client.post("/agents", json={"name": name, "model": "default", "tools": [],
                                     "instructions": "Do the task. Answer only with the JSON asked for.",
                                     "limits": {"max_tokens": 64, "max_steps": 3}})
    assert r.status_code == 201, r.text


@pytest.mark.slow
def test_a_three_stage_plan_with_the_embedded_model(server):
    client = api(server)
    for name in ("plan-research", "plan-outline", "plan-title"):
        agent(client, name)
    body = {"goal": "a short note about rivers", "name": "rivers", "tasks": [
        {"id": "research", "agent": "plan-research", "prompt": "List two facts for {goal}.", "output_schema": FACTS},
        {"id": "outline", "agent": "plan-outline", "prompt": "Pick the most interesting fact.",
         "depends_on": ["research"], "output_schema": FACTS},
        {"id": "title", "agent": "plan-title", "prompt": "Give the note a title.",
         "depends_on": ["research", "outline"], "output_schema": TITLE}]}
    created = client.post("/plans", json=body)
    assert created.status_code == 200, created.text
    plan_id = created.json()["id"]
    assert [t["status"] for t in created.json()["tasks"]] == ["ready", "waiting", "waiting"]

    events = []
    with client.stream("GET", f"/plans/{plan_id}/events", headers={"Accept": "text/event-stream"}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    plan = client.get(f"/plans/{plan_id}").json()
    assert plan["status"] == "succeeded", plan
    by = {t["key"]: t for t in plan["tasks"]}
    assert set(by["title"]["artifact"]) == {"title"} and by["title"]["artifact"]["title"]
    assert by["research"]["artifact"]["facts"]
    # the title task read exactly what its upstream tasks stored
    assert by["title"]["input_hashes"] == {k: by[k]["artifact_sha256"] for k in ("research", "outline")}
    assert plan["usage"]["runs"] == 3 and plan["usage"]["completion_tokens"] > 0
    for t in plan["tasks"]:  # each task's run is an ordinary run, its answer the stored artifact
        run = client.get(f"/runs/{t['run_id']}").json()
        assert run["status"] == "succeeded" and json.loads(run["result"]) == t["artifact"]
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "plan.created" and events[-1]["type"] == "plan.succeeded"
    # resuming after event 3 gives exactly the rest
    page = client.get(f"/plans/{plan_id}/events", params={"after": 3, "limit": 500}).json()
    assert [e["id"] for e in page["data"]] == [e["id"] for e in events[3:]]


def test_bad_plans_get_clear_errors_and_nothing_is_stored(server):
    client = api(server)
    agent(client, "plan-checker")
    before = client.get("/plans", params={"limit": 500}).json()["data"]
    cycle = {"goal": "g", "tasks": [
        {"id": "a", "agent": "plan-checker", "prompt": "x", "depends_on": ["c"]},
        {"id": "b", "agent": "plan-checker", "prompt": "x", "depends_on": ["a"]},
        {"id": "c", "agent": "plan-checker", "prompt": "x", "depends_on": ["b"]}]}
    r = client.post("/plans", json=cycle)
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "→" in message and all(k in message for k in "abc"), r.text
    r = client.post("/plans", json={"goal": "g", "tasks": [{"id": "a", "agent": "nobody", "prompt": "x"}]})
    assert r.status_code == 400 and "nobody" in r.json()["error"]["message"], r.text
    r = client.post("/plans", json={"goal": "g", "tasks": [{"id": "a", "agent": "plan-checker", "prompt": "x",
                                                             "output_schema": {"type": "no-such-type"}}]})
    assert r.status_code == 400, r.text
    r = client.post("/plans", json={"goal": "g", "tasks": []})
    assert r.status_code == 400, r.text
    r = client.post("/plans", json={"goal": "g", "simple_model": "no-such-model",
                                    "tasks": [{"id": "a", "agent": "plan-checker", "prompt": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "simple_model", r.text
    assert client.get("/plans", params={"limit": 500}).json()["data"] == before
    assert client.get("/plans/plan_nope").status_code == 404
    assert client.post("/plans/plan_nope/cancel").status_code == 404


def test_an_approval_gate_holds_the_plan_until_approved_and_a_cancel_ends_it(server):
    client = api(server)
    agent(client, "plan-gated")
    body = {"goal": "g", "approve_plan": True, "tasks": [{"id": "a", "agent": "plan-gated", "prompt": "say hi"}]}
    plan = client.post("/plans", json=body).json()
    assert plan["status"] == "awaiting_approval"
    assert client.get(f"/plans/{plan['id']}").json()["tasks"][0]["run_id"] is None  # nothing started
    cancelled = client.post(f"/plans/{plan['id']}/cancel", json={"actor": "ops"}).json()
    assert cancelled["status"] == "cancelled" and cancelled["tasks"][0]["status"] == "cancelled"
    r = client.post(f"/plans/{plan['id']}/approve")
    assert r.status_code == 409, r.text
