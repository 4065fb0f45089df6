"""One API call's engine work, and the fields every generation answer carries.

A call (one HTTP request) becomes one or more engine requests — `n` choices, several prompts —
run as a `Generation`: it calls the economics hooks around the engine work, merges the engine
streams, keeps the latest output of each choice (so usage is known even for a call cut short),
and aborts its engine requests when the client goes away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator

import anyio
from fastapi import Request

from mainspring import __version__
from mainspring.api import hooks
from mainspring.engine.outputs import RequestOutput, Usage
from mainspring.engine.params import SamplingParams

if TYPE_CHECKING:
    from mainspring.api.routes.models import ServedModel

log = logging.getLogger(__name__)

SYSTEM_FINGERPRINT = f"fp_mainspring_{__version__}"
_END = object()


# ---- the answer's fields ---------------------------------------------------------------------------
def now() -> int:
    return int(time.time())


def finite(logprob: float) -> float:
    """JSON has no -inf: OpenAI's stand-in for an impossible token is -9999."""
    return logprob if math.isfinite(logprob) else -9999.0


# ---- one engine request per choice -----------------------------------------------------------------
@dataclass
class Job:
    """One engine request: a prompt (token ids), its parameters, and which prompt it belongs to."""

    prompt_ids: list[int]
    params: SamplingParams
    group: int = 0  # choices of one prompt share a group: usage counts that prompt once


def choice_jobs(prompt_ids: list[int], params: SamplingParams, n: int, group: int = 0) -> list[Job]:
    """n independent choices of one prompt; with a seed, choice i samples with seed + i."""
    if params.seed is None or n == 1:
        return [Job(prompt_ids, params, group) for _ in range(n)]
    return [Job(prompt_ids, dataclasses.replace(params, seed=params.seed + i), group) for i in range(n)]


# ---- running a call --------------------------------------------------------------------------------
class Generation:
    """The engine requests of one API call, between `hooks.before_call` and `hooks.after_call`."""

    def __init__(self, request: Request, model: ServedModel, endpoint: str, jobs: list[Job], *, stream: bool,
                 call_id: str) -> None:
        self.request, self.model, self.jobs, self.call_id = request, model, jobs, call_id
        self.last: list[RequestOutput | None] = [None] * len(jobs)
        groups = {j.group: len(j.prompt_ids) for j in jobs}
        self.info = hooks.CallInfo(
            endpoint=endpoint, model=model.id, tier=model.tier, stream=stream, prompt_tokens=sum(groups.values()),
            max_output_tokens=sum(j.params.max_tokens for j in jobs), num_choices=len(jobs), request_id=call_id)
        self.reservation: Any = None
        self._settled = False
        self._stream: AsyncIterator[tuple[int, RequestOutput]] | None = None

    async def begin(self) -> None:
        """Admission (budgets, rate limits); an APIError raised here is the HTTP answer."""
        self.reservation = await hooks.before_call(self.request, self.info)

    def usage(self) -> Usage:
        """Usage so far: each prompt once (cached: the least any of its choices got), all completions."""
        prompt = cached = completion = 0
        for group in dict.fromkeys(j.group for j in self.jobs):
            idx = [i for i, j in enumerate(self.jobs) if j.group == group]
            prompt += len(self.jobs[idx[0]].prompt_ids)
            outputs = [self.last[i] for i in idx]
            started = [o.usage for o in outputs if o is not None and o.usage]
            cached += min((u.cached_tokens for u in started), default=0)
            completion += sum(u.completion_tokens for u in started)
        return Usage(prompt, cached, completion)

    async def settle(self, status: str) -> None:
        """`hooks.after_call`, exactly once; shielded so a cancelled (disconnected) task still records."""
        if self._settled:
            return
        self._settled = True
        outcome = hooks.CallOutcome(status, tuple(o.finish_reason if o else None for o in self.last))
        with anyio.CancelScope(shield=True):
            try:
                await hooks.after_call(self.usage(), self.request, self.info, self.reservation, outcome)
            except Exception:  # the response is decided; a failing recorder must not change it
                log.exception("after_call hook failed for %s", self.call_id)

    def stream(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, output) after every engine step of any choice; settles when it ends."""
        self._stream = self._run()
        return self._stream

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()  # type: ignore[attr-defined]
        await self.settle("stream_interrupted")  # no-op when the stream already settled

    async def _run(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        # what it is if we are closed before the end: the client broke off the stream / left
        status = "stream_interrupted" if self.info.stream else "cancelled"
        merged = self._merged()
        try:
            async for i, out in merged:
                self.last[i] = out
                yield i, out
            status = "ok"
        except Exception:
            status = "error"
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await merged.aclose()  # type: ignore[attr-defined]  # `async for` does not close it
            await self.settle(status)

    def _engine_stream(self, i: int) -> AsyncIterator[RequestOutput]:
        job = self.jobs[i]
        return self.model.engine.stream(job.prompt_ids, job.params, request_id=f"{self.call_id}-{i}",
                                        priority=self.model.priority)

    async def _merged(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        if len(self.jobs) == 1:
            stream = self._engine_stream(0)
            try:
                async for out in stream:
                    yield 0, out
            finally:
                await stream.aclose()  # type: ignore[attr-defined]
            return
        # n > 1: one task per engine stream feeding a queue; cancelling a task aborts its request
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int) -> None:
            try:
                async for out in self._engine_stream(i):
                    queue.put_nowait((i, out))
                queue.put_nowait((i, _END))
            except Exception as e:
                queue.put_nowait((i, e))

        tasks = [asyncio.create_task(pump(i)) for i in range(len(self.jobs))]
        try:
            remaining = len(tasks)
            while remaining:
                i, item = await queue.get()
                if item is _END:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def complete(self) -> list[RequestOutput] | None:
        """Runs every choice to the end; None if the client disconnected first (requests aborted)."""
        async def consume() -> None:
            async for _ in self.stream():
                pass

        work = asyncio.ensure_future(consume())
        watch = asyncio.ensure_future(_until_disconnected(self.request))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
        if work.cancelled():
            await self.settle("cancelled")
            return None
        work.result()  # re-raises an engine error (already settled as "error")
        return list(self.last)  # type: ignore[arg-type]


async def _until_disconnected(request: Request) -> None:
    # The body is already read, so the next ASGI message is the disconnect (or nothing, ever).
    while (await request.receive())["type"] != "http.disconnect":
        pass
