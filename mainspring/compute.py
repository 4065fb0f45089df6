"""The compute thread: one thread per process runs the serving path's torch work — building engines
and every engine's steps.

Why one: torch's CPU build parallelises ops with libgomp, and libgomp gives each thread that opens a
parallel region a pool of its own. Once a process holds more pooled threads than CPUs, every pool
spins only briefly before sleeping (libgomp's throttled spin count), and each of the thousand small
ops of a decode step then pays a futex wake-up. Measured on a 2-core AMD EPYC: one linear layer set
7 ms from one thread, 15–17 ms once a second thread had run torch; the server's single-stream decode
at about half of the same engine in process (20 vs 37 tok/s) while the standard engine, the -fast
engine and the start-up code each had their own thread. On this one thread they share one pool.

Engines take turns by step (`EngineStepper`), so the standard and the -fast engine interleave one
step at a time; jobs submitted with `run` (building an engine, loading a fine-tuned model) go
between steps. An engine whose `step_once` raises (it should fail its own requests instead) is logged and no
longer stepped; the thread goes on for the others.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from concurrent.futures import Future
from typing import Callable, Protocol, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class EngineStepper(Protocol):
    def step_once(self) -> bool:
        """One step if there is work; whether there was. Called on the compute thread only."""
        ...


class ComputeThread:
    def __init__(self) -> None:
        self._wake = threading.Event()
        self._jobs: deque[tuple[Callable[[], object], Future]] = deque()
        self._engines: list[EngineStepper] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="mainspring-compute", daemon=True)
                self._thread.start()

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the compute thread, between engine steps."""
        future: Future[T] = Future()
        if self.on_thread():  # a job that submits a job: run it now, or it would wait for itself
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)
            return future
        self._ensure_started()
        with self._lock:
            self._jobs.append((fn, future))
        self._wake.set()
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """`submit` and wait (from any thread but an event loop's)."""
        return self.submit(fn).result()

    async def run(self, fn: Callable[[], T]) -> T:
        """`submit` and await (from an event loop)."""
        return await asyncio.wrap_future(self.submit(fn))

    def register(self, engine: EngineStepper) -> None:
        self._ensure_started()
        with self._lock:
            self._engines.append(engine)
        self._wake.set()

    def unregister(self, engine: EngineStepper) -> None:
        with self._lock:
            if engine in self._engines:
                self._engines.remove(engine)

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            busy = True
            while busy:  # until a whole round found nothing to do; a wake-up meanwhile is kept for the next wait
                busy = False
                while True:
                    with self._lock:
                        job = self._jobs.popleft() if self._jobs else None
                    if job is None:
                        break
                    fn, future = job
                    if future.set_running_or_notify_cancel():
                        try:
                            future.set_result(fn())
                        except BaseException as exc:
                            future.set_exception(exc)
                    busy = True
                with self._lock:
                    engines = list(self._engines)
                for engine in engines:
                    try:
                        busy = engine.step_once() or busy
                    except BaseException:  # one broken engine must not stop the thread every engine steps on
                        log.exception("an engine's step raised; it is no longer stepped")
                        self.unregister(engine)


_compute = ComputeThread()


def compute_thread() -> ComputeThread:
    """The process's compute thread (started on first use)."""
    return _compute
