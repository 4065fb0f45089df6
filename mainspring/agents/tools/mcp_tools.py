"""Tools from an MCP server started over stdio (the official `mcp` package, 2.x).

    server = McpStdioServer(["python", "my_server.py"])
    tools = await server.start()          # or: async with McpStdioServer([...]) as server: server.tools
    ...
    await server.aclose()

The SDK's stdio client and session are anyio context managers that must be entered and left by one task, while a
run loop calls tools from whatever task runs the step. So one background task owns the connection for its whole
life, and calls from any task on the same event loop go through its session.
"""

from __future__ import annotations

import asyncio
import base64
import re
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from mainspring.agents.tools.base import Artifact, ToolContext, ToolError, ToolResult

START_TIMEOUT_S = 30.0


@dataclass
class McpTool:
    """One tool of an MCP server, as a `Tool`."""

    name: str
    description: str
    parameters: dict
    server: McpStdioServer = field(repr=False, compare=False)
    remote_name: str  # the name the server knows it by (ours may carry a prefix, or be sanitized)
    idempotent: bool = False
    requires_approval: bool = False
    timeout_s: float = 60
    retries: int = 0

    async def call(self, args: dict, ctx: ToolContext) -> ToolResult:
        call = asyncio.ensure_future(self.server.call_tool(self.remote_name, args or {}, self.timeout_s))
        try:
            while not call.done():
                if ctx.cancel.is_set():
                    call.cancel()  # the SDK tells the server the request was cancelled
                    return ToolResult(f"tool {self.name!r} cancelled", data={"cancelled": True}, is_error=True)
                await asyncio.wait({call}, timeout=0.05)
        except asyncio.CancelledError:
            call.cancel()
            raise
        return call.result()


@dataclass
class McpStdioServer:
    command: list[str]
    env: dict[str, str] | None = None  # added to the SDK's minimal default environment (not ours: no secrets leak)
    cwd: str | None = None
    prefix: str = ""  # prepended to every tool name, e.g. "github_"
    requires_approval: bool = False  # for all its tools; a tool the server marks destructive always requires it
    timeout_s: float = 60
    errlog: TextIO | None = None  # the server's stderr; None = ours
    tools: list[McpTool] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.command or not all(isinstance(part, str) and part for part in self.command):
            raise ValueError(f"an MCP server command is a non-empty list of strings, got {self.command!r}")
        self._session: Any = None
        self._task: asyncio.Task | None = None
        self._closing: asyncio.Event | None = None
        self._exit_error: BaseException | None = None

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> list[McpTool]:
        """Start the server, list its tools (all pages) and return them as `McpTool`s."""
        if self._task is not None:
            raise RuntimeError("this MCP server was already started")
        loop = asyncio.get_running_loop()
        ready, closing = loop.create_future(), asyncio.Event()
        self._closing = closing
        self._task = asyncio.create_task(self._own_connection(ready, closing), name=f"mcp-stdio {self.command[0]}")
        try:
            async with asyncio.timeout(timeout_s):
                listing = await asyncio.shield(ready)
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, TimeoutError):
                raise ToolError(f"MCP server {self.command!r} did not start within {timeout_s:g} s") from None
            raise
        self.tools = [self._as_tool(t) for t in listing]
        return self.tools

    async def _own_connection(self, ready: asyncio.Future, closing: asyncio.Event) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client
        from mcp.types import PaginatedRequestParams

        params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=self.env, cwd=self.cwd)
        try:
            async with stdio_client(params, errlog=self.errlog or sys.stderr) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    listing, cursor = [], None
                    while True:
                        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor
                                                        else None)
                        listing += page.tools
                        cursor = page.next_cursor
                        if not cursor:
                            break
                    self._session = session
                    ready.set_result(listing)
                    await closing.wait()
        except BaseException as exc:
            error = _first_error(exc)
            if not ready.done():
                ready.set_exception(ToolError(f"MCP server {self.command!r} failed to start: {error}"))
            self._exit_error = error
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._session = None

    def _as_tool(self, remote: Any) -> McpTool:
        hints = remote.annotations
        read_only = bool(hints and hints.read_only_hint)
        idempotent = read_only or bool(hints and hints.idempotent_hint)
        destructive = bool(hints and hints.destructive_hint and not read_only)
        schema = dict(remote.input_schema or {})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        name = self.prefix + re.sub(r"[^A-Za-z0-9_-]", "_", remote.name)
        return McpTool(name=name[:64], description=remote.description or remote.title or "", parameters=schema,
                       server=self, remote_name=remote.name, idempotent=idempotent,
                       requires_approval=self.requires_approval or destructive, timeout_s=self.timeout_s)

    async def call_tool(self, name: str, args: dict, timeout_s: float) -> ToolResult:
        session = self._session
        if session is None:
            why = f": {self._exit_error}" if self._exit_error else ""
            raise ToolError(f"MCP server {self.command[0]!r} is not running{why}")
        from mcp import MCPError

        try:
            result = await session.call_tool(name, args, read_timeout_seconds=timeout_s)
        except MCPError as exc:
            raise ToolError(f"MCP tool {name!r} failed: {exc.message}") from exc
        except RuntimeError as exc:  # a result not matching the tool's output schema, or one needing input
            raise ToolError(f"MCP tool {name!r}: {exc}") from exc
        except Exception as exc:  # the connection broke: the server exited mid-call
            raise ToolError(f"MCP server {self.command[0]!r} stopped during the call to {name!r}: "
                            f"{_first_error(exc)}") from exc
        return as_tool_result(result)

    async def aclose(self) -> None:
        """Stop the server (the SDK closes its stdin, then terminates it) and wait for the owner task."""
        if self._task is None or self._closing is None:  # never started (both are set together)
            return
        self._closing.set()
        try:
            async with asyncio.timeout(10):
                await asyncio.shield(self._task)
        except Exception:  # TimeoutError included
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def __aenter__(self) -> McpStdioServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()


async def mcp_stdio_tools(command: list[str], env: dict[str, str] | None = None, **options: Any) -> list[McpTool]:
    """Start an MCP server over stdio and return its tools; close with `close_mcp_tools(tools)`.

    `options` are McpStdioServer's: cwd, prefix, requires_approval, timeout_s, errlog."""
    return await McpStdioServer(list(command), env, **options).start()


async def close_mcp_tools(tools: list[Any]) -> None:
    """Stop the servers behind these tools (other tools in the list are ignored)."""
    servers = {id(t.server): t.server for t in tools if isinstance(t, McpTool)}
    for server in servers.values():
        await server.aclose()


def as_tool_result(result: Any) -> ToolResult:
    """An MCP CallToolResult as what the model sees: its text blocks; images and audio as artifacts."""
    texts: list[str] = []
    artifacts: list[Artifact] = []
    for n, block in enumerate(result.content or []):
        kind = getattr(block, "type", "")
        if kind == "text":
            texts.append(block.text)
        elif kind in ("image", "audio"):
            extension = block.mime_type.split("/")[-1]
            artifacts.append(Artifact(f"{kind}-{n}.{extension}", base64.b64decode(block.data), block.mime_type))
            texts.append(f"[{kind} {artifacts[-1].name}]")
        elif kind == "resource":
            resource = block.resource
            texts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        elif kind == "resource_link":
            texts.append(f"[resource link {block.uri}]")
    data = result.structured_content
    return ToolResult("\n".join(texts), data=data, is_error=bool(result.is_error), artifacts=artifacts)


def _first_error(exc: BaseException) -> BaseException:
    """anyio wraps failures in ExceptionGroups; the first leaf says what went wrong."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
