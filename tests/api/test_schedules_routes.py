"""Schedules over HTTP on a real server (scripted policy model, no model loaded): create, list, get, pause,
resume and delete; 400s naming the bad field; a webhook refused without its signature (401) and accepted with
it (202), its redelivery starting nothing new, with no API key even where keys are required; and project
scoping (another project's schedule is 404)."""

from __future__ import annotations

import hashlib
import hmac
import json

import httpx

from .test_agent_routes import TERMINAL, agent_server, error, make_agent, ok, wait_status

UNKNOWN_AGENT_TASK = {"id": "a", "agent": "nobody", "prompt": "p"}
PLAN = {"goal": "weekly digest", "tasks": [{"id": "digest", "agent": "digester", "prompt": "digest {goal}"}]}


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_schedules_create_list_get_pause_resume_delete_and_bad_input(tmp_path):
    with agent_server(tmp_path) as s:
        make_agent(s, "digester", [])
        created = ok(s.http.post("/v1/schedules", json={"name": "weekly", "cron": "0 8 * * 1",
                                                        "timezone": "Europe/Paris", "plan": PLAN}), 201)
        assert created["id"].startswith("sched_") and created["kind"] == "cron" and created["enabled"]
        assert created["next_fire_at"] and created["secret"] is None
        assert created["target"]["plan"]["goal"] == PLAN["goal"]
        agent = ok(s.http.post("/v1/schedules", json={"name": "hourly", "cron": "0 * * * *", "agent": "digester",
                                                      "goal": "summarise the hour"}), 201)
        listed = ok(s.http.get("/v1/schedules"))["data"]
        assert [x["id"] for x in listed] == [agent["id"], created["id"]]
        got = ok(s.http.get(f"/v1/schedules/{created['id']}"))
        assert got["fires"] == [] and got["timezone"] == "Europe/Paris"

        paused = ok(s.http.post(f"/v1/schedules/{created['id']}/pause"))
        assert not paused["enabled"]
        assert ok(s.http.post(f"/v1/schedules/{created['id']}/resume"))["enabled"]
        deleted = ok(s.http.delete(f"/v1/schedules/{created['id']}"))
        assert deleted["deleted"] is True
        assert error(s.http.get(f"/v1/schedules/{created['id']}"), 404)["code"] == "not_found"
        error(s.http.delete(f"/v1/schedules/{created['id']}"), 404)

        bad = [({"name": "x", "cron": "61 * * * *", "agent": "digester", "goal": "g"}, "cron"),
               ({"name": "x", "cron": "not a cron", "agent": "digester", "goal": "g"}, "cron"),
               ({"name": "x", "cron": "0 0 31 2 *", "agent": "digester", "goal": "g"}, "cron"),  # never fires
               ({"name": "x", "agent": "digester", "goal": "g"}, "cron"),
               ({"name": "x", "kind": "webhook", "cron": "* * * * *", "agent": "digester", "goal": "g"}, "cron"),
               ({"name": "x", "cron": "* * * * *", "timezone": "Mars/Olympus", "agent": "digester", "goal": "g"},
                "timezone"),
               ({"name": "x", "cron": "* * * * *", "agent": "nobody", "goal": "g"}, "agent"),
               ({"name": "x", "cron": "* * * * *", "agent": "digester"}, "goal"),
               ({"name": "x", "cron": "* * * * *"}, "plan"),
               ({"cron": "* * * * *", "agent": "digester", "goal": "g"}, "name"),
               ({"name": "x", "cron": "* * * * *", "plan": {**PLAN, "tasks": [UNKNOWN_AGENT_TASK]}},
                "plan.tasks[0].agent")]
        for body, param in bad:
            found = error(s.http.post("/v1/schedules", json=body), 400)
            assert found["param"] == param, (body, found)
        assert len(ok(s.http.get("/v1/schedules"))["data"]) == 1  # nothing bad was stored


