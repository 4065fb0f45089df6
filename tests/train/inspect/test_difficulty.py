"""Difficulty calibration and label noise over scripted completions (no model), and one slow run of
the real engine on the math domain."""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import pytest

from mainspring.train.domains.base import Domain, Sample, Score
from mainspring.train.inspect.difficulty import (EngineSource, answer_key, check_difficulty, check_label_noise,
                                                 normalize, reference_text)
from mainspring.train.inspect.findings import InspectOptions


class ExactScorer:
    """1 for the reference answer, 0.5 for a reply containing it, 0 otherwise."""

    def score(self, sample: Sample, completion: str) -> Score:
        want = str(sample.reference["answer"])
        if completion.strip() == want:
            return Score(1.0)
        return Score(0.5 if want in completion else 0.0)


def make_domain(answers: dict[str, str], scorer=None) -> Domain:
    train = [Sample(i, "toy", ({"role": "user", "content": f"question {i}"},), {"answer": a})
             for i, a in answers.items()]
    eval_ = [Sample("e0", "toy", ({"role": "user", "content": "held out"},), {"answer": "0"})]
    return Domain("toy", train, eval_, scorer or ExactScorer())


class Scripted:
    """A CompletionSource that answers from a script: item id -> its G completions."""

    def __init__(self, script: Callable[[Sample, int], list[str]]) -> None:
        self.script, self.calls = script, 0

    def complete(self, domain: Domain, samples: Sequence[Sample], n: int) -> list[list[str]]:
        self.calls += 1
        return [self.script(s, n) for s in samples]


def mixed(s: Sample, n: int) -> list[str]:
    """Half right, half wrong: every group has variance."""
    a = s.reference["answer"]
    return [a if j % 2 == 0 else "nope" for j in range(n)]


OPTS = InspectOptions(samples=4, score_timeout_s=2.0)


def by_check(findings):
    return {f.check: f for f in findings}


def test_reward_vs_length_of_the_model_samples_is_measured_for_the_plot():
    def longer_is_better(s: Sample, n: int) -> list[str]:  # right answers padded, wrong ones terse
        a = s.reference["answer"]
        return [f"{a} " + "so " * (5 + j) if j % 2 == 0 else "nope" for j in range(n)]

    d = make_domain({f"q{i}": str(i) for i in range(8)})
    f = by_check(check_difficulty(d, OPTS, Scripted(longer_is_better)))["difficulty.reward_length"]
    ev = f.evidence
    assert f.severity == "info" and ev["samples"] == 32 and len(ev["lengths"]) == len(ev["rewards"]) == 32
    assert ev["spearman"] > 0.8 and sorted(set(ev["rewards"])) == [0.0, 0.5]  # padded: contains, not equals
    flat = by_check(check_difficulty(d, OPTS, Scripted(mixed)))["difficulty.reward_length"]
    assert flat.evidence["spearman"] == 0.0  # every sample is one word: no correlation to measure


def test_a_well_calibrated_domain_has_only_the_measurement():
    d = make_domain({f"q{i}": str(i) for i in range(8)})
    found = by_check(check_difficulty(d, OPTS, Scripted(mixed)))
    assert set(found) == {"difficulty.pass_rate", "difficulty.reward_length"}
    ev = found["difficulty.pass_rate"].evidence
    assert found["difficulty.pass_rate"].severity == "info"
    assert ev["histogram"]["bins"] == [0.0, 0.25, 0.5, 0.75, 1.0] and ev["histogram"]["counts"] == [0, 0, 8, 0, 0]
    assert ev["useful_share"] == 1.0 and ev["mean_pass_rate"] == 0.5
    # a binary item at p = 1/2: a group of G has variance with probability 1 - 2 * 0.5^G
    assert ev["useful_share_at_group_size"]["4"] == pytest.approx(1 - 2 * 0.5 ** 4, abs=1e-4)
    assert ev["useful_groups_per_step"] == pytest.approx(4 * (1 - 2 * 0.5 ** 4), abs=0.01)


