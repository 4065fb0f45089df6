"""Data checks: malformed items here; duplicates (dedupe.py) and train/eval leakage (leakage.py) beside.

`check_malformed` reads each sample's structure: chat messages (a user turn, known roles, non-empty
string contents), and the reference the scorer reads. Shipped domains declare the reference keys
their scorers index (`REQUIRED_REFERENCE_KEYS`); for any other domain the items must agree among
themselves: a key most items carry and one item lacks is a hole in that item. Non-finite numbers
anywhere in a reference are malformed (a NaN answer can never be matched).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable

from mainspring.train.domains.base import Domain, Sample
from mainspring.train.inspect.dedupe import check_duplicates
from mainspring.train.inspect.findings import Finding, InspectOptions, items
from mainspring.train.inspect.leakage import check_leakage

__all__ = ["REQUIRED_REFERENCE_KEYS", "check_duplicates", "check_leakage", "check_malformed", "DATA_CHECKS"]

ROLES = frozenset({"system", "user", "assistant", "tool"})
MAX_LISTED = 50


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _nonempty_list(v: Any) -> bool:
    return isinstance(v, list | tuple) and len(v) > 0


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _any(v: Any) -> bool:
    return True


# What each shipped domain's scorer indexes in `sample.reference` (read off the scorers), and the shape
# it needs there. An unknown domain is checked for consistency among its items instead.
REQUIRED_REFERENCE_KEYS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "json": {"fields": lambda v: isinstance(v, dict) and bool(v), "schema": lambda v: isinstance(v, dict)},
    "math": {"answer": _is_number},
    "code": {"function": _nonempty_str, "tests": _nonempty_list},
    "scene": {"objects": _nonempty_list, "relation": _any},
    "finance": {"answer": _is_number},
    "terse": {"question": _nonempty_str, "answers": _nonempty_list},
    "verbose": {"question": _nonempty_str, "answers": _nonempty_list},
}


def _non_finite(value: Any, path: str = "") -> str | None:
    """The path of the first NaN or infinity in a JSON-like value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "(root)"
    if isinstance(value, dict):
        for k, v in value.items():
            hit = _non_finite(v, f"{path}.{k}" if path else str(k))
            if hit:
                return hit
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            hit = _non_finite(v, f"{path}[{i}]")
            if hit:
                return hit
    return None


def _message_problems(sample: Sample) -> list[str]:
    msgs = sample.messages
    if not isinstance(msgs, list | tuple) or not msgs:
        return ["no messages"]
    problems = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            problems.append(f"message {i} is a {type(m).__name__}, not an object")
            continue
        if m.get("role") not in ROLES:
            problems.append(f"message {i} has role {m.get('role')!r}")
        content = m.get("content")
        if not isinstance(content, str):
            problems.append(f"message {i} content is {type(content).__name__}, not a string")
        elif not content.strip():
            problems.append(f"message {i} ({m.get('role')}) is empty")
    if not any(isinstance(m, dict) and m.get("role") == "user" for m in msgs):
        problems.append("no user turn")
    return problems


def _reference_problems(sample: Sample, required: dict[str, Callable[[Any], bool]] | None,
                        common: set[str]) -> list[str]:
    ref = sample.reference
    if not isinstance(ref, dict):
        return [f"reference is a {type(ref).__name__}, not an object"]
    problems = []
    if required is not None:
        for key, ok in required.items():
            if key not in ref:
                problems.append(f"reference lacks {key!r}, which the scorer reads")
            elif not ok(ref[key]):
                problems.append(f"reference {key!r} has the wrong type or is empty")
    else:
        problems += [f"reference lacks {key!r}, which the other items have" for key in sorted(common - ref.keys())]
    bad = _non_finite(ref)
    if bad:
        problems.append(f"reference {bad} is not a finite number")
    return problems


def _common_keys(samples: list[Sample]) -> set[str]:
    """Keys more than half of the items' references carry: the data set's own schema."""
    counts = Counter(k for s in samples if isinstance(s.reference, dict) for k in s.reference)
    return {k for k, c in counts.items() if c * 2 > len(samples)}


def check_malformed(domain: Domain, options: InspectOptions) -> list[Finding]:
    """"data.malformed" errors, one per problem kind, naming the items that have it."""
    samples = [*items(domain, options, "train"), *items(domain, options, "eval")]
    required = REQUIRED_REFERENCE_KEYS.get(domain.name)
    common = _common_keys(samples) if required is None else set()
    by_problem: dict[str, list[str]] = {}
    for s in samples:
        try:
            problems = _message_problems(s) + _reference_problems(s, required, common)
        except Exception as exc:  # a sample object broken in a way we did not foresee is malformed too
            problems = [f"unreadable sample ({type(exc).__name__}: {exc})"]
        for p in problems:
            by_problem.setdefault(p, []).append(s.id)
    out = []
    for problem, ids in by_problem.items():
        out.append(Finding("data.malformed", "error", domain.name, f"{len(ids)} items: {problem}",
                           tuple(ids[:MAX_LISTED * 20]), {"problem": problem, "count": len(ids)},
                           "fix or drop these items: the scorer cannot score them as meant"))
    return out


# every data check, in the order a report lists them
DATA_CHECKS: tuple[Callable[[Domain, InspectOptions], list[Finding]], ...] = (
    check_malformed, check_duplicates, check_leakage)
