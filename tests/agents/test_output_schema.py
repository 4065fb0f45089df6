"""Typed final answers: an agent's output_schema checks the final answer, one constrained "finalize" step repairs
a refused one, invalid_output fails a run whose model ignores response_format, and the journal carries the
finalize step across a crash and a budget pause. The last test runs the real embedded model."""

from __future__ import annotations

import asyncio
import json

import pytest
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from mainspring.agents.output import canonical_json, response_format
from mainspring.agents.spec import AgentLimits, AgentSpec
from mainspring.models import ChatModel, Completion, ToolCall, Usage
from tests.agents.conftest import TERMINAL, CountTool, drive, make_runtime, spec, wait_status
from tests.scripted_model import ScriptedModel

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"},
                                           "points": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
          "required": ["title", "points"]}
CONSTRAINED = response_format(SCHEMA)


def typed(tools=("count",), **limits) -> AgentSpec:
    return spec(tools=tools, **limits).model_copy(update={"output_schema": SCHEMA})


def run_to_end(tmp_path, db_url, model: ChatModel, agent: AgentSpec, goal: str = "write it up", **options):
    rt = make_runtime(tmp_path, db_url, model, {"count": CountTool(tmp_path / "ledger")})
    rt.put_agent(agent)
    run = rt.start_run(agent.name, goal, **options)
    return rt, drive(rt, lambda: wait_status(rt, run.id, TERMINAL))


def test_a_valid_answer_is_the_result_as_canonical_json_in_one_call(tmp_path, db_url):
    model = ScriptedModel(['{ "points": ["a", "b"],\n  "title": "Zürich" }'])
    rt, done = run_to_end(tmp_path, db_url, model, typed())
    assert (done.status, done.stop_reason, done.step_count) == ("succeeded", "final_answer", 1)
    assert done.result == '{"points":["a","b"],"title":"Zürich"}'
    [call] = model.calls
    assert call["tools"] and call["response_format"] is None  # tools offered: the answer is checked, not forced


def test_a_tool_step_then_a_valid_answer(tmp_path, db_url):
    model = ScriptedModel([ToolCall("c0", "count", "{}"), '{"title": "t", "points": []}'])
    rt, done = run_to_end(tmp_path, db_url, model, typed())
    assert (done.status, done.step_count, done.result) == ("succeeded", 2, '{"points":[],"title":"t"}')
    assert [c["response_format"] for c in model.calls] == [None, None]


def test_a_refused_answer_gets_one_constrained_finalize_step(tmp_path, db_url):
    model = ScriptedModel(["Here it is: title t, no points.", '{"title": "t", "points": ["x"]}'])
    rt, done = run_to_end(tmp_path, db_url, model, typed())
    assert (done.status, done.stop_reason, done.step_count) == ("succeeded", "final_answer", 2)
    assert done.result == '{"points":["x"],"title":"t"}'
    first, final = model.calls
    assert first["tools"] and first["response_format"] is None
    assert final["tools"] is None and final["response_format"] == CONSTRAINED
    ask = final["messages"][-1]
    assert ask["role"] == "user" and "does not meet the required output schema" in ask["content"]
    assert "the answer is not JSON" in ask["content"] and canonical_json(SCHEMA) in ask["content"]
    assert final["messages"][-2] == {"role": "assistant", "content": "Here it is: title t, no points."}
    assert [(s["seq"], s["kind"], s["status"]) for s in rt.steps(done.id)] == [(1, "model", "completed"),
                                                                              (2, "model", "completed")]
    refused = [json.loads(e.data_json) for e in rt.events(done.id) if e.type == "output.refused"]
    assert [r["seq"] for r in refused] == [1]
    kinds = [json.loads(line)["kind"] for line in rt.export_audit(done.id)]
    assert kinds.count("model.step") == 2 and kinds.index("output.refused") < kinds.index("run.finished")
    assert rt.verify_audit(done.id).ok


