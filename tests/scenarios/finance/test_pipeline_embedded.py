"""One research question through the whole pipeline with the real embedded model, over HTTP on 127.0.0.1: the
server's worker and plan scheduler drive the four stages, the finance tools read the attached corpus, and the
verify stage's verdict comes back. The 135M model answers poorly; what must hold is that the verifier says so:
a report is verified only when every number in it is cited and re-computed, and otherwise the verdict names why."""

from __future__ import annotations

import json
from contextlib import contextmanager

import httpx
import pytest

from mainspring.scenarios.finance.corpus import generate_corpus
from mainspring.scenarios.finance.pipeline import (STAGES, audit_jsonl, put_agents, start_research,
                                                   wait_research)
from tests.servers import serve

pytestmark = pytest.mark.slow


@contextmanager
def finance_server(embedded, tmp_path, attach_root):
    from mainspring.api.app import create_app
    from mainspring.config import Settings
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine

    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=256)))
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'mainspring.db'}", agent_attach_roots=[attach_root])
    try:
        with serve(create_app(settings, engine=engine), engine) as srv:
            yield srv
    finally:
        engine.close()


def test_the_embedded_model_runs_the_four_stages_and_the_verifier_judges_its_report(embedded, tmp_path):
    root = tmp_path / "allowed"
    generate_corpus(root / "corpus", seed=0)
    with finance_server(embedded, tmp_path, root) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        put_agents(client, model, max_tokens=448, tool_steps=2)
        plan_id = start_research(client, "What was Orbital Dynamics' revenue in fiscal 2024?", str(root / "corpus"))
        outcome = wait_research(client, plan_id, timeout_s=900)
        trail = [json.loads(line) for line in audit_jsonl(client, outcome).splitlines()]

    assert outcome.status == "succeeded", outcome.error
    assert set(outcome.runs) == set(STAGES)
    verdict = outcome.verdict
    assert verdict is not None and verdict["verified"] is outcome.verified
    if outcome.verified:  # only when every number the model wrote is cited and resolves, its answer among them
        assert all(c["status"] == "ok" for c in verdict["claims"]), verdict
    else:  # fail closed, and say why: the failing claims, or the reason there was nothing to check
        assert outcome.failing_claims or verdict.get("reason")
    assert {e["stage"] for e in trail} == {*STAGES, "plan"}  # one reasoning chain for the whole report
    verify_calls = [e for e in trail if e["stage"] == "verify" and "verify_research_report" in json.dumps(e)]
    assert verify_calls, "the verdict's tool call is in the verify stage's audit trail"
