"""The fine-tuning jobs API with the official openai SDK against a real server: create, list, retrieve, events,
checkpoints, cancel, project isolation, 400s for bad input, a job that survives a server restart, serving the
fine-tuned model (chat + billing). Pause/resume, result files, servable checkpoints and the one job with the
real GRPO trainer are in test_fine_tuning_control.py, which shares the helpers here.

Most tests inject a fake trainer (same signature as run_training) so they take seconds: it reports steps and
checkpoints, honours should_stop and resume, and "exports" the embedded model's own weights (linked, not copied).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import openai
import pytest
from sqlalchemy import select

from mainspring.billing.keys import create_key
from mainspring.billing.prices import price
from mainspring.billing.usage import UsageRecord
from mainspring.store.db import session
from mainspring.store.tables import LedgerEntry
from mainspring.train.events import TrainEvent, TrainResult

from .conftest import serve

pytestmark = pytest.mark.slow
BASE = "SmolLM2-135M-Instruct"
DONE = ("succeeded", "failed", "cancelled")
GRADER = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
          "reference": "{{ item.answer }}", "operation": "ilike"}
CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"), ("Egypt", "Cairo"),
            ("Peru", "Lima"), ("Kenya", "Nairobi"), ("Chile", "Santiago")]


# ---- a fake trainer --------------------------------------------------------------------------------------
class FakeTrainer:
    """run_training's contract, without torch: a step at once (or per permit of `gate`), a checkpoint every
    step (a file with the step number), and an export folder linking the embedded model's files."""

    def __init__(self, weights: Path, gate: threading.Semaphore | None = None, fail: str | None = None,
                 export: bool = True) -> None:
        self.weights, self.gate, self.fail, self.export = weights, gate, fail, export
        self.calls: list[dict] = []
        self.started = threading.Event()

    def __call__(self, config, run_dir, *, resume=False, domains=None, on_event=None, should_stop=None,
                 settings=None) -> TrainResult:
        domain = domains["job"]
        first = domain.train[0]
        self.calls.append({"config": config, "resume": resume, "domain": domain,
                           "score": domain.scorer.score(first, first.reference["answer"]).total})
        if self.fail:
            raise RuntimeError(self.fail)
        ckpt = Path(run_dir) / "checkpoints" / "latest"
        step = int(ckpt.read_text()) if resume and ckpt.exists() else 0
        on_event(TrainEvent("started", step, {"resumed": resume}))
        while step < config.steps:
            self.started.set()
            while self.gate is not None and not self.gate.acquire(timeout=0.01) and not should_stop():
                pass
            if should_stop():
                self._checkpoint(ckpt, step, on_event)
                return TrainResult(Path(run_dir), step, True)
            step += 1
            on_event(TrainEvent("step", step, {"loss": 0.5 / step, "reward": 0.25 * step, "reward_job": 0.25 * step,
                                               "tokens": 100, "step_s": 0.01, "sampling_weights": {"job": 1.0}}))
            self._checkpoint(ckpt, step, on_event)
        if not self.export:
            on_event(TrainEvent("gate", step, {"passed": False, "regressions": ["job"]}))
            return TrainResult(Path(run_dir), step, False, gate_passed=False)
        out = Path(run_dir) / "export"
        out.mkdir(parents=True, exist_ok=True)
        for f in self.weights.iterdir():
            if f.is_file() and not (out / f.name).exists():
                (out / f.name).symlink_to(f)
        (out / "mainspring_export.json").write_text(json.dumps({"base": BASE, "suffix": config.suffix, "steps": step}))
        on_event(TrainEvent("export", step, {"path": str(out)}))
        return TrainResult(Path(run_dir), step, False, export_dir=out, checkpoints=[ckpt])

    @staticmethod
    def _checkpoint(ckpt: Path, step: int, on_event) -> None:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        ckpt.write_text(str(step))
        on_event(TrainEvent("checkpoint", step, {"path": str(ckpt.parent)}))


