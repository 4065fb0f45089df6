"""The report verifier: every number in a Markdown report must carry a citation that states or computes it.

A number's citation is the marker (or markers) right after it in the same sentence, before the next number. A
claim is `ok` when a cited source gives the printed value at the precision printed (scale applied: a
whole-dollar fact matches "$1,234.5 million"); `wrong_value` when it does not; `wrong_period` when the claim
names a fiscal period ("Q2 FY2023", "fiscal 2024") and the cited fact is another period's; `uncited` when no
marker follows it; `unresolved` when a marker names no known fact, span or program, or its program fails. A
marker that resolves nowhere fails even when no number precedes it. The verdict fails closed: any claim that is
not `ok` makes the report unverified.

A report's stated answer (the pipeline's `answer` field) must itself be one of its verified numbers
(`check_answer`): a report that states no number, or cites other numbers than its answer, is `answer_uncited`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Protocol

from mainspring.scenarios.finance.citations import Citation, NumberMention, find_citations, find_numbers, \
    mask_markers
from mainspring.scenarios.finance.periods import FiscalPeriod, PeriodMention, find_periods, same_period
from mainspring.scenarios.finance.programs import ProgramError, run_program

ClaimStatus = str  # "ok" | "wrong_value" | "wrong_period" | "uncited" | "unresolved" | "answer_uncited"
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n\s*\n|\n(?=\s*(?:[-*+]\s|\d+[.)]\s|\||#))|\|")


class VerifiableStore(Protocol):
    """What the verifier reads from the filings store (filings.FilingsStore)."""

    def fact(self, fact_id: str): ...  # -> filings.Fact

    def span(self, doc_id: str, page: int, start: int, end: int) -> str: ...

    def scale_of(self, doc_id: str) -> int: ...

    def fact_value(self, fact_id: str) -> float: ...

    def span_value(self, doc_id: str, page: int, start: int, end: int) -> float: ...


@dataclass
class Claim:
    text: str  # the number as printed ("" for a marker no number precedes)
    start: int
    end: int
    status: ClaimStatus
    reason: str = ""
    value: float | None = None  # the printed number with its scale
    citations: list[str] = field(default_factory=list)
    source_value: float | None = None  # what the first resolving citation gives
    period: str | None = None  # the fiscal period the claim names
    sentence: str = ""


@dataclass
class Verdict:
    verified: bool
    claims: list[Claim]
    reason: str = ""
    markdown: str = ""


@dataclass
class _Check:
    status: ClaimStatus
    reason: str
    value: float | None = None


def _sentence_bounds(masked: str, at: int) -> tuple[int, int]:
    start = 0
    for m in _SENTENCE_END.finditer(masked, 0, at):
        start = m.end()
    nxt = _SENTENCE_END.search(masked, at)
    return start, (nxt.start() if nxt else len(masked))


def _claimed_period(periods: list[PeriodMention], number: NumberMention, clause: tuple[int, int],
                    sentence: tuple[int, int]) -> FiscalPeriod | None:
    inside = [p for p in periods if clause[0] <= p.start and p.end <= clause[1]]
    if inside:
        return min(inside, key=lambda p: min(abs(p.start - number.end), abs(number.start - p.end))).period
    before = [p for p in periods if sentence[0] <= p.start and p.end <= number.start]
    return before[-1].period if before else None


def _check(citation: Citation, number: NumberMention, period: FiscalPeriod | None, store: VerifiableStore,
           programs: Mapping[str, str]) -> _Check:
    try:
        if citation.kind == "F":
            fact = store.fact(citation.ref)
            if period is not None and not same_period(period, fact.period):
                return _Check("wrong_period", f"the text names {period.label} but {citation.marker} is "
                                              f"{fact.concept} for {fact.period}", fact.val)
            if number.matches(fact.val):
                return _Check("ok", "", fact.val)
            return _Check("wrong_value", f"{citation.marker} is {fact.val:,.2f} {fact.unit} ({fact.concept}, "
                                         f"{fact.period}), not {number.text}", fact.val)
        if citation.kind == "D" and citation.doc_id is not None:
            page, s, e = citation.page or 0, citation.span_start or 0, citation.span_end or 0
            text = store.span(citation.doc_id, page, s, e)
            scale = store.scale_of(citation.doc_id)
            stated = find_numbers(text)
            for n in stated:
                for value in {n.value, n.value * scale if n.scale == 1 and not n.percent else n.value}:
                    if number.matches(value):
                        return _Check("ok", "", value)
            shown = ", ".join(n.text for n in stated) or "no number"
            return _Check("wrong_value", f"{citation.marker} states {shown}, not {number.text}",
                          stated[0].value if stated else None)
        if citation.kind == "P":
            if citation.ref not in programs:
                return _Check("unresolved", f"{citation.marker}: no program {citation.ref!r} was run "
                                            f"(known: {', '.join(sorted(programs)) or 'none'})")
            result = run_program(programs[citation.ref], store)
            if number.matches(result.value):
                return _Check("ok", "", result.value)
            return _Check("wrong_value", f"{citation.marker} computes {result.value:,.6g}, not {number.text}",
                          result.value)
    except ProgramError as exc:
        return _Check("unresolved", f"{citation.marker}: the program fails: {exc}")
    except LookupError as exc:
        message = exc.args[0] if exc.args else str(exc)
        return _Check("unresolved", f"{citation.marker} does not resolve: {message}")
    return _Check("unresolved", f"{citation.marker} is not a citation this verifier reads")


def _combine(checks: list[_Check]) -> _Check:
    for status in ("unresolved", "ok", "wrong_period", "wrong_value"):
        for c in checks:
            if c.status == status:
                return c
    return _Check("uncited", "no citation follows this number in its sentence")


def verify_report(markdown: str, store: VerifiableStore, programs: Mapping[str, str]) -> Verdict:
    """Check every number of `markdown` against its citations; `programs`: the run's programs by id (p-1 …)."""
    if not markdown.strip():
        return Verdict(False, [], "the report is empty", "**Unverified**: the report is empty.")
    masked = mask_markers(markdown)
    numbers = find_numbers(markdown)
    citations = find_citations(markdown)
    periods = find_periods(masked)
    used: set[int] = set()
    claims: list[Claim] = []
    for i, number in enumerate(numbers):
        sentence = _sentence_bounds(masked, number.start)
        next_start = numbers[i + 1].start if i + 1 < len(numbers) else len(markdown)
        prev_end = numbers[i - 1].end if i else 0
        window_end = min(sentence[1], next_start)
        mine = [c for c in citations if number.end <= c.start < window_end]
        used.update(c.start for c in mine)
        period = _claimed_period(periods, number, (max(sentence[0], prev_end), window_end), sentence)
        checks = [_check(c, number, period, store, programs) for c in mine]
        outcome = _combine(checks)
        claims.append(Claim(number.text, number.start, number.end, outcome.status, outcome.reason, number.value,
                            [c.marker for c in mine], outcome.value, period.label if period else None,
                            markdown[sentence[0]:sentence[1]].strip()))
    for c in citations:  # markers after no number: they must resolve all the same
        if c.start in used:
            continue
        check = _orphan_check(c, store, programs)
        if check is not None:
            claims.append(Claim("", c.start, c.end, "unresolved", check, citations=[c.marker]))
    claims.sort(key=lambda c: c.start)
    failing = [c for c in claims if c.status != "ok"]
    verified = not failing
    reason = "" if verified else f"{len(failing)} of {len(claims)} claims failed"
    return Verdict(verified, claims, reason, render_failures(claims))