def test_never_and_always_solved_items_are_flagged_by_id():
    d = make_domain({"easy": "1", "hard": "2", **{f"q{i}": str(i + 10) for i in range(6)}})

    def script(s: Sample, n: int) -> list[str]:
        if s.id == "easy":
            return [s.reference["answer"]] * n
        if s.id == "hard":
            return ["no idea"] * n
        return mixed(s, n)

    found = by_check(check_difficulty(d, OPTS, Scripted(script)))
    assert found["difficulty.never_solved"].item_ids == ("hard",)
    assert found["difficulty.always_solved"].item_ids == ("easy",)
    assert {f.severity for f in found.values()} == {"info", "warning"}
    assert found["difficulty.pass_rate"].evidence["histogram"]["counts"] == [1, 0, 6, 0, 1]
    assert found["difficulty.pass_rate"].evidence["useful_share"] == 0.75


@pytest.mark.parametrize("answer", ["right", "wrong"])
def test_a_domain_without_signal_is_an_error(answer):
    d = make_domain({f"q{i}": str(i) for i in range(5)})
    src = Scripted(lambda s, n: [s.reference["answer"] if answer == "right" else "x"] * n)
    found = by_check(check_difficulty(d, OPTS, src))
    f = found["difficulty.no_signal"]
    assert f.severity == "error" and len(f.item_ids) == 5
    assert ("always solved" if answer == "right" else "ever solved") in f.message


