"""Sandbox test kit: where test sandboxes live, and a root-only fixture (the `sandbox` fixture is in
tests/conftest.py, shared with the agent and scene tests)."""

import time
import uuid
from pathlib import Path

import pytest

from mainspring.config import Settings
from mainspring.sandbox import Sandbox

TEST_SANDBOX_DIR = "/tmp/mainspring-sandbox-tests"


def make_sandbox(**overrides) -> Sandbox:
    return Sandbox(Settings(sandbox_dir=TEST_SANDBOX_DIR, **overrides))


@pytest.fixture()
def as_root(sandbox):
    if not sandbox.host.is_root:
        pytest.skip("per-slot uids and cgroup accounting need the launcher to run as root")
    return sandbox


def job_name() -> str:
    """A process name no other process on this host has: a job sets it (`prctl(PR_SET_NAME)`, 15 bytes at most)
    so the test can find it among whatever else runs here, other test sessions' sandboxes included."""
    return f"job{uuid.uuid4().hex[:12]}"


def name_this_process(name: str) -> str:
    """Python source for a job that gives itself `name`."""
    return f"import ctypes; ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n"


def live_processes_named(name: str) -> list[int]:
    """Host pids called `name` that are not zombies (a zombie is dead and holds nothing)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == name:
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_for_processes(name: str, running: bool, guard_s: float = 120) -> bool:
    """Wait until a process called `name` runs (or none does). `guard_s` only keeps a broken build from hanging:
    the jobs that use this sleep for far longer, so reaching it means the job was not killed at all."""
    deadline = time.monotonic() + guard_s
    while bool(live_processes_named(name)) != running:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
