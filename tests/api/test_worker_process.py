"""`mainspring worker`: a process with no HTTP drives the runs that an API server, told not to
(MAINSPRING_SERVE_AGENT_WORKER=false), accepts; the embedded model answers; SIGTERM stops it cleanly."""

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from mainspring.config import Settings
from tests.servers import serve

pytestmark = pytest.mark.slow


def test_a_worker_process_drives_the_runs_an_api_only_server_accepts(async_engine, tmp_path):
    from mainspring.api.app import create_app

    url = f"sqlite:///{tmp_path / 'mainspring.db'}"
    app = create_app(Settings(database_url=url, serve_agent_worker=False), engine=async_engine)
    with serve(app, async_engine) as srv:
        api = httpx.Client(base_url=srv.openai_url, timeout=60)
        assert api.post("/agents", json={"name": "geo", "model": "default", "tools": [],
                                         "instructions": "Answer in a few words.",
                                         "limits": {"max_tokens": 16}}).status_code == 201
        run = api.post("/runs", json={"agent": "geo", "goal": "What is the capital of France?"}).json()
        log = open(tmp_path / "worker.log", "w")
        env = {**os.environ, "MAINSPRING_DATABASE_URL": url, "MAINSPRING_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "mainspring", "worker"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while api.get(f"/runs/{run['id']}").json()["status"] not in ("succeeded", "failed"):
                assert proc.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the worker did not finish the run"
                time.sleep(0.5)
            done = api.get(f"/runs/{run['id']}").json()
            assert done["status"] == "succeeded", done
            assert done["result"].strip()
            events = api.get(f"/runs/{run['id']}/events", params={"limit": 100}).json()["data"]
            owners = {e["data"].get("owner") for e in events if e["data"].get("owner")}
            assert owners and all(o.split(":")[1] == str(proc.pid) for o in owners), owners  # the worker's, only
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            log.close()
        assert code == 0, (tmp_path / "worker.log").read_text()[-3000:]
