"""Agent runtime test kit: a fresh database, test-only models and tools, and a runtime driving runs in-process.

The models here are scripted policies (TEST-ONLY, for the runtime's machinery); the end-to-end test with the
real embedded model lives in tests/api.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mainspring.agents.runtime import AgentRuntime
from mainspring.agents.spec import AgentLimits, AgentSpec
from mainspring.agents.tools.base import ToolResult
from mainspring.config import Settings
from mainspring.engine.outputs import Usage
from mainspring.models import ChatModel, Completion, ToolCall

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}


class PolicyModel(ChatModel):
    """TEST-ONLY: calls `tool` with `args` until `calls` results (or a "count=N" that high) are in the
    conversation, then answers with `final` followed by the last tool result. Records every conversation it saw."""

    def __init__(self, tool: str = "count", args: dict | None = None, calls: int = 1, final: str = "done:"):
        self.tool, self.args, self.n, self.final = tool, args or {}, calls, final
        self.model = "policy"
        self.seen: list[list[dict]] = []

    async def chat(self, messages, **kwargs) -> Completion:
        self.seen.append(messages)
        results = [m for m in messages if m["role"] == "tool"]
        # progress survives compaction: the summary keeps the tool results' "count=N"
        done = max([len(results)]
                   + [int(n) for m in messages for n in re.findall(r"count=(\d+)", str(m.get("content")))])
        usage = Usage(prompt_tokens=sum(len(str(m.get("content") or "")) for m in messages) // 4 + 10,
                      cached_tokens=0, completion_tokens=8)
        if done < self.n and kwargs.get("tools"):
            return Completion("", [ToolCall(f"c{done}", self.tool, json.dumps(self.args))], "tool_calls",
                              usage, self.model)
        last = results[-1]["content"] if results else ""
        return Completion(f"{self.final} {last}".strip(), [], "stop", usage, self.model)

    async def stream(self, messages, **kwargs):  # pragma: no cover - the runtime only calls chat()
        raise NotImplementedError


@dataclass
class CountTool:
    """TEST-ONLY side effect: appends its idempotency key to `ledger` once per effect (deduping by key when
    idempotent, which is what makes a re-run after a crash safe)."""
    ledger: Path
    name: str = "count"
    description: str = "add one to the counter"
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    idempotent: bool = True
    requires_approval: bool = False
    timeout_s: float = 30
    retries: int = 0
    delay_s: float = 0.0  # before the effect
    delay_after_s: float = 0.0  # after the effect, before returning (a crash here leaves an effect behind)
    calls: list[dict] = field(default_factory=list)

    async def call(self, args: dict, ctx) -> ToolResult:
        self.calls.append(args)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        keys = self.ledger.read_text().split() if self.ledger.exists() else []
        if not (self.idempotent and ctx.idempotency_key in keys):
            with open(self.ledger, "a") as f:
                f.write(ctx.idempotency_key + "\n")
        if self.delay_after_s:
            await asyncio.sleep(self.delay_after_s)
        total = sum(key.startswith(ctx.run_id + "/") for key in self.ledger.read_text().split())
        return ToolResult(f"count={total} args={json.dumps(args, sort_keys=True)}")


@pytest.fixture
def db_url(database_url):
    """A fresh, migrated database per test: SQLite and Postgres (tests/databases.py)."""
    return database_url


def make_runtime(tmp_path: Path, db_url: str, model: ChatModel, tools: dict, **settings: Any) -> AgentRuntime:
    s = Settings(data_dir=tmp_path, **settings)
    return AgentRuntime(s, models=lambda name, project=None: model, tools=tools, db_url=db_url)


DRIVE_TIMEOUT_S = 240.0  # far above any test's own waits (wait_plan: 60 s): past it, a test is stuck


def drive(runtime: AgentRuntime, body, timeout_s: float = DRIVE_TIMEOUT_S):
    """Run `body()` (a coroutine function) with the runtime started, and stop it afterwards. A body or a stop
    that does not finish in `timeout_s` fails the test with where every task of the loop was waiting (a hang
    seen once under xdist left only an idle event loop to look at)."""
    async def bounded(coro, what: str):
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            stuck = tasks_waiting()  # before the cancel unwinds them
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise AssertionError(f"{what} did not finish in {timeout_s:g} s; the loop's tasks:\n{stuck}")
        return task.result()

    async def main():
        await bounded(runtime.start(), "runtime.start()")
        try:
            return await bounded(body(), "the test body")
        finally:
            await bounded(runtime.stop(), "runtime.stop()")
    return asyncio.run(main())


def tasks_waiting() -> str:
    """Each pending task of the running loop: the chain of awaits it is suspended in, outermost first, down to
    what it waits on (Task.get_stack gives only the outermost frame of a suspended coroutine)."""
    lines = []
    for task in asyncio.all_tasks():
        chain, awaited = [], task.get_coro()
        while awaited is not None and len(chain) < 40:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                chain.append(repr(awaited)[:160])  # a future, or a coroutine that finished
                break
            chain.append(f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        lines.append(f"  {task.get_name()}: " + " -> ".join(chain))
    return "\n".join(sorted(lines))


def spec(name: str = "tester", tools=("count",), **limits: Any) -> AgentSpec:
    return AgentSpec(name=name, model="policy", tools=list(tools), limits=AgentLimits(**limits))


async def wait_status(runtime: AgentRuntime, run_id: str, statuses: set[str], timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        run = await asyncio.to_thread(runtime.run, run_id)
        if run.status in statuses:
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} is {run.status}, not {statuses} after {timeout}s: {run.error}")
        await asyncio.sleep(0.05)
