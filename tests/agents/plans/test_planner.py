"""The planner agent with scripted models: a plan from a goal is stored with how it was made, a refused first
answer is sent back with its error, two refusals store nothing, and the planner is offered only the caller's
project's agents under a schema whose every instance is a DAG. (The real embedded model writes a plan in
tests/api/test_planner_e2e.py.)"""

from __future__ import annotations

import asyncio
import json

import pytest
import typer
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from mainspring.agents.journal import JournalError
from mainspring.agents.plans import planner
from mainspring.agents.plans.cli import plan_cmd, plan_source
from mainspring.agents.plans.spec import PlanError, load_plan, validate_plan
from mainspring.agents.runtime import AgentRuntime
from mainspring.agents.spec import AgentSpec
from mainspring.config import Settings
from mainspring.engine.outputs import Usage
from mainspring.models import ChatModel, Completion, UpstreamError
from mainspring.store.db import session
from mainspring.store.tables import Project
from tests.agents.conftest import make_runtime
from tests.api.test_agent_routes import agent_server, ok


class ScriptedPlanner(ChatModel):
    """TEST-ONLY: answers each planner call with the next scripted text (or raises it, when it is an exception)
    and records the messages and response_format of every one; a task's run (no planner schema) gets "done"."""

    model = "scripted-planner"

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[dict] = []

    async def chat(self, messages, **kwargs) -> Completion:
        if (kwargs.get("response_format") or {}).get("json_schema", {}).get("name") != "plan":
            return Completion("done", [], "stop", Usage(prompt_tokens=5, cached_tokens=0, completion_tokens=1),
                              self.model)
        self.calls.append({"messages": [dict(m) for m in messages], **kwargs})
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Completion(answer, [], "stop", Usage(prompt_tokens=50, cached_tokens=0, completion_tokens=20),
                          self.model)

    async def stream(self, messages, **kwargs):  # pragma: no cover - the planner only calls chat()
        raise NotImplementedError


def plan_text(*tasks: dict) -> str:
    return json.dumps({"tasks": list(tasks)})


def task(id_: str, agent: str, *depends_on: str, prompt: str = "do your part") -> dict:
    return {"id": id_, "agent": agent, "prompt": prompt, "depends_on": list(depends_on)}


GOOD = plan_text(task("t1", "researcher", prompt="Find the facts."),
                 task("t2", "writer", "t1", prompt="Write the note from the facts."))


def runtime_with(tmp_path, db_url, model: ChatModel, *agents: str, **settings) -> AgentRuntime:
    rt = make_runtime(tmp_path, db_url, model, {}, **settings)
    for name in agents:
        rt.put_agent(AgentSpec(name=name, model="any", instructions=f"You are the {name}.", tools=[]))
    return rt


def created_event(rt: AgentRuntime, plan_id: str) -> dict:
    first = rt.plans.events(plan_id)[0]
    assert first.type == "plan.created"
    return json.loads(first.data_json)


def test_a_valid_plan_is_stored_with_planned_by(tmp_path, db_url):
    model = ScriptedPlanner(GOOD)
    rt = runtime_with(tmp_path, db_url, model, "researcher", "writer")
    row = asyncio.run(rt.plans.create_from_goal("a short note about rivers", name="rivers", priority=3))
    assert (row.status, row.goal, row.name, row.priority) == ("running", "a short note about rivers", "rivers", 3)
    tasks = {t.key: t for t in rt.plans.tasks(row.id)}
    assert {k: t.status for k, t in tasks.items()} == {"t1": "ready", "t2": "waiting"}
    spec = rt.plans.get(row.id)
    stored = load_plan(spec.spec_json)
    assert [(t.id, t.agent, t.depends_on) for t in stored.tasks] == [("t1", "researcher", []),
                                                                    ("t2", "writer", ["t1"])]
    # the planner ran on the default model (Settings.model), once
    assert created_event(rt, row.id)["planned_by"] == {"model": "smollm2", "attempts": 1}
    [call] = model.calls
    assert call["response_format"]["type"] == "json_schema"
    assert call["response_format"]["json_schema"]["strict"] is True
    system = call["messages"][0]["content"]
    assert "- researcher: You are the researcher." in system and "- writer: You are the writer." in system
    assert call["messages"][1] == {"role": "user", "content": "Goal: a short note about rivers"}


