"""Half-open intervals [start, end): the start is inside, the end is not, so [1, 3) and [3, 5) share no point."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class Interval:
    start: Any
    end: Any

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"an interval ends after it starts: {self.start!r} > {self.end!r}")

    @property
    def empty(self) -> bool:
        return self.start == self.end

    def length(self) -> Any:
        return self.end - self.start

    def contains(self, point: Any) -> bool:
        return self.start <= point <= self.end

    def overlaps(self, other: Interval) -> bool:
        """The two share at least one point."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other: Interval) -> Interval | None:
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))
