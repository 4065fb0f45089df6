"""`mainspring code "task"` against a real server whose worker drives the run (a scripted model, TEST-ONLY: the
machinery, not a model's skill; the real sandbox runs the tests): the live view, the final diff, `--apply`,
`mainspring code diff RUN`, and exit 2 with a message for bad input or no server."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from mainspring.config import Settings
from mainspring.models import ToolCall
from mainspring.scenarios.coding.cli import code_app
from mainspring.scenarios.coding.tools import coding_tools
from tests.agents.test_cli import CliResult, free_port
from tests.api.test_agent_routes import agent_server
from tests.scenarios.coding.sample_repo import BUGGY_MEAN, FIXED_MEAN, write_repo
from tests.scripted_model import ScriptedModel

cli = typer.Typer()
cli.add_typer(code_app, name="code")


def mainspring(*args: str) -> CliResult:
    r = CliRunner().invoke(cli, list(args))
    assert not (r.exception and not isinstance(r.exception, SystemExit)), r.exception  # no traceback, ever
    return CliResult(r.exit_code, r.stdout, r.stderr)


def serving(tmp_path, monkeypatch, model):
    """A server whose agents use `model` and the coding tools; the CLI finds the server and its database through
    the MAINSPRING_* variables, as a user's would."""
    data = tmp_path / "data"
    tools = {t.name: t for t in coding_tools(Settings(data_dir=data))}
    with agent_server(data, models=lambda name, project=None: model, tools=tools) as s:
        for name, value in (("HOST", "127.0.0.1"), ("PORT", s.url.rsplit(":", 1)[1]), ("DATA_DIR", str(data)),
                            ("DATABASE_URL", f"sqlite:///{data}/db.sqlite")):
            monkeypatch.setenv(f"MAINSPRING_{name}", value)
        yield model


@pytest.fixture
def fixing_server(tmp_path, monkeypatch):
    """The model runs the tests, fixes mean() and runs them again."""
    yield from serving(tmp_path, monkeypatch, ScriptedModel([
        ToolCall("c1", "run_tests", "{}"),
        ToolCall("c2", "edit_file", json.dumps({"file": "calc/stats.py", "search": BUGGY_MEAN,
                                                "replace": FIXED_MEAN})),
        ToolCall("c3", "run_tests", "{}")]))


def test_code_runs_until_green_shows_the_steps_and_applies_the_diff(tmp_path, fixing_server):
    repo = write_repo(tmp_path / "repo")
    r = mainspring("code", "mean() in calc/stats.py is wrong: fix it", "--repo", str(repo), "--apply")
    assert r.code == 0, r
    # the live view: each tool call as it happened, the failing test first
    assert r.out.index("run_tests") < r.out.index("edit_file") < r.out.rindex("run_tests")
    assert "2 failing, 1 passed" in r.out and "FAILURE tests/test_" in r.out, r
    # the diff, then the verdict
    assert "-" + BUGGY_MEAN.rstrip("\n") in r.out and "+" + FIXED_MEAN.rstrip("\n") in r.out
    assert "tests green after 1 test run with edits" in r.out
    assert len(fixing_server.calls) == 3
    # --apply: the user's repository now has the fix, and nothing else changed
    assert (repo / "calc" / "stats.py").read_text().count(FIXED_MEAN) == 1
    assert BUGGY_MEAN not in (repo / "calc" / "stats.py").read_text()
    run_id = r.err.split(" ", 1)[0].strip()
    assert run_id.startswith("run_"), r.err
    # the run is an ordinary stored run: its diff can be read again later
    again = mainspring("code", "diff", run_id, "--json")
    assert again.code == 0, again
    outcome = json.loads(again.out)
    assert (outcome["green"], outcome["stop_reason"], outcome["iterations"]) == (True, "tests_green", 1)
    assert "+" + FIXED_MEAN.rstrip("\n") in outcome["diff"]


def test_without_apply_the_repository_is_untouched(tmp_path, fixing_server):
    repo = write_repo(tmp_path / "repo")
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    r = mainspring("code", "fix mean", "--repo", str(repo), "--json")
    assert r.code == 0, r
    assert json.loads(r.out)["green"] is True
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()} == before


def test_bad_input_and_no_server_exit_2_with_a_message(tmp_path, monkeypatch):
    monkeypatch.setenv("MAINSPRING_PORT", str(free_port()))  # nothing listens there
    monkeypatch.setenv("MAINSPRING_DATA_DIR", str(tmp_path / "data"))
    repo = write_repo(tmp_path / "repo")
    cases = [(["code", "fix it", "--repo", str(tmp_path / "nowhere")], "no such repository folder"),
             (["code", "  ", "--repo", str(repo)], "the task is empty"),
             (["code", "fix it", "--repo", str(repo), "--max-iterations", "9"], "--max-iterations"),
             (["code", "fix it", "--repo", str(repo)], "no server at http://127.0.0.1:")]
    for args, message in cases:
        r = mainspring(*args)
        assert r.code == 2 and message in r.err, (args, r)
        assert "Traceback" not in r.err + r.out
    assert not (tmp_path / "data" / "runs").exists()  # nothing was queued


def test_a_task_named_like_nothing_else_is_a_run_and_help_lists_the_commands():
    r = mainspring("code", "--help")
    assert r.code == 0 and "run" in r.out and "diff" in r.out


@pytest.fixture
def gold_server(tmp_path, monkeypatch):
    """The model types in spans-1's gold fix between two test runs."""
    yield from serving(tmp_path, monkeypatch, ScriptedModel([
        ToolCall("c1", "run_tests", "{}"),
        ToolCall("c2", "edit_file", json.dumps({"file": "spans/interval.py",
                                                "search": "return self.start <= point <= self.end",
                                                "replace": "return self.start <= point < self.end"})),
        ToolCall("c3", "run_tests", "{}")]))


def test_code_bench_runs_a_task_through_the_server_and_writes_the_report(tmp_path, gold_server):
    trajectories = tmp_path / "out" / "t.jsonl"
    r = mainspring("code", "bench", "--tasks", "spans-1", "--trajectories", str(trajectories), "--json")
    assert r.code == 0, r
    report = json.loads(r.out)
    assert (report["tasks"], report["resolved"], report["pass@1"], report["mean_iterations_to_green"]) == (
        1, 1, 1.0, 1)
    assert report["tokens"]["prompt"] > 0 and report["results"][0]["instance_id"] == "spans-1"
    assert json.loads(trajectories.with_suffix(".report.json").read_text())["resolved"] == 1
    line = json.loads(trajectories.read_text().splitlines()[0])
    assert line["instance_id"] == "spans-1" and [s["tool_calls"][0]["name"] for s in line["steps"]] == [
        "run_tests", "edit_file", "run_tests"]
    assert "spans-1 #0: resolved" in r.err  # the progress line of each judged attempt


def test_code_bench_refuses_an_unknown_task_or_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("MAINSPRING_PORT", str(free_port()))
    for args, message in ((["--tasks", "nope-1"], "unknown instance ids"),
                          (["--layout", "sideways"], "--layout must be one of")):
        r = mainspring("code", "bench", *args)
        assert r.code == 2 and message in r.err, r