def test_approve_plan_holds_a_planned_plan_for_review(tmp_path, db_url):
    rt = runtime_with(tmp_path, db_url, ScriptedPlanner(GOOD), "researcher", "writer")
    row = asyncio.run(rt.plans.create_from_goal("g", approve_plan=True, planner_model="big"))
    assert row.status == "awaiting_approval"
    assert created_event(rt, row.id)["planned_by"] == {"model": "big", "attempts": 1}


@pytest.mark.parametrize("bad, expected", [
    (plan_text(task("a", "researcher", "b"), task("b", "writer", "a")), ["not a DAG", "a → b → a"]),
    (plan_text(task("t1", "researcher"), task("t2", "writer", "t7")), ["unknown task 't7'"]),
    (plan_text(task("t1", "editor")), ["unknown agent 'editor'"]),
    ('{"tasks": [{"id": "t1", "agent": "writer"', ["not JSON"]),
    (plan_text({**task("t1", "writer"), "on_failure": "skip"}), ["'on_failure'"]),
])
def test_a_refused_first_answer_is_sent_back_with_its_error(tmp_path, db_url, bad, expected):
    model = ScriptedPlanner(bad, GOOD)
    rt = runtime_with(tmp_path, db_url, model, "researcher", "writer")
    row = asyncio.run(rt.plans.create_from_goal("g"))
    assert created_event(rt, row.id)["planned_by"] == {"model": "smollm2", "attempts": 2}
    assert len(model.calls) == 2
    retry = model.calls[1]["messages"]
    assert retry[:2] == model.calls[0]["messages"]  # the same conversation, then the refused answer and why
    assert retry[2] == {"role": "assistant", "content": bad}
    assert retry[3]["role"] == "user" and all(e in retry[3]["content"] for e in expected), retry[3]["content"]


def test_two_refused_answers_are_a_422_and_nothing_is_stored(tmp_path, db_url):
    cycle = plan_text(task("a", "writer", "b"), task("b", "writer", "a"))
    model = ScriptedPlanner(cycle, cycle)
    rt = runtime_with(tmp_path, db_url, model, "writer")
    with pytest.raises(PlanError) as caught:
        asyncio.run(rt.plans.create_from_goal("g"))
    assert caught.value.status == 422
    assert "the planner's plan is not a DAG" in caught.value.message and "a → b → a" in caught.value.message
    assert "after 2 attempts" in caught.value.message
    assert rt.plans.recent() == [] and len(model.calls) == 2


def test_a_plan_over_max_tasks_is_refused(tmp_path, db_url):
    three = plan_text(task("t1", "writer"), task("t2", "writer"), task("t3", "writer"))
    rt = runtime_with(tmp_path, db_url, ScriptedPlanner(three, three), "writer")
    with pytest.raises(PlanError, match="more than max_tasks") as caught:
        asyncio.run(rt.plans.create_from_goal("g", max_tasks=2))
    assert caught.value.status == 422 and rt.plans.recent() == []


def test_no_agents_is_a_400_and_the_model_is_not_called(tmp_path, db_url):
    model = ScriptedPlanner(GOOD)
    rt = runtime_with(tmp_path, db_url, model)
    with pytest.raises(PlanError, match="create an agent first") as caught:
        asyncio.run(rt.plans.create_from_goal("g"))
    assert caught.value.status == 400 and model.calls == []


def test_a_blank_goal_is_a_400_and_the_model_is_not_called(tmp_path, db_url):
    model = ScriptedPlanner(GOOD)
    rt = runtime_with(tmp_path, db_url, model, "writer")
    with pytest.raises(PlanError) as caught:
        asyncio.run(rt.plans.create_from_goal("  "))
    assert (caught.value.status, caught.value.param) == (400, "goal") and model.calls == []


