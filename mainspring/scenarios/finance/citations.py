"""Citation markers and the numbers of a Markdown report.

Markers: `[F:fact_id]` (a reported fact), `[D:doc_id p.12 c.340-388]` (characters 340-388 of page 12's text as
the filings store extracts it), `[P:program_id]` (a program the run executed with `compute`).

The number finder returns each number a reader would take as a claim, with its scale applied ("$1,234.5 million"
→ 1234500000, "12.4%" → 0.124, "(3.2)" → -3.2) and the precision it was printed at, so a whole-dollar fact can be
compared with a rounded figure. It skips what is not a claim: years and fiscal-period labels (FY2023, Q2, 2024),
form names (10-K), the markers themselves, list numbering, page references and day-of-month in dates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FACT_MARKER = re.compile(r"\[F:\s*([A-Za-z0-9_.-]+)\s*\]")
SPAN_MARKER = re.compile(r"\[D:\s*(\S+?)\s+p\.\s*(\d+)\s+c\.\s*(\d+)\s*-\s*(\d+)\s*\]")
PROGRAM_MARKER = re.compile(r"\[P:\s*([A-Za-z0-9_.-]+)\s*\]")
ANY_MARKER = re.compile(r"\[(?:F|D|P):[^\]\n]*\]")

SCALES = {"thousand": 1e3, "k": 1e3, "million": 1e6, "mn": 1e6, "m": 1e6, "billion": 1e9, "bn": 1e9, "b": 1e9,
          "trillion": 1e12}
_NUMBER = re.compile(
    r"(?<![\w.,/#:-])(?P<open>\(\s*)?(?P<cur>\$\s?)?(?P<open2>\()?(?P<minus>[-−–])?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
    r"(?P<close>\))?(?P<pct>\s?%|\s?percent\b)?"
    r"(?P<scale>\s?(?:thousand|million|billion|trillion)s?\b|(?:bn|mn|[mbk])\b)?", re.IGNORECASE)
_MONTHS = ("january|february|march|april|may|june|july|august|september|october|november|december|"
           "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec")
_DAY_OF_MONTH = re.compile(rf"\b(?:{_MONTHS})\.?\s*$", re.IGNORECASE)
_PAGE_REF = re.compile(r"\b(?:p|pp|page|pages|note|notes|item|section|exhibit)\.?\s*$", re.IGNORECASE)
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]\s+)?$")


@dataclass(frozen=True)
class Citation:
    kind: str  # "F" | "D" | "P"
    ref: str  # the id (F, P) or "doc_id p.N c.S-E" (D)
    start: int  # the marker's character span in the text
    end: int
    doc_id: str | None = None
    page: int | None = None
    span_start: int | None = None
    span_end: int | None = None

    @property
    def marker(self) -> str:
        return f"[{self.kind}:{self.ref}]"


@dataclass(frozen=True)
class NumberMention:
    text: str  # as printed, e.g. "$1,234.5 million"
    start: int
    end: int
    number: float  # the printed digits with their sign, before the scale: 1234.5
    scale: float  # what the printed number is multiplied by: 1e6 for "million", 0.01 for a percent
    decimals: int  # digits printed after the point
    percent: bool = False

    @property
    def value(self) -> float:
        return self.number * self.scale

    def matches(self, value: float) -> bool:
        """Does `value` (whole units; a ratio for a percent) round to what was printed? A printed positive also
        matches a negative value of the same size ("a net loss of $3.2 million"). A percent matches a ratio
        (0.124 for "12.4%") or a value already in percent points (12.4: a program ending in multiply(…, 100))."""
        if self.percent and self._close(value):
            return True
        return self._close(value / self.scale)

    def _close(self, shown: float) -> bool:
        half = 0.5 * 10 ** -self.decimals + 1e-9 * max(1.0, abs(shown))
        if abs(shown - self.number) <= half:
            return True
        return self.number >= 0 and abs(abs(shown) - self.number) <= half


def find_citations(text: str) -> list[Citation]:
    """Every marker, in order of appearance."""
    found: list[Citation] = []
    for m in FACT_MARKER.finditer(text):
        found.append(Citation("F", m.group(1), m.start(), m.end()))
    for m in PROGRAM_MARKER.finditer(text):
        found.append(Citation("P", m.group(1), m.start(), m.end()))
    for m in SPAN_MARKER.finditer(text):
        doc, page, s, e = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
        found.append(Citation("D", f"{doc} p.{page} c.{s}-{e}", m.start(), m.end(), doc, page, s, e))
    # A marker-shaped text none of the three parses ("[F:]", "[D:x p.two]") is a citation that cannot resolve.
    known = {c.start for c in found}
    for m in ANY_MARKER.finditer(text):
        if m.start() not in known:
            found.append(Citation(m.group(0)[1], m.group(0)[3:-1].strip(), m.start(), m.end()))
    return sorted(found, key=lambda c: c.start)


def mask_markers(text: str) -> str:
    """The text with each marker blanked out (same length), so its digits are not read as numbers."""
    return ANY_MARKER.sub(lambda m: " " * len(m.group(0)), text)


def find_numbers(text: str) -> list[NumberMention]:
    """The claims' numbers in `text`, skipping years, period labels, markers, list numbering and page refs."""
    masked = mask_markers(text)
    found: list[NumberMention] = []
    for m in _NUMBER.finditer(masked):
        after = masked[m.end():m.end() + 2]
        if re.match(r"[A-Za-z0-9]|-[A-Za-z0-9]", after):  # 10-K, 2-for-1, 3x, a label such as 2023Q2
            continue
        digits = m.group("num")
        line_start = masked.rfind("\n", 0, m.start()) + 1
        before = masked[line_start:m.start()]
        plain = not (m.group("cur") or m.group("pct") or m.group("scale") or "," in digits or "." in digits)
        if plain and len(digits) == 4 and 1900 <= int(digits) <= 2100:
            continue  # a year
        if plain and _DAY_OF_MONTH.search(before):
            continue  # December 31, 2023
        if plain and _PAGE_REF.search(before):
            continue  # p. 12, page 3, Note 7
        listed = not (m.group("open") or m.group("open2")) and re.match(r"[.)](?:\s|$)", masked[m.end("num"):])
        if plain and listed and _LIST_ITEM.match(before):
            continue  # "1. " / "2) " list numbering
        negative = bool(m.group("minus")) or bool((m.group("open") or m.group("open2")) and m.group("close"))
        number = float(digits.replace(",", ""))
        decimals = len(digits.split(".")[1]) if "." in digits else 0
        scale_word = (m.group("scale") or "").strip().lower().rstrip("s")  # "millions" -> "million"
        percent = bool(m.group("pct"))
        scale = 0.01 if percent else SCALES.get(scale_word, 1.0)
        start, end = m.start(), m.end()
        found.append(NumberMention(text[start:end].strip(), start, end, -number if negative else number, scale,
                                   decimals, percent))
    return found


def first_number(text: str) -> NumberMention | None:
    """The first number a span states (what a `D:` argument of a program means)."""
    numbers = find_numbers(text)
    return numbers[0] if numbers else None
