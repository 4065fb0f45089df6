"""Compute-heavy work as Ray tasks, placed by resource request: `submit` a module-level function, wait for it
with `wait` (a thread) or `await_result` (an event loop), cancel it with the caller's cancel event.

The function and its arguments travel by pickle; the function must be importable on the Ray workers (Mainspring
installed there), and so must everything it returns. Nothing durable is kept in Ray: the caller writes the
result where it belongs, and a task lost with its node raises here so the caller can run it again.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any, Callable

from mainspring.cluster.ray_cluster import ray_module


class TaskCancelled(RuntimeError):
    """The caller cancelled the task; its worker process was stopped."""


def task_exception(exc: BaseException) -> BaseException:
    """What a remote task or actor method raised, without Ray's wrapper: Ray re-raises it as a subclass of
    both RayTaskError and its own class, whose str() is the worker's whole traceback (paths, pid, ip); that
    belongs in the log (it stays the chained cause), not in a message a person or a model reads."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) and isinstance(exc, ray_module().exceptions.RayTaskError) else exc


def submit(fn: Callable[..., Any], *args: Any, num_cpus: float = 1.0, memory_mb: int | None = None,
           **kwargs: Any) -> Any:
    """Start `fn(*args, **kwargs)` on the cluster where `num_cpus` and `memory_mb` are free; its ObjectRef."""
    ray = ray_module()
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_retries": 0}  # the caller decides whether to re-run
    if memory_mb:
        options["memory"] = memory_mb * 2**20
    return ray.remote(**options)(fn).remote(*args, **kwargs)


def wait(ref: Any, cancel: threading.Event | None = None, poll_s: float = 0.1) -> Any:
    """The task's result (its exception re-raised); when `cancel` is set first, the task's worker is stopped and
    TaskCancelled raised."""
    ray = ray_module()
    while True:
        ready, _ = ray.wait([ref], timeout=poll_s)
        if ready:
            try:
                return ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                raise task_exception(exc) from exc
        if cancel is not None and cancel.is_set():
            ray.cancel(ref, force=True)  # force: a sync task only stops with its worker process
            raise TaskCancelled("cancelled while running on Ray")


async def await_result(ref: Any) -> Any:
    """The task's result, from an event loop; cancelling the awaiting task cancels the Ray task."""
    ray = ray_module()
    try:
        return await ref
    except ray.exceptions.RayTaskError as exc:
        raise task_exception(exc) from exc
    except asyncio.CancelledError:
        ray.cancel(ref, force=True)
        raise


def placement() -> str:
    """Where this code runs, for a result's record: "ray:<node id>:<pid>" in a Ray worker, "" elsewhere."""
    try:
        import ray
    except ImportError:
        return ""
    if not ray.is_initialized():
        return ""
    return f"ray:{ray.get_runtime_context().get_node_id()[:12]}:{os.getpid()}"
