"""spans: half-open intervals of dates or numbers, their union, and calendar arithmetic."""

from spans.interval import Interval
from spans.merge import gaps, merge

__all__ = ["Interval", "gaps", "merge"]
