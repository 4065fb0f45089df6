import asyncio
import dataclasses
import os
import threading
from types import SimpleNamespace

import pytest

from mainspring.agents.tools.code import clip, python_tool, save_outputs, shell_tool

from tests.sandbox.conftest import job_name, name_this_process, wait_for_processes

from .conftest import call

python = python_tool()
shell = shell_tool()


@pytest.fixture()
def sctx(ctx, sandbox):
    return dataclasses.replace(ctx, sandbox=sandbox)


def test_python_reads_the_workspace_and_its_new_files_come_back(sctx, workspace):
    (workspace / "data").mkdir()
    (workspace / "data" / "in.csv").write_text("3\n4\n")
    code = ("import os\n"
            "nums = [int(x) for x in open('data/in.csv')]\n"
            "os.makedirs('out', exist_ok=True)\n"
            "open('out/sum.txt', 'w').write(str(sum(nums)))\n"
            "print('cwd files:', sorted(os.listdir('.')))\n")
    result = call(python, {"code": code}, sctx)
    assert not result.is_error, result.content
    assert result.content == ("exit code: 0\n--- stdout ---\ncwd files: ['data', 'out']\n"
                              "files saved to the workspace: out/sum.txt")
    assert (workspace / "out" / "sum.txt").read_text() == "7"
    assert (workspace / "data" / "in.csv").read_text() == "3\n4\n"  # unchanged inputs are not rewritten
    assert result.data["files_saved"] == ["out/sum.txt"] and result.data["exit_code"] == 0


def test_python_files_argument_lands_in_the_workspace_first(sctx, workspace):
    result = call(python, {"code": "print(open('helper.py').read().upper())", "files": {"helper.py": "x = 1"}},
                  sctx)
    assert "X = 1" in result.content and (workspace / "helper.py").read_text() == "x = 1"
    bad = call(python, {"code": "print(1)", "files": {"../evil.py": "x"}}, sctx)
    assert bad.is_error and "must not contain '..'" in bad.content


def test_shell_failure_is_an_error_result_with_stderr(sctx, workspace):
    (workspace / "a.txt").write_text("hello")
    ok = call(shell, {"command": "cat a.txt; echo done > b.txt"}, sctx)
    assert ok.content == "exit code: 0\n--- stdout ---\nhello\nfiles saved to the workspace: b.txt"
    failed = call(shell, {"command": "ls missing-file"}, sctx)
    assert failed.is_error and failed.content.startswith("exit code: 2\n--- stderr ---\nls: ")


def test_setting_the_cancel_token_kills_the_job(sctx):
    threading.Timer(1.0, sctx.cancel.set).start()
    result = call(python, {"code": "while True: pass"}, sctx)
    assert result.is_error and result.data["killed_by"] == "cancelled"
    assert "killed by: cancelled (the run was cancelled)" in result.content


def test_cancelling_the_awaiting_task_kills_the_job(sctx, sandbox):
    name = job_name()
    code = name_this_process(name) + "import time\ntime.sleep(600)"

    async def cancel_once_running():
        task = asyncio.create_task(python.call({"code": code}, sctx))
        assert await asyncio.to_thread(wait_for_processes, name, True), "the job never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_once_running())
    # the python profile's wall clock would end it at 30 s: gone well before that, the cancel killed it
    assert wait_for_processes(name, False, guard_s=20), "the cancelled job is still running"
    assert sandbox.run(["true"], profile="shell").ok  # its slot is free again


def test_long_output_is_clipped_with_a_marker(sctx):
    result = call(python, {"code": "print('a' * 30000); print('END')"}, sctx)
    assert "characters cut ...]" in result.content and result.content.rstrip().endswith("END")
    assert result.data["stdout_truncated"] and len(result.content) < 14_000


def test_big_workspace_files_are_not_copied_in_and_say_so(ctx, sandbox, workspace):
    (workspace / "big.bin").write_bytes(b"x" * (2 << 20))
    (workspace / "small.txt").write_text("s")
    capped = python_tool(SimpleNamespace(sandbox_profiles_file="", agent_workspace_copy_mb=1))
    result = call(capped, {"code": "import os; print(sorted(os.listdir('.')))"},
                  dataclasses.replace(ctx, sandbox=sandbox))
    assert "['small.txt']" in result.content
    assert "files not copied: big.bin (2097152 bytes; over the 1 MiB copied per call)" in result.content
    assert (workspace / "big.bin").stat().st_size == 2 << 20


def test_a_job_cannot_write_through_a_workspace_link(sctx, workspace, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("original")
    os.symlink(outside, workspace / "link.txt")
    result = call(shell, {"command": "ls -a; echo pwned > link.txt"}, sctx)
    assert "link.txt" not in result.data["stdout"]  # links are not copied into the sandbox
    assert outside.read_text() == "original"
    assert "link.txt (path 'link.txt' resolves outside the workspace" in result.content


def test_outputs_are_saved_only_inside_the_workspace(workspace):
    saved, refused = save_outputs(workspace, {"ok.txt": b"1", "../escape.txt": b"2", "/abs.txt": b"3"})
    assert saved == ["ok.txt"] and len(refused) == 2
    assert not (workspace.parent / "escape.txt").exists() and (workspace / "ok.txt").read_bytes() == b"1"


def test_without_a_sandbox_the_tools_say_so(ctx):
    result = call(shell, {"command": "true"}, ctx)
    assert result == type(result)("this run has no sandbox, so code cannot be run", is_error=True)


def test_clip_keeps_head_and_tail():
    text, cut = clip("h" * 100 + "t" * 100, limit=30)
    assert cut and text.startswith("h" * 20 + "\n[... 170 characters cut ...]\n") and text.endswith("t" * 10)
    assert clip("short") == ("short", False)
