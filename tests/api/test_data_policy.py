"""Project data policy at the API (api/project_policy.py): a local-only project's key is refused an upstream model
(chat, completions, agent runs, plans, schedules and resumes; the agents' model resolver again later; the models
list leaves them out), a no-training project's key is
refused fine-tuning jobs, and the retention sweeper runs in the server. A real server, the openai SDK in front, a
loopback fake upstream behind."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import httpx
import openai
import pytest
import yaml
from fastapi import FastAPI, Request

from mainspring.agents.journal import JournalError
from mainspring.api.agent_models import AppModels
from mainspring.api.upstream import Upstreams, UpstreamsFile
from mainspring.billing import ledger
from mainspring.billing.keys import create_key
from mainspring.billing.prices import DEFAULT_SHEET
from mainspring.store.data_policy import set_policy
from mainspring.store.db import session
from mainspring.store.tables import FineTuningJobRow, ResponseRow

from .conftest import serve

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hello."}]
PRICES = {"input": "2.00", "cached_input": "0.50", "output": "8.00"}
USAGE = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}


class FakeUpstream:
    """An OpenAI-compatible upstream that records every request it gets."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat)
        self.app.post("/v1/completions")(self.completions)

    async def chat(self, request: Request) -> dict:
        body = await request.json()
        self.calls.append(body)
        return {"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": USAGE}

    async def completions(self, request: Request) -> dict:
        body = await request.json()
        self.calls.append(body)
        return {"id": "cmpl-up", "object": "text_completion", "created": 1, "model": body["model"],
                "choices": [{"index": 0, "text": "hi", "finish_reason": "stop", "logprobs": None}], "usage": USAGE}


@pytest.fixture(scope="module")
def stack(async_engine, tmp_path_factory):
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    tmp = tmp_path_factory.mktemp("data-policy")
    fake = FakeUpstream()
    with serve(fake.app, None) as up:
        sheet = yaml.safe_load(DEFAULT_SHEET.read_text())
        sheet["version"] = "test-policy.1"
        sheet["models"]["remote-chat"] = {"context_window": 128000, "max_output_tokens": 1024,
                                          "tiers": {"standard": PRICES}, "source": "test"}
        (tmp / "prices.yaml").write_text(yaml.safe_dump(sheet))
        (tmp / "upstreams.yaml").write_text(yaml.safe_dump({"upstreams": [
            {"name": "fake", "base_url": up.openai_url, "models": ["remote-chat"]}]}))
        settings = Settings(database_url=f"sqlite:///{tmp}/db.sqlite", prices_file=str(tmp / "prices.yaml"),
                            upstreams_file=str(tmp / "upstreams.yaml"), data_dir=tmp,
                            serve_agent_worker=False)  # runs are created, never driven: nothing reaches a model
        app = create_app(settings, engine=async_engine)
        with serve(app, async_engine) as srv:
            yield srv, fake, app


def _key(app, project: str, **policy) -> tuple[str, int]:
    with session(app.state.economics.db) as s:
        made = create_key(s, project)
        if policy:
            set_policy(s, made.key.project_id, **policy)
        return made.secret, made.key.project_id


def oai(srv, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.openai_url, api_key=secret, max_retries=0, timeout=60)


def http(srv, secret: str) -> httpx.Client:
    return httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {secret}"}, timeout=60)


def _is_local_only_refusal(resp: httpx.Response, param: str | None = None) -> None:
    assert resp.status_code == 403, resp.text
    err = resp.json()["error"]
    assert err["type"] == "permission_error" and err["code"] == "local_only_project", err
    assert "local-only" in err["message"] and "remote-chat" in err["message"]
    if param is not None:
        assert err["param"] == param


def test_a_local_only_project_is_refused_an_upstream_model(stack):
    srv, fake, app = stack
    secret, pid = _key(app, "sealed", local_only=True)
    before = len(fake.calls)
    with pytest.raises(openai.PermissionDeniedError) as exc:
        oai(srv, secret).chat.completions.create(model="remote-chat", messages=HI, max_tokens=5)
    err = exc.value.response.json()["error"]
    assert err["code"] == "local_only_project" and err["param"] == "model"
    with pytest.raises(openai.PermissionDeniedError):
        oai(srv, secret).chat.completions.create(model="remote-chat", messages=HI, max_tokens=5, stream=True)
    with pytest.raises(openai.PermissionDeniedError):
        oai(srv, secret).completions.create(model="remote-chat", prompt="Say hello.", max_tokens=5)
    assert len(fake.calls) == before  # nothing of the project's reached the upstream
    with session(app.state.economics.db, readonly=True) as s:
        assert [e for e in ledger.entries(s) if e.project_id == pid] == []  # refused before anything is reserved
    # the embedded model still serves the project
    ok = oai(srv, secret).chat.completions.create(model="SmolLM2-135M-Instruct", messages=HI, max_tokens=3)
    assert ok.choices[0].message is not None


