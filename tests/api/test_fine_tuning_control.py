"""Pause and resume, result files and servable checkpoints of fine-tuning jobs, with the openai SDK against a real
server: the fake trainer of test_fine_tuning.py for the state changes (a paused job survives a restart, bad
transitions are 400s, another project's key gets 404s), the checkpoint weights applied like the export, and the
one job with the real GRPO trainer on the embedded model, whose checkpoint answers like its final model.
"""

from __future__ import annotations

import csv
import io
import json
import math
import threading
import time
from pathlib import Path

import openai
import pytest

from mainspring.api import fine_tuning_results

from .conftest import serve
from .test_fine_tuning import BASE, CAPITALS, FakeTrainer, client, make_app, messages, method, new_key, rft_line, \
    upload, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def weights(embedded) -> Path:
    return Path(embedded.path)


def wait_until(check, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def step_events(c: openai.OpenAI, job_id: str) -> list[int]:
    return [e.data["step"] for e in c.fine_tuning.jobs.list_events(job_id, limit=1000).data if e.type == "metrics"]


def csv_rows(c: openai.OpenAI, file_id: str) -> tuple[list[str], list[dict[str, str]]]:
    text = c.files.content(file_id).text
    reader = csv.DictReader(io.StringIO(text))
    return list(reader.fieldnames or []), list(reader)


def chat(c: openai.OpenAI, model: str):
    return c.chat.completions.create(model=model, max_tokens=4, temperature=0,
                                     messages=[{"role": "user", "content": "What is the capital of France?"}])


# ---- pause and resume ------------------------------------------------------------------------------------
def test_a_paused_job_waits_across_a_restart_and_resumes_from_its_checkpoint(async_engine, weights, tmp_path):
    gate = threading.Semaphore(0)
    first = FakeTrainer(weights, gate=gate)
    app = make_app(async_engine, tmp_path, first, str(weights))
    with serve(app, async_engine) as server:
        key = new_key(app)
        c = client(server, key)
        train = upload(c, [rft_line(*x) for x in CAPITALS])
        job = c.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=3))
        assert job.result_files == []
        gate.release()  # one step, then the trainer waits for the next permit
        wait_until(lambda: "Checkpoint created at step 1" in messages(c, job.id))
        paused = c.fine_tuning.jobs.pause(job.id)
        assert paused.status == "paused" and paused.estimated_finish is None
        assert c.fine_tuning.jobs.pause(job.id).status == "paused"  # again: the same answer
        wait_until(lambda: any(m.startswith("Training paused at step 1") for m in messages(c, job.id)))
        # the runner is free while the job waits: the next job runs to the end
        gate.release(10)
        other = wait_for(c, c.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=1)).id)
        assert other.status == "succeeded" and len(first.calls) == 2
        held = c.fine_tuning.jobs.retrieve(job.id)
        assert held.status == "paused" and held.result_files == [fine_tuning_results.file_id(job.id)]
        header, rows = csv_rows(c, held.result_files[0])  # written as the job goes: step 1 so far
        assert [r["step"] for r in rows] == ["1"]

    second = FakeTrainer(weights)
    app2 = make_app(async_engine, tmp_path, second, str(weights))
    with serve(app2, async_engine) as server2:
        c2 = client(server2, key)
        # the new runner has looked at the queue (a new job ran) and left the paused one alone
        third = wait_for(c2, c2.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=1)).id)
        assert third.status == "succeeded" and len(second.calls) == 1
        assert c2.fine_tuning.jobs.retrieve(job.id).status == "paused"
        assert c2.fine_tuning.jobs.resume(job.id).status in ("queued", "running")
        done = wait_for(c2, job.id)
        assert done.status == "succeeded" and second.calls[1]["resume"] is True
        log = messages(c2, job.id)[::-1]
        assert log.index("Job paused") < log.index("Job resumed")
        assert log[log.index("Job resumed") + 1] == "Resuming after the job was resumed from the checkpoint at step 1"
        assert step_events(c2, job.id) == [3, 2, 1] and done.trained_tokens == 300  # no step done twice

        # the result file: one CSV row a step, in the Files store, the same id throughout
        assert done.result_files == held.result_files
        f = c2.files.retrieve(done.result_files[0])
        assert (f.purpose, f.filename) == ("fine-tune-results", "step_metrics.csv")
        header, rows = csv_rows(c2, f.id)
        assert header == ["step", "train_reward_mean", "train_reward_job", "train_loss", "tokens", "step_s"]
        assert [r["step"] for r in rows] == ["1", "2", "3"] and [r["tokens"] for r in rows] == ["100"] * 3
        assert [float(r["train_reward_mean"]) for r in rows] == [0.25, 0.5, 0.75]
        assert [float(r["train_loss"]) for r in rows] == pytest.approx([0.5, 0.25, 0.5 / 3])
        assert f.id in [x.id for x in c2.files.list(purpose="fine-tune-results").data]


