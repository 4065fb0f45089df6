"""kill -9 the server in the middle of runs, start it again: every run completes, every step is in the journal
once, and the side effects are exact (idempotent calls by key; the cut-off non-idempotent call by a human)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
RUNS, CALLS = 4, 3


def start_server(tmp_path: Path, port: int, db_url: str) -> subprocess.Popen:
    env = {**os.environ, "MAINSPRING_DATABASE_URL": db_url, "MAINSPRING_THREADS": "1",
           "MAINSPRING_AGENT_LEASE_S": "30", "MAINSPRING_FAST_VARIANT": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.agents.crash_server", str(tmp_path), str(port)], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"server-{port}.log", "ab"))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise AssertionError((tmp_path / f"server-{port}.log").read_text()[-3000:])
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("server did not come up")


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_kill_9_mid_run_and_restart(tmp_path, free_tcp_port_factory, blank_database_url):
    """The server migrates the empty database itself (SQLite: creates the file), as a first start does."""
    port = free_tcp_port_factory()
    server = start_server(tmp_path, port, blank_database_url)
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=30)
    try:
        api.post("/agents", json={"name": "counter", "model": "policy", "tools": ["count"]}).raise_for_status()
        api.post("/agents", json={"name": "charger", "model": "policy-charge", "tools": ["charge"]}).raise_for_status()
        runs = [api.post("/runs", json={"agent": "counter", "goal": f"count {i}"}).json()["id"] for i in range(RUNS)]
        charge_run = api.post("/runs", json={"agent": "charger", "goal": "charge once"}).json()["id"]
        deadline = time.monotonic() + 60
        while len(lines(tmp_path / "count")) < RUNS + 1 or not any(
                e["type"] == "tool.started"
                for e in api.get(f"/runs/{charge_run}/events", params={"limit": 500}).json()["data"]):
            assert time.monotonic() < deadline, "runs never got going"
            time.sleep(0.05)
    finally:
        os.kill(server.pid, signal.SIGKILL)  # mid-run: calls in flight, leases held
        server.wait()
    effects_before = len(lines(tmp_path / "count"))
    assert effects_before < RUNS * CALLS  # the crash really landed mid-work

    server = start_server(tmp_path, port, blank_database_url)
    try:
        deadline = time.monotonic() + 120
        while True:
            states = {r: api.get(f"/runs/{r}").json()["status"] for r in runs + [charge_run]}
            if states[charge_run] == "waiting_approval":
                [interrupt] = api.get("/interrupts", params={"run_id": charge_run}).json()["data"]
                assert interrupt["kind"] == "in_flight"  # non-idempotent, cut off: not re-run blindly
                api.post(f"/interrupts/{interrupt['id']}/resolve",
                         json={"decision": "approve", "actor": "oncall"}).raise_for_status()
            if all(s == "succeeded" for s in states.values()):
                break
            assert time.monotonic() < deadline and not {"failed", "cancelled"} & set(states.values()), states
            time.sleep(0.1)
        for run_id in runs + [charge_run]:
            steps = api.get(f"/runs/{run_id}/steps").json()["data"]
            assert [s["seq"] for s in steps] == list(range(1, len(steps) + 1))  # each step once, none lost
            events = api.get(f"/runs/{run_id}/events", params={"limit": 500}).json()["data"]
            completed = [e["data"]["step_id"] for e in events if e["type"] == "step.completed"]
            assert len(completed) == len(set(completed)) == len(steps)
            assert api.get(f"/runs/{run_id}/audit").json()["ok"] is True
        recovered = [r for r in runs + [charge_run]
                     if any(e["type"] == "run.recovered"
                            for e in api.get(f"/runs/{r}/events", params={"limit": 500}).json()["data"])]
        assert charge_run in recovered
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    keys = lines(tmp_path / "count")
    assert len(keys) == len(set(keys)) == RUNS * CALLS  # the side-effect counter is exact
    assert lines(tmp_path / "charge") == [f"{charge_run}/1/0"]  # the approved re-run, once