def test_another_project_still_reaches_the_upstream(stack):
    srv, fake, app = stack
    secret, _ = _key(app, "open_proj")
    before = len(fake.calls)
    out = oai(srv, secret).chat.completions.create(model="remote-chat", messages=HI, max_tokens=5)
    assert out.choices[0].message.content == "hi" and len(fake.calls) == before + 1


def test_local_only_is_enforced_from_the_next_request_after_it_is_set(stack):
    srv, fake, app = stack
    secret, pid = _key(app, "turns_sealed")
    oai(srv, secret).chat.completions.create(model="remote-chat", messages=HI, max_tokens=5)
    with session(app.state.economics.db) as s:
        set_policy(s, pid, local_only=True)
    with pytest.raises(openai.PermissionDeniedError):
        oai(srv, secret).chat.completions.create(model="remote-chat", messages=HI, max_tokens=5)


def test_agent_runs_and_plans_naming_an_upstream_model_are_refused_at_creation(stack):
    srv, fake, app = stack
    secret, pid = _key(app, "sealed_agents")
    with http(srv, secret) as c:
        # made while the project could use upstreams; then the project goes local-only
        r = c.post("/v1/agents", json={"name": "remote", "model": "remote-chat", "instructions": "Test."})
        assert r.status_code == 201, r.text
        r = c.post("/v1/agents", json={"name": "local", "model": "SmolLM2-135M-Instruct", "instructions": "Test."})
        assert r.status_code == 201, r.text
        with session(app.state.economics.db) as s:
            set_policy(s, pid, local_only=True)
        _is_local_only_refusal(c.post("/v1/runs", json={"agent": "remote", "goal": "hi"}), "agent")
        assert c.post("/v1/runs", json={"agent": "local", "goal": "hi"}).status_code == 201
        # a new agent on an upstream model: refused by the runtime's model resolver
        r = c.post("/v1/agents", json={"name": "remote2", "model": "remote-chat", "instructions": "Test."})
        assert r.status_code == 403 and "local-only" in r.json()["error"]["message"], r.text
        _is_local_only_refusal(c.post("/v1/plans", json={"goal": "do it", "planner_model": "remote-chat"}),
                               "planner_model")
        _is_local_only_refusal(c.post("/v1/plans", json={"goal": "g", "tasks": [
            {"id": "a", "agent": "remote", "prompt": "hi"}]}), "tasks")
        # schedules of either (a fire's runs would reach the upstream later)
        cron = {"name": "nightly", "cron": "0 3 * * *"}
        _is_local_only_refusal(c.post("/v1/schedules", json={**cron, "agent": "remote", "goal": "hi"}), "agent")
        _is_local_only_refusal(c.post("/v1/schedules", json={**cron, "plan": {"goal": "g", "tasks": [
            {"id": "a", "agent": "remote", "prompt": "hi"}]}}), "plan")
        assert c.post("/v1/schedules", json={**cron, "agent": "local", "goal": "hi"}).status_code == 201


def test_the_agents_model_resolver_checks_the_policy_on_every_resolution(stack):
    """Defence in depth: a run created before its project went local-only is refused at its next step."""
    srv, fake, app = stack
    _, pid = _key(app, "sealed_later")
    ups = Upstreams(UpstreamsFile.model_validate({"upstreams": [
        {"name": "fake", "base_url": "http://127.0.0.1:9/v1", "models": ["remote-chat"]}]}))
    resolve = AppModels(engine=None, upstreams=ups, finetuned=None, configured_model="smollm2",
                        policy_db=app.state.economics.db)
    assert resolve("remote-chat", pid).model == "remote-chat"  # allowed (and cached)
    with session(app.state.economics.db) as s:
        set_policy(s, pid, local_only=True)
    with pytest.raises(JournalError) as exc:
        resolve("remote-chat", pid)  # the cache does not bypass the policy
    assert exc.value.status == 403 and "local-only" in str(exc.value)
    assert resolve("remote-chat", None).model == "remote-chat"  # no project: the default policy


