"""The compute thread: jobs and every engine's steps run on one thread; a failing engine fails only its own
requests, and recovers unless its steps keep failing."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import pytest

from mainspring.compute import ComputeThread, compute_thread
from mainspring.engine.async_engine import STOP_AFTER_FAILED_STEPS, AsyncLLMEngine
from mainspring.engine.errors import EngineStoppedError


@dataclass
class Out:
    request_id: str
    finished: bool
    delta_token_ids: tuple[int, ...] = (1,)  # one new token a step, as RequestOutput says


@dataclass
class FakeEngine:
    """TEST-ONLY: an LLMEngine-shaped object; each step advances every request by one output, the last finished."""

    steps_per_request: int = 3
    fail_on_step: int | None = None  # this step and every later one raise
    recovered: int = 0
    threads: set[str] = field(default_factory=set)
    left: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    tokenizer: object = None

    def add_request(self, prompt, params, request_id, priority, cache_salt) -> str:
        rid = request_id or f"r{len(self.left)}-{id(prompt)}"
        self.left[rid] = self.steps_per_request
        return rid

    def has_unfinished(self) -> bool:
        return any(self.left.values())

    def abort(self, rid: str) -> None:
        self.left.pop(rid, None)

    def recover(self) -> bool:
        self.recovered += 1
        self.left.clear()
        return True

    def step(self) -> list[Out]:
        self.threads.add(threading.current_thread().name)
        self.steps += 1
        if self.fail_on_step is not None and self.steps >= self.fail_on_step:
            raise RuntimeError("the kernel broke")
        outs = []
        for rid, n in list(self.left.items()):
            if n:
                self.left[rid] = n - 1
                outs.append(Out(rid, n == 1))
        return outs


def test_jobs_and_steps_of_every_engine_share_one_thread():
    a, b = FakeEngine(), FakeEngine()
    ea, eb = AsyncLLMEngine(a), AsyncLLMEngine(b)

    async def main():
        built_on = await compute_thread().run(lambda: threading.current_thread().name)
        outs = await asyncio.gather(ea.generate([1]), eb.generate([2]), ea.generate([3]))
        return built_on, outs

    try:
        built_on, outs = asyncio.run(main())
    finally:
        ea.close(), eb.close()
    assert all(o.finished for o in outs)
    assert a.threads == b.threads == {built_on} == {"mainspring-compute"}
    assert built_on != threading.current_thread().name


def test_a_failing_engine_fails_its_requests_and_the_others_go_on():
    bad, good = FakeEngine(fail_on_step=2), FakeEngine(steps_per_request=5)
    eb, eg = AsyncLLMEngine(bad), AsyncLLMEngine(good)

    async def main():
        return await asyncio.gather(eb.generate([1]), eg.generate([2]), return_exceptions=True)

    try:
        failed, ok = asyncio.run(main())
    finally:
        eb.close(), eg.close()
    assert isinstance(failed, RuntimeError) and "the engine failed" in str(failed)
    assert isinstance(failed.__cause__, RuntimeError) and str(failed.__cause__) == "the kernel broke"
    assert ok.finished and good.steps == 5
    assert bad.recovered == 1 and eb.stopped is None  # one failed step: its requests fail, the engine serves on


def test_failed_steps_in_a_row_stop_the_engine():
    """A request that breaks a step fails (and the engine recovers), but STOP_AFTER_FAILED_STEPS failures in a row
    say the engine itself is broken: it stops, and a later request is refused at once."""
    broken = FakeEngine(fail_on_step=1)
    eng = AsyncLLMEngine(broken)
    try:
        for n in range(STOP_AFTER_FAILED_STEPS):
            with pytest.raises(RuntimeError, match="the engine failed while serving this request"):
                asyncio.run(eng.generate([n]))
        assert broken.recovered == STOP_AFTER_FAILED_STEPS - 1
        assert str(eng.stopped) == "the kernel broke"
        with pytest.raises(EngineStoppedError, match="restart the server"):
            asyncio.run(eng.generate([9]))
        assert broken.steps == STOP_AFTER_FAILED_STEPS
    finally:
        eng.close()


def test_a_job_submitted_from_a_job_runs_at_once_and_errors_reach_the_caller():
    ct = ComputeThread()
    assert ct.call(lambda: ct.call(lambda: threading.current_thread().name)) == "mainspring-compute"
    with pytest.raises(ZeroDivisionError):
        ct.call(lambda: 1 / 0)
    assert ct.call(lambda: "still serving") == "still serving"


def test_a_closed_engine_is_not_stepped_again():
    fake = FakeEngine(steps_per_request=1000)
    eng = AsyncLLMEngine(fake)

    async def main():
        stream = eng.stream([1])
        await stream.__anext__()
        eng.close()
        return fake.steps

    at_close = asyncio.run(main())
    compute_thread().call(lambda: None)  # a full round of the compute loop after the close
    assert fake.steps <= at_close + 1


def test_an_engine_whose_step_raises_is_dropped_and_the_thread_goes_on(caplog):
    """step_once should fail its own requests, never raise; if one does anyway, the compute thread logs it, stops
    stepping that engine, and keeps stepping the others (before, the thread died and every engine in the process
    stalled)."""

    class Broken:
        calls = 0

        def step_once(self) -> bool:
            Broken.calls += 1
            raise RuntimeError("event loop is closed")

    broken, good = Broken(), FakeEngine(steps_per_request=4)
    compute_thread().register(broken)
    eg = AsyncLLMEngine(good)
    try:  # bounded: before the fix this waited forever on a dead thread
        out = asyncio.run(asyncio.wait_for(eg.generate([1]), timeout=60))
    finally:
        eg.close()
    assert out.finished and good.steps == 4
    assert Broken.calls == 1 and "an engine's step raised" in caplog.text
    assert compute_thread().call(lambda: threading.current_thread().name) == "mainspring-compute"  # still serving
