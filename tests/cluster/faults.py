"""Faults injected into an engine replica's actor, as a GPU fault would arrive there."""

from typing import Any

import pytest

from mainspring.engine.async_engine import STOP_AFTER_FAILED_STEPS
from mainspring.engine.errors import EngineStepError
from mainspring.engine.params import SamplingParams
from tests.engine_faults import FAULT


def break_steps(replica: Any) -> None:
    """Run inside the replica's actor (`handle.__ray_call__`): every engine step from now on raises, as on a lost
    GPU context."""
    def step():
        raise RuntimeError(FAULT)

    replica.engine.engine.step = step


def stop_engine(ray: Any, handle: Any) -> None:
    """Break the replica's steps and fail requests there until its engine stops (the actor itself lives on)."""
    ray.get(handle.__ray_call__.remote(break_steps))
    params = SamplingParams(temperature=0.0, max_tokens=2)
    for i in range(STOP_AFTER_FAILED_STEPS):
        with pytest.raises(EngineStepError):
            ray.get(handle.generate_batch.remote([[300 + i] * 20], [params]))


def block_event_loop(replica: Any, release: str) -> None:
    """Run inside the replica's actor: hold its event loop (where `info` and new requests are served), as a
    replica wedged in a call that never yields would, until the file `release` exists (at most two minutes)."""
    import os
    import time

    deadline = time.monotonic() + 120
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
