"""Shared fixtures for the agent tool tests: a call context over a temporary workspace, and a real sandbox."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mainspring.agents.tools.base import Tool, ToolContext, ToolResult
from mainspring.config import Settings

TEST_SANDBOX_DIR = "/tmp/mainspring-sandbox-tests"  # the sandbox tests' directory: its parents are traversable


def call(tool: Tool, args: dict, ctx: ToolContext) -> ToolResult:
    """Run one tool call to completion on a fresh event loop."""
    return asyncio.run(tool.call(args, ctx))


@pytest.fixture()
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture()
def ctx(workspace: Path) -> ToolContext:
    return ToolContext(run_id="run-1", call_id="call-1", idempotency_key="run-1/call-1", workspace=workspace)


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", sandbox_dir=TEST_SANDBOX_DIR)


