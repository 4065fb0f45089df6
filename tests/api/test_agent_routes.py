"""The agent runtime's REST API on a real server: agents, runs, the resumable SSE event stream, approvals
(approve / reject / edit), cancel, pause and resume, budget pause → raise → resume, artifacts, audit, errors and
authentication.

The runs here are driven by a scripted policy model and test-only tools (no model is loaded, the engine is a
stand-in); the last test runs an agent on the real embedded model through the server's own model resolver.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from mainspring.agents.tools.base import Artifact, ToolResult
from mainspring.engine.outputs import Usage
from mainspring.models import ChatModel, Completion, ToolCall
from mainspring.store.db import dispose_engines

from .conftest import serve

PRICED_MODEL = "SmolLM2-135M-Instruct"  # priced by the built-in sheet: 0.10 in / 0.40 out per 1M tokens
STEP_USAGE = Usage(prompt_tokens=100, cached_tokens=0, completion_tokens=10)
STEP_COST_U = 14  # 100 × 0.10 + 10 × 0.40 micro-USD
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")


class PolicyModel(ChatModel):
    """TEST-ONLY policy: while no tool result is in the conversation and tools are offered, it calls the first
    tool with {"text": <goal>}; then it answers "done: <last tool result>". Every step uses STEP_USAGE."""

    model = "policy"

    async def chat(self, messages: list[dict], *, tools: list[dict] | None = None, **kwargs: Any) -> Completion:
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if tools and not results:
            name = tools[0]["function"]["name"]
            call = ToolCall("c1", name, json.dumps({"text": messages[1]["content"]}))
            return Completion(f"calling {name}", [call], "tool_calls", STEP_USAGE, self.model)
        return Completion(f"done: {results[-1] if results else 'no tool'}", [], "stop", STEP_USAGE, self.model)

    def stream(self, messages, **kwargs):  # pragma: no cover - the runtime only calls chat()
        raise NotImplementedError


@dataclass
class EchoTool:
    """TEST-ONLY tool: answers with its arguments and records every call. `first_delay_s` makes its first call
    slow (to cut it mid-flight); `artifact` attaches a text file to each result."""

    name: str
    requires_approval: bool = False
    first_delay_s: float = 0.0
    artifact: bool = False
    description: str = "echo the text back"
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {"text": {"type": "string"}}})
    idempotent: bool = True
    timeout_s: float = 60
    retries: int = 0
    calls: list[dict] = field(default_factory=list)

    async def call(self, args: dict, ctx) -> ToolResult:
        self.calls.append(args)
        if self.first_delay_s and len(self.calls) == 1:
            await asyncio.sleep(self.first_delay_s)
        result = ToolResult(f"{self.name} ran with {json.dumps(args, sort_keys=True)}")
        if self.artifact:
            result.artifacts.append(Artifact("report.txt", f"report of {args['text']}\n".encode(), "text/plain"))
        return result


def test_tools() -> dict[str, EchoTool]:
    return {"echo": EchoTool("echo"), "guarded": EchoTool("guarded", requires_approval=True),
            "slow": EchoTool("slow", first_delay_s=30), "report": EchoTool("report", artifact=True)}


test_tools.__test__ = False  # a factory, not a test


class NoEngine:
    """Stands in for the inference engine: these servers' agents use the policy model, so nothing loads."""


@dataclass
class AgentServer:
    url: str
    app: Any
    tools: dict[str, EchoTool]
    http: httpx.Client


@contextmanager
def agent_server(data_dir: Path, engine: Any = None, models: Any = "policy", tools: Any = "test",
                 **settings: Any) -> Iterator[AgentServer]:
    """A real server on its own database whose agents use PolicyModel and the test tools (by default)."""
    from mainspring.api.app import create_app
    from mainspring.config import Settings

    policy = PolicyModel()
    tools = test_tools() if tools == "test" else tools
    app = create_app(Settings(data_dir=data_dir, database_url=f"sqlite:///{data_dir}/db.sqlite", **settings),
                     engine=engine or NoEngine(),
                     agent_models=(lambda name, project=None: policy) if models == "policy" else models,
                     agent_tools=tools)
    try:
        with serve(app, engine) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            yield AgentServer(srv.url, app, tools, http)
    finally:
        dispose_engines()


@pytest.fixture
def srv(tmp_path) -> Iterator[AgentServer]:
    with agent_server(tmp_path) as s:
        yield s


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json()