def test_bad_transitions_are_400s_and_another_project_gets_404s(async_engine, weights, tmp_path):
    gate = threading.Semaphore(0)
    fake = FakeTrainer(weights, gate=gate)
    app = make_app(async_engine, tmp_path, fake, str(weights))
    with serve(app, async_engine) as server:
        c, rival = client(server, new_key(app)), client(server, new_key(app, "rival"))
        train = upload(c, [rft_line(*x) for x in CAPITALS])
        running = c.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=2))
        assert fake.started.wait(30)
        queued = c.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=1))
        doomed = c.fine_tuning.jobs.create(model=BASE, training_file=train.id, method=method(steps=1))

        def refused(call, state: str, code: str) -> None:
            with pytest.raises(openai.BadRequestError, match=f"is {state} and cannot be") as exc:
                call()
            assert exc.value.body["type"] == "invalid_request_error" and exc.value.body["code"] == code

        # a queued job pauses and resumes; a job that is not paused cannot be resumed
        assert c.fine_tuning.jobs.pause(queued.id).status == "paused"
        assert c.fine_tuning.jobs.resume(queued.id).status == "queued"
        refused(lambda: c.fine_tuning.jobs.resume(queued.id), "queued", "job_not_resumable")
        refused(lambda: c.fine_tuning.jobs.resume(running.id), "running", "job_not_resumable")
        # a paused job can be cancelled; a cancelled one neither pauses nor resumes
        assert c.fine_tuning.jobs.pause(doomed.id).status == "paused"
        assert c.fine_tuning.jobs.cancel(doomed.id).status == "cancelled"
        refused(lambda: c.fine_tuning.jobs.pause(doomed.id), "cancelled", "job_not_pausable")
        refused(lambda: c.fine_tuning.jobs.resume(doomed.id), "cancelled", "job_not_resumable")
        for call in (lambda: rival.fine_tuning.jobs.pause(running.id),
                     lambda: rival.fine_tuning.jobs.resume(running.id)):
            with pytest.raises(openai.NotFoundError):
                call()

        gate.release(10)
        done = wait_for(c, running.id)
        assert done.status == "succeeded"
        refused(lambda: c.fine_tuning.jobs.pause(running.id), "succeeded", "job_not_pausable")
        refused(lambda: c.fine_tuning.jobs.resume(running.id), "succeeded", "job_not_resumable")
        assert wait_for(c, queued.id).status == "succeeded" and fake.calls[1]["resume"] is False  # never started

        # the result file is the job's key's, like the job's other files: another project cannot read it
        [fid] = done.result_files
        assert c.files.content(fid).text.startswith("step,train_reward_mean,")
        for call in (lambda: rival.files.content(fid), lambda: rival.files.retrieve(fid)):
            with pytest.raises(openai.NotFoundError):
                call()
        assert fid not in [f.id for f in rival.files.list().data]
        # the fake trainer's checkpoints hold no weights: listed, but not a model that answers
        name = c.fine_tuning.jobs.checkpoints.list(running.id).data[0].fine_tuned_model_checkpoint
        with pytest.raises(openai.NotFoundError):
            chat(c, name)


