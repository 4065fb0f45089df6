"""One private Ray cluster per test process (a fresh `ray.init` costs seconds), on loopback."""

import os

import pytest


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """The `ray` module, joined to a local cluster started for this test session. CI installs Ray (the test
    extra), so there its absence is a failure, not a skip."""
    from mainspring.cluster import ray_cluster as rc
    from mainspring.config import Settings

    try:
        rc.ray_module()
    except rc.RayUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    # logical CPUs: two pools of two 1-CPU replicas may exist at once (modules of one worker, one after another)
    ray = rc.connect(Settings(ray_address="local"), num_cpus=4)
    yield ray
    rc.disconnect()
