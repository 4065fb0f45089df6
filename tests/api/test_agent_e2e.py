"""One agent run end to end with the real embedded model, through the HTTP API: create, run, stream, audit."""

import json

import httpx
import pytest

pytestmark = pytest.mark.slow


def test_an_agent_run_with_the_embedded_model(server):
    api = httpx.Client(base_url=server.openai_url, timeout=120)
    agent = api.post("/agents", json={"name": "geo", "model": "default", "tools": [],
                                      "instructions": "Answer the question in a few words.",
                                      "limits": {"max_tokens": 24}})
    assert agent.status_code == 201, agent.text
    run = api.post("/runs", json={"agent": "geo", "goal": "What is the capital of France?"}).json()
    events = []
    with api.stream("GET", f"/runs/{run['id']}/events", headers={"Accept": "text/event-stream"}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    done = api.get(f"/runs/{run['id']}").json()
    assert done["status"] == "succeeded", done
    assert "Paris" in done["result"]
    types = [e["type"] for e in events]
    assert types[0] == "run.created" and types[-1] == "run.finished"
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    [step] = api.get(f"/runs/{run['id']}/steps").json()["data"]
    assert step["usage"]["prompt_tokens"] > 10 and step["usage"]["completion_tokens"] > 0
    assert api.get(f"/runs/{run['id']}/audit").json()["ok"] is True
