"""Reading answers out of free text: the first JSON object, the numbers, the words.

Scorers are lenient about where the answer sits (a small model wraps it in prose or code fences)
and strict about what it is; each domain says which number or object counts.
"""

from __future__ import annotations

import json
import re
from typing import Any

_DECODER = json.JSONDecoder()
# a thousands separator only between digit groups of three, so "1,250.5" is one number and "3,4" two
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")
_INTEGER = re.compile(r"(?<![\w.])-?\d+(?!\w|\.\d)")
_WORD = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first `{...}` in `text` that parses as a JSON object (fences and prose around it ignored)."""
    start = text.find("{")
    while start != -1:
        try:
            value, _ = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


def numbers(text: str) -> list[float]:
    """Every decimal number in `text`, in order ("1,250.5" -> 1250.5; "v2" and "3rd" are not numbers)."""
    return [float(m.group().replace(",", "")) for m in _NUMBER.finditer(text)]


def integers(text: str) -> list[int]:
    """Every integer standing alone in `text` (the digits of "2.5" or "x2" are not integers)."""
    return [int(m.group()) for m in _INTEGER.finditer(text)]


def words(text: str) -> list[str]:
    """Words as a reader counts them: letters and digits, with inner apostrophes and hyphens."""
    return _WORD.findall(text)


def is_bare_number(text: str) -> bool:
    """The reply is one number and nothing else (a currency sign, a unit-free % and a full stop allowed)."""
    s = text.strip().rstrip(".").strip()
    s = s.removeprefix("$").removesuffix("%").strip()
    return bool(s) and _NUMBER.fullmatch(s) is not None
