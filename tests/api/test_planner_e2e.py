"""A plan from a goal through the HTTP API: the real embedded model writes it under the planner's JSON schema
(constrained decoding), and what is stored is a valid DAG of the project's agents. Bad planner requests get
clear 400s and store nothing."""

import httpx
import pytest

from mainspring.agents.plans.spec import load_plan, validate_plan


def api(server) -> httpx.Client:
    return httpx.Client(base_url=server.openai_url, timeout=300)


def agent(client: httpx.Client, name: str, instructions: str) -> None:
    r = client.post("/agents", json={"name": name, "model": "default", "tools": [], "instructions": instructions,
                                     "limits": {"max_tokens": 64, "max_steps": 3}})
    assert r.status_code == 201, r.text


@pytest.mark.slow
def test_the_embedded_model_plans_a_goal_into_a_valid_dag(server):
    client = api(server)
    agent(client, "planned-researcher", "Find facts on the topic you are given.")
    agent(client, "planned-writer", "Write short text from the facts you are given.")
    # approve_plan: the plan is stored and waits; this test checks what the planner wrote, not the runs
    r = client.post("/plans", json={"goal": "a short note about rivers", "max_tasks": 3, "approve_plan": True,
                                    "name": "planned rivers"})
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["status"] == "awaiting_approval" and plan["name"] == "planned rivers"
    tasks = plan["tasks"]
    assert 1 <= len(tasks) <= 3
    agents = {a["name"] for a in client.get("/agents").json()["data"]}
    assert all(t["agent"] in agents for t in tasks)
    spec = load_plan({"goal": plan["goal"], "tasks": [
        {"id": t["key"], "agent": t["agent"], "prompt": "x", "depends_on": t["depends_on"]} for t in tasks]})
    validate_plan(spec, agents={name: set() for name in agents})  # raises on a cycle or an unknown dependency
    first = client.get(f"/plans/{plan['id']}/events", params={"limit": 1}).json()["data"][0]
    assert first["type"] == "plan.created"
    assert first["data"]["planned_by"]["model"] == "smollm2" and first["data"]["planned_by"]["attempts"] in (1, 2)
    assert client.post(f"/plans/{plan['id']}/cancel").json()["status"] == "cancelled"


def test_bad_planner_requests_are_400s_and_store_nothing(server):
    client = api(server)
    agent(client, "planned-checker", "Check things.")
    before = client.get("/plans", params={"limit": 500}).json()["data"]
    r = client.post("/plans", json={"goal": "g", "planner_model": "no-such-model"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "planner_model", r.text
    r = client.post("/plans", json={"goal": "g", "max_tasks": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tasks", r.text
    r = client.post("/plans", json={"goal": "g", "max_tasks": 33})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tasks", r.text
    r = client.post("/plans", json={"goal": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "goal", r.text
    r = client.post("/plans", json={"planner_model": "default"})
    assert r.status_code == 400, r.text
    assert client.get("/plans", params={"limit": 500}).json()["data"] == before
