"""Sandbox.run as its users call it: files in and out, stdin, limits, profiles, concurrency, cancellation, errors."""

import asyncio
import json
import logging
import textwrap

import pytest

from mainspring.sandbox import Profile, SandboxError, SandboxUnavailable
from tests.sandbox.conftest import job_name, make_sandbox, name_this_process, wait_for_processes

QUICK = Profile(name="quick", wall_s=20, output_bytes=4096, collect_mb=1)


def test_files_go_in_and_new_or_changed_files_come_out(sandbox):
    result = sandbox.run(
        ["python3", "job.py"],
        {"job.py": "import pathlib\npathlib.Path('out').mkdir()\npathlib.Path('out/r.json').write_text('{\"n\": 42}')\n"
                   "pathlib.Path('data/b.txt').write_text('changed')\n",
         "data/a.txt": "same", "data/b.txt": b"original"},
    )
    assert result.ok, result.stderr
    assert result.files == {"out/r.json": b'{"n": 42}', "data/b.txt": b"changed"}


def test_stdin_reaches_the_job_and_stdout_stderr_are_separate(sandbox):
    result = sandbox.run("tr a-z A-Z; echo oops >&2; exit 7", stdin="hello\n", profile="shell")
    assert (result.exit_code, result.stdout, result.stderr) == (7, "HELLO\n", "oops\n")


def test_runaway_output_is_capped_and_the_job_killed(sandbox):
    result = sandbox.run(["python3", "-c", "while True: print('x' * 1000)"], profile=QUICK)
    assert result.killed_by == "output"
    assert result.stdout_truncated and len(result.stdout) == QUICK.output_bytes


def test_output_files_over_the_collect_cap_are_named_not_returned(sandbox):
    result = sandbox.run("head -c 700000 /dev/zero > a.bin; head -c 700000 /dev/zero > b.bin; echo hi > c.txt",
                         profile=QUICK.model_copy(update={"runtime": False}))
    assert set(result.files) == {"a.bin", "c.txt"} and result.files_omitted == ["b.bin"]


def test_accounting_reports_cpu_wall_and_memory(sandbox):
    result = sandbox.run(["python3", "-c", "b = bytearray(100 << 20); s = sum(range(3_000_000))"])
    assert result.ok, result.stderr
    assert result.peak_memory >= 100 << 20
    assert result.cpu_s > 0 and result.wall_s >= result.cpu_s * 0.5


def test_shell_profile_has_no_project_runtime_but_python_has(sandbox):
    code = "import numpy; print(numpy.__name__)"
    assert sandbox.run(["python3", "-c", code]).stdout == "numpy\n"
    shell = sandbox.run(["python3", "-c", code], profile="shell")
    assert shell.exit_code == 1 and "ModuleNotFoundError" in shell.stderr


def test_pytest_profile_runs_a_real_test_suite(sandbox):
    tests = textwrap.dedent("""
        import multiprocessing, socket, subprocess
        import pytest

        def square(x):
            return x * x

        def test_tmp_path(tmp_path):
            (tmp_path / "f").write_text("x")
            assert (tmp_path / "f").read_text() == "x"

        def test_subprocess_and_pipes():
            out = subprocess.run("echo hi | wc -c", shell=True, capture_output=True, text=True).stdout
            assert out.strip() == "3"

        def test_multiprocessing_pool():
            with multiprocessing.Pool(2) as pool:
                assert pool.map(square, range(5)) == [0, 1, 4, 9, 16]

        def test_no_network():
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", 80), timeout=1)

        def test_this_one_fails():
            assert 1 == 2
    """)
    result = sandbox.run(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"], {"test_job.py": tests},
                         "pytest")
    assert result.exit_code == 1, result.stderr
    assert "1 failed, 4 passed" in result.stdout


def test_render_profile_initialises_software_egl(sandbox):
    code = textwrap.dedent("""
        import ctypes
        egl = ctypes.CDLL("libEGL.so.1")
        egl.eglGetDisplay.restype = ctypes.c_void_p
        egl.eglQueryString.restype = ctypes.c_char_p
        display = ctypes.c_void_p(egl.eglGetDisplay(ctypes.c_void_p(0)))
        major, minor = ctypes.c_int(), ctypes.c_int()
        assert egl.eglInitialize(display, ctypes.byref(major), ctypes.byref(minor))
        print(major.value, minor.value, egl.eglQueryString(display, 0x3053).decode())  # EGL_VENDOR
    """)
    result = sandbox.run(["python3", "egl.py"], {"egl.py": code}, "render")
    assert result.ok, result.stderr
    major, _, vendor = result.stdout.split(maxsplit=2)
    assert int(major) >= 1 and "Mesa" in vendor