# ---- servers, keys, helpers ------------------------------------------------------------------------------
def make_app(engine, data_dir: Path, train_fn, model_spec: str):
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    settings = Settings(database_url=f"sqlite:///{data_dir}/db.sqlite", data_dir=data_dir, require_auth=True,
                        model=model_spec, finetuned_kv_cache_mb=32)
    return create_app(settings, engine=engine, train_fn=train_fn)


def new_key(app, project: str = "acme") -> str:
    with session(app.state.economics.db) as s:
        return create_key(s, project).secret


def client(server, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_url, api_key=secret, max_retries=0, timeout=300)


def jsonl(lines: list) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def rft_line(country: str, capital: str) -> dict:
    return {"messages": [{"role": "user", "content": f"What is the capital of {country}? One word."}],
            "answer": capital}


def upload(c: openai.OpenAI, lines: list, purpose: str = "fine-tune"):
    return c.files.create(file=("data.jsonl", jsonl(lines)), purpose=purpose)


def method(grader: dict | None = None, **hp) -> dict:
    return {"type": "reinforcement", "reinforcement": {"grader": grader or GRADER, "hyperparameters": hp}}


def wait_for(c: openai.OpenAI, job_id: str, until=DONE, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        job = c.fine_tuning.jobs.retrieve(job_id)
        if job.status in until:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job.status}"
        time.sleep(0.05)


def messages(c: openai.OpenAI, job_id: str) -> list[str]:
    return [e.message for e in c.fine_tuning.jobs.list_events(job_id, limit=1000).data]


@pytest.fixture
def weights(embedded) -> Path:
    return Path(embedded.path)


@pytest.fixture
def ft(async_engine, weights, tmp_path):
    """A server with a fake trainer, and an SDK client with a key of project acme."""
    fake = FakeTrainer(weights)
    app = make_app(async_engine, tmp_path, fake, str(weights))
    with serve(app, async_engine) as server:
        yield server, app, fake, client(server, new_key(app))


