"""The coding agent's tools (an agent-computer interface after SWE-agent's), over the run's working copy:

- `view_file(file, start)`: 100 numbered lines (a folder: its files);
- `search_code(query)`: the files and lines that contain a text;
- `edit_file(file, search, replace)`: `search` must occur exactly once; refused when the resulting .py would not
  parse (the SyntaxError and its line are the answer), and for test files unless the task allows test edits;
- `create_file(file, content)`: a new file, under the same checks;
- `run_tests(ids)`: pytest in the sandbox (`pytest` profile), read back from JUnit XML (pytest_run.py).

`run_tests` also closes the loop. A test run after edits is an iteration; it ends the run (EndRun: the run
succeeds with the diff as its result) when the tests are green, when its failure signature was seen after an
earlier edit already (the fixes go in circles), or at the task's iteration cap. A test run before any edit
(the baseline) never counts. Every call's result is kept by idempotency key, so a call re-run after a crash
answers as it first did instead of editing twice or counting an iteration twice.

Names: `search` is the document search's, so these are all `*_file` / `*_code`; they are registered for every
agent through the `mainspring.agent_tools` entry point (pyproject.toml) and used by the agents that list them.
"""

from __future__ import annotations

import ast
import json
from typing import Any, Callable

from mainspring.agents.tools.base import EndRun, ToolContext, ToolError, ToolResult
from mainspring.agents.tools.decorator import FunctionTool, tool
from mainspring.config import Settings
from mainspring.sandbox.errors import SandboxError
from mainspring.sandbox.profiles import load_profiles
from mainspring.scenarios.coding.pytest_run import PROFILE, run_pytest
from mainspring.scenarios.coding.workcopy import WorkCopy, is_test_path

VIEW_LINES = 100
SEARCH_LINES = 40  # matching lines shown; the files are all listed
SEARCH_LINE_CHARS = 160
LIST_FILES = 200
TIMEOUT_MARGIN_S = 30.0  # over the profile's wall time: a free slot, copying files in and out
RESULT_DIFF_CHARS = 200_000
TOOL_NAMES = ("view_file", "search_code", "edit_file", "create_file", "run_tests")


def _remembered(ctx: ToolContext, fn: Callable[[WorkCopy], ToolResult]) -> ToolResult:
    """Run a state-changing call once per idempotency key; a second run returns (or re-ends with) the first."""
    wc = WorkCopy.of_call(ctx)
    with wc.lock():
        seen = wc.load_state()["calls"].get(ctx.idempotency_key)
    if seen is not None:
        if seen.get("end"):
            raise EndRun(seen["content"], seen["end"]["result"], seen["end"]["stop_reason"])
        return ToolResult(seen["content"], data=seen.get("data"), is_error=seen.get("is_error", False))
    try:
        result = fn(wc)
        record: dict[str, Any] = {"content": result.content, "data": result.data, "is_error": result.is_error}
    except EndRun as end:
        record = {"content": end.content, "end": {"result": end.result, "stop_reason": end.stop_reason}}
        result = None
    with wc.lock():
        state = wc.load_state()
        state["calls"][ctx.idempotency_key] = record
        wc.save_state(state)
    if result is None:
        raise EndRun(record["content"], record["end"]["result"], record["end"]["stop_reason"])
    return result


def _numbered(lines: list[str], first: int) -> str:
    width = len(str(first + len(lines) - 1))
    return "\n".join(f"{n:>{width}}| {line}" for n, line in enumerate(lines, first))


def _check_writable(wc: WorkCopy, rel: str) -> None:
    if is_test_path(rel) and not wc.options().allow_test_edits:
        raise ToolError(f"refused: {rel} is a test file, and this task does not allow editing tests. "
                        "Fix the code under test instead.")


def _check_parses(rel: str, text: str) -> None:
    if not rel.endswith(".py"):
        return
    try:
        ast.parse(text, filename=rel)
    except SyntaxError as exc:
        line = text.splitlines()[exc.lineno - 1] if exc.lineno and exc.lineno <= len(text.splitlines()) else ""
        raise ToolError(f"refused, nothing was changed: the result would not parse. SyntaxError: {exc.msg} "
                        f"at line {exc.lineno} of {rel}:\n{exc.lineno}| {line}") from None


