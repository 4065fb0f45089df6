"""`mainspring finance eval`: the question set through the research pipeline, scored.

Per question: the report's `answer` against the gold answer within the question's relative tolerance (a gold
None, "not reported", is right only when the answer is null too); the verifier's claims. Per run:

- accuracy, overall and by question type, and the correct answers whose report the verifier also passed (the
  report's `answer` field carries no citation of its own; its Markdown must);
- verified-claims rate and citation precision (of the numbers that carry a citation, the share whose source
  states or computes that number, in the period the text names);
- unsupported numbers per report (claims the verifier did not pass: uncited, wrong value, wrong period,
  unresolvable);
- cost per correct answer (list-price USD of all the runs' model calls over the correct answers), tokens.

Answers are in whole units (dollars, shares; ratios as percents), so a figure read from a table "in thousands"
and not scaled is wrong: that is the scale trap.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Callable

import httpx

from mainspring.scenarios.finance.corpus_format import Question
from mainspring.scenarios.finance.pipeline import ResearchOutcome, start_research, wait_research


def is_correct(question: Question, answer: float | None) -> bool:
    if question.answer is None:
        return answer is None
    if answer is None or not math.isfinite(answer):
        return False
    gold = question.answer
    return abs(answer - gold) <= max(abs(gold) * question.tolerance, 1e-9)


@dataclass
class QuestionResult:
    id: str
    question_type: str
    correct: bool
    verified: bool
    answer: float | None
    gold: float | None
    claims: int  # numbers in the report the verifier checked
    claims_ok: int
    cited: int  # of them, those that carried a citation
    unsupported: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_u: int  # micro-USD, list price
    plan_id: str
    status: str
    error: str | None = None


def result_of(question: Question, outcome: ResearchOutcome) -> QuestionResult:
    claims = (outcome.verdict or {}).get("claims", [])
    statuses = [c.get("status") for c in claims if isinstance(c, dict)]
    usage = outcome.usage or {}
    return QuestionResult(
        id=question.id, question_type=question.question_type, correct=is_correct(question, outcome.answer),
        verified=outcome.verified, answer=outcome.answer, gold=question.answer, claims=len(statuses),
        claims_ok=statuses.count("ok"), cited=sum(s != "uncited" for s in statuses),
        unsupported=sum(s != "ok" for s in statuses), prompt_tokens=int(usage.get("prompt_tokens", 0)),
        cached_tokens=int(usage.get("cached_tokens", 0)), completion_tokens=int(usage.get("completion_tokens", 0)),
        cost_u=int(usage.get("cost_u", 0)), plan_id=outcome.plan_id, status=outcome.status, error=outcome.error)


def summarize(results: list[QuestionResult]) -> dict[str, Any]:
    by_type: dict[str, list[QuestionResult]] = defaultdict(list)
    for r in results:
        by_type[r.question_type].append(r)
    correct = sum(r.correct for r in results)
    claims, ok, cited = (sum(getattr(r, k) for r in results) for k in ("claims", "claims_ok", "cited"))
    cost_u = sum(r.cost_u for r in results)
    return {
        "questions": len(results), "correct": correct,
        "accuracy": correct / len(results) if results else 0.0,
        "accuracy_by_type": {t: sum(r.correct for r in rs) / len(rs) for t, rs in sorted(by_type.items())},
        "reports_verified": sum(r.verified for r in results),
        "correct_and_verified": sum(r.correct and r.verified for r in results),  # the answer field is not cited
        "verified_claims_rate": ok / claims if claims else 0.0,
        "citation_precision": ok / cited if cited else 0.0,
        "unsupported_per_report": sum(r.unsupported for r in results) / len(results) if results else 0.0,
        "cost_usd": cost_u / 1e6,
        "cost_per_correct_usd": cost_u / 1e6 / correct if correct else None,
        "prompt_tokens": sum(r.prompt_tokens for r in results),
        "cached_tokens": sum(r.cached_tokens for r in results),
        "completion_tokens": sum(r.completion_tokens for r in results),
    }


def pick_questions(questions: list[Question], limit: int, types: list[str] | None = None) -> list[Question]:
    """The first `limit` questions taking each type in turn (so a small run still covers every type), in the
    set's order within a type. Unknown types are a ValueError naming the known ones."""
    by_type: dict[str, list[Question]] = defaultdict(list)
    for q in questions:
        by_type[q.question_type].append(q)
    wanted = types or sorted(by_type)
    unknown = sorted(set(wanted) - set(by_type))
    if unknown:
        raise ValueError(f"unknown question types {', '.join(unknown)}; the set has {', '.join(sorted(by_type))}")
    queues = [list(by_type[t]) for t in wanted]
    picked: list[Question] = []
    while len(picked) < limit and any(queues):
        for queue in queues:
            if queue and len(picked) < limit:
                picked.append(queue.pop(0))
    return picked


def run_eval(client: httpx.Client, corpus: str, questions: list[Question], *, timeout_s: float = 1800.0,
             progress: Callable[[QuestionResult], None] | None = None) -> list[QuestionResult]:
    """Each question as one research plan, one after another (the server's scheduler runs a plan's stages in
    order; questions in parallel would only share two cores)."""
    results = []
    for q in questions:
        plan_id = start_research(client, q.question, corpus, name=f"finance eval {q.id}")
        result = result_of(q, wait_research(client, plan_id, timeout_s=timeout_s))
        results.append(result)
        if progress is not None:
            progress(result)
    return results


def as_rows(results: list[QuestionResult]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]