# ---- the job lifecycle -----------------------------------------------------------------------------------
def test_a_job_runs_and_its_model_is_served_and_billed(ft):
    server, app, fake, c = ft
    train = upload(c, [rft_line(*x) for x in CAPITALS[:6]])
    valid = upload(c, [rft_line(*x) for x in CAPITALS[6:]])
    job = c.fine_tuning.jobs.create(model=BASE, training_file=train.id, validation_file=valid.id, suffix="capitals",
                                    seed=7, method=method(n_epochs=2, batch_size=3, learning_rate_multiplier=0.5),
                                    metadata={"team": "geo"})
    assert job.object == "fine_tuning.job" and job.id.startswith("ftjob-") and job.status in ("queued", "running")
    assert job.model == BASE and job.seed == 7 and job.training_file == train.id and job.validation_file == valid.id
    assert job.fine_tuned_model is None and job.metadata == {"team": "geo"}
    assert job.hyperparameters.batch_size == 3 and job.hyperparameters.n_epochs == 2
    assert job.method.type == "reinforcement"
    assert job.method.reinforcement.hyperparameters.learning_rate_multiplier == 0.5

    done = wait_for(c, job.id)
    assert done.status == "succeeded", done.error
    assert done.fine_tuned_model == f"ft:{BASE}:capitals:{job.id}"
    assert done.trained_tokens == 400 and done.finished_at >= done.created_at and done.error is None
    # what the trainer was given: 2 epochs of 6 lines in batches of 3, the grader as the scorer
    call = fake.calls[0]
    assert (call["config"].steps, call["config"].prompts_per_step, call["config"].lr) == (4, 3, pytest.approx(1e-4))
    assert (len(call["domain"].train), len(call["domain"].eval), call["score"], call["resume"]) == (6, 2, 1.0, False)

    # events: newest first, metrics events with OpenAI's step/total_steps, paged by `after`
    events = c.fine_tuning.jobs.list_events(job.id, limit=1000).data
    assert events[0].message == "The job has successfully completed"
    assert all(e.object == "fine_tuning.job.event" and e.level == "info" for e in events)
    steps = [e for e in events if e.type == "metrics"]
    assert [e.data["step"] for e in steps] == [4, 3, 2, 1] and steps[0].data["total_steps"] == 4
    assert "reward" in steps[0].data and "sampling_weights" not in steps[0].data
    page = c.fine_tuning.jobs.list_events(job.id, limit=2)
    assert page.has_more and [e.id for e in page.data] == [e.id for e in events[:2]]
    after = c.fine_tuning.jobs.list_events(job.id, limit=2, after=page.data[-1].id)
    assert [e.id for e in after.data] == [e.id for e in events[2:4]]

    cps = c.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [cp.step_number for cp in cps] == [4, 3, 2, 1]
    assert cps[0].fine_tuned_model_checkpoint == f"{done.fine_tuned_model}:ckpt-step-4"
    assert cps[0].metrics.train_loss == pytest.approx(0.125) and cps[0].fine_tuning_job_id == job.id

    # the model: listed, retrievable, answers, and is billed at the base model's prices
    ids = [m.id for m in c.models.list().data]
    assert done.fine_tuned_model in ids and BASE in ids
    assert c.models.retrieve(done.fine_tuned_model).id == done.fine_tuned_model
    chat = c.chat.completions.create(model=done.fine_tuned_model, max_tokens=4, temperature=0,
                                     messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert chat.model == done.fine_tuned_model and chat.choices[0].message.content
    base = c.chat.completions.create(model=BASE, max_tokens=4, temperature=0,
                                     messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert chat.choices[0].message.content == base.choices[0].message.content  # the fake "trained" nothing
    with session(app.state.economics.db, readonly=True) as s:
        row = s.scalar(select(LedgerEntry).where(LedgerEntry.model == done.fine_tuned_model))
    as_base = UsageRecord(model=BASE, input_total=row.tokens_input_uncached + row.tokens_cache_read,
                          cache_read=row.tokens_cache_read, output_total=row.tokens_output)
    assert row.cost_total_u == price(as_base, app.state.economics.sheet).total_u > 0
    assert app.state.finetuned.loaded() == [done.fine_tuned_model]


def test_list_jobs_pages_newest_first(ft):
    _, _, _, c = ft
    train = upload(c, [rft_line(*x) for x in CAPITALS])
    ids = [c.fine_tuning.jobs.create(model="smollm2", training_file=train.id, method=method(steps=1)).id
           for _ in range(3)]
    for i in ids:
        wait_for(c, i)
    listed = c.fine_tuning.jobs.list(limit=2)
    assert [j.id for j in listed.data] == ids[::-1][:2] and listed.has_more
    rest = c.fine_tuning.jobs.list(limit=2, after=listed.data[-1].id)
    assert [j.id for j in rest.data] == [ids[0]] and not rest.has_more
    # without a validation file a tenth (at least one line) is held out
    job = c.fine_tuning.jobs.retrieve(ids[0])
    assert job.validation_file is None and job.method.reinforcement.hyperparameters.eval_samples == 1


def test_another_projects_key_sees_nothing(ft):
    server, app, _, c = ft
    train = upload(c, [rft_line(*x) for x in CAPITALS])
    job = wait_for(c, c.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=1)).id)
    other = client(server, new_key(app, "rival"))
    for call in (lambda: other.fine_tuning.jobs.retrieve(job.id), lambda: other.fine_tuning.jobs.cancel(job.id),
                 lambda: other.fine_tuning.jobs.list_events(job.id),
                 lambda: other.fine_tuning.jobs.checkpoints.list(job.id),
                 lambda: other.models.retrieve(job.fine_tuned_model),
                 lambda: other.chat.completions.create(model=job.fine_tuned_model, max_tokens=2,
                                                       messages=[{"role": "user", "content": "hi"}])):
        with pytest.raises(openai.NotFoundError):
            call()
    assert other.fine_tuning.jobs.list().data == []
    assert job.fine_tuned_model not in [m.id for m in other.models.list().data]
    with pytest.raises(openai.BadRequestError, match="no such file"):  # nor its files
        other.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method())
    # a second key of the same project sees the job
    colleague = client(server, new_key(app, "acme"))
    assert colleague.fine_tuning.jobs.retrieve(job.id).status == "succeeded"
    with pytest.raises(openai.AuthenticationError):
        client(server, "nope").fine_tuning.jobs.list()


