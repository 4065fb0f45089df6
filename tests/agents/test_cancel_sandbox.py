"""Cancelling a run stops its in-flight tool call, down to the sandboxed process tree."""

import asyncio
import time

from mainspring.agents.tools.code import python_tool
from mainspring.config import Settings
from tests.agents.conftest import TERMINAL, PolicyModel, make_runtime, spec, wait_status
from tests.sandbox.conftest import TEST_SANDBOX_DIR, job_name, live_processes_named, name_this_process


def test_cancel_kills_a_sandboxed_infinite_loop(tmp_path, db_url, sandbox):
    tool = python_tool(Settings(sandbox_dir=TEST_SANDBOX_DIR))
    name = job_name()  # this job's own processes: other tests' sandboxes share the slot uids
    model = PolicyModel(tool="python", args={"code": name_this_process(name) + "while True:\n    pass\n"})
    rt = make_runtime(tmp_path, db_url, model, {"python": tool})
    rt.worker.env.sandbox = sandbox
    rt.put_agent(spec(tools=("python",)))
    run = rt.start_run("tester", "spin forever")

    async def body():
        await rt.start()
        try:
            while "tool.started" not in [e.type for e in rt.events(run.id)]:
                await asyncio.sleep(0.05)
            guard = time.monotonic() + 60
            while not live_processes_named(name):  # the job is spinning in its sandbox now
                assert time.monotonic() < guard, "the sandboxed job never started"
                await asyncio.sleep(0.05)
            started = time.monotonic()
            rt.act(run.id, "cancel")
            done = await wait_status(rt, run.id, TERMINAL, timeout=20)
            return done, time.monotonic() - started
        finally:
            await rt.stop()

    done, _ = asyncio.run(body())
    assert done.status == "cancelled" and done.stop_reason == "cancelled"
    [call] = rt.steps(run.id)[0]["tool_calls"]
    assert call["status"] == "cancelled"
    deadline = time.monotonic() + 5  # a killed process can take a moment to leave the process table
    while live_processes_named(name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_processes_named(name) == []