def test_a_model_that_ignores_response_format_fails_the_run_as_invalid_output(tmp_path, db_url):
    model = ScriptedModel(['{"title": "t"}', '{"title": "t", "points": ["1", "2", "3", "4"]}', "never asked"])
    rt, done = run_to_end(tmp_path, db_url, model, typed())
    assert (done.status, done.stop_reason, done.step_count) == ("failed", "invalid_output", 2)
    assert done.result is None and "$.points" in done.error and "is too long" in done.error
    assert len(model.calls) == 2 and "'points' is a required property" in model.calls[1]["messages"][-1]["content"]


def test_finalize_calls_no_tool_even_if_the_model_asks_for_one(tmp_path, db_url):
    model = ScriptedModel(["no json", ToolCall("c1", "count", "{}"), "never asked"])
    rt, done = run_to_end(tmp_path, db_url, model, typed())
    assert (done.status, done.stop_reason) == ("failed", "invalid_output") and "the answer is empty" in done.error
    assert not (tmp_path / "ledger").exists() and all(not s["tool_calls"] for s in rt.steps(done.id))


def test_an_agent_without_tools_is_constrained_from_its_first_call(tmp_path, db_url):
    model = ScriptedModel(['{"title":"t","points":["a"]}'])
    rt, done = run_to_end(tmp_path, db_url, model, typed(tools=()))
    assert (done.status, done.step_count, done.result) == ("succeeded", 1, '{"points":["a"],"title":"t"}')
    [call] = model.calls
    assert call["tools"] is None and call["response_format"] == CONSTRAINED


def test_a_runs_own_schema_is_the_one_its_answer_must_meet(tmp_path, db_url):
    """A plan task's run carries the task's artifact schema, over its agent's (here: none)."""
    from mainspring.agents import journal

    model = ScriptedModel(['{"title": "t", "points": []}'])
    rt = make_runtime(tmp_path, db_url, model, {})
    row = rt.put_agent(spec(tools=()))
    run = journal.create_run(db_url, row.id, "write it up", output_schema=SCHEMA)
    done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    assert (done.status, done.result) == ("succeeded", '{"points":[],"title":"t"}')
    assert model.calls[0]["response_format"] == CONSTRAINED


def test_an_agent_stored_before_output_schema_existed_keeps_its_version(db_url):
    from mainspring.agents import journal
    from mainspring.agents.tables import AgentRow
    from mainspring.store.db import session

    first = journal.put_agent(db_url, spec())
    with session(db_url) as s:  # as a version written before the field was added
        row = s.get(AgentRow, first.id)
        body = json.loads(row.spec_json)
        del body["output_schema"]
        row.spec_json = json.dumps(body)
    assert journal.put_agent(db_url, spec()).id == first.id
    assert journal.put_agent(db_url, typed()).version == first.version + 1


def test_at_the_step_limit_the_constrained_wrap_up_has_no_second_try(tmp_path, db_url):
    model = ScriptedModel(["not json", "never asked"])
    rt, done = run_to_end(tmp_path, db_url, model, typed(max_steps=1))
    assert (done.status, done.stop_reason, done.step_count) == ("failed", "invalid_output", 1)
    [call] = model.calls
    assert call["response_format"] == CONSTRAINED and call["messages"][-1]["content"].startswith("The step limit")


def test_the_finalize_step_counts_against_the_token_budget(tmp_path, db_url):
    """The refused answer is journaled with the pause; raising the budget resumes into the finalize step."""
    model = ScriptedModel(["not json", '{"title":"t","points":[]}'])
    rt = make_runtime(tmp_path, db_url, model, {"count": CountTool(tmp_path / "ledger")})
    rt.put_agent(typed(max_tokens=8))
    run = rt.start_run("tester", "write it up", token_budget=150)  # step 1 fits; the finalize prompt does not

    async def body():
        paused = await wait_status(rt, run.id, {"paused"})
        assert (paused.pause_reason, paused.step_count, len(model.calls)) == ("budget", 1, 1)
        rt.raise_budget(run.id, token_budget=10_000)
        return await wait_status(rt, run.id, TERMINAL)

    done = drive(rt, body)
    assert (done.status, done.step_count, done.result) == ("succeeded", 2, '{"points":[],"title":"t"}')
    assert model.calls[1]["response_format"] == CONSTRAINED


