"""The run loop: tool calls, approvals (approve / reject / edit / expiry), budgets, limits, retries, pause,
compaction."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mainspring.models import OpenAICompatibleModel
from tests.agents.conftest import TERMINAL, CountTool, PolicyModel, drive, make_runtime, spec, wait_status


def test_a_run_calls_a_tool_and_answers_from_its_result(tmp_path, db_url):
    model, tool = PolicyModel(calls=2), CountTool(tmp_path / "ledger")
    rt = make_runtime(tmp_path, db_url, model, {"count": tool})
    rt.put_agent(spec())
    run = rt.start_run("tester", "count twice")
    done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    assert (done.status, done.stop_reason, done.step_count) == ("succeeded", "final_answer", 3)
    assert done.result == 'done: count=2 args={}'
    steps = rt.steps(run.id)
    assert [s["seq"] for s in steps] == [1, 2, 3]
    assert [c["status"] for s in steps for c in s["tool_calls"]] == ["completed", "completed"]
    # the prefix (instructions + goal) is byte-identical on every call: prompt caching keeps hitting
    assert all(json.dumps(m[:2]) == json.dumps(model.seen[0][:2]) for m in model.seen)
    assert done.prompt_tokens > 0 and rt.verify_audit(run.id).ok


@pytest.mark.parametrize("decision, arguments, ledger_lines, final", [
    ("approve", None, 1, 'done: count=1 args={"n": 1}'),
    ("edit", {"n": 5}, 1, 'done: count=1 args={"n": 5}'),
    ("reject", None, 0, "done: A human rejected this call: not now. It was not run."),
])
def test_approval_gates_the_call(tmp_path, db_url, decision, arguments, ledger_lines, final):
    tool = CountTool(tmp_path / "ledger", requires_approval=True)
    rt = make_runtime(tmp_path, db_url, PolicyModel(args={"n": 1}), {"count": tool})
    rt.put_agent(spec())
    run = rt.start_run("tester", "count once, with approval")

    async def body():
        waiting = await wait_status(rt, run.id, {"waiting_approval"})
        assert waiting.pause_reason == "approval" and tool.calls == []
        [interrupt] = rt.interrupts(run.id)
        rt.resolve(interrupt.id, decision, actor="alice", arguments=arguments, comment="not now")
        return await wait_status(rt, run.id, TERMINAL)

    done = drive(rt, body)
    assert done.status == "succeeded" and done.result == final
    lines = (tmp_path / "ledger").read_text().split() if (tmp_path / "ledger").exists() else []
    assert len(lines) == ledger_lines
    [resolved] = rt.interrupts(run.id, status=None)
    assert resolved.actor == "alice" and resolved.status == {"approve": "approved", "edit": "edited",
                                                             "reject": "rejected"}[decision]
    kinds = [json.loads(line)["kind"] for line in rt.export_audit(run.id)]
    assert "interrupt.created" in kinds and "interrupt.resolved" in kinds


@pytest.mark.parametrize("default, ran", [("reject", False), ("approve", True)])
def test_unanswered_approvals_expire_with_their_default(tmp_path, db_url, default, ran):
    tool = CountTool(tmp_path / "ledger", requires_approval=True)
    rt = make_runtime(tmp_path, db_url, PolicyModel(), {"count": tool})
    rt.put_agent(spec(approval_ttl_s=0.3, approval_expiry_decision=default))
    run = rt.start_run("tester", "count once")
    done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    [interrupt] = rt.interrupts(run.id, status=None)
    assert interrupt.status == "expired" and interrupt.actor == "system:expiry"
    assert done.status == "succeeded" and (len(tool.calls) == 1) == ran


def test_budget_pauses_the_run_and_raising_it_resumes(tmp_path, db_url):
    rt = make_runtime(tmp_path, db_url, PolicyModel(calls=3), {"count": CountTool(tmp_path / "ledger")})
    rt.put_agent(spec(max_tokens=8))
    run = rt.start_run("tester", "count three times", token_budget=90)

    async def body():
        paused = await wait_status(rt, run.id, {"paused"})
        assert paused.pause_reason == "budget"
        assert paused.prompt_tokens + paused.completion_tokens <= 90  # never overshoots: checked before each call
        rt.raise_budget(run.id, token_budget=10_000)
        return await wait_status(rt, run.id, TERMINAL)

    done = drive(rt, body)
    assert done.status == "succeeded" and done.result.startswith("done: count=3")
    assert [e.type for e in rt.events(run.id)].count("budget.changed") == 1


def test_step_limit_asks_for_a_final_answer_instead_of_failing(tmp_path, db_url):
    model = PolicyModel(calls=100)
    rt = make_runtime(tmp_path, db_url, model, {"count": CountTool(tmp_path / "ledger")})
    rt.put_agent(spec(max_steps=3))
    run = rt.start_run("tester", "count forever")
    done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    assert (done.status, done.stop_reason, done.step_count) == ("succeeded", "max_steps", 3)
    assert model.seen[-1][-1]["content"].startswith("The step limit is reached")


def test_unknown_tools_and_bad_arguments_come_back_as_errors_the_model_sees(tmp_path, db_url):
    rt = make_runtime(tmp_path, db_url, PolicyModel(tool="nope"), {"count": CountTool(tmp_path / "ledger")})
    rt.put_agent(spec())
    run = rt.start_run("tester", "call a tool that does not exist")
    done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    assert done.status == "succeeded" and (
        "tool 'nope' is not one of this agent's tools (refused, not run); its tools: count" in done.result)
    [call] = rt.steps(run.id)[0]["tool_calls"]
    assert call["status"] == "failed"


def test_long_histories_are_compacted_with_the_prefix_unchanged(tmp_path, db_url):
    model = PolicyModel(calls=6)
    tool = CountTool(tmp_path / "ledger")
    rt = make_runtime(tmp_path, db_url, model, {"count": tool})
    rt.put_agent(spec(context_tokens=256, keep_recent_steps=1))
    run = rt.start_run("tester", "count six times " + "with a long goal " * 20)
    done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    assert done.status == "succeeded" and done.result.startswith("done: count=6")
    kinds = [s["kind"] for s in rt.steps(run.id)]
    assert kinds.count("model") == 7 and kinds.count("compaction") >= 1
    assert all(json.dumps(m[:2]) == json.dumps(model.seen[0][:2]) for m in model.seen)
    assert any(m[2]["content"].startswith("Summary of earlier steps") for m in model.seen[2:])
    assert max(len(json.dumps(m)) for m in model.seen) < 3 * len(json.dumps(model.seen[0])) + 2000


@pytest.mark.parametrize("action, calls", [("interrupt", 2), ("pause", 1)])
def test_interrupt_or_pause_mid_tool_then_resume(tmp_path, db_url, action, calls):
    """interrupt cuts the call in flight (an idempotent call re-runs on resume, one effect); pause lets it finish."""
    tool = CountTool(tmp_path / "ledger", delay_s=1.0)
    rt = make_runtime(tmp_path, db_url, PolicyModel(), {"count": tool})
    rt.put_agent(spec())
    run = rt.start_run("tester", "count once, slowly")

    async def body():
        while not tool.calls:
            await asyncio.sleep(0.02)
        rt.act(run.id, action)
        paused = await wait_status(rt, run.id, {"paused"})
        assert paused.pause_reason == "user"
        rt.act(run.id, "resume")
        return await wait_status(rt, run.id, TERMINAL)

    done = drive(rt, body)
    assert done.status == "succeeded" and len(tool.calls) == calls
    assert (tmp_path / "ledger").read_text().split() == [f"{run.id}/1/0"]  # one effect: same idempotency key


def test_a_flaky_model_endpoint_is_retried_with_backoff(tmp_path, db_url):
    answers = [503, 503, 200]

    class Flaky(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            status = answers.pop(0) if answers else 200
            body = {"error": {"message": "overloaded"}} if status != 200 else {
                "id": "x", "object": "chat.completion", "model": "flaky",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok!"}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        model = OpenAICompatibleModel(f"http://127.0.0.1:{server.server_port}/v1", model="flaky", max_retries=0)
        rt = make_runtime(tmp_path, db_url, model, {})
        rt.put_agent(spec(tools=(), model_retries=3, retry_backoff_s=0.01))
        run = rt.start_run("tester", "say ok")
        done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    finally:
        server.shutdown()
    assert done.status == "succeeded" and done.result == "ok!"
    retries = [json.loads(e.data_json) for e in rt.events(run.id) if e.type == "step.retry"]
    assert [r["attempt"] for r in retries] == [1, 2] and "503" in retries[0]["error"]


def test_a_model_that_keeps_failing_fails_the_run_with_the_reason(tmp_path, db_url):
    from mainspring.models import UpstreamError
    from tests.scripted_model import ScriptedModel

    model = ScriptedModel([UpstreamError(400, "bad request: max_tokens too large")])
    rt = make_runtime(tmp_path, db_url, model, {})
    rt.put_agent(spec(tools=(), model_retries=3, retry_backoff_s=0.01))
    run = rt.start_run("tester", "fail")
    done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    assert (done.status, done.stop_reason) == ("failed", "model_error") and "max_tokens too large" in done.error


def test_tool_choice_required_is_asked_on_every_step_that_offers_tools_and_tools_see_the_goal(tmp_path, db_url):
    class Recording(PolicyModel):
        choices: list = []

        async def chat(self, messages, **kwargs):
            self.choices.append((bool(kwargs.get("tools")), kwargs.get("tool_choice")))
            return await super().chat(messages, **kwargs)

    class GoalSeen(CountTool):
        goals: list = []

        async def call(self, args, ctx):
            self.goals.append(ctx.goal)
            return await super().call(args, ctx)

    model, tool = Recording(calls=2), GoalSeen(tmp_path / "ledger")
    rt = make_runtime(tmp_path, db_url, model, {"count": tool})
    rt.put_agent(spec(name="strict", max_steps=3).model_copy(update={"tool_choice": "required"}))
    rt.put_agent(spec(name="free"))
    strict = rt.start_run("strict", "count")
    done = drive(rt, lambda: wait_status(rt, strict.id, TERMINAL))
    # two tool steps asked for a call; the third is max_steps' wrap-up, which offers no tools and asks none
    assert done.status == "succeeded" and model.choices == [(True, "required"), (True, "required"), (False, None)]
    assert tool.goals == ["count", "count"]  # each call's context carries its run's goal
    model.choices.clear()
    free = rt.start_run("free", "count")
    drive(rt, lambda: wait_status(rt, free.id, TERMINAL))
    assert model.choices and all(choice is None for _, choice in model.choices)
