"""One private Ray cluster per test process (a fresh `ray.init` costs seconds), on loopback."""

import os

import pytest


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """The `ray` module, joined to a cluster of 2 CPUs started for this test session. CI installs Ray (the test
    extra), so there its absence is a failure, not a skip."""
    from mainspring.cluster import ray_cluster as rc
    from mainspring.config import Settings

    try:
        rc.ray_module()
    except rc.RayUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    ray = rc.connect(Settings(ray_address="local"), num_cpus=2)
    yield ray
    rc.disconnect()
