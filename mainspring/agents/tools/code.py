"""`python` and `shell`: a model's code runs in the sandbox, with the run's workspace as its working directory.

The workspace lives on the host; each call copies it into the sandbox's fresh tmpfs (up to a size cap) and copies
the files the job created or changed back, through the same path checks as the `files` tool, so a job can neither
read the host nor write outside the workspace. Files the job deletes are not deleted on the host (the sandbox
reports new and changed files only).
"""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Optional

from mainspring.agents.tools.base import ToolContext, ToolError, ToolResult
from mainspring.agents.tools.decorator import FunctionTool, tool
from mainspring.agents.tools.paths import relative_name, workspace_path, write_file_nofollow
from mainspring.config import Settings, get_settings
from mainspring.sandbox.errors import SandboxError
from mainspring.sandbox.profiles import load_profiles
from mainspring.sandbox.result import Result

WORKSPACE_COPY_BYTES = 32 << 20  # the most workspace data copied into one job
WORKSPACE_COPY_FILES = 2_000
OUTPUT_CHARS = 12_000  # per stream in what the model sees: the head and the tail, the middle cut
TIMEOUT_MARGIN_S = 30.0  # over the profile's wall time: waiting for a free slot, copying files in and out
# the tools whose calls run in the sandbox: a run of an agent with one of them may hold a sandbox slot at any step
# (the plan scheduler's admission counts such runs against Settings.sandbox_slots: agents/plans/admission.py)
SANDBOX_TOOLS = frozenset({"python", "shell"})

# Our own threads for blocking sandbox runs, so long jobs never starve asyncio's default executor.
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def python_tool(settings: Settings | None = None, profile: str = "python") -> FunctionTool:
    settings = settings or get_settings()
    timeout_s = _profile_wall_s(settings, profile) + TIMEOUT_MARGIN_S

    @tool(name="python", idempotent=False, timeout_s=timeout_s)
    async def python(ctx: ToolContext, code: str, files: Optional[dict[str, str]] = None) -> ToolResult:
        """Run Python 3 code in an isolated sandbox without network access. The current directory is this
        run's workspace: its files can be read, and files the code creates or changes there are saved. Print
        what you want to see. The project's Python packages (e.g. numpy) can be imported.

        Args:
            code: the Python source to run
            files: optional text files to save in the workspace before running, as {relative path: content}
        """
        for name, content in (files or {}).items():
            write_file_nofollow(workspace_path(ctx.workspace, name), content.encode("utf-8"))
        return await run_in_sandbox(ctx, ["python3", "-"], profile=profile, stdin=code, settings=settings)

    return python


def shell_tool(settings: Settings | None = None, profile: str = "shell") -> FunctionTool:
    settings = settings or get_settings()
    timeout_s = _profile_wall_s(settings, profile) + TIMEOUT_MARGIN_S

    @tool(name="shell", idempotent=False, timeout_s=timeout_s)
    async def shell(ctx: ToolContext, command: str) -> ToolResult:
        """Run a POSIX shell command (/bin/sh -c) in an isolated sandbox without network access. The current
        directory is this run's workspace; files the command creates or changes there are saved.

        Args:
            command: the shell command line
        """
        return await run_in_sandbox(ctx, command, profile=profile, settings=settings)

    return shell


def _profile_wall_s(settings: Settings, profile: str) -> float:
    profiles = load_profiles(settings.sandbox_profiles_file)
    if profile not in profiles:
        raise ValueError(f"unknown sandbox profile {profile!r}; known: {', '.join(sorted(profiles))}")
    return float(profiles[profile].wall_s)


@dataclass
class WorkspaceInputs:
    files: dict[str, bytes] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # "path (why)"


