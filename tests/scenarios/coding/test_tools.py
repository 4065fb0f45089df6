"""The coding tools over a real working copy: view, search, edits (refused when ambiguous, unparseable or to a
test file), create, paths kept inside the repository, run_tests parsing a real failing pytest run in the real
sandbox, and results kept per idempotency key."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from mainspring.agents.tools.base import EndRun, ToolContext
from mainspring.scenarios.coding.tools import coding_tools
from mainspring.scenarios.coding.workcopy import TaskOptions, WorkCopy, is_test_path
from tests.scenarios.coding.sample_repo import BUGGY_MEAN, FIXED_MEAN, write_repo

TOOLS = {t.name: t for t in coding_tools()}


def _ctx(workspace: Path, key: str = "k1", sandbox=None, attachments=None) -> ToolContext:
    return ToolContext(run_id="run_t", call_id=key, idempotency_key=key, workspace=workspace,
                       attachments=attachments or {}, sandbox=sandbox)


def call(name: str, args: dict, ctx: ToolContext):
    return asyncio.run(TOOLS[name].call(args, ctx))


@pytest.fixture
def wc(tmp_path) -> WorkCopy:
    return WorkCopy.prepare(tmp_path / "ws", write_repo(tmp_path / "src"))


def test_view_numbers_lines_and_pages(wc, tmp_path):
    big = "\n".join(f"x{i} = {i}" for i in range(1, 251)) + "\n"
    (wc.repo / "calc" / "big.py").write_text(big)
    r = call("view_file", {"file": "calc/big.py", "start": 101}, _ctx(wc.workspace))
    lines = r.content.splitlines()
    assert lines[0] == "calc/big.py (250 lines), lines 101-200:"
    assert lines[1] == "101| x101 = 101" and lines[100] == "200| x200 = 200"
    assert "50 more lines below" in lines[-1]
    listing = call("view_file", {"file": "."}, _ctx(wc.workspace)).content
    assert "calc/stats.py" in listing and "tests/test_stats.py" in listing and ".coding" not in listing


@pytest.mark.parametrize("bad", ["../src/calc/stats.py", "/etc/passwd", "~/x", "link/secret.py"])
def test_paths_stay_inside_the_repository(wc, tmp_path, bad):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("KEY = 1\n")
    (wc.repo / "link").symlink_to(outside)
    for name, args in (("view_file", {"file": bad}),
                       ("edit_file", {"file": bad, "search": "KEY", "replace": "K"}),
                       ("create_file", {"file": bad.replace("secret", "new"), "content": "x = 1\n"})):
        r = call(name, args, _ctx(wc.workspace, key=f"{name}-{bad}"))
        assert r.is_error, (name, bad)
    assert (outside / "secret.py").read_text() == "KEY = 1\n" and not (outside / "new.py").exists()


def test_search_lists_files_and_lines(wc):
    r = call("search_code", {"query": "MEAN("}, _ctx(wc.workspace))
    assert r.content.startswith("4 matches in 3 files:")
    assert "calc/report.py (1)\ncalc/stats.py (1)\ntests/test_stats.py (2)" in r.content
    assert "calc/stats.py:1: def mean(values: list[float]) -> float:" in r.content
    assert call("search_code", {"query": "no_such_name"}, _ctx(wc.workspace)).content.startswith("no file")


def test_edit_applies_one_exact_match(wc):
    r = call("edit_file", {"file": "calc/stats.py", "search": BUGGY_MEAN, "replace": FIXED_MEAN}, _ctx(wc.workspace))
    assert not r.is_error, r.content
    assert FIXED_MEAN in (wc.repo / "calc/stats.py").read_text()
    assert "3|     return sum(values) / len(values)" in r.content
    assert wc.load_state()["edits_since_tests"] == 1
    assert "+" + FIXED_MEAN.rstrip("\n") in wc.diff()


def test_edits_that_match_zero_or_many_times_are_refused(wc):
    before = (wc.repo / "calc/stats.py").read_text()
    missing = call("edit_file", {"file": "calc/stats.py", "search": "return nothing", "replace": "x"},
                   _ctx(wc.workspace, "a"))
    many = call("edit_file", {"file": "calc/stats.py", "search": "values", "replace": "xs"}, _ctx(wc.workspace, "b"))
    assert missing.is_error and "does not occur" in missing.content
    assert many.is_error and "occurs 6 times" in many.content
    assert (wc.repo / "calc/stats.py").read_text() == before and wc.load_state()["edits_since_tests"] == 0


def test_an_edit_that_breaks_the_syntax_is_refused_with_the_line(wc):
    before = (wc.repo / "calc/stats.py").read_text()
    r = call("edit_file", {"file": "calc/stats.py", "search": BUGGY_MEAN,
                           "replace": "    return sum(values) / (len(values)\n"}, _ctx(wc.workspace))
    assert r.is_error
    assert "SyntaxError" in r.content and "line 3" in r.content and "nothing was changed" in r.content
    assert "3|     return sum(values) / (len(values)" in r.content
    assert (wc.repo / "calc/stats.py").read_text() == before


def test_test_files_are_refused_unless_the_task_allows_them(tmp_path):
    src = write_repo(tmp_path / "src")
    strict = WorkCopy.prepare(tmp_path / "a", src)
    edit = {"file": "tests/test_stats.py", "search": "== 2", "replace": "== 1.5"}
    r = call("edit_file", edit, _ctx(strict.workspace))
    assert r.is_error and "test file" in r.content
    assert call("create_file", {"file": "calc/test_new.py", "content": "x = 1\n"}, _ctx(strict.workspace, "c")).is_error
    assert "== 2" in (strict.repo / "tests/test_stats.py").read_text()
    lenient = WorkCopy.prepare(tmp_path / "b", src, TaskOptions(allow_test_edits=True))
    assert not call("edit_file", edit, _ctx(lenient.workspace)).is_error
    assert "== 1.5" in (lenient.repo / "tests/test_stats.py").read_text()
    assert [is_test_path(p) for p in ("tests/a.py", "pkg/test_a.py", "a_test.py", "conftest.py", "calc/a.py",
                                      "contest.py")] == [True, True, True, True, False, False]


def test_create_makes_new_files_only_and_checks_syntax(wc):
    r = call("create_file", {"file": "calc/extra.py", "content": "def twice(x):\n    return 2 * x\n"},
             _ctx(wc.workspace, "a"))
    assert not r.is_error and (wc.repo / "calc/extra.py").exists()
    assert "--- /dev/null\n+++ b/calc/extra.py" in wc.diff()
    exists = call("create_file", {"file": "calc/stats.py", "content": "x = 1\n"}, _ctx(wc.workspace, "b"))
    broken = call("create_file", {"file": "calc/broken.py", "content": "def f(:\n"}, _ctx(wc.workspace, "c"))
    assert exists.is_error and "exists already" in exists.content
    assert broken.is_error and "SyntaxError" in broken.content and not (wc.repo / "calc/broken.py").exists()


def test_a_call_rerun_with_its_key_answers_as_it_first_did(wc):
    args = {"file": "calc/stats.py", "search": BUGGY_MEAN, "replace": FIXED_MEAN}
    first = call("edit_file", args, _ctx(wc.workspace, "same"))
    again = call("edit_file", args, _ctx(wc.workspace, "same"))  # after a crash: not "does not occur"
    assert not again.is_error and again.content == first.content
    assert wc.load_state()["edits_since_tests"] == 1


def test_a_run_without_a_working_copy_copies_its_attached_folder(tmp_path):
    src = write_repo(tmp_path / "src")
    r = call("view_file", {"file": "calc/stats.py"}, _ctx(tmp_path / "ws", attachments={"docs": str(src)}))
    assert "1| def mean(values: list[float]) -> float:" in r.content
    assert (tmp_path / "ws" / ".coding" / "snapshot" / "calc" / "stats.py").exists()
    none = call("view_file", {"file": "calc/stats.py"}, _ctx(tmp_path / "empty"))
    assert none.is_error and "no repository" in none.content


def test_run_tests_parses_a_real_failing_run(wc, sandbox):
    r = call("run_tests", {}, _ctx(wc.workspace, sandbox=sandbox))
    assert not r.is_error, r.content
    tests = r.data["tests"]
    assert tests["failed"] == ["tests/test_report.py::test_render", "tests/test_stats.py::test_mean"]
    assert tests["passed"] == 1 and not tests["green"] and r.data["counted"] is False
    mean = next(f for f in tests["failures"] if f["id"].endswith("test_mean"))
    assert mean["kind"] == "failure" and mean["message"].startswith("assert 1.5 == 2")
    assert "tests/test_stats.py:5: in test_mean" in mean["traceback"]
    render = next(f for f in tests["failures"] if f["id"].endswith("test_render"))
    assert "mean=2.0 spread=2" in render["message"]
    assert "FAILURE tests/test_stats.py::test_mean" in r.content and "before any edit" in r.content
    # a selection runs only those ids: green on a subset is reported, and does not end the run
    call("edit_file", {"file": "calc/stats.py", "search": BUGGY_MEAN, "replace": FIXED_MEAN}, _ctx(wc.workspace, "e"))
    subset = call("run_tests", {"ids": ["tests/test_stats.py::test_mean"]}, _ctx(wc.workspace, "t2", sandbox))
    assert subset.data["tests"]["green"] and subset.data["tests"]["passed"] == 1 and subset.data["iteration"] == 1
    assert "without ids" in subset.content
    # an option is not a test id
    assert call("run_tests", {"ids": ["-p", "evil"]}, _ctx(wc.workspace, "t3", sandbox)).is_error


def test_run_tests_after_an_edit_ends_the_run_when_green(wc, sandbox):
    call("edit_file", {"file": "calc/stats.py", "search": BUGGY_MEAN, "replace": FIXED_MEAN}, _ctx(wc.workspace, "e"))
    with pytest.raises(EndRun) as ended:
        call("run_tests", {}, _ctx(wc.workspace, "t", sandbox))
    result = json.loads(ended.value.result)
    assert ended.value.stop_reason == "tests_green" and result["green"] and result["iterations"] == 1
    assert result["tests"]["passed"] == 3 and result["diff"] == wc.diff()
    with pytest.raises(EndRun):  # re-run with the same key (a crash after the call): the same ending
        call("run_tests", {}, _ctx(wc.workspace, "t", sandbox))
    assert wc.load_state()["iterations"] == 1


def test_run_tests_needs_a_sandbox(wc):
    r = call("run_tests", {}, _ctx(wc.workspace))
    assert r.is_error and "no sandbox" in r.content
