"""What a tool is to the run loop: a name, a JSON schema, a declared risk profile, and an async call.

The loop journals every call before it runs it. `idempotent` tools are re-run after a crash with the same
`ToolContext.idempotency_key`; a non-idempotent call that was in flight at a crash is never re-run without a
human's decision. `requires_approval` tools wait for a human before every call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


class ToolError(Exception):
    """A tool failed in a way the model should see (bad arguments, missing file, query error)."""


class TransientToolError(ToolError):
    """A failure worth retrying (timeouts, a busy resource): the loop retries with backoff up to `retries`."""


class EndRun(Exception):
    """Raised by a tool to end its run here, successfully, with `result` and `stop_reason` (a handoff: the run's
    work goes on in another agent's run). The call is recorded as completed with `content` first."""

    def __init__(self, content: str, result: str, stop_reason: str):
        super().__init__(content)
        self.content, self.result, self.stop_reason = content, result, stop_reason


@dataclass
class Artifact:
    name: str
    data: bytes
    mime: str = "application/octet-stream"


@dataclass
class ToolResult:
    content: str  # what the model sees next turn
    data: Any = None  # structured result for the journal and the API (citations, rows, …)
    is_error: bool = False
    artifacts: list[Artifact] = field(default_factory=list)


@dataclass
class ToolContext:
    run_id: str
    call_id: str
    idempotency_key: str  # stable across retries and crash re-runs of this one call
    workspace: Path  # the run's own files directory on the host (persists across steps)
    attachments: dict[str, str] = field(default_factory=dict)  # e.g. {"docs": "/path/folder", "db": "/path/x.db"}
    cancel: threading.Event = field(default_factory=threading.Event)  # set when the run is cancelled
    sandbox: Any = None  # mainspring.sandbox.Sandbox, when code tools need one
    goal: str = ""  # the run's goal as the model got it (a plan task's: its prompt and input artifacts)


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments object
    idempotent: bool
    requires_approval: bool
    timeout_s: float
    retries: int

    async def call(self, args: dict, ctx: ToolContext) -> ToolResult: ...


def openai_schema(tool: Tool) -> dict:
    """The tool as the OpenAI `tools` entry a ChatModel takes."""
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}
