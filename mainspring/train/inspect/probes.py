"""Synthetic completions for probing a verifier, and the safe, budgeted scoring of them.

The verifier and reward-hacking checks need no model: they score answers built from each item's
reference completion (`Domain.reference_completion`) whose correctness is known by construction -
the reference itself, wrong answers in the reference's own format, worthless text (empty, the
prompt echoed, filler, a constant) and any of them padded towards the length cap. The wrong
answers are derived from the reference's shape, not from the domain's name, so the same probes
work on a user's data set: Python code gets its function bodies replaced, a JSON object gets every
value changed, numbers in text are moved far outside any sane tolerance.
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from mainspring.train.domains.base import Domain, Sample, Score, score_safely
from mainspring.train.domains.extract import first_json_object
from mainspring.train.inspect.findings import InspectOptions

ACCEPT = 0.5  # a wrong answer scoring above half marks is accepted (half for format alone is shaping)
FULL_MARKS = 0.999
CONSTANT = "I don't know."
# no digits, braces, code or sentence ends: filler must carry no answer of any domain
_FILLER = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?!\w)")
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.S)
_MAX_TIMEOUTS = 3  # a scorer that hangs this often is not called again: each hang costs score_timeout_s
_OTHERS = 16  # candidates for another item's reference
_WIDTH = 4  # concurrent scorer calls (a sandboxed scorer waits on I/O; score_safely's pool has 4 workers)


def filler(n_words: int) -> str:
    """`n_words` words of meaningless text."""
    return " ".join(_FILLER[i % len(_FILLER)] for i in range(n_words))


def padded(text: str, n_words: int) -> str:
    """`text` with `n_words` of filler on a line of its own after it (outside any code or JSON)."""
    return f"{text}\n\n{filler(n_words)}" if n_words > 0 else text


def in_prose(text: str) -> str:
    """A right answer, plainly written: the reference between two sentences of prose."""
    return f"Here is my answer.\n{text}\nI hope this is right."


def reference_of(domain: Domain, sample: Sample) -> tuple[str | None, str | None]:
    """(the sample's reference completion, None) or (None, why there is none); never raises."""
    if domain.reference_completion is None:
        return None, "the domain has no reference_completion"
    try:
        ref = domain.reference_completion(sample)
    except Exception as exc:  # a user's data line without a reference, or a builder's bug: a finding
        return None, f"{type(exc).__name__}: {exc}"
    if not isinstance(ref, str):
        return None, f"reference_completion returned {type(ref).__name__}, not str"
    return ref, None


def references(domain: Domain, samples: Sequence[Sample]) -> tuple[dict[str, str], dict[str, str]]:
    """({sample id: reference completion}, {sample id: why it has none})."""
    refs: dict[str, str] = {}
    missing: dict[str, str] = {}
    for s in samples:
        ref, why = reference_of(domain, s)
        if ref is None:
            missing[s.id] = why or "no reference"
        else:
            refs[s.id] = ref
    return refs, missing


def other_reference(samples: Sequence[Sample], refs: dict[str, str], index: int) -> str | None:
    """A right answer to another prompt: of the next few items' references, the one sharing the
    fewest words with this item's (two records can share a city; the probe wants none right)."""
    own = refs.get(samples[index].id)
    mine = _tokens(own or "")
    best: tuple[float, str] | None = None
    for step in range(1, min(len(samples), _OTHERS + 1)):
        other = refs.get(samples[(index + step) % len(samples)].id)
        if other is None or other == own:
            continue
        theirs = _tokens(other)
        overlap = len(mine & theirs) / max(1, len(mine | theirs))
        if best is None or overlap < best[0]:
            best = (overlap, other)
    return best[1] if best else None


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.casefold()))


def wrong_answers(reference: str, other: str | None = None) -> dict[str, str]:
    """Answers in the reference's format with wrong content, by probe name; those that come out
    equal to the reference (nothing to change) are left out."""
    out: dict[str, str] = {}
    code = code_of(reference)
    if code is not None:
        out["returns_none"] = _recode(reference, code, ast.Constant(None))
        out["returns_constant"] = _recode(reference, code, ast.Constant(0))
    else:
        obj = first_json_object(reference)
        if obj is not None:
            out["json_values"] = reference.replace(_json_span(reference, obj), json.dumps(_mutate_json(obj)), 1)
        elif _NUMBER.search(reference):
            out["numbers_shifted"] = _NUMBER.sub(lambda m: _number(m.group(), shift=True), reference)
            out["numbers_doubled"] = _NUMBER.sub(lambda m: _number(m.group(), shift=False), reference)
    if other is not None:
        out["other_reference"] = other
    return {k: v for k, v in out.items() if v.strip() != reference.strip()}


