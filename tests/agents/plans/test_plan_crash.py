"""kill -9 a server mid-plan: after a restart every task completes exactly once (one run each, no task lost, the
side effects exact); with two servers on one database, the standby takes over as scheduler when the leader dies."""

import os
import signal
import time
from collections import Counter

import httpx
import pytest

from mainspring.agents.plans import leader
from tests.agents.test_crash import lines, start_server

pytestmark = pytest.mark.slow
CALLS = 3  # the crash server's counter agent: three count calls, then its answer
PLAN = {"goal": "count", "tasks": [
    *({"id": f"c{i}", "agent": "counter", "prompt": f"count part {i}"} for i in range(4)),
    {"id": "join", "agent": "counter", "prompt": "count the total", "depends_on": [f"c{i}" for i in range(4)]}]}


def wait_plan(api: httpx.Client, plan_id: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        plan = api.get(f"/plans/{plan_id}").json()
        if plan["status"] in ("succeeded", "failed", "cancelled"):
            return plan
        assert time.monotonic() < deadline, plan
        time.sleep(0.1)


def check_exactly_once(api: httpx.Client, plan: dict, ledger) -> None:
    assert plan["status"] == "succeeded", plan
    events = api.get(f"/plans/{plan['id']}/events", params={"limit": 500}).json()["data"]
    succeeded = Counter(e["task"] for e in events if e["type"] == "task.succeeded")
    assert succeeded == {t["key"]: 1 for t in plan["tasks"]}  # each task once, none lost
    dispatched = [e["data"]["run_id"] for e in events if e["type"] == "task.dispatched"]
    assert sorted(dispatched) == sorted(t["run_id"] for t in plan["tasks"])  # one run per task, no retry
    assert plan["usage"]["runs"] == len(plan["tasks"])
    keys = lines(ledger)
    assert len(keys) == len(set(keys))  # no effect twice
    per_run = Counter(k.split("/")[0] for k in keys)
    # each counting task's run made its three calls; the join task reads "count=3" in its upstream artifacts,
    # which the scripted policy takes as done, so it answers at once
    assert {t["key"]: per_run[t["run_id"]] for t in plan["tasks"]} == {**{f"c{i}": CALLS for i in range(4)},
                                                                       "join": 0}


def test_kill_9_mid_plan_and_restart(tmp_path, free_tcp_port_factory, blank_database_url):
    port = free_tcp_port_factory()
    server = start_server(tmp_path, port, blank_database_url)
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=30)
    try:
        api.post("/agents", json={"name": "counter", "model": "policy", "tools": ["count"]}).raise_for_status()
        plan = api.post("/plans", json=PLAN).json()
        deadline = time.monotonic() + 60
        while len(lines(tmp_path / "count")) < 3:  # some tasks' runs are mid-way
            assert time.monotonic() < deadline, "the plan never got going"
            time.sleep(0.05)
    finally:
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
    assert len(lines(tmp_path / "count")) < CALLS * len(PLAN["tasks"])  # the crash landed mid-plan

    server = start_server(tmp_path, port, blank_database_url)
    try:
        done = wait_plan(api, plan["id"])
        check_exactly_once(api, done, tmp_path / "count")
        assert all(api.get(f"/runs/{t['run_id']}/audit").json()["ok"] for t in done["tasks"])
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def lease_holder(db_url: str) -> tuple[str, int] | None:
    row = leader.holder(db_url, leader.SCHEDULER_LEASE)
    return None if row is None else (row.owner, row.term)


def test_a_second_server_takes_over_scheduling_when_the_leader_dies(tmp_path, free_tcp_port_factory,
                                                                    blank_database_url):
    """Both servers start at once on an empty database (one migrates it, the other waits: store/db.py)."""
    ports = [free_tcp_port_factory(), free_tcp_port_factory()]
    servers = {port: start_server(tmp_path, port, blank_database_url) for port in ports}
    apis = {port: httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=30) for port in ports}
    db = blank_database_url
    try:
        first = apis[ports[0]]
        first.post("/agents", json={"name": "counter", "model": "policy", "tools": ["count"]}).raise_for_status()
        deadline = time.monotonic() + 30
        while (holder := lease_holder(db)) is None:
            assert time.monotonic() < deadline, "no server took the scheduler lease"
            time.sleep(0.1)
        owner, term = holder
        leader_port = next(p for p, proc in servers.items() if owner.split(":")[1] == str(proc.pid))
        standby_port = next(p for p in ports if p != leader_port)
        plan = apis[standby_port].post("/plans", json=PLAN).json()  # created through either: one database
        deadline = time.monotonic() + 60
        while len(lines(tmp_path / "count")) < 2:
            assert time.monotonic() < deadline, "the plan never got going"
            time.sleep(0.05)
        os.kill(servers[leader_port].pid, signal.SIGKILL)
        servers[leader_port].wait()
        done = wait_plan(apis[standby_port], plan["id"])
        check_exactly_once(apis[standby_port], done, tmp_path / "count")
        new_owner, new_term = lease_holder(db)
        assert new_owner.split(":")[1] == str(servers[standby_port].pid) and new_term == term + 1
    finally:
        for proc in servers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