def test_a_webhook_without_an_api_key_fires_once_per_delivery_and_schedules_are_per_project(tmp_path):
    from mainspring.billing.keys import create_key
    from mainspring.store.db import session

    with agent_server(tmp_path, require_auth=True) as s:
        with session(s.app.state.agents.db) as db:
            a, b = create_key(db, "alpha"), create_key(db, "beta")
        A = httpx.Client(base_url=s.url, timeout=30, headers={"Authorization": f"Bearer {a.secret}"})
        B = httpx.Client(base_url=s.url, timeout=30, headers={"Authorization": f"Bearer {b.secret}"})
        s.http.headers["Authorization"] = f"Bearer {a.secret}"
        make_agent(s, "triage", ["echo"])
        hook = ok(A.post("/v1/schedules", json={"name": "on-issue", "kind": "webhook", "agent": "triage",
                                                "goal": "triage this issue"}), 201)
        secret, url = hook["secret"], hook["hook_url"]
        assert secret and url == f"/v1/hooks/{hook['id']}" and hook["next_fire_at"] is None
        assert ok(A.get(f"/v1/schedules/{hook['id']}"))["secret"] is None  # shown on creation only
        assert all(x["secret"] is None for x in ok(A.get("/v1/schedules"))["data"])

        anonymous = httpx.Client(base_url=s.url, timeout=30)  # the sender has no API key: the signature is its auth
        body = json.dumps({"issue": 42, "title": "crash on start"}).encode()
        refused = error(anonymous.post(url, content=body), 401)
        assert refused["code"] == "invalid_signature"
        error(anonymous.post(url, content=body, headers={"X-Hub-Signature-256": sign("guess", body)}), 401)
        unknown = error(anonymous.post("/v1/hooks/sched_nope", content=body,
                                       headers={"X-Hub-Signature-256": sign(secret, body)}), 401)
        assert unknown == refused  # an unknown id answers exactly as a bad signature: existence is not confirmed

        headers = {"X-Hub-Signature-256": sign(secret, body), "X-Mainspring-Delivery": "delivery-1"}
        fired = ok(anonymous.post(url, content=body, headers=headers), 202)
        assert fired["duplicate"] is False and fired["status"] == "started" and fired["run_id"]
        run = wait_status(s, fired["run_id"], TERMINAL)
        assert run["status"] == "succeeded", run
        assert run["goal"] == f"triage this issue\n\n<webhook>\n{body.decode()}\n</webhook>"
        again = ok(anonymous.post(url, content=body, headers=headers), 202)
        assert again["duplicate"] is True and again["run_id"] == fired["run_id"]
        assert [r["id"] for r in ok(A.get("/v1/runs"))["data"]] == [fired["run_id"]]  # in A's project
        got = ok(A.get(f"/v1/schedules/{hook['id']}"))
        assert got["fire_count"] == 1 and [f["run_id"] for f in got["fires"]] == [fired["run_id"]]
        error(anonymous.post(url, content=b"x" * (64 * 1024 + 1),
                             headers={"X-Hub-Signature-256": sign(secret, b"x" * (64 * 1024 + 1))}), 413)

        # another project's schedule: not found, whatever it tries; its own list is empty
        for r in (B.get(f"/v1/schedules/{hook['id']}"), B.delete(f"/v1/schedules/{hook['id']}"),
                  B.post(f"/v1/schedules/{hook['id']}/pause")):
            assert error(r, 404)["code"] == "not_found" and secret not in r.text
        assert ok(B.get("/v1/schedules"))["data"] == []
        assert ok(A.get(f"/v1/schedules/{hook['id']}"))["enabled"]  # B's pause changed nothing
        error(anonymous.get("/v1/schedules"), 401)  # the schedule routes themselves need a key

        ok(A.post(f"/v1/schedules/{hook['id']}/pause"))
        body2 = b'{"issue": 43}'
        paused = anonymous.post(url, content=body2, headers={"X-Hub-Signature-256": sign(secret, body2)})
        assert error(paused, 409)["code"] == "invalid_state"
        for c in (A, B, anonymous):
            c.close()
