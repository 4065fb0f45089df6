"""Scoring the question set: answers within tolerance, "not reported" only for null, the claims' rates, cost per
correct answer, and a small pick that still covers every type."""

import pytest

from mainspring.scenarios.finance.corpus_format import Question
from mainspring.scenarios.finance.evaluate import is_correct, pick_questions, result_of, summarize
from mainspring.scenarios.finance.pipeline import ResearchOutcome


def question(qid: str, qtype: str = "extraction", answer: float | None = 1_234_500_000.0) -> Question:
    return Question(id=qid, companies=["ORBT"], question_type=qtype, question_reasoning="look it up",
                    question="What was revenue?", answer=answer, answer_text="$1,234.5 million", unit="USD",
                    tolerance=0.005)


def test_an_answer_counts_within_the_relative_tolerance_and_in_whole_units_only():
    q = question("q1")
    assert is_correct(q, 1_234_500_000.0) and is_correct(q, 1_236_000_000.0)
    assert not is_correct(q, 1_250_000_000.0)
    assert not is_correct(q, 1_234.5)  # read "in millions" and not scaled: the scale trap
    assert not is_correct(q, None) and not is_correct(q, float("nan"))
    unanswerable = question("q2", "unanswerable", None)
    assert is_correct(unanswerable, None) and not is_correct(unanswerable, 0.0)


def test_results_and_the_summary_count_claims_and_cost_per_correct_answer():
    verdict = {"verified": False, "claims": [{"status": "ok"}, {"status": "wrong_period"}, {"status": "uncited"}]}
    usage = {"prompt_tokens": 900, "cached_tokens": 300, "completion_tokens": 100, "cost_u": 2_000}
    right = result_of(question("q1"), ResearchOutcome("plan_1", "succeeded", "m", 1_234_500_000.0, False,
                                                      verdict, usage=usage))
    wrong = result_of(question("q2"), ResearchOutcome("plan_2", "succeeded", "m", 5.0, True,
                                                      {"verified": True, "claims": [{"status": "ok"}]},
                                                      usage=usage))
    assert (right.correct, right.claims, right.claims_ok, right.cited, right.unsupported) == (True, 3, 1, 2, 2)
    summary = summarize([right, wrong])
    assert summary["accuracy"] == 0.5 and summary["reports_verified"] == 1
    assert summary["correct_and_verified"] == 0  # the right answer's report failed a claim; the verified one is wrong
    assert summary["verified_claims_rate"] == 2 / 4 and summary["citation_precision"] == 2 / 3
    assert summary["unsupported_per_report"] == 1.0
    assert summary["cost_per_correct_usd"] == pytest.approx(0.004)  # both questions' cost over one right answer
    assert summarize([wrong])["accuracy_by_type"] == {"extraction": 0.0}


def test_a_small_pick_takes_each_type_in_turn_and_refuses_unknown_types():
    qs = [question(f"e{i}") for i in range(5)] + [question(f"t{i}", "trap") for i in range(2)]
    assert [q.id for q in pick_questions(qs, 4)] == ["e0", "t0", "e1", "t1"]
    assert [q.id for q in pick_questions(qs, 10, ["trap"])] == ["t0", "t1"]
    with pytest.raises(ValueError, match="unknown question types chain"):
        pick_questions(qs, 3, ["chain"])
