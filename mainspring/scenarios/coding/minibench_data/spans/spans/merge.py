"""The union of intervals as sorted disjoint intervals, and the gaps it leaves."""

from __future__ import annotations

from typing import Iterable

from spans.interval import Interval


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points; intervals that overlap or touch ([1, 3) and [3, 5))
    become one."""
    ordered = sorted(iv for iv in intervals if not iv.empty)
    out = [ordered[0]]
    for iv in ordered[1:]:
        last = out[-1]
        if last.overlaps(iv):
            out[-1] = Interval(last.start, max(last.end, iv.end))
        else:
            out.append(iv)
    return out


def gaps(intervals: Iterable[Interval], within: Interval) -> list[Interval]:
    """The parts of `within` that none of the intervals cover."""
    out, cursor = [], within.start
    for iv in merge(intervals):
        if iv.end <= within.start or iv.start >= within.end:
            continue
        if iv.start > cursor:
            out.append(Interval(cursor, iv.start))
        cursor = max(cursor, iv.end)
    if cursor < within.end:
        out.append(Interval(cursor, within.end))
    return out
