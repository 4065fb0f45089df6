"""The train layer's side of the project data policy (store/data_policy.py): the fine-tuning runner fails a job of
a no-training project when it would start it (the API refuses one at creation; a policy set later is caught
here), and the agent-run outputs loader (`mainspring inspect-outputs --agent-runs`) refuses such a project and
leaves its runs out of every other read."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
import typer
from typer.testing import CliRunner

from mainspring.config import Settings
from mainspring.store.data_policy import set_policy
from mainspring.store.db import init_db, session
from mainspring.store.tables import FineTuningJobRow, Project
from mainspring.train.inspect.outputs import records_from_agent_runs

from tests.train.test_jobs import add_job, run_until_done


@pytest.fixture
def env(tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/db.sqlite")
    return settings, init_db(settings.resolved_database_url())


def test_the_runner_fails_a_job_of_a_no_training_project_without_training(env):
    settings, db = env
    job_id = add_job(env)
    with session(db) as s:
        p = Project(name="sealed")
        s.add(p)
        s.flush()
        s.get(FineTuningJobRow, job_id).project_id = p.id
        set_policy(s, p.id, training_allowed=False)  # after the job was created (and queued)
    row = run_until_done(env, lambda *a, **k: pytest.fail("must not train"), job_id)
    error = json.loads(row.error_json)
    assert row.status == "failed" and error["code"] == "training_not_allowed"
    assert "data policy" in error["message"]


def test_a_job_of_a_project_that_allows_training_still_runs(env):
    settings, db = env
    job_id = add_job(env)
    with session(db) as s:
        p = Project(name="open_proj")
        s.add(p)
        s.flush()
        s.get(FineTuningJobRow, job_id).project_id = p.id
    trained = []

    def train(config, run_dir, *, resume, domains, on_event, should_stop, settings):
        trained.append(config)
        raise RuntimeError("stop here")  # reaching the trainer is the point

    row = run_until_done(env, train, job_id)
    assert trained and json.loads(row.error_json)["code"] == "training_failed"


@pytest.fixture
def journal(tmp_path):
    """A platform database with two projects' agent runs, one step each: `open_proj` and `sealed`
    (never for training)."""
    url = f"sqlite:///{tmp_path / 'platform.db'}"
    engine = init_db(url)
    from mainspring.agents.tables import RunRow, StepRow

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with session(engine) as s:
        for pid, name in ((1, "open_proj"), (2, "sealed")):
            s.add(Project(id=pid, name=name))
        s.flush()
        set_policy(s, 2, training_allowed=False)
    raw = sa.create_engine(url)  # a plain engine, foreign keys unchecked: runs without agents or threads
    with raw.begin() as conn:
        for i, (run, pid) in enumerate((("run_open", 1), ("run_sealed", 2))):
            conn.execute(RunRow.__table__.insert().values(  # type: ignore[attr-defined]
                id=run, thread_id="t", agent_id="a", goal="g", project_id=pid))
            conn.execute(StepRow.__table__.insert().values(  # type: ignore[attr-defined]
                id=f"step_{run}", run_id=run, seq=0, kind="model", status="completed",
                output_json=json.dumps({"role": "assistant", "content": f"answer of {run}"}),
                started_at=t0 + timedelta(seconds=i)))
    raw.dispose()
    return url


def test_the_outputs_export_refuses_a_no_training_project(journal):
    with pytest.raises(ValueError, match="never used for training"):
        records_from_agent_runs(journal, project="sealed")
    with pytest.raises(ValueError, match="run_sealed belongs to project 'sealed'"):
        records_from_agent_runs(journal, run_ids=["run_sealed"])
    assert [r.id for r in records_from_agent_runs(journal)] == ["step_run_open"]  # every project: sealed left out
    assert [r.id for r in records_from_agent_runs(journal, project="open_proj")] == ["step_run_open"]


def test_inspect_outputs_cli_refuses_a_no_training_project(journal, monkeypatch, tmp_path):
    from mainspring.train.inspect.cli import inspect_outputs_cmd

    monkeypatch.setenv("MAINSPRING_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MAINSPRING_DATABASE_URL", journal)
    app = typer.Typer()
    app.command()(inspect_outputs_cmd)
    r = CliRunner().invoke(app, ["--agent-runs", "--project", "sealed"])
    assert r.exit_code == 2 and "never used for training" in r.stderr, r.output
