"""Joining the Ray cluster that `MAINSPRING_RAY_ADDRESS` names, once per process.

"auto" finds a cluster started on this machine (`ray start --head`), "host:port" or "ray://host:port"
joins a remote one, and "local" starts a private one for this process (tests, a laptop). Ray is an optional
dependency (`pip install 'mainspring[ray]'`): without it, or without an address, nothing is placed on Ray
and the caller gets `RayUnavailable` with the reason.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from mainspring.config import Settings, get_settings

log = logging.getLogger(__name__)
_lock = threading.Lock()


class RayUnavailable(RuntimeError):
    """Ray is not installed, no address is configured, or the cluster cannot be reached."""


def ray_module() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable("Ray is not installed: pip install 'mainspring[ray]'") from exc
    return ray


def connect(settings: Settings | None = None, num_cpus: int | None = None) -> Any:
    """The `ray` module, connected to the configured cluster (joined on the first call in this process).
    `num_cpus` sizes a "local" cluster only."""
    s = settings or get_settings()
    address = s.ray_address.strip()
    if not address:
        raise RayUnavailable("no Ray cluster configured: set MAINSPRING_RAY_ADDRESS ('auto', 'local', host:port)")
    ray = ray_module()
    with _lock:
        if ray.is_initialized():
            return ray
        kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        try:
            if address == "local":
                ray.init(num_cpus=num_cpus, object_store_memory=1 << 30, **kwargs)  # room for a weight sync
            else:
                ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RayUnavailable(f"cannot join the Ray cluster at {address!r}: {exc}") from exc
        log.info("joined Ray at %s: %s", address, ray.cluster_resources())
    return ray


def disconnect() -> None:
    """Leave the cluster (a "local" one stops with it)."""
    try:
        import ray
    except ImportError:
        return
    with _lock:
        if ray.is_initialized():
            ray.shutdown()