def make_agent(s: AgentServer, name: str, tools: list[str], **limits: Any) -> dict:
    return ok(s.http.post("/v1/agents", json={"name": name, "model": PRICED_MODEL, "instructions": "Test agent.",
                                              "tools": tools, "limits": {"max_tokens": 16, **limits}}), 201)


def start_run(s: AgentServer, agent: str, goal: str = "say hi", **options: Any) -> dict:
    return ok(s.http.post("/v1/runs", json={"agent": agent, "goal": goal, **options}), 201)


def wait_status(s: AgentServer, run_id: str, statuses: tuple[str, ...], timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = ok(s.http.get(f"/v1/runs/{run_id}"))
        if run["status"] in statuses:
            return run
        assert time.monotonic() < deadline, f"run {run_id} is {run['status']}, not {statuses}: {run}"
        time.sleep(0.05)


def all_events(s: AgentServer, run_id: str) -> list[dict]:
    return ok(s.http.get(f"/v1/runs/{run_id}/events", params={"limit": 500}))["data"]


def sse_frames(lines: Iterator[str], until: str | None = None, within_s: float = 20) -> list[dict]:
    """Parse SSE frames (id / event / data) until the stream ends, or through the first event of type `until`;
    fails if that takes longer than `within_s` (the server pings an idle stream, so this is checked)."""
    frames, frame, deadline = [], {}, time.monotonic() + within_s
    for line in lines:
        assert time.monotonic() < deadline, f"the stream did not end within {within_s}s: {frames[-3:]}"
        if line == "":
            if "data" in frame:
                frames.append(frame)
                if frame["event"] == until:
                    return frames
            frame = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            frame[key] = value
    return frames


def error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return body


# ---- agents and a run end to end -------------------------------------------------------------------------
def test_agent_versions_and_a_run_to_its_answer(srv):
    first = make_agent(srv, "helper", ["echo"])
    assert (first["id"], first["version"], first["spec"]["tools"]) == ("agent_helper_v1", 1, ["echo"])
    same = srv.http.post("/v1/agents", json=first["spec"])
    assert same.status_code == 200 and same.json()["id"] == "agent_helper_v1"  # unchanged spec: no new version
    second = make_agent(srv, "helper", ["echo", "report"])
    assert second["version"] == 2
    assert ok(srv.http.get("/v1/agents/helper"))["id"] == "agent_helper_v2"  # a name means its newest version
    assert ok(srv.http.get("/v1/agents/agent_helper_v1"))["spec"]["tools"] == ["echo"]
    assert [a["id"] for a in ok(srv.http.get("/v1/agents"))["data"]] == ["agent_helper_v1", "agent_helper_v2"]

    thread = ok(srv.http.post("/v1/threads"), 201)
    run = start_run(srv, "agent_helper_v1", "find the answer", thread_id=thread["id"], priority=5)
    assert (run["status"], run["thread_id"], run["agent_id"], run["priority"]) == (
        "queued", thread["id"], "agent_helper_v1", 5)
    done = wait_status(srv, run["id"], TERMINAL)
    assert done["status"] == "succeeded" and done["stop_reason"] == "final_answer"
    assert done["result"] == 'done: echo ran with {"text": "find the answer"}'
    assert done["step_count"] == 2 and done["pending_interrupts"] == []
    assert done["usage"] == {"prompt_tokens": 200, "completion_tokens": 20, "cached_tokens": 0, "total_tokens": 220}
    assert (done["cost_u"], done["cost_usd"]) == (2 * STEP_COST_U, "0.000028")
    assert done["created_at"] <= done["started_at"] <= done["finished_at"]
    assert srv.tools["echo"].calls == [{"text": "find the answer"}]

    steps = ok(srv.http.get(f"/v1/runs/{run['id']}/steps"))["data"]
    assert [(st["seq"], st["kind"], st["status"]) for st in steps] == [(1, "model", "completed"),
                                                                      (2, "model", "completed")]
    (call,) = steps[0]["tool_calls"]
    assert (call["name"], json.loads(call["arguments"]), call["status"]) == ("echo", {"text": "find the answer"},
                                                                              "completed")
    assert ok(srv.http.get("/v1/runs", params={"status": "succeeded"}))["data"][0]["id"] == run["id"]
    assert ok(srv.http.get("/v1/runs", params={"status": "queued"}))["data"] == []


# ---- the event stream ------------------------------------------------------------------------------------
def test_sse_stream_waits_for_approval_and_resumes_after_last_event_id(srv):
    make_agent(srv, "gate", ["guarded"])
    run = start_run(srv, "gate", "open the door")
    url = f"/v1/runs/{run['id']}/events"
    with srv.http.stream("GET", url, headers={"Accept": "text/event-stream"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        first = sse_frames(r.iter_lines(), until="interrupt.created")
    assert first[0]["event"] == "run.created" and first[-1]["event"] == "interrupt.created"
    for f in first:  # the SSE id and event name are the event's own
        data = json.loads(f["data"])
        assert (int(f["id"]), f["event"], data["run_id"]) == (data["id"], data["type"], run["id"])
    interrupt_id = json.loads(first[-1]["data"])["data"]["interrupt_id"]
    assert wait_status(srv, run["id"], ("waiting_approval",))["pending_interrupts"] == [interrupt_id]

    ok(srv.http.post(f"/v1/interrupts/{interrupt_id}/resolve", json={"decision": "approve"}))
    last_seen = first[-1]["id"]
    with srv.http.stream("GET", url, headers={"Accept": "text/event-stream", "Last-Event-ID": last_seen}) as r:
        rest = sse_frames(r.iter_lines())  # returns only because the server ends the stream after the run ends
    assert rest[-1]["event"] == "run.finished" and json.loads(rest[-1]["data"])["data"]["status"] == "succeeded"
    assert min(int(f["id"]) for f in rest) > int(last_seen)
    assert [int(f["id"]) for f in first + rest] == [e["id"] for e in all_events(srv, run["id"])]  # none lost or twice

    again = srv.http.get(url, params={"stream": "true", "after": rest[-3]["id"]})  # ?after= works like the header
    assert [f["id"] for f in sse_frames(iter(again.text.splitlines()))] == [f["id"] for f in rest[-2:]]


def test_events_json_pages(srv):
    make_agent(srv, "pager", ["echo"])
    run = start_run(srv, "pager")
    wait_status(srv, run["id"], TERMINAL)
    events = all_events(srv, run["id"])
    assert events[0]["type"] == "run.created" and events[-1]["type"] == "run.finished"
    page1 = ok(srv.http.get(f"/v1/runs/{run['id']}/events", params={"limit": 2}))
    assert [e["id"] for e in page1["data"]] == [e["id"] for e in events[:2]] and page1["has_more"] is True
    page2 = ok(srv.http.get(f"/v1/runs/{run['id']}/events", params={"limit": 500, "after": page1["last_id"]}))
    assert [e["id"] for e in page2["data"]] == [e["id"] for e in events[2:]] and page2["has_more"] is False


# ---- approvals -------------------------------------------------------------------------------------------
def pending_interrupt(s: AgentServer, run_id: str) -> dict:
    wait_status(s, run_id, ("waiting_approval",))
    (interrupt,) = ok(s.http.get("/v1/interrupts", params={"run_id": run_id}))["data"]
    return interrupt


def test_approve_runs_the_call_as_asked(srv):
    make_agent(srv, "gate", ["guarded"])
    run = start_run(srv, "gate", "ship it")
    i = pending_interrupt(srv, run["id"])
    assert (i["status"], i["kind"], i["tool_call"]["name"]) == ("pending", "approval", "guarded")
    assert json.loads(i["tool_call"]["arguments"]) == {"text": "ship it"}
    assert srv.tools["guarded"].calls == []  # nothing ran before the decision
    resolved = ok(srv.http.post(f"/v1/interrupts/{i['id']}/resolve",
                                json={"decision": "approve", "actor": "alice", "comment": "fine"}))
    assert (resolved["status"], resolved["actor"], resolved["comment"]) == ("approved", "alice", "fine")
    done = wait_status(srv, run["id"], TERMINAL)
    assert done["result"] == 'done: guarded ran with {"text": "ship it"}'
    assert srv.tools["guarded"].calls == [{"text": "ship it"}]
    again = srv.http.post(f"/v1/interrupts/{i['id']}/resolve", json={"decision": "reject"})
    assert "already approved" in error(again, 409)["message"]
    assert ok(srv.http.get("/v1/interrupts", params={"run_id": run["id"]}))["data"] == []  # none pending
    (past,) = ok(srv.http.get("/v1/interrupts", params={"run_id": run["id"], "status": "all"}))["data"]
    assert past["status"] == "approved"


def test_edit_runs_the_call_with_new_arguments(srv):
    make_agent(srv, "gate", ["guarded"])
    run = start_run(srv, "gate", "delete everything")
    i = pending_interrupt(srv, run["id"])
    no_args = srv.http.post(f"/v1/interrupts/{i['id']}/resolve", json={"decision": "edit"})
    assert error(no_args, 400)["param"] == "arguments"
    resolved = ok(srv.http.post(f"/v1/interrupts/{i['id']}/resolve",
                                json={"decision": "edit", "arguments": {"text": "delete one file"}}))
    assert json.loads(resolved["tool_call"]["arguments"]) == {"text": "delete one file"}
    done = wait_status(srv, run["id"], TERMINAL)
    assert srv.tools["guarded"].calls == [{"text": "delete one file"}]
    assert done["result"] == 'done: guarded ran with {"text": "delete one file"}'


def test_reject_never_runs_the_call_and_tells_the_model(srv):
    make_agent(srv, "gate", ["guarded"])
    run = start_run(srv, "gate", "spend the money")
    i = pending_interrupt(srv, run["id"])
    ok(srv.http.post(f"/v1/interrupts/{i['id']}/resolve", json={"decision": "reject", "comment": "too risky"}))
    done = wait_status(srv, run["id"], TERMINAL)
    assert srv.tools["guarded"].calls == []
    assert done["status"] == "succeeded"
    assert done["result"] == "done: A human rejected this call: too risky. It was not run."


# ---- cancel, pause / interrupt, resume -------------------------------------------------------------------
def wait_event(s: AgentServer, run_id: str, kind: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in all_events(s, run_id) if e["type"] == kind]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no {kind} event in run {run_id}"
        time.sleep(0.05)


def test_cancel_cuts_the_tool_call_in_flight(srv):
    make_agent(srv, "sleepy", ["slow"])
    run = start_run(srv, "sleepy")
    wait_event(srv, run["id"], "tool.started")  # the slow tool is now sleeping for 30 s
    ok(srv.http.post(f"/v1/runs/{run['id']}/cancel"))
    done = wait_status(srv, run["id"], TERMINAL, timeout=20)  # the tool would sleep 30 s: cancel cut it
    assert (done["status"], done["stop_reason"]) == ("cancelled", "cancelled")
    (call,) = ok(srv.http.get(f"/v1/runs/{run['id']}/steps"))["data"][0]["tool_calls"]
    assert call["status"] == "cancelled"
    again = srv.http.post(f"/v1/runs/{run['id']}/resume")
    assert "already cancelled" in error(again, 409)["message"]


def test_interrupt_pauses_at_once_and_resume_continues(srv):
    make_agent(srv, "sleepy", ["slow"])
    run = start_run(srv, "sleepy", "nap")
    wait_event(srv, run["id"], "tool.started")
    ok(srv.http.post(f"/v1/runs/{run['id']}/interrupt"))
    paused = wait_status(srv, run["id"], ("paused",), timeout=10)
    assert paused["pause_reason"] == "user"
    assert ok(srv.http.post(f"/v1/runs/{run['id']}/resume"))["status"] in ("queued", "running", "succeeded")
    done = wait_status(srv, run["id"], TERMINAL)
    assert done["status"] == "succeeded" and done["result"] == 'done: slow ran with {"text": "nap"}'
    assert srv.tools["slow"].calls == [{"text": "nap"}, {"text": "nap"}]  # the cut call ran again (idempotent)


def test_resume_refuses_a_run_that_is_not_paused(srv):
    make_agent(srv, "gate", ["guarded"])
    run = start_run(srv, "gate")
    wait_status(srv, run["id"], ("waiting_approval",))
    resume_waiting = srv.http.post(f"/v1/runs/{run['id']}/resume")
    assert "not paused" in error(resume_waiting, 409)["message"]


# ---- budgets ---------------------------------------------------------------------------------------------
def test_cost_budget_pauses_and_raising_it_resumes(srv):
    make_agent(srv, "thrifty", ["echo"])
    # step 1 fits (estimated ~9 µ$, costs 14); step 2 would pass 20 µ$: the run pauses before calling the model
    run = start_run(srv, "thrifty", "count coins", cost_budget_usd="0.00002")
    assert run["budget"] == {"token_budget": None, "cost_budget_u": 20, "cost_budget_usd": "0.00002"}
    paused = wait_status(srv, run["id"], ("paused",) + TERMINAL)
    assert (paused["status"], paused["pause_reason"]) == ("paused", "budget")
    assert (paused["step_count"], paused["cost_u"]) == (1, STEP_COST_U)
    assert srv.tools["echo"].calls == [{"text": "count coins"}]
    raised = ok(srv.http.post(f"/v1/runs/{run['id']}/budget", json={"cost_budget_usd": "1.00"}))
    assert raised["budget"]["cost_budget_usd"] == "1" and raised["status"] in ("queued", "running", "succeeded")
    done = wait_status(srv, run["id"], TERMINAL)
    assert (done["status"], done["step_count"], done["cost_u"]) == ("succeeded", 2, 2 * STEP_COST_U)
    assert srv.tools["echo"].calls == [{"text": "count coins"}]  # the completed tool call did not run again
    kinds = [e["type"] for e in all_events(srv, run["id"])]
    assert "budget.changed" in kinds


def test_token_budget_pauses_before_the_first_step(srv):
    make_agent(srv, "tiny", ["echo"])
    run = start_run(srv, "tiny", token_budget=5)
    paused = wait_status(srv, run["id"], ("paused",) + TERMINAL)
    assert (paused["status"], paused["pause_reason"], paused["step_count"]) == ("paused", "budget", 0)
    ok(srv.http.post(f"/v1/runs/{run['id']}/budget", json={"token_budget": 100_000}))
    assert wait_status(srv, run["id"], TERMINAL)["status"] == "succeeded"


# ---- artifacts and audit ---------------------------------------------------------------------------------
def test_artifacts_list_and_content(srv):
    make_agent(srv, "writer", ["report"])
    run = start_run(srv, "writer", "quarterly")
    wait_status(srv, run["id"], TERMINAL)
    (art,) = ok(srv.http.get(f"/v1/runs/{run['id']}/artifacts"))["data"]
    assert (art["name"], art["mime"], art["bytes"]) == ("report.txt", "text/plain", len(b"report of quarterly\n"))
    content = srv.http.get(art["url"])
    assert content.status_code == 200 and content.content == b"report of quarterly\n"
    assert content.headers["content-type"].startswith("text/plain")
    assert error(srv.http.get("/v1/artifacts/art_nope/content"), 404)["code"] == "not_found"


def test_audit_verdict_and_jsonl_export(srv):
    make_agent(srv, "audited", ["guarded"])
    run = start_run(srv, "audited")
    i = pending_interrupt(srv, run["id"])
    ok(srv.http.post(f"/v1/interrupts/{i['id']}/resolve", json={"decision": "approve"}))
    wait_status(srv, run["id"], TERMINAL)
    verdict = ok(srv.http.get(f"/v1/runs/{run['id']}/audit"))
    assert verdict["ok"] is True and verdict["broken_at"] is None and len(verdict["head"]) == 64
    export = srv.http.get(f"/v1/runs/{run['id']}/audit.jsonl")
    assert export.headers["content-type"].startswith("application/x-ndjson")
    entries = [json.loads(line) for line in export.text.splitlines()]
    assert len(entries) == verdict["entries"] and entries[-1]["hash"] == verdict["head"]
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    kinds = [e["kind"] for e in entries]
    assert kinds[0] == "run.created" and kinds[-1] == "run.finished"
    assert {"interrupt.created", "interrupt.resolved", "tool.call"} <= set(kinds)
    resolved = next(e for e in entries if e["kind"] == "interrupt.resolved")
    assert resolved["payload"]["actor"] == "anonymous"  # no key on this server: the actor is not taken on trust


# ---- errors ----------------------------------------------------------------------------------------------
def test_errors_are_openai_error_bodies(srv):
    make_agent(srv, "someone", ["echo"])
    body = error(srv.http.get("/v1/runs/run_nope"), 404)
    assert (body["message"], body["type"], body["code"]) == ("no run 'run_nope'", "invalid_request_error",
                                                               "not_found")
    for path in ("/v1/runs/run_nope/events", "/v1/runs/run_nope/steps", "/v1/runs/run_nope/audit",
                 "/v1/runs/run_nope/artifacts", "/v1/agents/nobody"):
        error(srv.http.get(path), 404)
    error(srv.http.get("/v1/runs/run_nope/events", params={"stream": "true"}), 404)  # not a 200 stream
    error(srv.http.post("/v1/runs/run_nope/cancel"), 404)
    error(srv.http.post("/v1/interrupts/int_nope/resolve", json={"decision": "approve"}), 404)
    no_agent = srv.http.post("/v1/runs", json={"agent": "nobody", "goal": "x"})
    assert error(no_agent, 404)["message"] == "no agent 'nobody'"

    assert error(srv.http.post("/v1/runs", json={"agent": "someone"}), 400)["param"] == "goal"
    assert error(srv.http.post("/v1/runs", json={"agent": "someone", "goal": "x", "cost_budget_usd": "lots"}),
                 400)["param"] == "cost_budget_usd"
    assert error(srv.http.post("/v1/runs", json={"agent": "someone", "goal": "x", "thread_id": "thread_nope"}),
                 404)["message"] == "no thread 'thread_nope'"
    unknown_tool = error(srv.http.post("/v1/agents", json={"name": "x", "tools": ["rm_rf"]}), 400)
    assert "rm_rf" in unknown_tool["message"] and "echo" in unknown_tool["message"]
    assert error(srv.http.post("/v1/agents", json={"name": "bad name!"}), 400)["param"] == "name"
    assert error(srv.http.post("/v1/agents", json={"name": "x", "colour": "red"}), 400)["param"] == "colour"
    bad_schema = error(srv.http.post("/v1/agents", json={"name": "x", "output_schema": {"type": "nope"}}), 400)
    assert bad_schema["param"] == "output_schema" and "not a valid JSON Schema" in bad_schema["message"]
    assert error(srv.http.get("/v1/runs", params={"status": "sleeping"}), 400)["param"] == "status"
    forever = srv.http.post("/v1/agents", json={"name": "x", "limits": {"max_wall_s": 1e12}})
    assert error(forever, 400)["param"] == "limits.max_wall_s"  # its deadline would overflow the worker's clock

    run = start_run(srv, "someone")
    no_budget = srv.http.post(f"/v1/runs/{run['id']}/budget", json={})
    assert error(no_budget, 400)["code"] == "missing_required_parameter"
    bad_id = srv.http.get(f"/v1/runs/{run['id']}/events", headers={"Last-Event-ID": "abc"})
    assert error(bad_id, 400)["param"] == "Last-Event-ID"
    bad_decision = srv.http.post("/v1/interrupts/int_x/resolve", json={"decision": "maybe"})
    assert error(bad_decision, 400)["param"] == "decision"


def test_keys_are_required_when_auth_is_on_and_name_the_actor(tmp_path):
    from mainspring.billing.keys import create_key
    from mainspring.store.db import session

    with agent_server(tmp_path, require_auth=True) as s:
        anonymous = s.http.get("/v1/runs")
        assert error(anonymous, 401)["code"] == "invalid_api_key"
        error(s.http.post("/v1/agents", json={"name": "gate", "tools": ["guarded"]}), 401)
        with session(s.app.state.agents.db) as db:
            key = create_key(db, "acme")
        s.http.headers["Authorization"] = f"Bearer {key.secret}"
        make_agent(s, "gate", ["guarded"])
        run = start_run(s, "gate")
        i = pending_interrupt(s, run["id"])
        resolved = ok(s.http.post(f"/v1/interrupts/{i['id']}/resolve", json={"decision": "approve",
                                                                              "actor": "alice"}))
        assert resolved["actor"] == f"alice (key:{key.key.id})"


# ---- the real model ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_an_agent_on_the_embedded_model(async_engine, tmp_path):
    """The server's own model resolver: the engine's model by its name (priced by the built-in sheet)."""
    with agent_server(tmp_path, engine=async_engine, models=None, tools={}) as s:
        agent = ok(s.http.post("/v1/agents", json={"name": "plain", "model": async_engine.engine.name,
                                                   "limits": {"max_tokens": 12}}), 201)
        run = start_run(s, agent["id"], "What is the capital of France? Answer in one word.")
        done = wait_status(s, run["id"], TERMINAL, timeout=120)
        assert done["status"] == "succeeded", done
        assert done["step_count"] == 1 and "Paris" in done["result"]
        assert done["usage"]["completion_tokens"] > 0 and Decimal(done["cost_usd"]) > 0