# ---- checkpoints as models -------------------------------------------------------------------------------
def test_checkpoint_weights_are_applied_like_the_export(embedded, tmp_path):
    """A LoRA checkpoint merges as export does it (W + B A alpha / r); full weights replace the base's."""
    import torch
    from safetensors.torch import save_file

    from mainspring.api.finetuned_checkpoints import apply
    from mainspring.engine.model import CausalLM
    from mainspring.train.config import LoraSpec
    from mainspring.train.export import hf_state_dict
    from mainspring.train.policy import Policy

    cfg = embedded.config
    policy = Policy(cfg, embedded.state_dict, LoraSpec(r=2, alpha=6.0, targets=["qkv_proj", "down_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in policy.trainable().values():
            p.normal_(0, 0.02)  # B = 0 at init would merge to the base itself
    lora = tmp_path / "lora"
    lora.mkdir()
    save_file(policy.trainable_state(), str(lora / "weights.safetensors"))
    (lora / "meta.json").write_text(json.dumps({"step": 1, "config": {"lora": {"r": 2, "alpha": 6.0}}}))
    merged = apply(embedded, lora).state_dict
    want = hf_state_dict(cfg, policy.merged_weights())
    assert want and all(torch.allclose(merged[n], t, atol=1e-6) for n, t in want.items())
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[name], embedded.state_dict[name])  # the base itself is untouched
    assert merged["model.norm.weight"] is embedded.state_dict["model.norm.weight"]

    model = CausalLM.from_weights(cfg, embedded.state_dict)
    full = tmp_path / "full"
    full.mkdir()
    doubled = {n: p.detach() * 2 for n, p in model.named_parameters() if n.startswith("layers.0.")}
    save_file(doubled, str(full / "weights.safetensors"))
    (full / "meta.json").write_text(json.dumps({"step": 1, "config": {"lora": None}}))
    replaced = apply(embedded, full).state_dict
    for n in ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight"):
        assert torch.equal(replaced[n], embedded.state_dict[n] * 2)
    assert replaced["model.layers.1.mlp.up_proj.weight"] is embedded.state_dict["model.layers.1.mlp.up_proj.weight"]


# ---- the real trainer ------------------------------------------------------------------------------------
def test_a_real_reinforcement_job_on_the_embedded_model(async_engine, weights, tmp_path):
    """One GRPO step of the embedded model (group of 2, 4 new tokens, no eval), exported, served, answering; its
    step-1 checkpoint (the same weights as the export) answers the same, to its project only; its result file."""
    app = make_app(async_engine, tmp_path, None, str(weights))  # None: mainspring.train.trainer.run_training
    with serve(app, async_engine) as server:
        c = client(server, new_key(app))
        train = upload(c, [rft_line(*x) for x in CAPITALS[:4]])
        grader = {"type": "text_similarity", "name": "close", "input": "{{ sample.output_text }}",
                  "reference": "{{ item.answer }}", "evaluation_metric": "fuzzy_match"}
        job = c.fine_tuning.jobs.create(model=BASE, training_file=train.id, suffix="e2e", seed=1,
                                        method=method(grader, steps=1, batch_size=1, group_size=2, max_tokens=4,
                                                      eval=False))
        done = wait_for(c, job.id, timeout=600)
        assert done.status == "succeeded", (done.error, messages(c, job.id))
        assert done.fine_tuned_model == f"ft:{BASE}:e2e:{job.id}" and done.trained_tokens > 0
        log = messages(c, job.id)
        assert "Training started at step 0" in log and "Exported the trained weights" in log  # the trainer's events
        step = next(e for e in c.fine_tuning.jobs.list_events(job.id, limit=100).data if e.type == "metrics")
        assert step.data["step"] == 1 and math.isfinite(step.data["loss"]) and 0 <= step.data["reward"] <= 1
        cps = c.fine_tuning.jobs.checkpoints.list(job.id).data
        assert [cp.step_number for cp in cps] == [1]
        assert done.fine_tuned_model in [m.id for m in c.models.list().data]
        final = chat(c, done.fine_tuned_model)
        assert final.model == done.fine_tuned_model and final.usage.completion_tokens > 0

        ckpt = cps[0].fine_tuned_model_checkpoint
        assert ckpt == f"{done.fine_tuned_model}:ckpt-step-1"
        answer = chat(c, ckpt)
        assert answer.model == ckpt and answer.choices[0].message.content == final.choices[0].message.content
        assert c.models.retrieve(ckpt).id == ckpt and ckpt not in [m.id for m in c.models.list().data]
        with pytest.raises(openai.BadRequestError, match="checkpoint"):  # served, but not a base to train from
            c.fine_tuning.jobs.create(model=ckpt, training_file=train.id, method=method(grader, steps=1))
        rival = client(server, new_key(app, "rival"))
        for call in (lambda: chat(rival, ckpt), lambda: rival.models.retrieve(ckpt)):
            with pytest.raises(openai.NotFoundError):
                call()

        header, rows = csv_rows(c, done.result_files[0])
        assert header[:5] == ["step", "train_reward_mean", "train_reward_job", "train_loss", "kl"]
        assert len(rows) == 1 and rows[0]["step"] == "1" and math.isfinite(float(rows[0]["train_loss"]))
        assert float(rows[0]["train_reward_mean"]) == pytest.approx(step.data["reward"])
