"""Shared test setup: keep torch to a deliberate thread count so tests don't oversubscribe 2 cores
(under pytest-xdist, the cores are divided among the workers)."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The suite tests the CPU path wherever it runs: an engine left on device "auto" would take a visible GPU in bf16,
# and the CPU tests expect fp32's answers. With MAINSPRING_TEST_GPU=1 (bench/gpu_check.sh sets it) torch sees the
# GPU, and tests/engine/test_cuda.py runs on it instead of on the simulated one.
if os.environ.get("MAINSPRING_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402

_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
_threads = max(1, min(2, _cores // _workers))
torch.set_num_threads(int(os.environ.get("MAINSPRING_TEST_THREADS", str(_threads))))

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# database_url / blank_database_url: each database-facing test on SQLite and on a throwaway Postgres
pytest_plugins = ["tests.databases"]

# converted weights are cached per checkout, so a clean clone converts once per run
os.environ.setdefault("MAINSPRING_DATA_DIR", str(Path(__file__).resolve().parent.parent / ".mainspring-test"))


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct, converted and loaded once per test session."""
    from mainspring.config import Settings
    from mainspring.engine.loader import load_model

    return load_model("smollm2", Settings().cache_dir)


@pytest.fixture(scope="session")
def sandbox():
    """A real sandbox (bubblewrap, cgroups, seccomp, Landlock as this host has them), shared by every test.
    CI installs bubblewrap, so there a host that cannot isolate is a failure, not a skip."""
    from mainspring.sandbox import SandboxUnavailable
    from tests.sandbox.conftest import make_sandbox

    sb = make_sandbox(sandbox_slots=8)
    try:
        sb.prepare()
    except SandboxUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to isolate jobs: {exc}")
        pytest.skip(str(exc))
    yield sb
    sb.close()