def workspace_inputs(workspace: Path, cap_bytes: int = WORKSPACE_COPY_BYTES,
                     cap_files: int = WORKSPACE_COPY_FILES) -> WorkspaceInputs:
    """The workspace's regular files (links are not followed), smallest paths first, within the caps."""
    out = WorkspaceInputs()
    total = 0
    for root, dirs, names in os.walk(workspace, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            full = Path(root) / name
            rel = relative_name(workspace, full)
            info = os.lstat(full)
            if not stat.S_ISREG(info.st_mode):
                out.skipped.append(f"{rel} (not a regular file)")
            elif len(out.files) >= cap_files:
                out.skipped.append(f"{rel} (more than {cap_files} files)")
            elif total + info.st_size > cap_bytes:
                out.skipped.append(f"{rel} ({info.st_size} bytes; over the {cap_bytes >> 20} MiB copied per call)")
            else:
                out.files[rel] = full.read_bytes()
                total += info.st_size
    return out


async def run_in_sandbox(ctx: ToolContext, command: str | list[str], *, profile: str, stdin: str | None = None,
                         settings: Settings | None = None) -> ToolResult:
    """Run `command` in `ctx.sandbox` over a copy of the workspace; save its outputs; describe what happened."""
    if ctx.sandbox is None:
        raise ToolError("this run has no sandbox, so code cannot be run")
    workspace = Path(ctx.workspace)
    workspace.mkdir(parents=True, exist_ok=True)
    cap = int(getattr(settings, "agent_workspace_copy_mb", WORKSPACE_COPY_BYTES >> 20)) << 20
    inputs = workspace_inputs(workspace, cap_bytes=cap)
    try:
        result = await _run_cancellable(ctx, command, inputs.files, profile, stdin)
    except SandboxError as exc:  # SandboxUnavailable included: the host cannot isolate, or bad input files
        raise ToolError(f"the sandbox could not run this: {exc}") from exc
    saved, refused = save_outputs(workspace, result.files)
    return describe(result, saved, refused + inputs.skipped + [f"{p} (over the output size cap)"
                                                               for p in result.files_omitted])


async def _run_cancellable(ctx: ToolContext, command: str | list[str], files: dict[str, bytes], profile: str,
                           stdin: str | None) -> Result:
    """`sandbox.run` in a thread; the job is killed when the run's cancel token is set or this task is cancelled."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="agent-sandbox")
    kill = threading.Event()
    job = asyncio.get_running_loop().run_in_executor(
        _executor, partial(ctx.sandbox.run, command, files, profile, stdin=stdin, cancel=kill))
    try:
        while not job.done():
            if ctx.cancel.is_set():
                kill.set()  # the job dies within ~50 ms; we still wait for its Result (killed_by="cancelled")
            await asyncio.wait({job}, timeout=0.05)
    except asyncio.CancelledError:
        kill.set()
        raise
    return job.result()


def save_outputs(workspace: Path, outputs: dict[str, bytes]) -> tuple[list[str], list[str]]:
    """Write the job's new and changed files into the workspace; returns (saved paths, refused "path (why)")."""
    saved: list[str] = []
    refused: list[str] = []
    for name, data in sorted(outputs.items()):
        try:
            write_file_nofollow(workspace_path(workspace, name), data)
            saved.append(name)
        except ToolError as exc:
            refused.append(f"{name} ({exc})")
        except OSError as exc:
            refused.append(f"{name} (not saved: {exc.strerror})")
    return saved, refused


def describe(result: Result, saved: list[str], notes: list[str]) -> ToolResult:
    """What the model sees: exit code, which limit fired, the output (head and tail), the files saved."""
    lines = [f"exit code: {result.exit_code}"]
    if result.killed_by:
        lines.append(f"killed by: {result.killed_by}" + _KILL_HINTS.get(result.killed_by, ""))
    if result.limits_hit:
        lines.append(f"limits hit: {', '.join(result.limits_hit)}")
    stdout, stdout_cut = clip(result.stdout, result.stdout_truncated)
    stderr, stderr_cut = clip(result.stderr, result.stderr_truncated)
    if stdout:
        lines += ["--- stdout ---", stdout.rstrip("\n")]
    if stderr:
        lines += ["--- stderr ---", stderr.rstrip("\n")]
    if not stdout and not stderr:
        lines.append("(no output)")
    if saved:
        lines.append("files saved to the workspace: " + ", ".join(saved))
    if notes:
        lines.append("files not copied: " + "; ".join(notes))
    data = {"exit_code": result.exit_code, "killed_by": result.killed_by, "limits_hit": result.limits_hit,
            "stdout": stdout, "stderr": stderr, "stdout_truncated": stdout_cut, "stderr_truncated": stderr_cut,
            "files_saved": saved, "files_not_copied": notes, "wall_s": result.wall_s, "cpu_s": result.cpu_s,
            "peak_memory": result.peak_memory, "profile": result.profile}
    return ToolResult("\n".join(lines), data=data, is_error=not result.ok)


_KILL_HINTS = {
    "wall_time": " (the job ran past its wall-clock limit)",
    "cpu_time": " (the job used up its CPU-time limit)",
    "memory": " (the job ran out of its memory limit)",
    "output": " (the job printed more than the output limit)",
    "file_size": " (the job wrote a file over the size limit)",
    "cancelled": " (the run was cancelled)",
}


def clip(text: str, already_truncated: bool = False, limit: int = OUTPUT_CHARS) -> tuple[str, bool]:
    """Head and tail of `text` within `limit` characters, a marker where the middle was cut."""
    if len(text) <= limit:
        return text + ("\n[output truncated by the sandbox's output limit]" if already_truncated else ""), \
            already_truncated
    head, tail = text[: limit * 2 // 3], text[-(limit // 3):]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters cut ...]\n{tail}", True
