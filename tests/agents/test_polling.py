"""The pollers' pace: an idle worker looks at the database less and less often, up to IDLE_POLL_S between looks;
a look that finds work brings it back to the busy pace."""

import asyncio

import pytest

from mainspring.agents import worker as worker_module
from mainspring.agents.polling import IDLE_POLL_S, IdlePace
from tests.agents.conftest import make_runtime


def test_the_wait_doubles_while_idle_and_drops_back_after_work():
    pace = IdlePace(0.2, idle_s=2.0)
    assert [pace.after(False) for _ in range(6)] == [0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    assert pace.after(True) == 0.2
    assert pace.after(False) == 0.4
    assert IdlePace(3.0, idle_s=2.0).after(False) == 3.0  # never below the busy pace


@pytest.mark.parametrize("found", [[False] * 7, [True] * 3, [False, False, False, True, False]])
def test_a_worker_waits_longer_only_after_looks_that_found_nothing(tmp_path, monkeypatch, found):
    worker = make_runtime(tmp_path, "sqlite:///" + str(tmp_path / "db.sqlite"), model=None, tools={}).worker
    worker.poll_s = 0.05
    waits: list[float] = []  # what the worker asked to wait after each look

    class RecordedPace(IdlePace):
        def after(self, found_work: bool) -> float:  # recorded, then not waited at all
            waits.append(super().after(found_work))
            return 0

    async def body():
        finished = asyncio.Event()

        async def tick(t: float) -> bool:  # each look finds what `found` says
            if len(waits) >= len(found):
                finished.set()
                return False
            return found[len(waits)]

        monkeypatch.setattr(worker, "_tick", tick)
        monkeypatch.setattr(worker_module, "IdlePace", RecordedPace)
        await worker.start()
        await finished.wait()
        await worker.stop()

    asyncio.run(body())
    expected, wait = [], 0.05
    for f in found:
        wait = 0.05 if f else min(wait * 2, IDLE_POLL_S)
        expected.append(wait)
    assert waits[:len(found)] == expected


@pytest.mark.parametrize("poller", ["agent worker", "plan scheduler"])
def test_a_poller_stops_when_a_wake_up_and_the_stop_land_in_the_same_turn(tmp_path, poller):
    """asyncio.wait_for on Python 3.11 returns normally when its inner wait finishes in the same turn as the cancel
    (CPython gh-86296): the polling loop then went on, and stop(), awaiting it, waited for ever (a test under xdist
    hung 30 minutes on this)."""
    rt = make_runtime(tmp_path, "sqlite:///" + str(tmp_path / "db.sqlite"), model=None, tools={})
    part = rt.worker if poller == "agent worker" else rt.scheduler

    async def body():
        await part.start()
        for _ in range(3):  # a few looks, then idle in the wait
            await asyncio.sleep(0.05)
        wake = part.notify if poller == "agent worker" else part.wake
        wake()  # the wait's event is set: its wake-up is queued ...
        async with asyncio.timeout(10):
            await part.stop()  # ... and the cancel lands in the same turn
        return part._main

    main = asyncio.run(body())
    assert main is None or (main.done() and main.cancelled())


def test_a_plan_scheduler_tick_counts_as_work_only_when_it_acted():
    from mainspring.agents.plans.scheduler import TickReport

    assert not TickReport().acted() and not TickReport(leader=True, term=3).acted()
    assert TickReport(dispatched=1).acted() and TickReport(completed=2).acted() and TickReport(fired=1).acted()
    assert TickReport(blocked={"sandbox_slots": 1}).acted()  # held back: capacity may free up at any moment
