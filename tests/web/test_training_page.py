"""The console's training page in chromium: a fine-tuning job's reward curves per domain, its loss and the
evaluation before/after, drawn from the job's events. The job is written to the database as the runner would
leave a finished one (a finished job: the runner does not pick it up)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Iterator

import pytest

from tests.api.test_agent_routes import AgentServer, agent_server

STEPS = 6
DOMAINS = ("code", "math")
METHOD = {"type": "reinforcement", "reinforcement": {"hyperparameters": {
    "batch_size": 4, "learning_rate_multiplier": 1.0, "n_epochs": 1}}}


@pytest.fixture
def srv(tmp_path) -> Iterator[AgentServer]:
    with agent_server(tmp_path / "data") as s:
        yield s


def add_job(srv: AgentServer) -> str:
    from mainspring.store.db import session
    from mainspring.store.tables import FineTuningEventRow, FineTuningJobRow

    job_id = "ftjob-webtest"
    now = datetime.now(timezone.utc)
    with session(srv.app.state.economics.db) as s:
        s.add(FineTuningJobRow(id=job_id, model="SmolLM2-135M-Instruct", training_file="file-x", seed=1,
                               status="succeeded", method_json=json.dumps(METHOD),
                               config_json="{}", created_at=now, started_at=now, finished_at=now))
        s.flush()

        def event(message: str, data: dict) -> None:
            s.add(FineTuningEventRow(job_id=job_id, type="metrics", message=message, data_json=json.dumps(data)))

        event("Evaluation before", {"step": 0, "phase": "before", "code": {"mean": 0.2, "ci": 0.05, "n": 20},
                                    "math": {"mean": 0.1, "ci": 0.04, "n": 20}})
        for step in range(1, STEPS + 1):
            event(f"Step {step}/{STEPS}", {"step": step, "total_steps": STEPS, "reward": 0.1 * step,
                                           "reward_code": 0.12 * step, "reward_math": 0.08 * step,
                                           "loss": 1.0 / step})
        event("Evaluation after", {"step": STEPS, "phase": "after", "code": {"mean": 0.5, "ci": 0.05, "n": 20},
                                   "math": {"mean": 0.3, "ci": 0.04, "n": 20}})
    return job_id


def test_reward_curves_per_domain_and_the_eval_before_after(srv, console):
    job_id = add_job(srv)
    c = console(srv.url)
    page = c.open("#/training")
    page.get_by_role("link", name=job_id).click()
    chart = page.get_by_role("img", name="Reward per domain by step")
    chart.wait_for()
    for name in ("reward", *(f"reward_{d}" for d in DOMAINS)):
        points = chart.locator(f'g[data-series="{name}"] circle.pt')
        assert points.count() == STEPS, name
    assert [float(v) for v in chart.locator('g[data-series="reward_code"] circle.pt').evaluate_all(
        "els => els.map(e => e.dataset.y)")] == pytest.approx([0.12 * s for s in range(1, STEPS + 1)])
    assert page.get_by_role("img", name="Loss by step").locator("circle.pt").count() == STEPS
    rows = page.locator("#evals-h + .scroll tbody tr")
    assert rows.count() == 2
    assert rows.nth(0).inner_text().split("\t")[:4] == ["code", "0.200 ± 0.050", "0.500 ± 0.050", "0.300"]
    c.shot("training")
    assert c.errors == [], c.errors