def view_file_tool() -> FunctionTool:
    @tool(name="view_file", idempotent=True, timeout_s=30)
    def view_file(ctx: ToolContext, file: str = ".", start: int = 1) -> str:
        """Show 100 lines of a file of the repository, numbered, from line `start`. A folder shows its files.

        Args:
            file: path relative to the repository root, e.g. src/app.py ('.' lists the repository)
            start: first line to show (1-based)
        """
        wc = WorkCopy.of_call(ctx)
        path = wc.path(file, allow_root=True)
        if path.is_dir():
            names = sorted(wc.rel(p) for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            more = f"\n… and {len(names) - LIST_FILES} more" if len(names) > LIST_FILES else ""
            return f"{wc.rel(path)}/ holds {len(names)} files:\n" + "\n".join(names[:LIST_FILES]) + more
        if not path.is_file():
            raise ToolError(f"no file {file!r} in the repository (view_file('.') lists them)")
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        start = max(1, min(start, max(len(lines), 1)))
        shown = lines[start - 1:start - 1 + VIEW_LINES]
        end = start + len(shown) - 1
        below = len(lines) - end
        tail = f"\n({below} more lines below; view_file({file!r}, {end + 1}))" if below > 0 else "\n(end of file)"
        return f"{wc.rel(path)} ({len(lines)} lines), lines {start}-{end}:\n{_numbered(shown, start)}{tail}"

    return view_file


def search_code_tool() -> FunctionTool:
    @tool(name="search_code", idempotent=True, timeout_s=30)
    def search_code(ctx: ToolContext, query: str) -> str:
        """Find a text (case-insensitive, not a regex) in the repository's files: which files, and the lines.

        Args:
            query: the text to look for, e.g. a function name
        """
        if not query.strip():
            raise ToolError("the query is empty")
        wc = WorkCopy.of_call(ctx)
        needle = query.lower()
        per_file: dict[str, int] = {}
        hits: list[str] = []
        for rel, data in wc.files().items():
            if b"\x00" in data:
                continue
            for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
                if needle in line.lower():
                    per_file[rel] = per_file.get(rel, 0) + 1
                    if len(hits) < SEARCH_LINES:
                        hits.append(f"{rel}:{n}: {line.strip()[:SEARCH_LINE_CHARS]}")
        if not per_file:
            return f"no file contains {query!r}"
        total = sum(per_file.values())
        files = "\n".join(f"{rel} ({k})" for rel, k in per_file.items())
        more = f"\n… {total - len(hits)} more matches" if total > len(hits) else ""
        return f"{total} matches in {len(per_file)} files:\n{files}\n\n" + "\n".join(hits) + more

    return search_code


def edit_file_tool() -> FunctionTool:
    @tool(name="edit_file", idempotent=True, timeout_s=30)
    def edit_file(ctx: ToolContext, file: str, search: str, replace: str) -> ToolResult:
        """Replace one exact piece of a file: `search` must occur exactly once (copy it, indentation included,
        from view_file; give more lines when it occurs more than once). Python that would not parse is refused.

        Args:
            file: path relative to the repository root
            search: the exact text to replace, one or more whole lines
            replace: the new text
        """
        def apply(wc: WorkCopy) -> ToolResult:
            path = wc.path(file)
            rel = wc.rel(path)
            _check_writable(wc, rel)
            if not path.is_file():
                raise ToolError(f"no file {file!r} in the repository (create_file makes a new one)")
            if not search:
                raise ToolError("`search` is empty: give the exact text to replace")
            text = path.read_text(encoding="utf-8")
            count = text.count(search)
            if count != 1:
                hint = ("it does not occur; view_file the lines and copy them exactly, indentation included"
                        if count == 0 else f"it occurs {count} times; include more surrounding lines")
                raise ToolError(f"refused, nothing was changed: `search` must occur exactly once in {rel}, but {hint}")
            new = text.replace(search, replace, 1)
            _check_parses(rel, new)
            wc.write(path, new)
            _note_edit(wc)
            first = text[:text.index(search)].count("\n") + 1
            lines = new.splitlines()
            shown = lines[max(0, first - 3):first - 1 + replace.count("\n") + 3]
            return ToolResult(f"edited {rel}; lines {max(1, first - 2)}+ now read:\n"
                              f"{_numbered(shown, max(1, first - 2))}", data={"file": rel, "line": first})

        return _remembered(ctx, apply)

    return edit_file


def create_file_tool() -> FunctionTool:
    @tool(name="create_file", idempotent=True, timeout_s=30)
    def create_file(ctx: ToolContext, file: str, content: str) -> ToolResult:
        """Create a new file in the repository (an existing file is changed with edit_file instead).

        Args:
            file: path relative to the repository root
            content: the whole file
        """
        def apply(wc: WorkCopy) -> ToolResult:
            path = wc.path(file)
            rel = wc.rel(path)
            _check_writable(wc, rel)
            if path.exists():
                raise ToolError(f"refused: {rel} exists already; change it with edit_file")
            _check_parses(rel, content)
            wc.write(path, content)
            _note_edit(wc)
            return ToolResult(f"created {rel} ({len(content.splitlines())} lines)", data={"file": rel})

        return _remembered(ctx, apply)

    return create_file


def _note_edit(wc: WorkCopy) -> None:
    with wc.lock():
        state = wc.load_state()
        state["edits_since_tests"] += 1
        wc.save_state(state)


def run_tests_tool(settings: Settings | None = None) -> FunctionTool:
    profiles = load_profiles(settings.sandbox_profiles_file if settings else None)
    wall_s = float(profiles[PROFILE].wall_s)

    @tool(name="run_tests", idempotent=True, timeout_s=wall_s + TIMEOUT_MARGIN_S)
    def run_tests(ctx: ToolContext, ids: list[str] | None = None) -> ToolResult:
        """Run the repository's tests (pytest, isolated) and report each failing test with its assertion
        message and the end of its traceback. Run them after your edits: when they pass, you are done.

        Args:
            ids: optional pytest ids to run (e.g. tests/test_x.py::test_y); default: the task's tests
        """
        def test(wc: WorkCopy) -> ToolResult:
            if ctx.sandbox is None:
                raise ToolError("this run has no sandbox, so tests cannot be run")
            options = wc.options()
            selection = list(ids or options.test_ids)
            try:
                report = run_pytest(ctx.sandbox, wc.files(), selection, cancel=ctx.cancel)
            except ValueError as exc:  # a bad id
                raise ToolError(str(exc)) from None
            except SandboxError as exc:
                raise ToolError(f"the sandbox could not run the tests: {exc}") from None
            with wc.lock():
                state = wc.load_state()
                counted = state["edits_since_tests"] > 0
                state["edits_since_tests"] = 0
                if counted:
                    state["iterations"] += 1
                seen = report.signature() in state["signatures"]
                if counted and not report.green:
                    state["signatures"].append(report.signature())
                wc.save_state(state)
            iteration = state["iterations"]
            full = not ids or list(ids) == options.test_ids  # green on a subset is not done yet
            if not counted:
                note = "(before any edit: not an iteration)"
            else:
                note = f"(iteration {iteration} of {options.max_iterations})"
            content = f"{report.summary()}\n{note}"
            data = {"tests": report.to_dict(), "iteration": iteration, "counted": counted}
            stop = None
            if counted and report.green and full:
                stop = "tests_green"
            elif counted and not report.green and seen:
                stop = "same_failure"
                content += "\nThe same tests fail the same way as after an earlier edit: stopping here."
            elif counted and iteration >= options.max_iterations:
                stop = "max_iterations"
                content += f"\nThe iteration cap ({options.max_iterations}) is reached: stopping here."
            elif report.green and not full:
                content += "\nThese pass; run_tests() without ids to check all of them."
            if stop is not None:
                diff = wc.diff()
                result = {"stop_reason": stop, "green": report.green, "iterations": iteration,
                          "tests": report.to_dict(), "diff": diff[:RESULT_DIFF_CHARS],
                          "diff_truncated": len(diff) > RESULT_DIFF_CHARS}
                raise EndRun(content, json.dumps(result), stop)
            return ToolResult(content, data=data, is_error=False)

        return _remembered(ctx, test)

    return run_tests


def coding_tools(settings: Settings | None = None) -> list[FunctionTool]:
    return [view_file_tool(), search_code_tool(), edit_file_tool(), create_file_tool(), run_tests_tool(settings)]


def agent_tool_pack(settings: Settings) -> list[FunctionTool]:
    """This scenario's tools for every agent run: the `mainspring.agent_tools` entry point (pyproject.toml)."""
    return coding_tools(settings)