def test_an_unknown_planner_model_is_a_400(tmp_path, db_url):
    model = ScriptedPlanner(plan_text(task("t1", "writer")))

    def resolve(name: str, project=None) -> ChatModel:
        if name != "known":
            raise JournalError(f"unknown model {name!r} for an agent", status=400)
        return model

    rt = AgentRuntime(Settings(data_dir=tmp_path, model="known"), models=resolve, tools={}, db_url=db_url)
    rt.put_agent(AgentSpec(name="writer", model="known", tools=[]))
    with pytest.raises(PlanError) as caught:
        asyncio.run(rt.plans.create_from_goal("g", planner_model="nope"))
    assert (caught.value.status, caught.value.param) == (400, "planner_model") and model.calls == []
    row = asyncio.run(rt.plans.create_from_goal("g"))  # the default: Settings.model
    assert created_event(rt, row.id)["planned_by"]["model"] == "known"


def test_a_model_failure_is_not_retried_and_says_so(tmp_path, db_url):
    model = ScriptedPlanner(UpstreamError(500, "overloaded"), GOOD)
    rt = runtime_with(tmp_path, db_url, model, "writer", "researcher")
    with pytest.raises(PlanError, match="overloaded") as caught:
        asyncio.run(rt.plans.create_from_goal("g"))
    assert caught.value.status == 502 and len(model.calls) == 1 and rt.plans.recent() == []


def test_a_stopped_engine_as_planner_is_a_503_to_retry_after_a_restart(tmp_path, db_url, embedded):
    from mainspring.models import LocalModel
    from tests.engine_faults import stopped_engine

    engine = stopped_engine(embedded)
    try:
        rt = runtime_with(tmp_path, db_url, LocalModel(engine), "writer", "researcher")
        with pytest.raises(PlanError, match="not serving") as caught:
            asyncio.run(rt.plans.create_from_goal("g"))
    finally:
        engine.close()
    assert caught.value.status == 503 and rt.plans.recent() == []


def test_the_planner_is_offered_only_the_callers_projects_agents(tmp_path, db_url):
    with session(db_url) as s:
        mine, theirs = Project(name="mine"), Project(name="theirs")
        s.add_all([mine, theirs])
    model = ScriptedPlanner(plan_text(task("t1", "secret-agent")), plan_text(task("t1", "secret-agent")))
    rt = make_runtime(tmp_path, db_url, model, {})
    ours, other = rt.scoped(mine.id), rt.scoped(theirs.id)
    ours.put_agent(AgentSpec(name="writer", model="m", tools=[]))
    ours.put_agent(AgentSpec(name="researcher", model="m", tools=[]))
    other.put_agent(AgentSpec(name="secret-agent", model="m", instructions="Knows the other project's secrets.",
                              tools=[]))
    with pytest.raises(PlanError, match="unknown agent 'secret-agent'"):  # named anyway: refused, not stored
        asyncio.run(ours.plans.create_from_goal("g"))
    for call in model.calls:
        schema = call["response_format"]["json_schema"]["schema"]
        items = schema["properties"]["tasks"]["prefixItems"]
        assert [item["properties"]["agent"]["enum"] for item in items] == [["researcher", "writer"]] * len(items)
        assert "secret" not in call["messages"][0]["content"]
    assert ours.plans.recent() == [] and other.plans.recent() == []


# ---- the schema itself -----------------------------------------------------------------------------------------
def test_every_instance_of_the_planner_schema_is_a_dag_of_known_agents():
    schema = planner.planner_schema(["writer", "researcher"], 3)
    valid = Draft202012Validator(schema)
    Draft202012Validator.check_schema(schema)
    ok = {"tasks": [task("t1", "researcher"), task("t2", "writer", "t1"), task("t3", "writer", "t1", "t2")]}
    assert valid.is_valid(ok)
    validate_plan(load_plan({"goal": "g", **ok}))
    refused = [
        {"tasks": [task("t1", "researcher", "t2"), task("t2", "writer", "t1")]},  # a cycle: t1 may depend on none
        {"tasks": [task("t1", "writer"), task("t2", "writer", "t2")]},  # on itself
        {"tasks": [task("t1", "writer"), task("t1", "writer")]},  # a repeated id
        {"tasks": [task("a", "writer")]},  # an id out of place
        {"tasks": [task("t1", "editor")]},  # an agent not offered
        {"tasks": [task(f"t{i}", "writer") for i in range(1, 5)]},  # more than max_tasks
        {"tasks": []},
        {"tasks": [{**task("t1", "writer"), "map_over": "t1"}]},  # no other fields
        {"tasks": [task("t1", "writer", prompt="")]},
    ]
    for doc in refused:
        assert not valid.is_valid(doc), doc


