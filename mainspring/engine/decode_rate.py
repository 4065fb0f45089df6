"""The engine's measured decode rate: tokens it generated per second of stepping, over its last steps.

AsyncLLMEngine records every step (the tokens its outputs gained, the step's wall time); the plan scheduler's
admission (agents/plans/admission.py, through the server's model resolver) reads the rate to decide whether one
more run on this engine would still get its floor of tokens/s. Only time spent stepping counts, so an idle engine
keeps the rate it last had instead of drifting to zero; prefill steps count with their time, so a long prompt
lowers the rate as it lowers what the runs get.
"""

from __future__ import annotations

import threading
from collections import deque

STEPS = 256  # the window: recent enough to follow the load, long enough to smooth one slow step


class DecodeRate:
    def __init__(self, steps: int = STEPS) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=steps)
        self._lock = threading.Lock()  # recorded on the compute thread, read from the scheduler's

    def record(self, tokens: int, seconds: float) -> None:
        """One step: the tokens its outputs gained (all requests together) and the step's wall time."""
        if seconds <= 0:
            return
        with self._lock:
            self._samples.append((tokens, seconds))

    def tokens_per_s(self) -> float | None:
        """Generated tokens per second of stepping over the window; None before any step generated a token."""
        with self._lock:
            tokens = sum(t for t, _ in self._samples)
            busy = sum(s for _, s in self._samples)
        return tokens / busy if tokens and busy > 0 else None
