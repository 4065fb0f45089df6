"""The minibench runner on real coding runs (real SQLite, the real sandbox) with a scripted model (TEST-ONLY: the
machinery, not a model's skill): the gold fix typed in by the model resolves, a naive fix goes green on nothing
and is not resolved; the report's figures add up; trajectories hold each run's steps; the layouts differ where
the task text goes."""

from __future__ import annotations

import asyncio
import json

import pytest

from mainspring.models import ToolCall
from mainspring.scenarios.coding.instances import load_instances
from mainspring.scenarios.coding.minibench import MinibenchReport, run_minibench
from tests.scenarios.coding.embedded_http import embedded_http, served_model
from tests.scenarios.coding.test_loop import _runtime
from tests.scripted_model import ScriptedModel

SPANS_1, SPANS_5 = load_instances(ids=["spans-1", "spans-5"])


def _edit(file: str, search: str, replace: str, call_id: str) -> ToolCall:
    return ToolCall(call_id, "edit_file", json.dumps({"file": file, "search": search, "replace": replace}))


def _bench(tmp_path, sandbox, model, name: str = "scripted", **kwargs) -> tuple[MinibenchReport, object]:
    runtime = _runtime(tmp_path, model, sandbox)
    seen = []

    async def main():
        await runtime.start()
        try:
            return await asyncio.to_thread(run_minibench, runtime, name, sandbox=sandbox, progress=seen.append,
                                           poll_s=0.05, timeout_s=240, **kwargs)
        finally:
            await runtime.stop()
    report = asyncio.run(main())
    assert [r.instance_id for r in seen] == [r.instance_id for r in report.results]
    return report, runtime


def test_the_gold_fix_resolves_and_the_report_adds_up(tmp_path, sandbox):
    gold = _edit("spans/interval.py", "return self.start <= point <= self.end", "return self.start <= point < self.end",
                 "c2")
    naive = _edit("spans/interval.py", "return self.start < other.end and other.start < self.end",
                  "return self.start <= other.end and other.start <= self.end", "d2")
    model = ScriptedModel([ToolCall("c1", "run_tests", "{}"), gold, ToolCall("c3", "run_tests", "{}"),
                           ToolCall("d1", "run_tests", "{}"), naive, ToolCall("d3", "run_tests", "{}")])
    trajectories = tmp_path / "out" / "trajectories.jsonl"
    report, runtime = _bench(tmp_path, sandbox, model, tasks=["spans-1", "spans-5"], trajectories=trajectories,
                             max_iterations=1)
    first, second = report.results
    assert (first.instance_id, first.resolved, first.green, first.stop_reason, first.iterations) == (
        "spans-1", True, True, "tests_green", 1), first.reason
    assert first.iterations_to_green == 1 and "FAIL_TO_PASS" in first.reason
    # the naive fix breaks a visible test: the agent's loop sees red and stops at the cap; the harness says why
    assert (second.resolved, second.green, second.stop_reason, second.iterations_to_green) == (
        False, False, "max_iterations", None)
    assert "PASS_TO_PASS tests broke" in second.reason
    assert len(model.calls) == 6
    # the totals are the attempts' sums; pass@1 over one sample each is the resolved rate
    assert (report.resolved, report.resolved_rate, report.pass_at_1) == (1, 0.5, 0.5)
    tokens = report.tokens()
    assert tokens["prompt"] == first.prompt_tokens + second.prompt_tokens > 0
    assert tokens["completion"] == first.completion_tokens + second.completion_tokens > 0
    runs = [runtime.run(r.run_id) for r in report.results]
    assert tokens["prompt"] == sum(r.prompt_tokens for r in runs) and report.cache_hit_rate == 0.0  # scripted: no cache
    assert report.cost_usd == sum(r.cost_u for r in runs) / 1e6 and report.usd_per_resolved == report.cost_usd
    assert report.mean_iterations_to_green == 1.0 and 0 < first.wall_s < 240 and first.eval_s > 0
    summary = report.to_dict()
    assert (summary["resolved"], summary["attempts"], summary["tasks"], summary["pass@1"]) == (1, 2, 2, 0.5)
    json.dumps(summary)
    table = report.render()
    assert table.splitlines()[0].split()[:4] == ["task", "kind", "resolved", "green"]
    assert "resolved 1/2 (50.0%)" in table and "spans-5" in table
    # one trajectory line per attempt, with the run's steps and the harness's verdict
    lines = [json.loads(line) for line in trajectories.read_text().splitlines()]
    assert [t["instance_id"] for t in lines] == ["spans-1", "spans-5"]
    assert [len(t["steps"]) for t in lines] == [3, 3]
    assert lines[0]["steps"][1]["tool_calls"][0]["name"] == "edit_file"
    assert lines[0]["evaluation"]["resolved"] is True and lines[1]["evaluation"]["resolved"] is False
    assert lines[0]["outcome"]["diff"].startswith("diff --git a/spans/interval.py")


