"""Per-key request and token limits over a sliding minute, answered with 429 + Retry-After.

In memory, per server process: limits protect one server's capacity; the money limits
(budgets) are in the database and hold across processes.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass

WINDOW_S = 60.0


@dataclass
class RateLimitedCall:
    at: float
    tokens: int


class RateLimited(Exception):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def retry_after(self) -> str:
        return str(max(1, math.ceil(self.retry_after_s)))


class RateLimiter:
    def __init__(self, clock=time.monotonic) -> None:
        self._calls: dict[str, deque[RateLimitedCall]] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def admit(self, key: str, rpm: int, tpm: int, tokens: int) -> RateLimitedCall:
        """Count a call of up to `tokens` tokens, or raise RateLimited; 0 = no limit.

        The estimate (prompt + max output) is replaced by the real count in `settle`, so a
        short answer does not keep a large share of the minute."""
        with self._lock:
            now = self._clock()
            calls = self._calls.setdefault(key, deque())
            while calls and now - calls[0].at >= WINDOW_S:
                calls.popleft()
            if rpm and len(calls) >= rpm:
                wait = WINDOW_S - (now - calls[0].at)
                raise RateLimited(f"rate limit reached: {rpm} requests per minute for this key; "
                                  f"retry in {math.ceil(wait)} s", wait)
            if tpm:
                if tokens > tpm:
                    raise RateLimited(f"this call may use {tokens} tokens but the key's limit is {tpm} tokens "
                                      "per minute; lower max_tokens or the prompt", WINDOW_S)
                used = sum(c.tokens for c in calls)
                if used + tokens > tpm:
                    wait, freed = 0.0, 0
                    for c in calls:  # until enough old calls leave the window
                        freed += c.tokens
                        wait = WINDOW_S - (now - c.at)
                        if used - freed + tokens <= tpm:
                            break
                    raise RateLimited(f"rate limit reached: {tpm} tokens per minute for this key "
                                      f"({used} used); retry in {math.ceil(wait)} s", wait)
            call = RateLimitedCall(now, tokens)
            calls.append(call)
            return call

    def settle(self, call: RateLimitedCall, tokens: int) -> None:
        with self._lock:
            call.tokens = tokens