@pytest.mark.parametrize("change,param,reason", [
    ({"method": None}, "method", "only reinforcement"),
    ({"method": {"type": "supervised", "supervised": {}}}, "method.type", "only reinforcement"),
    ({"method": {"type": "dpo", "dpo": {}}}, "method.type", "only reinforcement"),
    ({"method": {"type": "reinforcement", "reinforcement": {}}}, "method.reinforcement.grader", "missing"),
    ({"method": method({"type": "score_model", "name": "j", "model": "gpt-4o", "input": []})},
     "method.reinforcement.grader", "judge model"),
    ({"method": method({**GRADER, "input": "{{ output }}"})}, "method.reinforcement.grader", "not of the form"),
    ({"method": method({**GRADER, "type": "text_similarity", "evaluation_metric": "meteor", "operation": None})},
     "method.reinforcement.grader", "Extra inputs|meteor"),
    ({"method": method(n_epochs=0)}, "method.reinforcement.hyperparameters", "n_epochs"),
    ({"method": method(learning_rate="high")}, "method.reinforcement.hyperparameters.learning_rate", "Extra"),
    ({"method": method(group_size=1)}, "method.reinforcement.hyperparameters.group_size", "greater than"),
    ({"training_file": "file-nope"}, "training_file", "no such file"),
    ({"validation_file": "file-nope"}, "validation_file", "no such file"),
    ({"model": "gpt-4o"}, "model", "cannot be fine-tuned"),
    ({"model": BASE + "-fast"}, "model", "int4"),
    ({"suffix": "a:b"}, "suffix", "letters, digits"),
    ({"seed": -1}, "seed", "greater than"),
])
def test_bad_input_is_a_400_naming_the_field(ft, change, param, reason):
    _, _, _, c = ft
    train = upload(c, [rft_line(*x) for x in CAPITALS])
    args = {"model": BASE, "training_file": train.id, "method": method(), **change}
    if args["method"] is None:
        del args["method"]
    with pytest.raises(openai.BadRequestError, match=reason) as exc:
        c.fine_tuning.jobs.create(**args)
    assert exc.value.body["param"] == param, exc.value.body


@pytest.mark.parametrize("lines,purpose,reason", [
    (["not json", rft_line("France", "Paris")], "fine-tune", "line 1 is not valid JSON"),
    ([{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}] * 2, "fine-tune",
     "last message must be from the user"),
    ([rft_line("France", "Paris")], "fine-tune", "at least 2 lines"),
    ([{"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": {}}], "batch", "purpose"),
])
def test_bad_training_files_are_400s(ft, lines, purpose, reason):
    _, _, _, c = ft
    f = upload(c, lines, purpose)
    with pytest.raises(openai.BadRequestError, match=reason) as exc:
        c.fine_tuning.jobs.create(model=BASE, training_file=f.id, method=method())
    assert exc.value.body["param"] == "training_file"
    with pytest.raises(openai.BadRequestError, match="not an event id"):
        c.get("/fine_tuning/jobs/ftjob-x/events", cast_to=object, options={"params": {"after": "x"}})


def test_cancel_a_queued_and_a_running_job(async_engine, weights, tmp_path):
    gate = threading.Semaphore(0)
    fake = FakeTrainer(weights, gate=gate)
    app = make_app(async_engine, tmp_path, fake, str(weights))
    with serve(app, async_engine) as server:
        c = client(server, new_key(app))
        train = upload(c, [rft_line(*x) for x in CAPITALS])
        running = c.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=3))
        assert fake.started.wait(30)
        queued = c.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=3))
        assert c.fine_tuning.jobs.retrieve(queued.id).status == "queued"  # one job at a time
        assert c.fine_tuning.jobs.cancel(queued.id).status == "cancelled"
        assert c.fine_tuning.jobs.cancel(queued.id).status == "cancelled"  # again: the same answer
        cancelled = c.fine_tuning.jobs.cancel(running.id)
        assert cancelled.status == "cancelled" and cancelled.finished_at is not None
        deadline = time.monotonic() + 30
        while "Training stopped at step 0 (cancelled)" not in messages(c, running.id):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert len(fake.calls) == 1  # the cancelled queued job never ran
        gate.release(10)
        done = wait_for(c, c.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=1)).id)
        with pytest.raises(openai.BadRequestError, match="succeeded and can no longer be cancelled"):
            c.fine_tuning.jobs.cancel(done.id)
        assert c.fine_tuning.jobs.retrieve(running.id).fine_tuned_model is None


