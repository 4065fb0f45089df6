"""Streams, events and graphs of the simulated GPU: streams run in order, a graph replays its recorded ops."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tests.simulated_cuda.tensor import DEVICE

if TYPE_CHECKING:
    from tests.simulated_cuda.kernels import Kernels


class CUDAGraph:
    """Stands in for torch.cuda.CUDAGraph: the ops recorded by a capture, run again at each replay."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, tuple, dict, Any]] = []
        self._mode: Kernels | None = None

    def replay(self) -> None:
        if self._mode is None:
            raise RuntimeError("CUDAGraph.replay: the graph was never captured")
        self._mode.replay(self)

    def pool(self) -> tuple[str, int]:
        return ("graph pool", id(self))

    def reset(self) -> None:
        self.ops.clear()


class Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = DEVICE

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        from tests.simulated_cuda.kernels import Kernels  # the kernels layer imports this one

        Kernels.current()._sync("Stream.synchronize")

    def record_event(self, event: Any = None) -> Any:
        return event or Event()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class Event:
    """A CUDA event; its timing is the host's clock (ops run synchronously here), so a timed script runs, and
    its times say nothing of a GPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.at: float | None = None

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        from tests.simulated_cuda.kernels import Kernels

        Kernels.current()._sync("Event.synchronize")

    def elapsed_time(self, end: Event) -> float:
        if self.at is None or end.at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.at - self.at) * 1000.0

    def query(self) -> bool:
        return True