def test_the_schema_needs_agents_and_a_sane_task_count():
    with pytest.raises(PlanError, match="create an agent first"):
        planner.planner_schema([], 4)
    with pytest.raises(PlanError) as caught:
        planner.planner_schema(["writer"], planner.MAX_TASKS + 1)
    assert caught.value.param == "max_tasks"


def test_a_dependency_named_twice_is_one_edge():
    spec = planner.parse_plan(plan_text(task("t1", "w"), task("t2", "w", "t1", "t1")), "g", {"w"}, 4)
    assert spec.tasks[1].depends_on == ["t1"]


# ---- the CLI: `mainspring plan "goal"` -------------------------------------------------------------------------
def test_a_plan_file_or_plan_text_is_a_plan_anything_else_a_goal(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text("goal: g\ntasks:\n  - {id: a, agent: w, prompt: x}\n")
    assert [t.id for t in plan_source("p.yaml").tasks] == ["a"]
    assert plan_source('{"goal": "g", "tasks": [{"id": "b", "agent": "w", "prompt": "x"}]}').tasks[0].id == "b"
    assert plan_source("goal: g\ntasks:\n  - {id: c, agent: w, prompt: x}").tasks[0].id == "c"
    for goal in ("a short note about rivers", "Summary: the rivers of Europe", "[urgent] plan.yaml cleanup",
                 "x" * 5000):
        assert plan_source(goal) is None, goal
    with pytest.raises(typer.Exit) as caught:  # a file name that is no file: an error, not a goal
        plan_source("missing.yaml")
    assert caught.value.exit_code == 2


def plan_cli(monkeypatch, url: str, *args: str):
    monkeypatch.setenv("MAINSPRING_HOST", "127.0.0.1")
    monkeypatch.setenv("MAINSPRING_PORT", url.rsplit(":", 1)[1])
    cli = typer.Typer()
    cli.command("plan")(plan_cmd)
    cli.command("noop")(lambda: None)  # two commands: `plan` stays a subcommand
    r = CliRunner().invoke(cli, ["plan", *args])
    assert not (r.exception and not isinstance(r.exception, SystemExit)), r.exception  # no traceback
    return r


def test_the_cli_plans_a_goal_and_a_refused_plan_exits_2(tmp_path, monkeypatch):
    cycle = plan_text(task("a", "writer", "b"), task("b", "writer", "a"))
    model = ScriptedPlanner(plan_text(task("t1", "writer", prompt="Write it.")), cycle, cycle)
    with agent_server(tmp_path, models=lambda name, project=None: model, tools={}) as srv:
        ok(srv.http.post("/v1/agents", json={"name": "writer", "model": "m", "tools": []}), 201)
        r = plan_cli(monkeypatch, srv.url, "a short note about rivers", "--planner-model", "m", "--max-tasks", "2")
        assert r.exit_code == 0, r.output
        assert "running" in r.stdout and "t1" in r.stdout and "writer" in r.stdout
        [created] = ok(srv.http.get("/v1/plans"))["data"]
        assert created["goal"] == "a short note about rivers"
        schema = model.calls[0]["response_format"]["json_schema"]["schema"]
        assert schema["properties"]["tasks"]["maxItems"] == 2
        r = plan_cli(monkeypatch, srv.url, "another goal")
        assert r.exit_code == 2 and "not a DAG" in r.stderr and "HTTP 422" in r.stderr, r.output
        assert len(ok(srv.http.get("/v1/plans"))["data"]) == 1
        r = plan_cli(monkeypatch, srv.url, str(tmp_path / "p.json"), "--max-tasks", "2")
        assert r.exit_code == 2 and "no plan file" in r.stderr
