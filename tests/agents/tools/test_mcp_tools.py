import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from mainspring.agents.tools.base import Tool, ToolContext, ToolError
from mainspring.agents.tools.mcp_tools import McpStdioServer, close_mcp_tools, mcp_stdio_tools
from mainspring.agents.tools.registry import ToolRegistry

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_echo_server.py"))]
CTX = ToolContext("r", "c", "k", workspace=None)  # type: ignore[arg-type]


def test_round_trip_through_a_stdio_server(tmp_path):
    async def scenario():
        with open(tmp_path / "server.log", "w") as log:
            tools = await mcp_stdio_tools(SERVER, errlog=log, timeout_s=10)
            try:
                by_name = {t.name: t for t in tools}
                assert sorted(by_name) == ["echo", "fail", "math_add", "slow", "wipe"]
                assert all(isinstance(t, Tool) for t in tools)
                echo, add = by_name["echo"], by_name["math_add"]
                assert echo.description == "Repeat the text." and add.remote_name == "math.add"
                assert echo.parameters["properties"]["times"] == {"default": 1, "title": "Times", "type": "integer"}
                assert echo.parameters["required"] == ["text"] and echo.parameters["type"] == "object"
                # readOnlyHint and idempotentHint make a tool idempotent; destructiveHint requires approval
                flags = {t.name: (t.idempotent, t.requires_approval) for t in tools}
                assert flags == {"echo": (True, False), "math_add": (True, False), "wipe": (False, True),
                                 "fail": (False, False), "slow": (False, False)}

                result = await echo.call({"text": "hi", "times": 3}, CTX)
                assert (result.content, result.is_error, result.data) == ("hi hi hi", False, {"result": "hi hi hi"})
                assert (await add.call({"a": 2, "b": 40}, CTX)).content == "42"
                failed = await by_name["fail"].call({"reason": "boom"}, CTX)
                assert failed.is_error and "fail" in failed.content
                bad = await add.call({"a": "x"}, CTX)
                assert bad.is_error and "validation error" in bad.content

                # calls from several tasks at once share the one connection
                many = await asyncio.gather(*(echo.call({"text": str(i)}, CTX) for i in range(5)))
                assert [r.content for r in many] == ["0", "1", "2", "3", "4"]

                # the run's cancel token abandons a slow call
                cancelled = ToolContext("r", "c2", "k2", workspace=None)  # type: ignore[arg-type]
                asyncio.get_running_loop().call_later(0.3, cancelled.cancel.set)
                result = await by_name["slow"].call({"seconds": 30}, cancelled)
                assert result.is_error and result.data == {"cancelled": True}

                registry = ToolRegistry(tools)
                assert registry.schemas()[0]["function"]["name"] == "echo"
            finally:
                # closed from another task than the one that started it
                await asyncio.create_task(close_mcp_tools(tools))
            with pytest.raises(ToolError, match="is not running"):
                await tools[0].call({"text": "late"}, CTX)

    asyncio.run(scenario())


def test_context_manager_stops_the_server_process():
    async def scenario():
        async with McpStdioServer(SERVER) as server:
            assert "echo" in [t.name for t in server.tools]
            pids = _server_pids()
            assert len(pids) == 1, "one server process should be running"
        return pids

    pids = asyncio.run(scenario())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_a_server_that_dies_at_start_is_a_clear_error():
    async def scenario():
        with pytest.raises(ToolError, match="failed to start"):
            await mcp_stdio_tools([sys.executable, "-c", "import sys; sys.exit(3)"])

    asyncio.run(scenario())
    with pytest.raises(ValueError, match="non-empty list of strings"):
        McpStdioServer([])


def _server_pids() -> list[int]:
    """Our child processes running the echo server."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"mcp_echo_server.py" in cmdline:
            pids.append(int(proc.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"