def test_a_domain_never_fully_solved_is_an_error_even_with_partial_credit():
    d = make_domain({f"q{i}": str(i) for i in range(4)})
    # "the answer is N" earns 0.5 (pass) only at the threshold above it: no item reaches it
    src = Scripted(lambda s, n: [f"about {s.reference['answer']}", "nothing"] * (n // 2))
    found = by_check(check_difficulty(d, OPTS, src, pass_threshold=0.9))
    assert found["difficulty.no_signal"].severity == "error"
    assert "partial credit" in found["difficulty.no_signal"].message


def test_low_signal_share_is_a_warning():
    d = make_domain({f"q{i}": str(i) for i in range(10)})
    src = Scripted(lambda s, n: mixed(s, n) if s.id == "q0" else [s.reference["answer"]] * (n - 1) + ["x"]
                   if s.id == "q1" else ["x"] * n)
    found = by_check(check_difficulty(d, OPTS, src))
    assert found["difficulty.low_signal"].severity == "warning"
    assert "q0" not in found["difficulty.low_signal"].item_ids and "q5" in found["difficulty.low_signal"].item_ids


class Flaky:
    """Raises on one answer, hangs on another, NaN on a third."""

    def score(self, sample: Sample, completion: str) -> Score:
        if completion == "boom":
            raise RuntimeError("bad")
        if completion == "hang":
            time.sleep(2)
        if completion == "nan":
            return Score(math.nan)
        return ExactScorer().score(sample, completion)


def test_a_failing_scorer_is_a_finding_not_a_crash():
    d = make_domain({"a": "1", "b": "2", "c": "3"}, Flaky())
    src = Scripted(lambda s, n: {"a": ["boom", "1"], "b": ["hang", "2"], "c": ["nan", "3"]}[s.id] * (n // 2))
    found = by_check(check_difficulty(d, InspectOptions(samples=2, score_timeout_s=0.2), src))
    f = found["difficulty.scorer_errors"]
    assert f.severity == "warning" and set(f.item_ids) == {"a", "b", "c"}
    assert any("timed out" in e for e in f.evidence["examples"])


def test_a_failing_source_is_reported():
    class Broken:
        def complete(self, domain, samples, n):
            raise RuntimeError("no model")

    d = make_domain({"a": "1"})
    assert [f.check for f in check_difficulty(d, OPTS, Broken())] == ["difficulty.unavailable"]
    assert [f.check for f in check_label_noise(d, OPTS, Broken())] == ["label_noise.unavailable"]
    short = Scripted(lambda s, n: [])
    short.complete = lambda domain, samples, n: []  # type: ignore[method-assign]
    assert check_difficulty(d, OPTS, short)[0].check == "difficulty.unavailable"


def test_checks_do_not_modify_the_domain():
    d = make_domain({f"q{i}": str(i) for i in range(3)})
    before = [(s.id, dict(s.reference)) for s in d.train]
    check_difficulty(d, OPTS, Scripted(mixed))
    check_label_noise(d, OPTS, Scripted(mixed))
    assert [(s.id, dict(s.reference)) for s in d.train] == before


# -- label noise ----------------------------------------------------------------------------------
def test_clean_labels_give_no_finding():
    d = make_domain({f"q{i}": str(i) for i in range(6)})
    assert check_label_noise(d, OPTS, Scripted(mixed)) == []
    # a model that agrees with the reference is no evidence against it
    assert check_label_noise(d, OPTS, Scripted(lambda s, n: [s.reference["answer"]] * n)) == []


def test_a_wrong_reference_that_samples_agree_against_is_flagged():
    truth = {f"q{i}": str(i) for i in range(6)}
    labels = dict(truth, q3="99")  # planted: q3's label is wrong
    d = make_domain(labels)

    def strong(s: Sample, n: int) -> list[str]:
        return [truth[s.id] + ("." if j == 0 else "") for j in range(n - 1)] + ["unsure"]  # 3 of 4; "3." == "3"

    found = check_label_noise(d, OPTS, Scripted(strong))
    assert len(found) == 1 and found[0].check == "label_noise.consensus_disagrees"
    f = found[0]
    assert f.severity == "warning" and f.item_ids == ("q3",)
    assert f.evidence["items"]["q3"]["majority_answer"] == "3" and f.evidence["items"]["q3"]["votes"] == "3/4"
    assert f.evidence["items"]["q3"]["reference_score"] == 1.0


def test_samples_that_word_the_same_answer_differently_agree():
    """Exact text would see four different answers here; the answer's shape sees one."""
    d = make_domain({"q0": "0", "q1": "1", "q2": "12"})

    def worded(s: Sample, n: int) -> list[str]:
        if s.id != "q2":
            return [s.reference["answer"]] * n
        return ["The answer is 1,000.", "1000", "so the total is 1000.0", "I think 999"][:n]

    (f,) = check_label_noise(d, OPTS, Scripted(worded))
    assert f.item_ids == ("q2",) and f.evidence["items"]["q2"]["votes"] == "3/4"
    assert f.evidence["items"]["q2"]["majority_answer"] == "the answer is 1,000"  # as the model wrote it


def test_answer_key():
    assert answer_key("The answer is 42.") == answer_key("42") == answer_key("42.0") != answer_key("4.2")
    assert answer_key("x = -3") == answer_key("-3") != answer_key("3")
    assert answer_key('Here: {"b": 1, "a": [2]}') == answer_key('{"a":[2],"b":1}') != answer_key('{"a": [3], "b": 1}')
    assert answer_key("  Paris. ") == answer_key("paris") != answer_key("Lima")
    assert answer_key("v1.2.3 is out") != answer_key("3")  # a version is not the number 3


def test_a_habitual_answer_is_not_evidence_against_labels():
    d = make_domain({f"q{i}": str(i) for i in range(10)})
    # the model says "7" to everything: its habit, not ten wrong labels
    found = check_label_noise(d, OPTS, Scripted(lambda s, n: ["7"] * n))
    assert found == []


def test_split_votes_are_no_consensus():
    d = make_domain({"q0": "0", "q1": "1"})
    assert check_label_noise(d, OPTS, Scripted(lambda s, n: ["5", "5", "6", "6"][:n])) == []


def test_normalize_and_reference_text():
    assert normalize("  The Answer\n is 42. ") == "the answer is 42"
    s = Sample("x", "d", (), {"answer": 5})
    assert reference_text(s) == "5"
    assert reference_text(Sample("y", "d", (), {"fields": {"a": 1}})) is None


def test_engine_source_caches_per_item():
    class FakeEngine:
        calls = 0

    src = EngineSource(FakeEngine())
    d = make_domain({"a": "1"})
    src._cache[("toy", "a", 2, d.settings.temperature, d.settings.max_tokens)] = ["x", "y"]
    assert src.complete(d, d.train, 2) == [["x", "y"]]  # served from the cache: no engine call


@pytest.mark.slow
def test_the_real_engine_calibrates_three_math_items(embedded):
    from mainspring.train.domains.arithmetic import build
    from mainspring.train.inspect.difficulty import engine_source

    d = build(0)
    d.train = d.train[:3]
    opts = InspectOptions(samples=2, max_items=3)
    src = engine_source(loaded=embedded, threads=1)
    found = by_check(check_difficulty(d, opts, src))
    info = found["difficulty.pass_rate"]
    assert info.evidence["items"] == 3 and sum(info.evidence["histogram"]["counts"]) == 3
    comps = src.complete(d, d.train, 2)
    assert len(comps) == 3 and all(len(c) == 2 and all(isinstance(t, str) for t in c) for c in comps)
    assert isinstance(check_label_noise(d, opts, src), list)
