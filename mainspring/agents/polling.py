"""How long a poller waits before its next look at the database: short while it finds work, longer while it finds
none.

The agent worker and the plan scheduler look for work other processes make (runs queued by another API server on
the same database, a lease that ran out, an interrupt past its expiry) by polling; work made in this process wakes
them at once instead. An idle server kept polling at the busy pace, 7 looks a second: 4.3% of a core, and each
look took a core away from the engine's two OpenMP threads in the middle of a step (a parallel region waits for
its slowest thread). Measured on a 2-core Intel Xeon through HTTP (bench/http_peers.py's client), with both pollers
at 2 s: idle CPU 1.3% of a core, single-stream decode 28.6 -> 29.6 tok/s, 32 agents 2,974 -> 3,051 tok/s.

`IdlePace` doubles the wait after each look that found nothing, from the busy pace up to `idle_s`, and drops back
to the busy pace after a look that found work. Work from elsewhere is seen at most `idle_s` late.
"""

from __future__ import annotations

from dataclasses import dataclass, field

IDLE_POLL_S = 2.0  # the longest wait of an idle poller: how late work from another process may be seen


@dataclass
class IdlePace:
    busy_s: float  # the wait after a look that found work
    idle_s: float = IDLE_POLL_S  # the longest wait
    wait_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.idle_s = max(self.idle_s, self.busy_s)
        self.wait_s = self.busy_s

    def after(self, found_work: bool) -> float:
        """The wait before the next look, given what this look found."""
        self.wait_s = self.busy_s if found_work else min(self.wait_s * 2, self.idle_s)
        return self.wait_s