def _states(number: NumberMention, answer: float) -> bool:
    """`number` as printed says `answer` (whole units; a percent answer is in percent points) at its precision."""
    target = answer if number.percent else answer / number.scale
    return abs(target - number.number) <= 0.5 * 10 ** -number.decimals + abs(target) * 1e-9


def check_answer(verdict: Verdict, markdown: str, answer: float | None) -> Verdict:
    """The verdict, failed closed unless the report's `answer` is printed in its Markdown as a verified number.
    A null answer ("not reported") states no figure, so only the Markdown's own numbers are checked."""
    if answer is None:
        return verdict
    ok_at = {c.start for c in verdict.claims if c.status == "ok"}
    if any(n.start in ok_at and _states(n, answer) for n in find_numbers(markdown)):
        return verdict
    claim = Claim(f"{answer:g}", 0, 0, "answer_uncited", f"the report's answer ({answer:g}) is not among the "
                  "Markdown's cited and verified numbers: the answer rests on no source")
    claims = [claim, *verdict.claims]
    failing = sum(c.status != "ok" for c in claims)
    return Verdict(False, claims, f"{failing} of {len(claims)} claims failed", render_failures(claims))


def _orphan_check(c: Citation, store: VerifiableStore, programs: Mapping[str, str]) -> str | None:
    """Why a marker with no number before it does not resolve; None when it does."""
    try:
        if c.kind == "F":
            store.fact(c.ref)
        elif c.kind == "D" and c.doc_id is not None:
            store.span(c.doc_id, c.page or 0, c.span_start or 0, c.span_end or 0)
        elif c.kind == "P":
            if c.ref not in programs:
                return f"{c.marker}: no program {c.ref!r} was run"
            run_program(programs[c.ref], store)
        else:
            return f"{c.marker} is not a citation this verifier reads"
    except ProgramError as exc:
        return f"{c.marker}: the program fails: {exc}"
    except LookupError as exc:
        return f"{c.marker} does not resolve: {exc.args[0] if exc.args else exc}"
    return None


def render_failures(claims: list[Claim]) -> str:
    """The failing claims as Markdown (or one line saying all passed)."""
    failing = [c for c in claims if c.status != "ok"]
    if not failing:
        return f"**Verified**: all {len(claims)} cited numbers check out."
    lines = [f"**Unverified**: {len(failing)} of {len(claims)} claims failed.", "",
             "| number | status | why |", "|---|---|---|"]
    for c in failing:
        why = (c.reason or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {c.text or ' '.join(c.citations)} | {c.status} | {why} |")
    return "\n".join(lines)
