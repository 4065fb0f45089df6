"""The test kit's `drive`: a test body that never finishes fails with where each of the loop's tasks waits,
instead of holding its xdist worker until pytest-timeout or CI's limit."""

from __future__ import annotations

import asyncio

import pytest

from tests.agents.conftest import drive


class Runtime:
    def __init__(self) -> None:
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True


def test_a_stuck_body_fails_naming_the_await_it_is_stuck_in_and_the_runtime_still_stops():
    async def never_done():
        await asyncio.Event().wait()

    async def body():
        await never_done()

    rt = Runtime()
    with pytest.raises(AssertionError, match="the test body did not finish in 0.3 s") as failed:
        drive(rt, body, timeout_s=0.3)
    assert "body (test_drive.py" in str(failed.value) and "never_done (test_drive.py" in str(failed.value)
    assert rt.stopped


def test_a_body_that_finishes_returns_its_value():
    async def body():
        await asyncio.sleep(0)
        return 7

    assert drive(Runtime(), body, timeout_s=5) == 7
