"""The fine-tuning runner without a server or a model: jobs inserted in a database, a fake trainer, and the
paths the API tests do not reach (a data file deleted before the run, a job that keeps being interrupted,
graders that fail during training, paths kept out of the events)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from mainspring.config import Settings
from mainspring.store.db import init_db, session
from mainspring.store.tables import FileRow, FineTuningEventRow, FineTuningJobRow
from mainspring.train import job_store
from mainspring.train.events import TrainEvent, TrainResult
from mainspring.train.jobs import MAX_ATTEMPTS, FineTuningRunner
from mainspring.train.rft_config import RFTHyperparameters, resolve, train_config
from mainspring.store.ids import new_id

GRADER = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
          "reference": "{{ item.answer }}", "operation": "eq"}


@pytest.fixture
def env(tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/db.sqlite")
    return settings, init_db(settings.resolved_database_url())


def add_job(env, *, status: str = "queued", attempts: int = 0) -> str:
    settings, db = env
    lines = [{"messages": [{"role": "user", "content": f"q{i}"}], "answer": f"a{i}"} for i in range(4)]
    path = settings.data_dir / "files" / "file-train"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = train_config(resolve(RFTHyperparameters(steps=2), 3, 1), model="smollm2", domain="job", suffix="t",
                          seed=0)
    job_id = new_id("ftjob-")
    with session(db) as s:
        if s.get(FileRow, "file-train") is None:
            s.add(FileRow(id="file-train", purpose="fine-tune", filename="t.jsonl", bytes=path.stat().st_size,
                          path="files/file-train"))
        s.add(FineTuningJobRow(id=job_id, model="Base", training_file="file-train", seed=0, status=status,
                               attempts=attempts, config_json=config.model_dump_json(), created_at=job_store.now(),
                               method_json=json.dumps({"type": "reinforcement", "reinforcement": {
                                   "grader": GRADER, "hyperparameters": {}}})))
    return job_id


def run_until_done(env, train_fn, job_id: str) -> FineTuningJobRow:
    settings, db = env
    runner = FineTuningRunner(settings, db, train_fn=train_fn, poll_s=0.02)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while (row := job_store.load(db, job_id)).status not in job_store.TERMINAL:
            assert time.monotonic() < deadline, row.status
            time.sleep(0.02)
    finally:
        runner.stop(timeout=10)
    return row


def events(env, job_id: str) -> list[FineTuningEventRow]:
    with session(env[1], readonly=True) as s:
        return list(s.scalars(select(FineTuningEventRow).where(FineTuningEventRow.job_id == job_id)
                              .order_by(FineTuningEventRow.id)))


def test_a_training_file_deleted_before_the_run_fails_the_job(env):
    job_id = add_job(env)
    with session(env[1]) as s:
        s.delete(s.get(FileRow, "file-train"))
    row = run_until_done(env, lambda *a, **k: pytest.fail("must not train"), job_id)
    error = json.loads(row.error_json)
    assert row.status == "failed" and error["code"] == "invalid_file" and error["param"] == "training_file"
    assert "no longer exists" in error["message"] and events(env, job_id)[-1].level == "error"


def test_a_job_interrupted_too_often_fails_instead_of_looping(env):
    job_id = add_job(env, status="running", attempts=MAX_ATTEMPTS)
    row = run_until_done(env, lambda *a, **k: pytest.fail("must not train"), job_id)
    assert row.status == "failed" and json.loads(row.error_json)["code"] == "too_many_restarts"


def test_grading_failures_are_warned_and_server_paths_stay_out_of_events(env):
    def train(config, run_dir, *, resume, domains, on_event, should_stop, settings):
        assert not resume and Path(run_dir) == settings.data_dir / "fine_tuning" / job_id
        on_event(TrainEvent("started", 0, {"resumed": False, "run_dir": str(run_dir), "trainable_params": 8}))
        on_event(TrainEvent("step", 1, {"loss": 0.1, "reward": 0.0, "tokens": 10, "scorer_errors": 2,
                                        "scorer_error_examples": ["grader raised KeyError: 'answer'"]}))
        on_event(TrainEvent("eval", 1, {"phase": "after", "job": {"mean": 0.5, "ci": [0.1, 0.9], "n": 1,
                                                                   "mean_length": 3.0, "scores": {"valid-1": 0.5}}}))
        on_event(TrainEvent("message", 1, {"message": "hello from the trainer"}))
        return TrainResult(Path(run_dir), 1, False)  # no export: the job fails, saying so

    job_id = add_job(env)
    row = run_until_done(env, train, job_id)
    assert row.status == "failed" and json.loads(row.error_json)["code"] == "export_refused"
    assert row.trained_tokens == 10
    evs = events(env, job_id)
    warn = next(e for e in evs if e.level == "warn")
    assert "2 completions could not be graded at step 1" in warn.message and "KeyError" in warn.message
    started = next(e for e in evs if e.message.startswith("Training started"))
    assert json.loads(started.data_json) == {"resumed": False, "trainable_params": 8}
    ev = next(e for e in evs if e.message.startswith("Evaluation after"))
    assert ev.message == "Evaluation after: job 0.500 (n=1)" and "scores" not in json.loads(ev.data_json)["job"]
    assert any(e.message == "hello from the trainer" for e in evs)
    assert not any(str(env[0].data_dir) in (e.data_json or "") + e.message for e in evs)


def test_publish_replaces_a_folder_left_by_an_earlier_attempt(env):
    settings, db = env
    runner = FineTuningRunner(settings, db, train_fn=None)
    for text in ("old", "new"):
        export = settings.data_dir / "export"
        export.mkdir()
        (export / "config.json").write_text(text)
        dest = runner.publish(export, "ft:Base:t:ftjob-1")
    assert dest == settings.finetuned_path / "ft:Base:t:ftjob-1" and (dest / "config.json").read_text() == "new"
    assert not export.exists() and [p.name for p in settings.finetuned_path.iterdir()] == ["ft:Base:t:ftjob-1"]