def test_a_no_training_project_is_refused_fine_tuning_jobs(stack):
    srv, fake, app = stack
    secret, _ = _key(app, "no_train", training_allowed=False)
    with pytest.raises(openai.PermissionDeniedError) as exc:
        oai(srv, secret).fine_tuning.jobs.create(model="SmolLM2-135M-Instruct", training_file="file-abc")
    err = exc.value.response.json()["error"]
    assert err["code"] == "training_not_allowed" and "never used for training" in err["message"]
    assert oai(srv, secret).fine_tuning.jobs.list().data == []
    # a project that allows training gets past the policy (to the file check: the file does not exist)
    other, _ = _key(app, "may_train")
    with pytest.raises(openai.BadRequestError):
        oai(srv, other).fine_tuning.jobs.create(model="SmolLM2-135M-Instruct", training_file="file-abc",
                                                method={"type": "reinforcement", "reinforcement": {
                                                    "grader": {"type": "string_check", "name": "g",
                                                               "input": "{{sample.output_text}}",
                                                               "reference": "x", "operation": "eq"}}})


def test_a_paused_job_is_not_resumed_once_its_project_is_no_training(stack):
    srv, fake, app = stack
    secret, pid = _key(app, "paused_then_sealed")
    with session(app.state.economics.db) as s:  # paused while the project allowed training
        s.add(FineTuningJobRow(id="ftjob-paused", project_id=pid, model="SmolLM2-135M-Instruct",
                               training_file="file-x", seed=1, status="paused", method_json="{}", config_json="{}"))
        set_policy(s, pid, training_allowed=False)
    with pytest.raises(openai.PermissionDeniedError) as exc:
        oai(srv, secret).fine_tuning.jobs.resume("ftjob-paused")
    assert exc.value.response.json()["error"]["code"] == "training_not_allowed"
    with session(app.state.economics.db, readonly=True) as s:
        assert s.get(FineTuningJobRow, "ftjob-paused").status == "paused"
    with pytest.raises(openai.NotFoundError):  # another's job, or none: still a 404
        oai(srv, secret).fine_tuning.jobs.resume("ftjob-nope")


def test_the_server_runs_the_retention_sweeper(stack):
    srv, fake, app = stack
    _, pid = _key(app, "short_memory", retention_days=1)
    _, keep_pid = _key(app, "long_memory")
    old = datetime.now(timezone.utc) - timedelta(days=3)
    with session(app.state.economics.db) as s:
        for rid, project in (("resp_swept", pid), ("resp_kept", keep_pid)):
            s.add(ResponseRow(id=rid, project_id=project, model="m", status="completed", request_json="{}",
                              input_json="[]", output_json="[]", usage_json="{}", created_at=old))
    task = app.state.batch_runner.retention  # started with the server
    assert task is not None
    asyncio.run(task.run_once())  # (its own hourly pass would do the same, only later)
    with session(app.state.economics.db, readonly=True) as s:
        assert s.get(ResponseRow, "resp_swept") is None and s.get(ResponseRow, "resp_kept") is not None


def test_a_local_only_project_sees_no_upstream_model_in_the_list(stack):
    srv, fake, app = stack
    sealed, _ = _key(app, "sealed_models", local_only=True)
    other, _ = _key(app, "open_models")
    assert "remote-chat" not in {m.id for m in oai(srv, sealed).models.list()}
    assert "SmolLM2-135M-Instruct" in {m.id for m in oai(srv, sealed).models.list()}
    with pytest.raises(openai.PermissionDeniedError):
        oai(srv, sealed).models.retrieve("remote-chat")
    assert "remote-chat" in {m.id for m in oai(srv, other).models.list()}
    assert oai(srv, other).models.retrieve("remote-chat").owned_by == "fake"


def test_resuming_a_run_on_an_upstream_model_is_refused_once_the_project_is_local_only(stack):
    srv, fake, app = stack
    secret, pid = _key(app, "sealed_resume")
    with http(srv, secret) as c:
        for name, model in (("remote", "remote-chat"), ("local", "SmolLM2-135M-Instruct")):
            r = c.post("/v1/agents", json={"name": name, "model": model, "instructions": "Test."})
            assert r.status_code == 201, r.text
        remote = c.post("/v1/runs", json={"agent": "remote", "goal": "hi"}).json()["id"]
        local = c.post("/v1/runs", json={"agent": "local", "goal": "hi"}).json()["id"]
        assert c.post(f"/v1/runs/{remote}/resume").status_code != 403  # allowed so far (a queued run: 409)
        with session(app.state.economics.db) as s:
            set_policy(s, pid, local_only=True)
        _is_local_only_refusal(c.post(f"/v1/runs/{remote}/resume"))
        assert c.post(f"/v1/runs/{local}/resume").status_code != 403
        assert c.post("/v1/runs/run_nope/resume").status_code == 404  # the action's own answer
