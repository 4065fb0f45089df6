"""The one backoff formula for every retry loop (model calls, tool calls, the CLI's event stream, upstreams)."""

from __future__ import annotations


def backoff_delay(attempt: int, base_s: float, cap_s: float) -> float:
    """Seconds to wait before retry `attempt`: `base_s` doubled each attempt (attempt 0 waits `base_s`),
    never more than `cap_s`, so a long outage is polled at a steady pace instead of ever more rarely."""
    return min(base_s * 2 ** attempt, cap_s)
