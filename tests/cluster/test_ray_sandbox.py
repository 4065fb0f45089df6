"""Sandbox jobs placed on Ray (MAINSPRING_RAY_COMPUTE=["sandbox"]): a job and a scene render run in a Ray
worker's own sandbox, with the isolation and the results of a local one; cancelling stops the job."""

import os
import threading
import time

import pytest

from mainspring.config import Settings
from mainspring.sandbox import SandboxUnavailable

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_sandbox(ray_cluster, sandbox):  # `sandbox`: this host can isolate (else the shared fixture skips or fails)
    from mainspring.sandbox.on_ray import RaySandbox

    sb = RaySandbox(Settings(ray_compute=["sandbox"], sandbox_dir=str(sandbox.root)))
    yield sb
    sb.close()


def test_a_job_runs_isolated_on_a_ray_worker(ray_sandbox):
    code = "import os; print(open('in.txt').read().upper(), os.getuid()); open('out.txt', 'w').write('done')"
    try:
        r = ray_sandbox.run(["python3", "-c", code], {"in.txt": "hello"}, "python")
    except SandboxUnavailable as exc:  # pragma: no cover - the local fixture passed, so the node should too
        pytest.fail(str(exc))
    assert r.ok, r.stderr
    text, uid = r.stdout.split()
    assert text == "HELLO" and r.files["out.txt"] == b"done"
    if os.geteuid() == 0:
        assert int(uid) != 0  # a slot's unprivileged uid, as in a local job
    kind, _node, pid = r.placement.split(":")
    assert kind == "ray" and int(pid) != os.getpid()


def test_a_job_refused_on_a_ray_worker_raises_the_sandbox_error_a_local_job_would(ray_sandbox, sandbox):
    from mainspring.sandbox import SandboxError

    with pytest.raises(SandboxError) as local:
        sandbox.run(["true"], {"../escape.txt": "x"}, "python")
    with pytest.raises(SandboxError) as remote:
        ray_sandbox.run(["true"], {"../escape.txt": "x"}, "python")
    assert str(remote.value) == str(local.value)  # the sandbox's words, not the Ray worker's traceback


def test_a_scene_render_through_ray_matches_one_in_process(ray_sandbox, tmp_path):
    from mainspring.scenarios.scene3d import load_briefs
    from mainspring.scenarios.scene3d.tools import render_in_process, render_in_sandbox

    snowman = next(b for b in load_briefs() if b.id == "snowman").reference
    on_ray = render_in_sandbox(ray_sandbox, snowman)
    here = render_in_process(snowman)
    assert on_ray.report["constraints"] == here.report["constraints"]
    assert on_ray.report["pixels"] == here.report["pixels"]


def test_cancelling_a_job_on_ray_stops_it(ray_sandbox):
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    start = time.monotonic()
    r = ray_sandbox.run(["sleep", "30"], profile="shell", cancel=cancel)
    assert r.killed_by == "cancelled" and time.monotonic() - start < 15
