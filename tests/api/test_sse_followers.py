"""Idle followers of a run's event stream cost (almost) nothing: they sleep on the event bus instead of each
polling the database, and all of them still get the run's next events the moment they are written."""

from __future__ import annotations

import json
import threading
import time

import httpx

from .test_agent_routes import agent_server, make_agent, ok, pending_interrupt, start_run

FOLLOWERS = 50
IDLE_S = 3.0
# generous: polling per follower cost ~0.7 cores for 50; the bus's one poller costs a few queries a second
MAX_IDLE_CORES = 0.25


def test_fifty_idle_followers_cost_little_cpu_and_all_see_the_end(tmp_path):
    with agent_server(tmp_path) as s:
        make_agent(s, "gate", ["guarded"])
        run = start_run(s, "gate", "wait for a human")
        interrupt = pending_interrupt(s, run["id"])
        last = ok(s.http.get(f"/v1/runs/{run['id']}/events"))["last_id"]
        connected, ends = threading.Barrier(FOLLOWERS + 1, timeout=60), []

        def follow() -> None:
            with httpx.Client(base_url=s.url, timeout=60) as http, http.stream(
                    "GET", f"/v1/runs/{run['id']}/events", params={"stream": "true", "after": last}) as r:
                assert r.status_code == 200
                connected.wait()
                types = [json.loads(line[6:])["type"] for line in r.iter_lines() if line.startswith("data: ")]
                ends.append(types[-1] if types else None)

        threads = [threading.Thread(target=follow, daemon=True) for _ in range(FOLLOWERS)]
        for t in threads:
            t.start()
        connected.wait()
        time.sleep(0.5)  # every follower has read its backlog (none) and is waiting
        cpu0, wall0 = time.process_time(), time.monotonic()  # this process runs the server, its worker and clients
        time.sleep(IDLE_S)
        cores = (time.process_time() - cpu0) / (time.monotonic() - wall0)
        assert cores < MAX_IDLE_CORES, f"{FOLLOWERS} idle followers cost {cores:.2f} cores"

        ok(s.http.post(f"/v1/interrupts/{interrupt['id']}/resolve", json={"decision": "approve"}))
        for t in threads:
            t.join(timeout=30)
        assert ends == ["run.finished"] * FOLLOWERS