def code_of(text: str) -> str | None:
    """The Python source in `text` (a fenced block, else the whole text) when it parses and
    defines a function at the top level; None otherwise."""
    for candidate in [m.group(1) for m in _FENCE.finditer(text)] + [text]:
        try:
            tree = ast.parse(candidate)
        except (SyntaxError, ValueError, RecursionError):
            continue
        if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in tree.body):
            return candidate
    return None


def fenced(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


def _recode(reference: str, code: str, value: ast.expr) -> str:
    """The reference with every top-level function's body replaced by `return value`."""
    tree = ast.parse(code)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.body = [ast.Return(value)]
    new = ast.unparse(ast.fix_missing_locations(tree))
    return reference.replace(code, new + "\n", 1) if code != reference else new


def _json_span(text: str, obj: dict[str, Any]) -> str:
    """The source text of the first JSON object (so a fence or prose around it is kept)."""
    start = text.find("{")
    while start != -1:
        try:
            value, end = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            value, end = None, start
        if value == obj:
            return text[start:end]
        start = text.find("{", start + 1)
    return json.dumps(obj)


def _mutate_json(obj: Any) -> Any:
    """Every leaf changed: strings rotated among the document's distinct strings (so they stay
    plausible values), numbers shifted by a quarter, booleans flipped; keys and nesting kept."""
    strings: list[str] = []

    def collect(v: Any) -> None:
        if isinstance(v, str) and v not in strings:
            strings.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                collect(x)
        elif isinstance(v, list):
            for x in v:
                collect(x)

    def change(v: Any) -> Any:
        if isinstance(v, bool):
            return not v
        if isinstance(v, (int, float)):
            return _shift(v)
        if isinstance(v, str):
            return strings[(strings.index(v) + 1) % len(strings)] if len(strings) > 1 else v[::-1] + "x"
        if isinstance(v, dict):
            return {k: change(x) for k, x in v.items()}
        if isinstance(v, list):
            return [change(x) for x in v]
        return v

    collect(obj)
    return change(obj)


def _shift(x: int | float) -> int | float:
    """A number moved by a quarter of itself (at least 1): far outside any answer tolerance."""
    step = max(1, round(abs(x) / 4))
    return x + step if isinstance(x, int) else float(x + step)


def _number(text: str, shift: bool) -> str:
    decimals = len(text.split(".")[1]) if "." in text else 0
    x = float(text)
    y = x + max(1.0, round(abs(x) / 4)) if shift else (2 * x if x else 1.0)
    return f"{y:.{decimals}f}"


@dataclass
class Prober:
    """Scores (sample, completion) pairs through `score_safely`, caching each pair's score.

    A scorer that times out `_MAX_TIMEOUTS` times is not called again (the remaining pairs come
    back None), so a hanging verifier costs a few timeouts, not one per probe."""

    domain: Domain
    options: InspectOptions
    timeouts: list[str] = field(default_factory=list)  # ids of the samples whose scoring timed out
    skipped: int = 0
    _cache: dict[tuple[str, str], Score] = field(default_factory=dict)

    @property
    def exhausted(self) -> bool:
        return len(self.timeouts) >= _MAX_TIMEOUTS

    def score(self, sample: Sample, completion: str, fresh: bool = False) -> Score | None:
        key = (sample.id, completion)
        if not fresh and key in self._cache:
            return self._cache[key]
        if self.exhausted:
            self.skipped += 1
            return None
        result = score_safely(self.domain.scorer, sample, completion, self.options.score_timeout_s)
        if result.error is not None and result.error.startswith("scorer timed out"):
            self.timeouts.append(sample.id)
            return None
        if not fresh:
            self._cache[key] = result
        return result

    def score_many(self, pairs: Sequence[tuple[Sample, str]], fresh: bool = False) -> list[Score | None]:
        """Every pair's score, in order, a few at a time."""
        if len(pairs) <= 1:
            return [self.score(s, c, fresh) for s, c in pairs]
        with cf.ThreadPoolExecutor(max_workers=_WIDTH, thread_name_prefix="probe") as pool:
            return list(pool.map(lambda p: self.score(p[0], p[1], fresh), pairs))


def spread(samples: Sequence[Sample], n: int) -> list[Sample]:
    """At most `n` samples, evenly spaced over the list (probes that only need a sample)."""
    if len(samples) <= n:
        return list(samples)
    return [samples[i * len(samples) // n] for i in range(n)]