@pytest.mark.parametrize("layout", ["map_first", "task_first"])
def test_the_layout_puts_the_task_before_or_after_the_map(tmp_path, sandbox, layout):
    model = ScriptedModel(["I cannot fix this."])  # a final answer with no edit: nothing to judge but the snapshot
    report, _ = _bench(tmp_path, sandbox, model, tasks=[SPANS_1], layout=layout)
    (result,) = report.results
    assert not result.resolved and result.iterations == 0 and report.usd_per_resolved is None
    system = model.calls[0]["messages"][0]["content"]
    statement = SPANS_1.problem_statement
    assert system.startswith(f"Task: {statement}") == (layout == "task_first")
    assert (statement in system) == (layout == "task_first")
    assert "Repository map" in system and model.calls[0]["messages"][1]["content"] == statement
    assert report.layout == layout and report.to_dict()["layout"] == layout


def test_a_run_that_does_not_end_in_time_is_cancelled_and_judged(tmp_path, sandbox):
    runtime = _runtime(tmp_path, ScriptedModel([]), sandbox)  # never started: nothing drives the run
    report = run_minibench(runtime, "scripted", tasks=["spans-2"], timeout_s=0.3, poll_s=0.05, sandbox=sandbox)
    (result,) = report.results
    assert (result.timed_out, result.status, result.resolved) == (True, "cancelled", False)
    assert "FAIL_TO_PASS tests do not pass" in result.reason and result.eval_s > 0


def test_bad_arguments_are_refused_before_any_run(tmp_path, sandbox):
    runtime = _runtime(tmp_path, ScriptedModel([]), sandbox)
    for bad in ({"layout": "sideways"}, {"tasks": ["nope-1"]}, {"samples": 0}):
        with pytest.raises(ValueError):
            run_minibench(runtime, "scripted", **bad)
    assert runtime.runs() == []


@pytest.fixture(scope="module")
def embedded_server(embedded, tmp_path_factory):
    with embedded_http(embedded, tmp_path_factory.mktemp("minibench-api")) as srv:
        yield srv


@pytest.mark.slow
def test_the_embedded_model_runs_a_minibench_task_end_to_end_over_http(tmp_path, sandbox, embedded_server):
    """SmolLM2-135M is not expected to resolve the task: the machinery must run to an outcome, every model call
    going over HTTP, with its usage counted and the harness's verdict on whatever diff the run left."""
    from mainspring.models import OpenAICompatibleModel

    served = served_model(embedded_server)
    model = OpenAICompatibleModel(embedded_server.openai_url, api_key="x", model=served, timeout=300,
                                  max_retries=0)
    trajectories = tmp_path / "traj.jsonl"
    report, runtime = _bench(tmp_path, sandbox, model, served, tasks=["spans-2"], trajectories=trajectories,
                             max_steps=3, max_tokens=64)
    (result,) = report.results
    run = runtime.run(result.run_id)
    assert result.status in ("succeeded", "failed", "paused") and not result.timed_out, result.to_dict()
    assert run.step_count >= 1 and run.stop_reason, (result.to_dict(), run.error)
    assert result.prompt_tokens == run.prompt_tokens > 500  # the map and tools went in
    assert result.completion_tokens > 0 and result.eval_s > 0
    assert result.resolved in (True, False) and result.reason  # judged on the run's diff, empty or not
    (line,) = [json.loads(x) for x in trajectories.read_text().splitlines()]
    assert line["steps"] and line["steps"][0]["usage"]["prompt_tokens"] > 500
    assert report.model == served and f"model {served}" in report.render()
    print(report.render())
