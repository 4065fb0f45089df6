"""A real sandbox for the tests: bubblewrap, cgroups, seccomp and Landlock as this host has them.

CI installs bubblewrap, so there a host that cannot isolate is a failure, not a skip.
"""

import os

import pytest

from mainspring.config import Settings
from mainspring.sandbox import Sandbox, SandboxUnavailable

TEST_SANDBOX_DIR = "/tmp/mainspring-sandbox-tests"


def make_sandbox(**overrides) -> Sandbox:
    return Sandbox(Settings(sandbox_dir=TEST_SANDBOX_DIR, **overrides))


@pytest.fixture(scope="session")
def sandbox():
    sb = make_sandbox(sandbox_slots=8)
    try:
        sb.prepare()
    except SandboxUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to isolate jobs: {exc}")
        pytest.skip(str(exc))
    yield sb
    sb.close()


@pytest.fixture()
def as_root(sandbox):
    if not sandbox.host.is_root:
        pytest.skip("per-slot uids and cgroup accounting need the launcher to run as root")
    return sandbox
