"""AsyncLLMEngine: the engine's steps on the compute thread, one asyncio stream per request.

The HTTP server and the chat CLI run on an event loop; the model runs on the process's compute
thread (mainspring/compute.py: one thread for every engine, so torch keeps one thread pool) so a
forward pass never blocks the loop. Every engine call holds one lock, so adds and aborts from the
loop interleave safely with steps.

A step that raises fails every request in the engine (each stream gets the error) and aborts them; the engine
then serves new requests if that left it whole (no request, every KV block free). STOP_AFTER_FAILED_STEPS failed
steps in a row mean the engine, not a request, is broken (a lost GPU context fails every step): it stops, /health
says so, and every later request gets EngineStoppedError.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import AsyncIterator

from mainspring.compute import compute_thread
from mainspring.engine.decode_rate import DecodeRate
from mainspring.engine.engine import LLMEngine, Prompt
from mainspring.engine.errors import EngineStepError, EngineStoppedError
from mainspring.engine.outputs import RequestOutput
from mainspring.engine.params import SamplingParams

log = logging.getLogger(__name__)

STOP_AFTER_FAILED_STEPS = 3


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._aborts: list[str] = []
        self._closed = False
        self._error: BaseException | None = None
        self._failed_in_a_row = 0
        self._compute = compute_thread()
        self._compute.register(self)
        self.decode_rate = DecodeRate()  # what the plan scheduler's admission reads (engine/decode_rate.py)

    @property
    def stopped(self) -> BaseException | None:
        """The error the engine stopped on (then it serves nothing more), or None while it serves."""
        return self._error

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    async def stream(self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None,
                     priority: int = 0, cache_salt: str | None = None) -> AsyncIterator[RequestOutput]:
        """Yields a RequestOutput after every step that advanced the request; the last is finished.

        Leaving the iteration early (client gone, task cancelled) aborts the request.
        """
        self._raise_if_stopped()
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def add() -> str:  # on a worker thread: waiting for the lock must not block the event loop
            with self._lock:
                self._raise_if_stopped()  # it may have stopped since: a request added now would wait forever
                rid = self.engine.add_request(prompt, params, request_id, priority, cache_salt)
                self._queues[rid] = (loop, queue)
            self._compute.wake()
            return rid

        adding = asyncio.ensure_future(asyncio.to_thread(add))
        try:
            rid = await asyncio.shield(adding)
        except asyncio.CancelledError:  # the thread still adds it: abort once it has, or it runs for nobody
            def abort_once_added(f: asyncio.Future[str]) -> None:
                if not f.cancelled() and f.exception() is None:
                    self.abort(f.result())

            adding.add_done_callback(abort_once_added)
            raise
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise EngineStepError("the engine failed while serving this request") from item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(rid)

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None, **kw) -> RequestOutput:
        last = None
        async for out in self.stream(prompt, params, **kw):
            last = out
        assert last is not None
        return last

    def abort(self, request_id: str) -> None:
        """Non-blocking: the engine thread drops the request before its next step."""
        self._queues.pop(request_id, None)
        self._aborts.append(request_id)
        self._compute.wake()

    def close(self) -> None:
        """Stop stepping this engine; a step in flight finishes first (the lock)."""
        self._closed = True
        self._compute.unregister(self)
        with self._lock:
            pass

    def step_once(self) -> bool:
        """One engine step if a request is waiting (the compute thread calls this); whether it stepped."""
        if self._closed or self._error is not None:
            return False
        with self._lock:
            while self._aborts:
                self.engine.abort(self._aborts.pop())
            if not self.engine.has_unfinished():
                return False
            try:
                started = time.perf_counter()
                outputs = self.engine.step()
                took = time.perf_counter() - started
            except Exception as exc:  # the engine's state is settled before a waiting stream hears of it
                self._failed_in_a_row += 1
                log.exception("an engine step failed; its %d request(s) fail with it", len(self._queues))
                if self._failed_in_a_row >= STOP_AFTER_FAILED_STEPS:
                    log.error("the engine stops: %d steps failed in a row", self._failed_in_a_row)
                    self._stop(exc)
                elif not self._recover():
                    self._stop(exc)
                self._fail_streams(exc)
                return False
            except BaseException as exc:  # deliver to every waiting stream instead of dying silently
                self._stop(exc)
                self._fail_streams(exc)
                return False
            self._failed_in_a_row = 0
            self.decode_rate.record(sum(len(o.delta_token_ids) for o in outputs), took)
            for out in outputs:
                target = self._queues.get(out.request_id)
                if target is None:
                    continue
                if out.finished:
                    self._queues.pop(out.request_id, None)  # abort() may pop it from the loop's thread meanwhile
                try:
                    target[0].call_soon_threadsafe(target[1].put_nowait, out)
                except RuntimeError:  # its event loop is closed (that server stopped): nobody to tell
                    self._queues.pop(out.request_id, None)
        return True

    def _recover(self) -> bool:
        try:
            if self.engine.recover():
                return True
            log.error("the engine stops: aborting the failed step's requests did not leave it whole")
        except Exception:
            log.exception("the engine stops: aborting the failed step's requests raised")
        return False

    def _raise_if_stopped(self) -> None:
        if self._error is not None:
            raise EngineStoppedError() from self._error

    def _fail_streams(self, exc: BaseException) -> None:
        # a snapshot: each stream told aborts its request from the event loop's thread, which pops from _queues
        waiting, self._queues = self._queues, {}
        for loop, q in waiting.values():
            try:
                loop.call_soon_threadsafe(q.put_nowait, exc)
            except RuntimeError:  # its event loop is closed: nobody waits on that stream
                pass

    def _stop(self, exc: BaseException) -> None:
        self._error = exc
        self._compute.unregister(self)