def test_failures_are_reported_on_the_job(async_engine, weights, tmp_path):
    for fake, code, text in ((FakeTrainer(weights, fail="CUDA fell over"), "training_failed", "CUDA fell over"),
                             (FakeTrainer(weights, export=False), "export_refused", "evaluation gate refused")):
        app = make_app(async_engine, tmp_path / code, fake, str(weights))
        with serve(app, async_engine) as server:
            c = client(server, new_key(app))
            train = upload(c, [rft_line(*x) for x in CAPITALS])
            job = wait_for(c, c.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=1)).id)
            assert job.status == "failed" and job.error.code == code and text in job.error.message
            assert job.fine_tuned_model is None
            assert c.fine_tuning.jobs.list_events(job.id, limit=1).data[0].level == "error"


def test_a_running_job_resumes_after_a_server_restart(async_engine, weights, tmp_path):
    gate = threading.Semaphore(0)
    first = FakeTrainer(weights, gate=gate)
    app = make_app(async_engine, tmp_path, first, str(weights))
    with serve(app, async_engine) as server:
        key = new_key(app)
        c = client(server, key)
        train = upload(c, [rft_line(*x) for x in CAPITALS])
        job = c.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=3))
        gate.release()  # one step, then the trainer waits for the next permit
        deadline = time.monotonic() + 30
        while not any(m.startswith("Checkpoint created at step 1") for m in messages(c, job.id)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
    # the server is down: the job stopped at a checkpoint and is still `running`, to be resumed
    second = FakeTrainer(weights)
    app2 = make_app(async_engine, tmp_path, second, str(weights))
    with serve(app2, async_engine) as server2:
        c2 = client(server2, key)
        done = wait_for(c2, job.id)
        assert done.status == "succeeded"
        assert second.calls[0]["resume"] is True and first.calls[0]["resume"] is False
        log = messages(c2, job.id)[::-1]
        paused = next(i for i, m in enumerate(log) if m.startswith("Paused at step"))
        assert log[paused + 1].startswith("Resuming after a restart from the checkpoint at step")
        steps = [e.data["step"] for e in c2.fine_tuning.jobs.list_events(job.id, limit=100).data if e.type == "metrics"]
        assert steps == [3, 2, 1]  # step 1 before the restart, 2 and 3 after it: none done twice
        assert [cp.step_number for cp in c2.fine_tuning.jobs.checkpoints.list(job.id).data] == [3, 2, 1]
        assert done.trained_tokens == 300
        assert done.fine_tuned_model in [m.id for m in c2.models.list().data]


def test_grader_endpoints(ft):
    _, _, _, c = ft
    run = c.fine_tuning.alpha.graders.run(grader=GRADER, model_sample="It is paris.", item={"answer": "Paris"})
    assert run.reward == 1.0 and run.sub_rewards == {"exact": 1.0} and not run.metadata.errors.other_error
    bad = c.fine_tuning.alpha.graders.run(grader={**GRADER, "reference": "{{ item.city }}"}, model_sample="x", item={})
    assert bad.reward == 0.0 and bad.metadata.errors.invalid_variable_error
    assert c.fine_tuning.alpha.graders.validate(grader=GRADER).grader.name == "exact"
    with pytest.raises(openai.BadRequestError, match="operation"):
        c.fine_tuning.alpha.graders.validate(grader={**GRADER, "operation": "contains"})
