"""Sandbox test kit: where test sandboxes live, and a root-only fixture (the `sandbox` fixture is in
tests/conftest.py, shared with the agent and scene tests)."""


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