class RefuseThenHang(ChatModel):
    """TEST-ONLY: answers prose (refused by the schema), then hangs in the finalize call until the worker dies."""

    model = "hang"

    def __init__(self) -> None:
        self.calls = 0

    async def chat(self, messages, **kwargs) -> Completion:
        self.calls += 1
        if self.calls > 1:
            await asyncio.sleep(3600)
        return Completion("prose, not JSON", [], "stop", Usage(10, 0, 3), self.model)

    async def stream(self, messages, **kwargs):  # pragma: no cover - the runtime only calls chat()
        raise NotImplementedError


def test_a_worker_killed_in_the_finalize_call_is_recovered_into_the_finalize_step(tmp_path, db_url):
    a_model = RefuseThenHang()
    a = make_runtime(tmp_path, db_url, a_model, {}, agent_lease_s=0.5)
    a.put_agent(typed(tools=()))
    run = a.start_run("tester", "write it up")

    async def phase_a():
        await a.start()
        while a_model.calls < 2:
            await asyncio.sleep(0.01)
        await a.stop()  # like kill -9 mid-call: the journal says step 2 started, the lease is still A's

    asyncio.run(phase_a())
    b_model = ScriptedModel(['{"title":"t","points":["p"]}'])
    b = make_runtime(tmp_path, db_url, b_model, {}, agent_lease_s=0.5)
    done = drive(b, lambda: wait_status(b, run.id, TERMINAL))
    assert (done.status, done.step_count, done.result) == ("succeeded", 2, '{"points":["p"],"title":"t"}')
    [call] = b_model.calls  # step 1 is not asked again: B goes straight to the finalize step
    assert call["response_format"] == CONSTRAINED and "does not meet" in call["messages"][-1]["content"]
    assert [(s["seq"], s["attempts"]) for s in b.steps(run.id)] == [(1, 1), (2, 2)]
    assert [e.type for e in b.events(run.id)].count("output.refused") == 1 and b.verify_audit(run.id).ok


@pytest.mark.parametrize("schema, where", [({"type": "nope"}, "/type"), ({"required": "title"}, "/required"),
                                           ({"properties": {"n": {"minimum": "zero"}}}, "/properties/n/minimum")])
def test_a_bad_schema_is_refused_with_the_agent(schema, where):
    with pytest.raises(ValidationError, match=f"not a valid JSON Schema: .* \\(at {where}\\)") as caught:
        AgentSpec(name="x", output_schema=schema)
    assert caught.value.errors()[0]["loc"] == ("output_schema",)
    assert AgentSpec(name="x", output_schema=SCHEMA).output_schema == SCHEMA


# ---- the real embedded model ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def async_engine(embedded):
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine

    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=64)))
    yield engine
    engine.close()


@pytest.mark.slow
def test_the_embedded_model_writes_a_typed_answer(tmp_path, db_url, async_engine):
    from mainspring.models import LocalModel

    agent = AgentSpec(name="writer", model="smollm2", tools=[], output_schema=SCHEMA,
                      limits=AgentLimits(max_tokens=256, max_steps=3))
    rt, done = run_to_end(tmp_path, db_url, LocalModel(async_engine), agent,
                          goal="Explain why the sky is blue: a title and up to three short points.")
    assert done.status == "succeeded", done.error
    value = json.loads(done.result)
    assert not list(Draft202012Validator(SCHEMA).iter_errors(value)) and done.result == canonical_json(value)
    assert done.step_count == 1  # constrained from the first call: no finalize step needed
