"""`mainspring sandbox run|check|profiles` as a user runs them: a real process, exit codes, files."""

import json
import os
import subprocess
import sys

import pytest

from tests.sandbox.conftest import TEST_SANDBOX_DIR


def run(*args: str, input: str | None = None, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "MAINSPRING_SANDBOX_DIR": TEST_SANDBOX_DIR}
    return subprocess.run([sys.executable, "-m", "mainspring", "sandbox", *args], capture_output=True, text=True,
                          env=env, input=input, timeout=120, cwd=cwd)


def test_run_copies_files_in_and_out_and_passes_the_exit_code(sandbox, tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import sys\nopen('result.txt', 'w').write('done')\nprint('hi')\nsys.exit(3)\n")
    proc = run("run", "--file", str(script), "--out", str(tmp_path / "out"), "--", "python3", "job.py")
    assert proc.returncode == 3 and proc.stdout == "hi\n"
    assert (tmp_path / "out" / "result.txt").read_text() == "done"


def test_run_json_reports_the_limit_that_fired(sandbox):
    proc = run("run", "--json", "--", "python3", "-c", "print('x' * 5_000_000)")
    result = json.loads(proc.stdout)
    assert result["killed_by"] == "output" and result["stdout_truncated"] is True
    assert proc.returncode == 128 + 9


def test_run_passes_stdin_when_asked(sandbox):
    proc = run("run", "--stdin", "--profile", "shell", "--", "wc", "-l", input="a\nb\nc\n")
    assert proc.returncode == 0 and proc.stdout.strip() == "3"


@pytest.mark.parametrize("args, message", [
    (["run", "--profile", "gpu", "--", "true"], "unknown sandbox profile 'gpu'"),
    (["run", "--file", "/nonexistent/file.py", "--", "true"], "no such file"),
])
def test_bad_input_exits_2_with_a_message(sandbox, args, message):
    proc = run(*args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_check_and_profiles_describe_the_host(sandbox):
    check = run("check")
    assert check.returncode == 0 and "bubblewrap" in check.stdout and "ok:" in check.stdout
    profiles = run("profiles")
    assert profiles.returncode == 0 and all(p in profiles.stdout for p in ("python", "pytest", "shell", "render"))
