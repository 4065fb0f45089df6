"""The coding loop as a durable agent run: a scripted model (TEST-ONLY: the machinery, not a model's skill) fixes a
bug in two turns in the real sandbox on real SQLite; the run stops on green with the right diff; it stops when
the same failure comes back after an edit; the repository map heads the system prompt on every turn."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from mainspring.agents.runtime import AgentRuntime
from mainspring.config import Settings
from mainspring.models import ToolCall
from mainspring.scenarios.coding.recipe import CodingTask, coding_outcome, coding_spec, prompt_maps, start_coding_run
from mainspring.scenarios.coding.tools import coding_tools
from tests.scenarios.coding.sample_repo import BUGGY_MEAN, FIXED_MEAN, write_repo
from tests.scripted_model import ScriptedModel

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "paused"}


def _runtime(tmp_path: Path, model, sandbox) -> AgentRuntime:
    settings = Settings(data_dir=tmp_path / "data")
    tools = {t.name: t for t in coding_tools(settings)}
    return AgentRuntime(settings, models=lambda name, project=None: model, tools=tools, sandbox=sandbox,
                        db_url=f"sqlite:///{tmp_path / 'runs.db'}")


def _drive(runtime: AgentRuntime, task: CodingTask, timeout: float = 240.0):
    async def main():
        await runtime.start()
        try:
            run = await asyncio.to_thread(start_coding_run, runtime, task)
            deadline = time.monotonic() + timeout
            while (await asyncio.to_thread(runtime.run, run.run_id)).status not in TERMINAL:
                assert time.monotonic() < deadline, "the coding run did not end in time"
                await asyncio.sleep(0.05)
            return run
        finally:
            await runtime.stop()
    return asyncio.run(main())


def _edit(search: str, replace: str, call_id: str) -> ToolCall:
    return ToolCall(call_id, "edit_file", json.dumps({"file": "calc/stats.py", "search": search,
                                                     "replace": replace}))


def test_two_turn_fix_stops_on_green_with_the_diff(tmp_path, sandbox):
    repo = write_repo(tmp_path / "repo")
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    model = ScriptedModel([ToolCall("c1", "run_tests", "{}"), _edit(BUGGY_MEAN, FIXED_MEAN, "c2"),
                           ToolCall("c3", "run_tests", "{}")])
    runtime = _runtime(tmp_path, model, sandbox)
    run = _drive(runtime, CodingTask("mean() in calc/stats.py is wrong: fix it", repo, model="scripted"))
    outcome = coding_outcome(runtime, run.run_id)
    assert (outcome.status, outcome.stop_reason, outcome.green, outcome.iterations) == (
        "succeeded", "tests_green", True, 1), outcome.error
    assert len(model.calls) == 3  # the green test run ended the run: no fourth model call
    # the first test run saw the failure, with its id and assertion
    steps = runtime.steps(run.run_id)
    first_tests = steps[0]["tool_calls"][0]["result"]["content"]
    assert "tests/test_stats.py::test_mean" in first_tests and "FAILURE" in first_tests
    assert "tests/test_report.py::test_render" in first_tests
    assert "before any edit" in first_tests
    # the diff: exactly the one line, against the snapshot
    assert outcome.diff.splitlines() == [
        "diff --git a/calc/stats.py b/calc/stats.py", "--- a/calc/stats.py", "+++ b/calc/stats.py",
        "@@ -1,6 +1,6 @@", " def mean(values: list[float]) -> float:", '     """The arithmetic mean."""',
        "-" + BUGGY_MEAN.rstrip("\n"), "+" + FIXED_MEAN.rstrip("\n"), " ", " ",
        " def spread(values: list[float]) -> float:"]
    assert json.loads(outcome.result)["diff"] == outcome.diff
    # the user's repository is untouched
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()} == before
    # every step is in the audit trail, and the trail verifies
    assert runtime.verify_audit(run.run_id).ok
    events = [e.type for e in runtime.events(run.run_id)]
    assert events.count("tool.finished") == 3 and "run.finished" in events
    # the map heads the system prompt, byte-identical on every turn, and names the task's file first
    systems = {c["messages"][0]["content"] for c in model.calls}
    assert len(systems) == 1
    system = systems.pop()
    assert run.repo_map.text in system and run.focus.files[0] == "calc/stats.py"
    assert system.index(run.repo_map.text) < system.rindex(run.focus.text)  # the repository's map, then the task's
    assert system.index("calc/stats.py:") < system.index("⋮ def mean(")
    assert all(c["messages"][1]["content"] == "mean() in calc/stats.py is wrong: fix it" for c in model.calls)


def test_the_same_failure_twice_stops_the_run(tmp_path, sandbox):
    repo = write_repo(tmp_path / "repo")
    wrong = "    return sum(values) / (len(values) + 2)\n"
    doc, doc_2 = '    """The arithmetic mean."""\n', '    """The mean of the values."""\n'
    model = ScriptedModel([ToolCall("c1", "run_tests", "{}"), _edit(BUGGY_MEAN, wrong, "c2"),
                           ToolCall("c3", "run_tests", "{}"), _edit(doc, doc_2, "c4"),
                           ToolCall("c5", "run_tests", "{}"), "unreachable"])
    runtime = _runtime(tmp_path, model, sandbox)
    run = _drive(runtime, CodingTask("fix mean in calc/stats.py", repo, model="scripted", max_iterations=5))
    outcome = coding_outcome(runtime, run.run_id)
    # iteration 1 fails with a new message (1.2, not the baseline's 1.5): no stop; iteration 2 (a docstring
    # edit) fails exactly as iteration 1 did: stopped, well before the cap of 5
    assert (outcome.stop_reason, outcome.iterations, outcome.green) == ("same_failure", 2, False), outcome.error
    assert len(model.calls) == 5
    result = json.loads(outcome.result)
    assert result["tests"]["failed"] == ["tests/test_report.py::test_render", "tests/test_stats.py::test_mean"]
    assert "+" + wrong.rstrip("\n") in outcome.diff.splitlines()


def test_the_iteration_cap_stops_the_run(tmp_path, sandbox):
    repo = write_repo(tmp_path / "repo")
    wrong = "    return sum(values) / (len(values) + 2)\n"
    model = ScriptedModel([_edit(BUGGY_MEAN, wrong, "c1"), ToolCall("c2", "run_tests", "{}"), "unreachable"])
    runtime = _runtime(tmp_path, model, sandbox)
    run = _drive(runtime, CodingTask("fix mean in calc/stats.py", repo, model="scripted", max_iterations=1))
    outcome = coding_outcome(runtime, run.run_id)
    assert (outcome.stop_reason, outcome.iterations, outcome.green) == ("max_iterations", 1, False)
    assert len(model.calls) == 2


@pytest.mark.parametrize("bad", [{"repo": "missing"}, {"task": "  "}, {"max_iterations": 6}])
def test_bad_tasks_are_refused_before_a_run(tmp_path, bad):
    write_repo(tmp_path / "repo")
    fields = {"task": "fix it", "repo": tmp_path / "repo", **bad}
    if bad.get("repo"):
        fields["repo"] = tmp_path / bad["repo"]
    with pytest.raises(ValueError):
        CodingTask(**fields).check()


def test_runs_on_one_repository_share_the_instructions_and_the_map(tmp_path):
    """The prompt prefix every task on a repository has in common: the instructions and the repository's map;
    the focus map after it follows the task; both maps together stay within the budget (a hard cap)."""
    repo = write_repo(tmp_path / "repo")
    a = CodingTask("mean() in calc/stats.py is wrong", repo, map_tokens=120)
    b = CodingTask("to_cents in calc/units.py rounds wrongly", repo, map_tokens=120)
    (map_a, focus_a), (map_b, focus_b) = prompt_maps(a), prompt_maps(b)
    assert map_a.text == map_b.text and focus_a.text != focus_b.text
    assert focus_a.files[0] == "calc/stats.py" and focus_b.files[0] == "calc/units.py"
    assert map_a.tokens + focus_a.tokens <= 120 and map_b.tokens + focus_b.tokens <= 120
    sys_a, sys_b = (coding_spec(t, m.text, f.text).instructions for t, (m, f) in ((a, (map_a, focus_a)),
                                                                                   (b, (map_b, focus_b))))
    assert len(os.path.commonprefix([sys_a, sys_b])) >= sys_a.index(map_a.text) + len(map_a.text)
    # task first: the task's own text is the prompt's start, so two tasks share nothing
    firsts = [coding_spec(CodingTask(t.task, repo, map_tokens=120, layout="task_first"), m.text, f.text).instructions
              for t, (m, f) in ((a, (map_a, focus_a)), (b, (map_b, focus_b)))]
    assert len(os.path.commonprefix(firsts)) < len("Task: ") + 10
