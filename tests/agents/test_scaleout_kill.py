"""Many processes on one Postgres: 2 API servers that drive no runs and 2 `mainspring worker`-style processes,
100 runs with a side-effecting tool; kill -9 one worker and one API server mid-flight. Every run completes on the
surviving worker, each step once, the side effects exact, the ledger exact, the events unique."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from mainspring.agents.tables import RunRow
from mainspring.billing.keys import create_key
from mainspring.store.db import dispose_engines, session
from mainspring.store.tables import LedgerEntry
from tests.agents.scaleout_process import CALLS
from tests.servers import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
RUNS = 100
pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
def pg_url(pg_cluster, pg_template):
    name = pg_cluster.create_database(pg_template)
    yield pg_cluster.url(name)
    dispose_engines()
    pg_cluster.drop_database(name)


def spawn(args: list[str], db: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "MAINSPRING_DATABASE_URL": db, "MAINSPRING_THREADS": "1", "MAINSPRING_AGENT_LEASE_S": "3",
           "MAINSPRING_FAST_VARIANT": "0", "MAINSPRING_REQUIRE_AUTH": "1"}
    return subprocess.Popen([sys.executable, "-m", "tests.agents.scaleout_process", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))


def effects(ledgers: Path) -> list[str]:
    path = ledgers / "count"
    return path.read_text().split() if path.exists() else []


def leases_held(db: str, pid: int) -> int:
    """Unfinished runs leased to the worker process `pid` (a lease owner is "host:pid:nonce")."""
    with session(db, readonly=True) as s:
        owners = s.scalars(select(RunRow.lease_owner).where(RunRow.lease_owner.is_not(None))).all()
    return sum(1 for owner in owners if owner.split(":")[1] == str(pid))


def _log_tails(logs: Path) -> dict[str, str]:
    return {p.name: p.read_text()[-2000:] for p in sorted(logs.glob("*.log"))}


def test_two_apis_two_workers_survive_kill_9(pg_url, tmp_path, free_tcp_port_factory):
    with session(pg_url) as s:
        secret = create_key(s, "acme").secret
    ports = [free_tcp_port_factory(), free_tcp_port_factory()]
    apis = [spawn(["api", str(tmp_path), str(p)], pg_url, tmp_path / f"api-{p}.log") for p in ports]
    workers = [spawn(["worker", str(tmp_path)], pg_url, tmp_path / f"worker-{i}.log") for i in range(2)]
    procs = apis + workers
    try:
        for proc, port in zip(apis, ports):
            wait_healthy(proc, f"http://127.0.0.1:{port}", tmp_path / f"api-{port}.log", timeout=120)
        # both workers up before any run exists: under load one started two minutes late, after the other had
        # taken every run, and then held none to be killed with
        deadline = time.monotonic() + 180
        while not all("driving runs" in (tmp_path / f"worker-{i}.log").read_text() for i in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in workers), _log_tails(tmp_path)
            time.sleep(0.1)
        a, b = (httpx.Client(base_url=f"http://127.0.0.1:{p}/v1", timeout=30,
                             headers={"Authorization": f"Bearer {secret}"}) for p in ports)
        a.post("/agents", json={"name": "counter", "model": "policy", "tools": ["count"]}).raise_for_status()
        runs = []
        for i in range(RUNS):
            r = (a if i % 2 else b).post("/runs", json={"agent": "counter", "goal": f"count {i}"})
            r.raise_for_status()
            runs.append(r.json()["id"])
        deadline = time.monotonic() + 120
        # the one to kill must be holding runs (a worker takes at most 64 at a time: the other gets the rest)
        while len(effects(tmp_path)) < RUNS // 2 or not leases_held(pg_url, workers[0].pid):
            assert time.monotonic() < deadline, ("the workers never got going", _log_tails(tmp_path))
            assert all(p.poll() is None for p in workers), (tmp_path / "worker-0.log").read_text()[-3000:]
            time.sleep(0.05)
        os.kill(workers[0].pid, signal.SIGKILL)  # mid-flight: runs leased to it, calls in progress
        os.kill(apis[1].pid, signal.SIGKILL)
        cut = len(effects(tmp_path))
        assert cut < RUNS * CALLS  # the kill landed mid-work

        deadline = time.monotonic() + 180
        while True:
            page = a.get("/runs", params={"limit": RUNS}).json()["data"]
            states = {r["id"]: r["status"] for r in page}
            if len(states) == RUNS and all(st == "succeeded" for st in states.values()):
                break
            ended_badly = {r["id"]: (r["status"], r["error"]) for r in page if r["status"] in ("failed", "cancelled")}
            assert not ended_badly, (ended_badly, _log_tails(tmp_path))
            assert time.monotonic() < deadline, {st: list(states.values()).count(st) for st in set(states.values())}
            assert workers[1].poll() is None, (tmp_path / "worker-1.log").read_text()[-3000:]
            time.sleep(0.2)

        recovered = 0
        for run_id in runs:
            steps = a.get(f"/runs/{run_id}/steps").json()["data"]
            assert [st["seq"] for st in steps] == list(range(1, len(steps) + 1))  # each step once, none lost
            events = a.get(f"/runs/{run_id}/events", params={"limit": 500}).json()["data"]
            assert len({e["id"] for e in events}) == len(events)
            completed = [e["data"]["step_id"] for e in events if e["type"] == "step.completed"]
            assert len(completed) == len(set(completed)) == len(steps)
            recovered += any(e["type"] == "run.recovered" for e in events)
            with session(pg_url, readonly=True) as s:
                billed = list(s.scalars(select(LedgerEntry.request_id).where(LedgerEntry.custom_id == run_id)))
            model_steps = [st["id"] for st in steps if st["kind"] == "model"]
            assert sorted(billed) == sorted(model_steps)  # one ledger row per model call, none twice
        assert recovered >= 1  # the killed worker's runs were taken over
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    keys = effects(tmp_path)
    assert len(keys) == len(set(keys)) == RUNS * CALLS  # the side effects are exact
