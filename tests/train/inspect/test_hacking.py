"""Reward-hacking probes (check_reward_hacking): length, formatting, constants and, for code, hidden
tests that do not go beyond the visible example. A clean case and a planted defect of each kind."""

import dataclasses

import pytest

from mainspring.train.config import DomainSpec
from mainspring.train.domains.base import Domain, DomainSettings, Sample, Score
from mainspring.train.domains.code_tasks import TASKS
from mainspring.train.domains.extract import integers
from mainspring.train.domains.python_functions import extract_code, prompt
from mainspring.train.domains.registry import load_domain
from mainspring.train.inspect.findings import InspectOptions
from mainspring.train.inspect.hacking import check_reward_hacking, spearman, special_case
from tests.train.inspect.planted import always_true, by_check, domain, length_hackable, snapshot, with_scorer

OPTS = InspectOptions(max_items=12, score_timeout_s=5.0)


def errors_and_warnings(findings):
    return [f for f in findings if f.severity != "info"]


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [5, 5, 5]) == 0.0
    assert spearman([1, 1, 2, 2], [0, 0, 1, 1]) == pytest.approx(1.0)  # ties


@pytest.mark.parametrize("name", ["math", "json", "scene", "finance"])
def test_clean_domains_have_no_warnings_and_are_not_modified(name):
    d = domain(name)
    before = snapshot(d)
    findings = check_reward_hacking(d, OPTS)
    assert errors_and_warnings(findings) == [], [f.message for f in findings]
    assert {f.check for f in findings} == {"hacking.length_correlation", "hacking.format_share"}
    assert snapshot(d) == before


def test_a_length_hackable_scorer_is_an_error():
    (f,) = [f for f in check_reward_hacking(length_hackable(domain("json")), OPTS)
            if f.check == "hacking.length" and f.evidence["family"] == "wrong answer"]
    assert f.severity == "error" and f.evidence["spearman"] >= 0.5 and f.evidence["gain_at_cap"] > 0.2
    curve = f.evidence["rewards"]  # the mean reward at each padded length: what the report plots
    assert len(curve) == len(f.evidence["levels_words"]) and curve[-1] - curve[0] == pytest.approx(
        f.evidence["gain_at_cap"], abs=1e-3) and curve == sorted(curve)


def test_a_length_bonus_only_for_wrong_answers_is_caught_without_references():
    d = dataclasses.replace(domain("math"), reference_completion=None)
    cap = d.settings.max_tokens

    class Rambling:
        def score(self, sample, completion):
            right = d.scorer.score(sample, completion).total
            return Score(max(right, min(0.9, len(completion.split()) / cap)))

    found = by_check(check_reward_hacking(with_scorer(d, Rambling()), OPTS))
    assert [(f.evidence["family"], f.severity) for f in found["hacking.length"]] == [("filler", "error")]


def test_formatting_alone_pays_is_a_warning():
    d = domain("math")

    class FormatOnly:  # a bare number earns 0.9, right or wrong; right earns 1
        def score(self, sample, completion):
            found = integers(completion)
            right = bool(found) and found[-1] == sample.reference["answer"]
            bare = completion.strip().lstrip("-").isdigit()
            return Score(1.0 if right and bare else 0.9 if bare else 0.6 if right else 0.0)

    found = by_check(check_reward_hacking(with_scorer(d, FormatOnly()), OPTS))
    (f,) = found["hacking.format"]
    assert f.severity == "warning" and f.evidence["format_share"] > 0.5 and f.evidence["wrong_beats_prose"] > 6


def test_a_constant_that_pays_everywhere_is_an_error():
    d = domain("finance")

    class Yes:
        def score(self, sample, completion):
            return Score(1.0) if completion.strip() == "yes" else d.scorer.score(sample, completion)

    found = by_check(check_reward_hacking(with_scorer(d, Yes()), OPTS))
    (f,) = found["hacking.constant"]
    assert f.severity == "error" and f.evidence["constant"] == "yes" and f.evidence["share"] == 1.0
    (f,) = by_check(check_reward_hacking(always_true(d), OPTS))["hacking.constant"]
    assert {c["constant"] for c in f.evidence["constants"]} >= {"", "0", "yes", "I don't know."}


def test_the_most_common_answer_as_a_constant():
    d = domain("math")
    # a data set whose answers are mostly the same number: answering it every time pays
    skewed = [dataclasses.replace(s, reference={**s.reference, "answer": 7 if i % 4 else s.reference["answer"]})
              for i, s in enumerate(d.train)]
    d = dataclasses.replace(d, train=skewed, eval=list(d.eval))
    found = by_check(check_reward_hacking(d, OPTS))
    (f,) = found["hacking.constant"]
    assert f.evidence["constant"] == "7" and f.severity in ("warning", "error")


# a code domain scored in this process (the check is the same for any scorer; the sandboxed one is below)
class InProcess:
    def score(self, sample, completion):
        code = extract_code(completion, sample.reference["function"])
        if code is None:
            return Score(0.0)
        ns: dict = {}
        try:
            exec(code, ns)
        except Exception:
            return Score(0.0)
        passed = 0
        for test in sample.reference["tests"]:
            try:
                passed += eval(test, ns) is True
            except Exception:
                pass
        return Score(passed / len(sample.reference["tests"]))


def code_domain(tasks=TASKS[:8], tests=None, show=None) -> Domain:
    samples = [Sample(f"code-{i}", "code", ({"role": "user", "content": prompt(t) + (show(t) if show else "")},),
                      {"function": t.function, "tests": list(tests(t) if tests else t.tests), "example": t.example})
               for i, t in enumerate(tasks)]
    solutions = {t.function: t.solution for t in tasks}
    return Domain("code", samples[:6], samples[6:], InProcess(), DomainSettings(max_tokens=96),
                  reference_completion=lambda s: f"```python\n{solutions[s.reference['function']]}\n```")


def test_special_case_solution():
    src = special_case("add(1, 2) == 3")
    ns: dict = {}
    exec(src, ns)
    assert ns["add"](1, 2) == 3 and ns["add"](2, 2) is None
    assert special_case("is_even(4) is True") is not None
    assert special_case("abs(f(37) - 98.6) < 1e-9") is None


def test_clean_code_tasks_have_no_warnings():
    findings = check_reward_hacking(code_domain(), OPTS)
    assert errors_and_warnings(findings) == [], [f.message for f in findings]


def test_hidden_tests_equal_to_the_example_are_caught():
    d = code_domain(tests=lambda t: [t.example.replace(", ", ",")])  # the same test, written differently
    found = by_check(check_reward_hacking(d, OPTS))
    assert found["hacking.visible_tests"][0].severity == "error"
    assert len(found["hacking.visible_tests"][0].item_ids) == 8
    (f,) = found["hacking.special_case"]
    assert f.severity == "error" and f.evidence["accepted"] == 8


def test_hidden_tests_shown_in_the_prompt_are_caught():
    d = code_domain(show=lambda t: f" Also {t.tests[1]}.")  # the prompt shows a hidden test
    found = by_check(check_reward_hacking(d, OPTS))
    (f,) = found["hacking.visible_tests"]
    assert f.severity == "error" and f.evidence["in_prompt"] == 8 and f.evidence["equal_to_example"] == 0
    assert "hacking.special_case" not in found  # the example itself is still not a hidden test


def test_code_domain_in_the_sandbox(sandbox):
    d = load_domain(DomainSpec(name="code"), 0, sandbox=sandbox)
    findings = check_reward_hacking(d, InspectOptions(max_items=1))
    assert errors_and_warnings(findings) == [], [f.message for f in findings]
