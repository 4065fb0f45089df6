"""An agent run on the embedded engine when that engine fails: a failed step is retried like a 5xx and the run
goes on; a stopped engine parks the run whole (paused, model_stopped), and a worker that starts with a working
engine queues it again and finishes it. Nothing of the run is lost or failed on the way."""

from __future__ import annotations

import json

from mainspring.agents.status import MODEL_STOPPED, TERMINAL
from mainspring.engine.async_engine import AsyncLLMEngine
from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.models import LocalModel
from tests.agents.conftest import drive, make_runtime, spec, wait_status
from tests.engine_faults import failing_engine, stopped_engine


def statuses(rt, run_id: str) -> list[tuple[str, str | None]]:
    events = [json.loads(e.data_json) for e in rt.events(run_id) if e.type == "run.status"]
    return [(e["status"], e.get("reason")) for e in events]


def test_a_failed_engine_step_is_retried_and_the_run_goes_on(tmp_path, db_url, embedded):
    engine = failing_engine(embedded, failures=1)
    try:
        rt = make_runtime(tmp_path, db_url, LocalModel(engine), {})
        rt.put_agent(spec(tools=(), model_retries=2, retry_backoff_s=0.01, max_tokens=8))
        run = rt.start_run("tester", "Say hello.")
        done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL, timeout=120))
    finally:
        engine.close()
    assert done.status == "succeeded" and done.result, (done.status, done.error)
    retries = [json.loads(e.data_json) for e in rt.events(run.id) if e.type == "step.retry"]
    assert len(retries) == 1 and "500" in retries[0]["error"]


def test_a_stopped_engine_parks_the_run_and_a_starting_worker_finishes_it(tmp_path, db_url, embedded):
    dead = stopped_engine(embedded)
    try:
        rt = make_runtime(tmp_path, db_url, LocalModel(dead), {})
        rt.put_agent(spec(tools=(), model_retries=3, retry_backoff_s=0.01, max_tokens=8))
        run = rt.start_run("tester", "Say hello.")
        parked = drive(rt, lambda: wait_status(rt, run.id, {"paused", *TERMINAL}, timeout=120))
    finally:
        dead.close()
    assert (parked.status, parked.pause_reason, parked.error) == ("paused", MODEL_STOPPED, None)
    assert not [e for e in rt.events(run.id) if e.type == "step.retry"]  # retrying a stopped engine is pointless

    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=64)))  # the server restarted
    try:
        rt2 = make_runtime(tmp_path, db_url, LocalModel(engine), {})
        done = drive(rt2, lambda: wait_status(rt2, run.id, TERMINAL, timeout=120))
    finally:
        engine.close()
    assert done.status == "succeeded" and done.result, (done.status, done.error)
    seen = statuses(rt2, run.id)
    assert ("paused", MODEL_STOPPED) in seen and ("queued", "a worker started") in seen