def test_eight_sandboxes_at_once_see_only_their_own_files(sandbox):
    job = textwrap.dedent("""
        import hashlib, json, os, time
        start = time.time()
        time.sleep(2)  # long enough to overlap on a loaded machine: the launches are far quicker
        mine = sorted(os.path.join(r, f) for r, _, fs in os.walk("/workspace") for f in fs)
        others = sorted(f for f in os.listdir("/tmp"))
        digest = hashlib.sha256(open("secret.txt", "rb").read()).hexdigest()
        print(json.dumps({"files": mine, "tmp": others, "digest": digest, "start": start, "end": time.time()}))
    """)

    async def all_jobs():
        return await asyncio.gather(*(
            sandbox.arun(["python3", "job.py"], {"job.py": job, "secret.txt": f"secret-{i}"}) for i in range(8)))

    results = asyncio.run(all_jobs())
    reports = [json.loads(r.stdout) for r in results]
    import hashlib
    # a checkout under /tmp shows its (read-only) package path there: that is the runtime, not another job
    runtime_dirs = sorted({dest.split("/")[2] for _, dest in sandbox.runtime.binds if dest.startswith("/tmp/")})
    for i, report in enumerate(reports):
        assert report["files"] == ["/workspace/job.py", "/workspace/secret.txt"]
        assert report["tmp"] == runtime_dirs
        assert report["digest"] == hashlib.sha256(f"secret-{i}".encode()).hexdigest()
    latest_start = max(r["start"] for r in reports)
    assert sum(r["end"] > latest_start for r in reports) >= 2  # they overlapped: ran at once, not in turn


def test_cancelling_an_async_run_kills_the_job(sandbox):
    name = job_name()
    sleeper = QUICK.model_copy(update={"wall_s": 3600})  # only the cancel can end it within the test

    async def cancel_once_running():
        task = asyncio.create_task(sandbox.arun(["python3", "-c", name_this_process(name) + "import time\n"
                                                 "time.sleep(3600)"], profile=sleeper))
        assert await asyncio.to_thread(wait_for_processes, name, True), "the job never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_once_running())
    assert wait_for_processes(name, False), "the cancelled job is still running"
    assert sandbox.run(["true"], profile="shell").ok


def test_cancel_event_stops_a_blocking_run(sandbox):
    import threading

    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    result = sandbox.run(["sleep", "60"], profile="shell", cancel=cancel)
    assert result.killed_by == "cancelled"  # not "wall_time": the shell profile allows 30 s, the job sleeps 60


@pytest.mark.parametrize("name", ["../escape.txt", "/etc/passwd", "a/../../b", "", "x\x00y"])
def test_bad_input_paths_are_refused(sandbox, name):
    with pytest.raises(SandboxError, match="input file|bad input"):
        sandbox.run(["true"], {name: "x"}, profile="shell")


def test_unknown_profile_and_empty_command_are_refused(sandbox):
    with pytest.raises(SandboxError, match="unknown sandbox profile 'gpu'.*python"):
        sandbox.run(["true"], profile="gpu")
    with pytest.raises(SandboxError, match="empty command"):
        sandbox.run([], profile="shell")


def test_missing_command_exits_127_with_a_message(sandbox):
    result = sandbox.run(["no-such-program"], profile="shell")
    assert result.exit_code == 127 and "command not found: no-such-program" in result.stderr


def test_a_host_without_bubblewrap_is_refused_with_the_reason():
    sandbox = make_sandbox(sandbox_bwrap="/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match="bubblewrap is not installed.*INSECURE_LOCAL"):
        sandbox.run(["true"], profile="shell")


def test_insecure_local_runs_unisolated_and_says_so(caplog):
    sandbox = make_sandbox(sandbox_bwrap="/nonexistent/bwrap", sandbox_insecure_local=True)
    with caplog.at_level(logging.WARNING, logger="mainspring.sandbox"):
        result = sandbox.run(["python3", "-c", "import os; print(os.getcwd())"], {"in.txt": "x"})
    assert result.ok and result.insecure
    assert result.stdout.strip().startswith(sandbox.settings.sandbox_dir)
    assert any("INSECURE_LOCAL" in r.getMessage() for r in caplog.records)
